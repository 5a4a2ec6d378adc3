#!/usr/bin/env python3
"""`make bench` (a table kept from a changelog, issue 61): a Debezium changelog of 1M changes of
a table of 100K keys (20% creates, 70% updates, 10% deletes; each key in one of 4 files, as a keyed
topic keeps a key in one partition), applied by `INSERT OR REPLACE INTO customers SELECT ... FROM
stream` with `envelope := 'debezium'`, against DuckDB's own batch answer over the same files: the
last change of each key by offset, written with one `INSERT OR REPLACE`. Both on a new database
file, in fresh processes, alternating; the median of the runs next to the best. Both tables are
checked equal.

Prints a table and writes it into docs/benchmarks.md (section 'changelog') unless --quick.

usage: bench_changelog.py [--quick]
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
COLUMNS = "{'id': 'BIGINT', 'name': 'VARCHAR', 'tier': 'VARCHAR', 'score': 'DOUBLE'}"


def data(changes, keys, directory):
    """The changelog, each key's changes in file `id % 4`, in order."""
    if os.path.exists(os.path.join(directory, "done")):
        return directory
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(61)
    files = [open(os.path.join(directory, f"p{p}.ndjson"), "w") for p in range(4)]
    rows = {}                 # the live keys' rows
    live, at = [], {}         # the live keys, and where each is in the list (O(1) picks)
    ts = 1_700_000_000_000
    for i in range(changes):
        ts += 1
        r = rng.random()
        if r < 0.2 or len(live) < 2:
            k = rng.randrange(keys)
            op = "u" if k in rows else "c"
        else:
            k = live[rng.randrange(len(live))]
            op = "u" if r < 0.9 else "d"
        before = rows.get(k)
        if op == "d":
            e = {"before": before, "after": None, "op": "d", "ts_ms": ts}
            del rows[k]
            j = at.pop(k)
            last = live.pop()
            if last != k:
                live[j], at[last] = last, j
        else:
            row = {"id": k, "name": f"n{k}-{i}", "tier": rng.choice(["gold", "silver", "bronze"]),
                   "score": round(rng.uniform(0, 100), 2)}
            e = {"before": before, "after": row, "op": op, "ts_ms": ts}
            if k not in rows:
                at[k] = len(live)
                live.append(k)
            rows[k] = row
        e["source"] = {"connector": "postgresql", "table": "customers", "ts_ms": ts}
        files[k % 4].write(json.dumps(e, separators=(",", ":")) + "\n")
    for f in files:
        f.close()
    open(os.path.join(directory, "done"), "w").close()
    return directory


CHILD = """
import duckdb, json, os, resource, sys, time
ext, pattern, which, db = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
for f in (db, db + '.wal', db + '.streaming_etl.sqlite'):
    if os.path.exists(f):
        os.remove(f)
con = duckdb.connect(db, config={'allow_unsigned_extensions': 'true'})
con.execute(f"LOAD '{ext}'")
before = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.time()
if which == 'job':
    rows = con.execute(f\"\"\"SELECT * FROM streaming_etl_sql('file:{pattern}',
        'INSERT OR REPLACE INTO customers SELECT id, name, tier, score FROM stream',
        envelope := 'debezium', primary_key := ['id'], columns := {COLUMNS})\"\"\").fetchall()
    events = rows[-1][1]
else:
    con.execute("CREATE TABLE customers (id BIGINT PRIMARY KEY, name VARCHAR, tier VARCHAR, score DOUBLE)")
    con.execute(f\"\"\"INSERT OR REPLACE INTO customers
        SELECT r.id, r.name, r.tier, r.score FROM (
            SELECT op, CASE WHEN op = 'd' THEN before ELSE after END AS r
            FROM read_ndjson('{pattern}', filename := true, columns := {{
                'op': 'VARCHAR', 'ts_ms': 'BIGINT',
                'before': 'STRUCT(id BIGINT, name VARCHAR, tier VARCHAR, score DOUBLE)',
                'after': 'STRUCT(id BIGINT, name VARCHAR, tier VARCHAR, score DOUBLE)'}})
            QUALIFY row_number() OVER (PARTITION BY (CASE WHEN op = 'd' THEN before ELSE after END).id
                                       ORDER BY filename, ts_ms DESC) = 1)
        WHERE op <> 'd'\"\"\")
    events = con.execute(f"SELECT count(*) FROM read_ndjson('{pattern}', columns := {{'op': 'VARCHAR'}})").fetchone()[0]
wall = time.time() - t0
after = resource.getrusage(resource.RUSAGE_SELF)
digest = con.execute("SELECT count(*), sum(hash(id, name, tier, score)) FROM customers").fetchone()
print(json.dumps({"events": events, "wall_s": wall,
                  "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                  "rows": digest[0], "digest": str(digest[1])}))
""".replace("{COLUMNS}", COLUMNS.replace("{", "{{").replace("}", "}}"))


def one(which, pattern, db):
    out = subprocess.run([sys.executable, "-c", CHILD, EXT, pattern, which, db], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    quick = "--quick" in sys.argv[1:]
    changes, keys = (200_000, 20_000) if quick else (1_000_000, 100_000)
    directory = data(changes, keys, os.path.join(ROOT, "bench-out", f"changelog-{changes}"))
    pattern = f"{directory}/*.ndjson"
    db = os.path.join(ROOT, "bench-out", "changelog.duckdb")
    runs = {"job": [], "batch": []}
    for _ in range(1 if quick else 5):
        for which in ("job", "batch"):
            runs[which].append(one(which, pattern, db))
    job, batch = runs["job"], runs["batch"]
    assert all(r["digest"] == batch[0]["digest"] and r["rows"] == batch[0]["rows"] for r in job + batch), \
        "the job's table differs from DuckDB's batch answer"

    def rate(r):
        return r["events"] / r["wall_s"]

    med = {w: statistics.median(rate(r) for r in rs) for w, rs in runs.items()}
    best = {w: max(rate(r) for r in rs) for w, rs in runs.items()}
    rows = ["| | changes/s (median) | changes/s (best) | wall s (median) | rows kept |",
            "|---|---|---|---|---|"]
    names = {"job": "the job: INSERT OR REPLACE ... FROM stream, envelope := 'debezium'",
             "batch": "DuckDB's batch: last change per key, one INSERT OR REPLACE over read_ndjson"}
    for w in ("job", "batch"):
        rows.append(f"| {names[w]} | {med[w]:,.0f} | {best[w]:,.0f} | "
                    f"{statistics.median(r['wall_s'] for r in runs[w]):.2f} | {runs[w][0]['rows']:,} |")
    rows.append(f"\nThe job at **{med['job'] / med['batch']:.2f}×** DuckDB's batch answer by the median "
                f"({best['job'] / best['batch']:.2f}× by the best; goal ≥ 0.5×), {job[0]['events']:,} changes of "
                f"{keys:,} keys, {len(job)} runs each; both tables equal.")
    table = "\n".join(rows)
    print(table)
    if not quick:
        from docs_section import write_section
        write_section("docs/benchmarks.md", "changelog", "make bench (scripts/bench_changelog.py)", table)


if __name__ == "__main__":
    main()
