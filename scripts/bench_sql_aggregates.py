#!/usr/bin/env python3
"""`make bench` (any DuckDB aggregate over typed columns): issue 39's goals.

- Speed: 5M orders (the seed's shape: 50 keys, an event per millisecond, 4 files), 1 s windows:
  `median(value)` and `count(DISTINCT customer)` computed by DuckDB over each window's staged
  events, against the built-in job (count, sum, min, max of the value, the engine's own). Fresh
  processes, alternating, the best of two each.
- Bounded: each job over a tenth of the events and over all of them (10x the events, 10x the
  event time): the process's peak RSS, and the DuckDB job's staged events at any moment (sampled
  every 20 ms from a second connection while the run goes). The windows table (and its primary
  key's index) grows with the windows written, in both jobs alike.

Prints a table and writes it into docs/benchmarks.md (section 'duckdb aggregates') unless --quick.

usage: bench_sql_aggregates.py [--quick]
"""
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchlib  # noqa: E402
from docs_section import write_section  # noqa: E402

COLUMNS = "{'payload.value AS value': 'DOUBLE', 'customer.id AS customer': 'VARCHAR'}"
# The same job declaring every field of the orders as a user declares read_json's columns: the
# aggregates read two of the seven.
COLUMNS_ALL = ("{'payload.value AS value': 'DOUBLE', 'customer.id AS customer': 'VARCHAR', 'region': 'VARCHAR', "
               "'item.sku AS sku': 'VARCHAR', 'amount': 'DOUBLE', 'status': 'VARCHAR', 'coupon': 'VARCHAR'}")
DUCK_AGGS = "['count(*) AS count', 'median(value) AS median_value', 'count(DISTINCT customer) AS customers']"


def staged_child(db, topic, named):
    """A run of the job in this process while another connection counts its staged events."""
    import duckdb

    con = duckdb.connect(db, config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{benchlib.EXT}'")
    args = "".join(f", {k} := {v}" for k, v in named.items())
    done = threading.Event()
    most = [0 if named else None]

    def poll():
        cur = con.cursor()
        while not done.is_set() and most[0] is not None:
            try:
                most[0] = max(most[0], cur.execute("SELECT count(*) FROM streaming_etl_staged_windows").fetchone()[0])
            except duckdb.Error:
                pass  # not created yet
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()
    t0 = time.perf_counter()
    rows = con.execute(f"SELECT events_consumed, windows_emitted FROM streaming_etl_run('{topic}', 1000, 200{args})").fetchall()
    wall = time.perf_counter() - t0
    done.set()
    t.join()
    print(json.dumps({"events": rows[-1][0], "windows": rows[-1][1], "wall_s": wall, "max_staged": most[0],
                      "peak_rss_mb": benchlib.peak_rss_mb()}))


def speed(events):
    topic = f"file:{benchlib.orders_data(events)}/*.ndjson"
    jobs = [("built-in: count, sum, min, max (the engine's)", {}),
            ("DuckDB: median(value), count(DISTINCT customer)", {"columns": COLUMNS, "aggregates": DUCK_AGGS}),
            ("the same, declaring 7 columns (5 read by no aggregate: converted, not staged)",
             {"columns": COLUMNS_ALL, "aggregates": DUCK_AGGS})]
    every = {}
    best = benchlib.best_runs("sqlaggs", topic, jobs, 1000, 200, rounds=5, every=every)

    def rate(run):
        return run["stats"]["events_consumed"] / run["wall_s"]

    base = rate(best[jobs[0][0]])
    base_median = statistics.median(rate(r) for r in every[jobs[0][0]])
    out = []
    for name, _ in jobs:
        run = best[name]
        median = statistics.median(rate(r) for r in every[name])
        out.append({"job": name, "events": run["stats"]["events_consumed"], "events_per_sec": round(rate(run)),
                    "ratio": round(rate(run) / base, 3), "median_events_per_sec": round(median),
                    "median_ratio": round(median / base_median, 3), "cpu_s": round(run["cpu_s"], 2),
                    "window_rows": run["window_rows"]})
        print(json.dumps(out[-1]), flush=True)
    return out


def bounded(events):
    import subprocess
    out = []
    for job, named in (("built-in", {}), ("DuckDB", {"columns": COLUMNS, "aggregates": DUCK_AGGS})):
        for n in (events // 10, events):
            topic = f"file:{benchlib.orders_data(n)}/*.ndjson"
            db = benchlib.fresh_db("sqlaggs-staged")
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--staged-child", db, topic, json.dumps(named)],
                               capture_output=True, text=True, cwd=ROOT)
            if p.returncode != 0:
                raise RuntimeError(p.stderr)
            r = {"job": job, **json.loads(p.stdout.strip().splitlines()[-1])}
            out.append(r)
            print(json.dumps(r), flush=True)
    return out


def main():
    if sys.argv[1:2] == ["--staged-child"]:
        db, topic, named = sys.argv[2:5]
        staged_child(db, topic, json.loads(named))
        return
    quick = "--quick" in sys.argv
    os.makedirs(benchlib.OUT, exist_ok=True)
    events = 500_000 if quick else 5_000_000
    jobs = speed(events)
    sizes = bounded(events)
    lines = ["| job (5M orders, 4 files, 50 keys, 1 s windows) | events/s (median of 5) | vs built-in (median) | "
             "events/s (best) | vs built-in (best) | CPU s | window rows |",
             "|---|---|---|---|---|---|---|"]
    for r in jobs:
        lines.append(f"| {r['job']} | {r['median_events_per_sec']:,} | {r['median_ratio']} | {r['events_per_sec']:,} | "
                     f"{r['ratio']} | {r['cpu_s']} | {r['window_rows']:,} |")
    lines += ["", "| job | events | event time | wall s | peak RSS MB | staged events at most |",
              "|---|---|---|---|---|---|"]
    for r in sizes:
        staged = "-" if r["max_staged"] is None else f"{r['max_staged']:,}"
        lines.append(f"| {r['job']} | {r['events']:,} | {r['events'] // 1000:,} s | {r['wall_s']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {staged} |")
    table = "\n".join(lines)
    print(table)
    if not quick:
        write_section("docs/benchmarks.md", "duckdb aggregates", "make bench (scripts/bench_sql_aggregates.py)", table)


if __name__ == "__main__":
    main()
