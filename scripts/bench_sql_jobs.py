#!/usr/bin/env python3
"""`make bench` (jobs written as SQL): issue 46's goals, on 1M order events in 4 files, 5% of them
2-5 s late, a `customers` table of 500 rows.

- Same speed: the default job written as SQL (key, count, sum/min/max of the value, TUMBLE 1 s),
  which runs on the engine's own path, against the parameter job: the same rows, events/s.
- Enrichment: TUMBLE 1 s, a WHERE that drops 10%, an inner join with `customers`, count,
  sum(DECIMAL), median and count(DISTINCT) grouped by the joined region, against the parameter job.
- Transform: WHERE, the join and five columns, appended, against DuckDB's own
  `CREATE TABLE ... AS SELECT ... FROM read_ndjson(...) JOIN customers ... WHERE ...`.
- Memory: the enrichment job over 1M and 10M events (10x the event time): peak RSS, the job
  prepared before it runs, so that DuckDB checkpoints what it writes as it goes (a plain first
  run keeps its tables' new rows in memory until it ends: docs/semantics.md).

Fresh processes, alternating, the best of five each (and the median run's ratios). Prints a table and writes it into
docs/benchmarks.md (section 'sql jobs') unless --quick.

usage: bench_sql_jobs.py [--quick]
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchlib  # noqa: E402
from docs_section import write_section  # noqa: E402

CUSTOMERS = "CREATE TABLE customers AS SELECT range AS id, 'r' || (range % 7) AS region, 'name ' || range AS name FROM range(500)"

SAME = ("INSERT INTO w SELECT key, window_start, window_end, count(*) AS count, sum(value) AS sum_value, "
        "min(value) AS min_value, max(value) AS max_value FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) GROUP BY ALL")
SAME_COLUMNS = "{'key': 'VARCHAR', 'payload.value AS value': 'DOUBLE'}"

ENRICH = ("INSERT INTO by_region SELECT c.region, window_start, count(*) AS orders, sum(o.amount) AS revenue, "
          "median(o.amount) AS med, count(DISTINCT o.customer_id) AS customers "
          "FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o JOIN customers AS c ON c.id = o.customer_id "
          "WHERE o.status = 'paid' GROUP BY ALL")
TRANSFORM = ("INSERT INTO paid SELECT o.customer_id, o.amount, c.region, o.sku, o.event_time "
             "FROM stream AS o JOIN customers AS c ON c.id = o.customer_id WHERE o.status = 'paid'")
ORDER_COLUMNS = "{'customer_id': 'BIGINT', 'amount': 'DECIMAL(18,2)', 'status': 'VARCHAR', 'sku': 'VARCHAR'}"

BATCH = ("CREATE TABLE paid AS SELECT o.customer_id, o.amount, c.region, o.sku, make_timestamptz(o.event_time_ms * 1000) AS event_time "
         "FROM read_ndjson('{files}', columns := {{'customer_id': 'BIGINT', 'amount': 'DECIMAL(18,2)', 'status': 'VARCHAR', "
         "'sku': 'VARCHAR', 'event_time_ms': 'BIGINT'}}) AS o JOIN customers AS c ON c.id = o.customer_id WHERE o.status = 'paid'")


def data(events):
    """`events` orders over 4 files (message i in file i % 4, event time i ms, 5% of them 2-5 s
    late), 500 customers, 10% of the orders cancelled."""
    import duckdb
    d = os.path.join(benchlib.OUT, "data", f"sqljobs-{events}")
    if os.path.exists(os.path.join(d, "done")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    con = duckdb.connect()
    for p in range(4):
        con.execute(f"""COPY (
          SELECT '{{"key":"k' || (i % 50) || '","event_time_ms":' ||
                 (1700000000000 + i - CASE WHEN hash(i, 'late') % 100 < 5 THEN 2000 + hash(i, 'by') % 3000 ELSE 0 END) ||
                 ',"customer_id":' || (hash(i, 'c') % 500) || ',"amount":' || round((hash(i, 'a') % 10001) / 100.0, 2) ||
                 ',"status":"' || CASE WHEN hash(i, 's') % 10 = 0 THEN 'cancelled' ELSE 'paid' END || '"' ||
                 ',"sku":"s' || (i % 20) || '","payload":{{"value":' || round((hash(i, 'v') % 10001) / 100.0, 2) || '}}}}' AS line
          FROM range({p}, {events}, 4) t(i) ORDER BY i
        ) TO '{d}/p{p}.ndjson' (FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\\x01')""")
    open(os.path.join(d, "done"), "w").close()
    return d


def child(db, kind, topic, text, columns):
    """One run in this (fresh) process: `kind` is param, sql or batch."""
    import duckdb
    con = duckdb.connect(db, config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{benchlib.EXT}'")
    con.execute(CUSTOMERS)
    most = [None]
    done = threading.Event()
    if kind == "sql-prepared":
        def poll():
            # The staged rows at any moment (a second connection counts them while the run goes).
            cur = con.cursor()
            while not done.is_set():
                try:
                    n = cur.execute("SELECT count(*) FROM streaming_etl_staged_by_region").fetchone()[0]
                    most[0] = max(most[0] or 0, n)
                except duckdb.Error:
                    pass  # not created yet
                time.sleep(0.02)
        threading.Thread(target=poll, daemon=True).start()
    cpu0, t0 = benchlib.cpu_seconds(), time.perf_counter()
    if kind == "param":
        rows = con.execute(f"SELECT events_consumed FROM streaming_etl_run('{topic}', 1000, 200, flush := true)").fetchall()
        events, table = rows[-1][0], "windows"
    elif kind == "batch":
        con.execute(text)
        events, table = None, "paid"
    else:
        sql = text.replace("'", "''")
        call = (f"SELECT events_consumed FROM streaming_etl_sql('{topic}', '{sql}', lateness_ms := 200, "
                f"flush := true, columns := {columns})")
        if kind == "sql-prepared":
            # Bound apart from its run, the job's tables are made before the run's transaction
            # begins, so DuckDB checkpoints what the run writes (docs/semantics.md).
            con.execute(f"PREPARE job AS {call}")
            rows = con.execute("EXECUTE job").fetchall()
        else:
            rows = con.execute(call).fetchall()
        events, table = rows[-1][0], text.split()[2]
    wall, cpu = time.perf_counter() - t0, benchlib.cpu_seconds() - cpu0
    peak = benchlib.peak_rss_mb()
    done.set()
    n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    same = None
    if table == "w":
        # The rows of the parameter job, as the statement writes them.
        same = con.execute("SELECT count(*), sum(hash(key, epoch_ms(window_start), count, sum_value, min_value, max_value)) FROM w").fetchall()[0]
    elif table == "windows":
        same = con.execute("SELECT count(*), sum(hash(key, window_start_ms, count, sum_value, min_value, max_value)) FROM windows").fetchall()[0]
    print(json.dumps({"events": events, "wall_s": wall, "cpu_s": cpu, "rows": n, "peak_rss_mb": peak, "staged_at_most": most[0],
                      "checksum": None if same is None else [str(x) for x in same]}))


def measured(name, kind, topic, text="", columns=""):
    db = benchlib.fresh_db(f"sqljobs-{name}")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", db, kind, topic, text, columns],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{name}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def best(runs, rounds=2):
    """Each (name, kind, topic, text, columns) run `rounds` times, alternating; the fastest, with
    every run's wall time (`walls`)."""
    out, walls = {}, {}
    for _ in range(rounds):
        for name, *args in runs:
            r = measured(name, *args)
            walls.setdefault(name, []).append(r["wall_s"])
            if name not in out or r["wall_s"] < out[name]["wall_s"]:
                out[name] = r
    for name, w in walls.items():
        out[name]["walls"] = sorted(w)
    return out


def main():
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:7])
        return
    quick = "--quick" in sys.argv
    os.makedirs(benchlib.OUT, exist_ok=True)
    n = 200_000 if quick else 1_000_000
    d = data(n)
    topic, files = f"file:{d}/*.ndjson", f"{d}/*.ndjson"
    runs = best([("parameter job", "param", topic),
                 ("same job as SQL", "sql", topic, SAME, SAME_COLUMNS),
                 ("enrichment", "sql", topic, ENRICH, ORDER_COLUMNS),
                 ("transform", "sql", topic, TRANSFORM, ORDER_COLUMNS),
                 ("DuckDB batch CTAS", "batch", topic, BATCH.format(files=files))], rounds=2 if quick else 5)
    base = runs["parameter job"]
    rate = lambda r: n / r["wall_s"]  # noqa: E731
    rows = []
    for name, vs in (("parameter job", None), ("same job as SQL", "parameter job"), ("enrichment", "parameter job"),
                     ("transform", "DuckDB batch CTAS"), ("DuckDB batch CTAS", None)):
        r = runs[name]
        ratio = round(rate(r) / rate(runs[vs]), 2) if vs else None
        rows.append({"job": name, "events_per_sec": round(rate(r)), "vs": vs, "ratio": ratio, "cpu_s": round(r["cpu_s"], 2),
                     "rows": r["rows"], "peak_rss_mb": round(r["peak_rss_mb"])})
        print(json.dumps(rows[-1]), flush=True)
    median = lambda r: r["walls"][len(r["walls"]) // 2]  # noqa: E731
    medians = {name: round(median(runs[vs]) / median(runs[name]), 2)
               for name, vs in (("same job as SQL", "parameter job"), ("enrichment", "parameter job"),
                                ("transform", "DuckDB batch CTAS"))}
    print(json.dumps({"median_ratios": medians}), flush=True)
    same_rows = runs["same job as SQL"]["checksum"] == base["checksum"]
    print(json.dumps({"same_rows_as_the_parameter_job": same_rows}), flush=True)
    memory = []
    for m in ((n // 10, n) if quick else (n, 10 * n)):
        dm = data(m)
        r = measured(f"mem{m}", "sql-prepared", f"file:{dm}/*.ndjson", ENRICH, ORDER_COLUMNS)
        memory.append({"events": m, "wall_s": round(r["wall_s"], 2), "peak_rss_mb": round(r["peak_rss_mb"]),
                       "staged_at_most": r["staged_at_most"]})
        print(json.dumps(memory[-1]), flush=True)
    lines = [f"| job ({n:,} orders, 4 files, 5% late) | events/s | against | ratio | CPU s | rows | peak RSS MB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['job']} | {r['events_per_sec']:,} | {r['vs'] or '-'} | {r['ratio'] or '-'} | {r['cpu_s']} | "
                     f"{r['rows']:,} | {r['peak_rss_mb']} |")
    rounds = len(base["walls"])
    lines += ["", f"Ratios of the median run of {rounds} (events/s): "
              + ", ".join(f"{k} {v}" for k, v in medians.items()) + ".",
              "", f"The same job as SQL writes the parameter job's rows: {'yes' if same_rows else 'NO'}.", "",
              "| enrichment job (PREPARE, EXECUTE) over | wall s | peak RSS MB | staged rows at most |", "|---|---|---|---|"]
    for m in memory:
        lines.append(f"| {m['events']:,} events | {m['wall_s']} | {m['peak_rss_mb']} | {m['staged_at_most']:,} |")
    table = "\n".join(lines)
    print(table)
    if not quick:
        write_section("docs/benchmarks.md", "sql jobs", "make bench (scripts/bench_sql_jobs.py)", table)


if __name__ == "__main__":
    main()
