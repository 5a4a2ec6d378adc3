#!/usr/bin/env python3
"""`make bench` (issue 62): Nexmark's joins of persons and auctions as SQL jobs, against DuckDB's
batch query over the same files, rows checked equal.

Events: the Nexmark generator's whole stream (`nexmark --format json --no-wait -n N`: persons,
auctions and bids, 1:3:46, each kind wrapped in an object of its name, `{"Person": {...}}`), 4
NDJSON files round-robin. One stream: its event time is whichever of `Person.date_time`,
`Auction.date_time`, `Bid.date_time` the event has (`time_field` lists the three); persons and
auctions are the stream read twice, by which object an event has.

  q8  monitor new users: the persons who opened an auction in the 10 s tumbling window they
      registered in (a window join)

Both sides on a new database file, in fresh processes, alternating; the median of the runs next to
the best, and peak RSS. Prints a table and writes it into docs/benchmarks.md (section 'nexmark
joins') unless --quick.

usage: bench_nexmark_joins.py [--quick]
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import bench_nexmark  # noqa: E402  (the generator)
import benchlib  # noqa: E402

ROOT, EXT = benchlib.ROOT, benchlib.EXT
TIME_FIELDS = "Person.date_time, Auction.date_time, Bid.date_time"
WINDOW = "TUMBLE(stream, event_time, INTERVAL 10 SECOND)"
COLUMNS = "{'Person.id AS pid': 'BIGINT', 'Person.name AS name': 'VARCHAR', 'Auction.seller AS seller': 'BIGINT'}"

QUERIES = [
    {"name": "read", "title": "(the read alone: events counted per 10 s window, no join)",
     "job": f"SELECT window_start, count(*) AS n FROM {WINDOW} GROUP BY ALL",
     "batch": """SELECT time_bucket(INTERVAL 10 SECOND, make_timestamptz(coalesce(Person.date_time, Auction.date_time,
                        Bid.date_time) * 1000)) AS window_start, count(*) AS n
                 FROM read_ndjson('{pattern}', columns := {{'Person': 'STRUCT(date_time BIGINT)',
                   'Auction': 'STRUCT(date_time BIGINT)', 'Bid': 'STRUCT(date_time BIGINT)'}}) GROUP BY ALL""",
     "digest": "count(*), sum(hash(epoch_ms(window_start), n))"},
    {"name": "q8", "title": "q8 monitor new users (a window join, 10 s TUMBLE)",
     "job": f"""SELECT p.pid AS id, p.name, p.window_start AS starttime
                FROM {WINDOW} AS p JOIN {WINDOW} AS a ON p.pid = a.seller AND p.window_start = a.window_start
                GROUP BY ALL""",
     # Flink's q8: each side grouped per window, then joined on the id and the window.
     "batch": """WITH ev AS (SELECT Person, Auction, time_bucket(INTERVAL 10 SECOND,
                      make_timestamptz(coalesce(Person.date_time, Auction.date_time, Bid.date_time) * 1000)) AS ws
                    FROM read_ndjson('{pattern}', columns := {{'Person': 'STRUCT(id BIGINT, name VARCHAR, date_time BIGINT)',
                      'Auction': 'STRUCT(seller BIGINT, date_time BIGINT)', 'Bid': 'STRUCT(date_time BIGINT)'}})),
                  p AS (SELECT Person.id AS id, Person.name AS name, ws FROM ev WHERE Person IS NOT NULL GROUP BY ALL),
                  a AS (SELECT Auction.seller AS seller, ws FROM ev WHERE Auction IS NOT NULL GROUP BY ALL)
                SELECT p.id, p.name, p.ws AS starttime FROM p JOIN a ON p.id = a.seller AND p.ws = a.ws""",
     "digest": "count(*), sum(hash(id, name, epoch_ms(starttime)))"},
]

CHILD = """
import duckdb, json, os, resource, sys, time
ext, pattern, which, db, sql, columns, time_fields, digest = sys.argv[1:9]
for f in (db, db + '.wal', db + '.streaming_etl.sqlite'):
    if os.path.exists(f):
        os.remove(f)
con = duckdb.connect(db, config={'allow_unsigned_extensions': 'true'})
con.execute(f"LOAD '{ext}'")
t0 = time.time()
if which == 'job':
    rows = con.execute(f"SELECT * FROM streaming_etl_sql('file:{pattern}', $$INSERT INTO q {sql}$$, "
                       f"time_field := '{time_fields}', lateness_ms := 0, flush := true, columns := {columns})").fetchall()
    events, late, dead = rows[-1][1], rows[-1][3], rows[-1][4]
else:
    con.execute(f"CREATE TABLE q AS {sql}")
    events, late, dead = None, 0, 0
wall = time.time() - t0
rows, d = con.execute(f"SELECT {digest} FROM q").fetchone()
print(json.dumps({"events": events, "late": late, "dead": dead, "wall_s": wall, "rows": rows, "digest": str(d),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def one(q, which, pattern, db):
    sql = q["job"] if which == "job" else q["batch"].format(pattern=pattern)
    out = subprocess.run([sys.executable, "-c", CHILD, EXT, pattern, which, db, sql, COLUMNS, TIME_FIELDS, q["digest"]],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    quick = "--quick" in sys.argv[1:]
    events = 200_000 if quick else 1_000_000
    pattern = f"{bench_nexmark.bids(events, 'roundrobin', kind='all')}/*.ndjson"
    db = os.path.join(benchlib.OUT, "nexmark_joins.duckdb")
    rows = ["| query | the job, events/s (median) | (best) | DuckDB's batch query, events/s (median) | (best) | "
            "ratio (median) | rows | peak RSS MB, job / batch |",
            "|---|---|---|---|---|---|---|---|"]
    for q in QUERIES:
        runs = {"job": [], "batch": []}
        for _ in range(1 if quick else 5):
            for which in ("job", "batch"):
                runs[which].append(one(q, which, pattern, db))
        job, batch = runs["job"], runs["batch"]
        assert all(r["late"] == 0 and r["dead"] == 0 for r in job), f"{q['name']}: no event is late or dead"
        assert all(r["events"] == events for r in job), f"{q['name']}: every event read"
        assert all(r["digest"] == batch[0]["digest"] and r["rows"] == batch[0]["rows"] for r in job + batch), \
            f"{q['name']}: the job's rows differ from DuckDB's batch query"
        med = {w: statistics.median(events / r["wall_s"] for r in rs) for w, rs in runs.items()}
        best = {w: max(events / r["wall_s"] for r in rs) for w, rs in runs.items()}
        rss = {w: max(r["rss_mb"] for r in rs) for w, rs in runs.items()}
        rows.append(f"| {q['title']} | {med['job']:,.0f} | {best['job']:,.0f} | {med['batch']:,.0f} | {best['batch']:,.0f} | "
                    f"**{med['job'] / med['batch']:.2f}×** | {job[0]['rows']:,} | {rss['job']:.0f} / {rss['batch']:.0f} |")
    rows.append("\nThe first row is the floor under every query: reading and decoding the events (the files hold "
                "about 270 bytes an event, most of them text no query reads).")
    rows.append(f"\n{events:,} Nexmark events (persons, auctions and bids), {1 if quick else 5} runs each, alternating; "
                "the job's rows equal the batch query's; goal ≥ 0.8× the batch query.")
    table = "\n".join(rows)
    print(table)
    if not quick:
        from docs_section import write_section
        write_section("docs/benchmarks.md", "nexmark joins", "make bench (scripts/bench_nexmark_joins.py)", table)


if __name__ == "__main__":
    main()
