#!/usr/bin/env python3
"""`make bench` (several statements over one read): issue 47's goals, on the order events of
bench_sql_jobs.py (1M in 4 files, 5% of them 2-5 s late, 500 customers).

Three statements: TUMBLE 1 s with a join (the enrichment of bench_sql_jobs.py), TUMBLE 2 s per
SKU, and a transform (WHERE, the join, five columns). Run as three jobs one after another, each
in a fresh process, and as one job of three statements: wall time and CPU seconds (the
processes' own, user and system), the best of three, alternating. The tables of both are compared
(each statement's rows are what it writes alone). Prints a table and writes it into
docs/benchmarks.md (section 'sql sets') unless --quick.

usage: bench_sql_sets.py [--quick]
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchlib  # noqa: E402
from bench_sql_jobs import CUSTOMERS, ENRICH, ORDER_COLUMNS, TRANSFORM, data  # noqa: E402
from docs_section import write_section  # noqa: E402

BY_SKU = ("INSERT INTO by_sku SELECT sku, window_start, count(*) AS orders, sum(amount) AS revenue "
          "FROM TUMBLE(stream, event_time, INTERVAL 2 SECOND) GROUP BY ALL")
STATEMENTS = [ENRICH, BY_SKU, TRANSFORM]
TABLES = ["by_region", "by_sku", "paid"]


def child(db, topic, text):
    """One job in this (fresh) process: its wall and CPU seconds, and a checksum of each table
    it wrote."""
    import duckdb
    con = duckdb.connect(db, config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{benchlib.EXT}'")
    con.execute(CUSTOMERS)
    sql = text.replace("'", "''")
    call = (f"SELECT events_consumed FROM streaming_etl_sql('{topic}', '{sql}', lateness_ms := 200, "
            f"flush := true, columns := {ORDER_COLUMNS})")
    cpu0, t0 = benchlib.cpu_seconds(), time.perf_counter()
    # Prepared apart from its run, as a scheduled job's statement is (docs/semantics.md).
    con.execute(f"PREPARE job AS {call}")
    events = con.execute("EXECUTE job").fetchall()[-1][0]
    wall, cpu = time.perf_counter() - t0, benchlib.cpu_seconds() - cpu0
    sums = {}
    for t in TABLES:
        if con.execute(f"SELECT count(*) FROM duckdb_tables() WHERE table_name = '{t}'").fetchone()[0]:
            n, h = con.execute(f"SELECT count(*), sum(hash(r)) FROM {t} AS r").fetchone()
            sums[t] = [n, str(h)]
    print(json.dumps({"events": events, "wall_s": wall, "cpu_s": cpu, "tables": sums,
                      "peak_rss_mb": benchlib.peak_rss_mb()}))


def measured(name, topic, text):
    db = benchlib.fresh_db(f"sqlsets-{name}")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", db, topic, text],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{name}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:5])
        return
    quick = "--quick" in sys.argv
    os.makedirs(benchlib.OUT, exist_ok=True)
    n = 200_000 if quick else 1_000_000
    topic = f"file:{data(n)}/*.ndjson"
    apart, together, each = None, None, None
    for _ in range(3):
        runs = [measured(f"alone{i}", topic, s) for i, s in enumerate(STATEMENTS)]
        three = {"wall_s": sum(r["wall_s"] for r in runs), "cpu_s": sum(r["cpu_s"] for r in runs),
                 "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                 "tables": {t: v for r in runs for t, v in r["tables"].items()}}
        one = measured("set", topic, ";\n".join(STATEMENTS))
        if apart is None or three["wall_s"] < apart["wall_s"]:
            apart, each = three, runs
        if together is None or one["wall_s"] < together["wall_s"]:
            together = one
    same = together["tables"] == apart["tables"]
    rows = [(f"{t} alone", r) for t, r in zip(TABLES, each)]
    rows += [("three jobs, one after another", apart), ("one job of three statements", together)]
    lines = [f"| {n:,} orders (4 files, 5% late) | wall s | CPU s | events/s | peak RSS MB |", "|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {round(n / r['wall_s']):,} | {round(r['peak_rss_mb'])} |")
    wall = together["wall_s"] / apart["wall_s"]
    cpu = together["cpu_s"] / apart["cpu_s"]
    lines += ["", f"One job of three statements against three jobs: wall {wall:.2f}x (goal 0.5x), CPU {cpu:.2f}x "
              f"(goal 0.6x). Each table equal to the one its statement writes alone: {'yes' if same else 'NO'}."]
    table = "\n".join(lines)
    print(json.dumps({"wall_ratio": round(wall, 3), "cpu_ratio": round(cpu, 3), "same_tables": same}))
    print(table)
    if not quick:
        write_section("docs/benchmarks.md", "sql sets", "make bench (scripts/bench_sql_sets.py)", table)


if __name__ == "__main__":
    main()
