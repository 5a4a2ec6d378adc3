#!/usr/bin/env python3
"""`make bench` (a window join, issue 62): 1M events of one stream, orders and payments (each 50%,
1,000 customers, 4 files, event time rising 1 ms an event), joined per customer in 10 s tumbling
windows (`FROM TUMBLE(stream, ...) AS o JOIN TUMBLE(stream, ...) AS p ON o.customer = p.customer
AND o.window_start = p.window_start`), against DuckDB's batch join over the same files
(`read_ndjson`, `time_bucket`). Both on a new database file, in fresh processes, alternating; the
median of the runs next to the best, and each side's peak RSS; the job's peak RSS at 10× the
events. Both tables are checked equal.

Prints a table and writes it into docs/benchmarks.md (section 'window join') unless --quick.

usage: bench_window_join.py [--quick]
"""
import json
import os
import random
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

EXT = os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension")


def data(events, directory):
    if os.path.exists(os.path.join(directory, "done")):
        return directory
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(62)
    files = [open(os.path.join(directory, f"p{p}.ndjson"), "w") for p in range(4)]
    ts = 1_700_000_000_000
    for i in range(events):
        ts += 1
        c = f"c{rng.randrange(1000)}"
        if rng.random() < 0.5:
            e = {"kind": "order", "customer": c, "amount": rng.randint(1, 500), "ts": ts}
        else:
            e = {"kind": "payment", "customer": c, "paid": rng.randint(1, 500), "ts": ts}
        files[i % 4].write(json.dumps(e, separators=(",", ":")) + "\n")
    for f in files:
        f.close()
    open(os.path.join(directory, "done"), "w").close()
    return directory


JOIN = """SELECT o.customer, o.window_start, count(*) AS pairs, sum(p.paid) AS paid, max(o.amount) AS top
FROM {left} AS o JOIN {right} AS p ON o.customer = p.customer AND o.window_start = p.window_start
WHERE o.kind = 'order' AND p.kind = 'payment' GROUP BY ALL"""
WINDOW = "TUMBLE(stream, event_time, INTERVAL 10 SECOND)"
COLUMNS = "{'kind': 'VARCHAR', 'customer': 'VARCHAR', 'amount': 'BIGINT', 'paid': 'BIGINT'}"

CHILD = """
import duckdb, json, os, resource, sys, time
ext, pattern, which, db, job, batch, columns, prepared = sys.argv[1:9]
for f in (db, db + '.wal', db + '.streaming_etl.sqlite'):
    if os.path.exists(f):
        os.remove(f)
con = duckdb.connect(db, config={'allow_unsigned_extensions': 'true'})
con.execute(f"LOAD '{ext}'")
t0 = time.time()
if which == 'job':
    call = (f"SELECT * FROM streaming_etl_sql('file:{pattern}', $$INSERT INTO joined {job}$$, time_field := 'ts', "
            f"lateness_ms := 0, flush := true, columns := {columns})")
    if prepared == 'prepared':
        # (Prepared, the run lets DuckDB checkpoint as it goes, as a job in the background does.)
        con.execute(f"PREPARE j AS {call}")
        rows = con.execute("EXECUTE j").fetchall()
    else:
        rows = con.execute(call).fetchall()
    events, late = rows[-1][1], rows[-1][3]
else:
    con.execute(f"CREATE TABLE joined AS {batch}")
    events, late = con.execute(f"SELECT count(*) FROM read_ndjson('{pattern}', columns := {{'ts': 'BIGINT'}})").fetchone()[0], 0
wall = time.time() - t0
digest = con.execute("SELECT count(*), sum(hash(customer, epoch_ms(window_start), pairs, paid, top)) FROM joined").fetchone()
print(json.dumps({"events": events, "late": late, "wall_s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rows": digest[0], "digest": str(digest[1])}))
"""


def one(which, pattern, db, prepared=False):
    placed = (f"(SELECT *, time_bucket(INTERVAL 10 SECOND, make_timestamptz(ts * 1000)) AS window_start "
              f"FROM read_ndjson('{pattern}', columns := {COLUMNS[:-1]}, 'ts': 'BIGINT'}}))")
    batch = JOIN.format(left=placed, right=placed)
    job = JOIN.format(left=WINDOW, right=WINDOW)
    out = subprocess.run([sys.executable, "-c", CHILD, EXT, pattern, which, db, job, batch, COLUMNS,
                          "prepared" if prepared else "plain"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    quick = "--quick" in sys.argv[1:]
    events = 200_000 if quick else 1_000_000
    directory = data(events, os.path.join(ROOT, "bench-out", f"window-join-{events}"))
    pattern = f"{directory}/*.ndjson"
    db = os.path.join(ROOT, "bench-out", "window_join.duckdb")
    runs = {"job": [], "batch": []}
    for _ in range(1 if quick else 5):
        for which in ("job", "batch"):
            runs[which].append(one(which, pattern, db))
    job, batch = runs["job"], runs["batch"]
    assert all(r["late"] == 0 for r in job), "no event is late in this feed"
    assert all(r["digest"] == batch[0]["digest"] and r["rows"] == batch[0]["rows"] for r in job + batch), \
        "the job's rows differ from DuckDB's batch join"

    def rate(r):
        return r["events"] / r["wall_s"]

    med = {w: statistics.median(rate(r) for r in rs) for w, rs in runs.items()}
    best = {w: max(rate(r) for r in rs) for w, rs in runs.items()}
    rows = ["| | events/s (median) | events/s (best) | wall s (median) | peak RSS MB | rows |",
            "|---|---|---|---|---|---|"]
    names = {"job": "the job: a window join of the stream's orders and payments, 10 s TUMBLE",
             "batch": "DuckDB's batch join over read_ndjson (time_bucket)"}
    for w in ("job", "batch"):
        rows.append(f"| {names[w]} | {med[w]:,.0f} | {best[w]:,.0f} | "
                    f"{statistics.median(r['wall_s'] for r in runs[w]):.2f} | "
                    f"{max(r['rss_mb'] for r in runs[w]):.0f} | {runs[w][0]['rows']:,} |")
    rows.append(f"\nThe window join at **{med['job'] / med['batch']:.2f}×** DuckDB's batch join by the median "
                f"({best['job'] / best['batch']:.2f}× by the best; goal ≥ 0.5×), {job[0]['events']:,} events, "
                f"{len(job)} runs each; both tables equal.")
    if not quick:
        # State stays bounded: the job over 10x the events (the same feed, longer), prepared, as a
        # long job runs (a plain statement holds DuckDB's checkpoints back until it ends, so the
        # target's rows stay in memory: shown too).
        big = data(events * 10, os.path.join(ROOT, "bench-out", f"window-join-{events * 10}"))
        one_x = one("job", pattern, db, prepared=True)
        ten = one("job", f"{big}/*.ndjson", db, prepared=True)
        ten_plain = one("job", f"{big}/*.ndjson", db)
        rows.append(f"Peak RSS of the job at 10× the events ({ten['events']:,}), prepared: {ten['rss_mb']:.0f} MB, "
                    f"{ten['rss_mb'] / one_x['rss_mb']:.2f}× the 1× run's {one_x['rss_mb']:.0f} MB (goal ≤ 1.3×). "
                    f"As one plain statement, which holds DuckDB's checkpoints back until it ends, so that the "
                    f"target's {ten_plain['rows']:,} rows stay in memory: {ten_plain['rss_mb']:.0f} MB.")
    table = "\n".join(rows)
    print(table)
    if not quick:
        from docs_section import write_section
        write_section("docs/benchmarks.md", "window join", "make bench (scripts/bench_window_join.py)", table)


if __name__ == "__main__":
    main()
