#!/usr/bin/env python3
"""What the benchmarks share (scripts/bench.py and the bench_*.py beside it): where things are,
a scenario's data (generated once into bench-out/data), fresh databases, and measured runs, each
in a fresh process running this file (`--child-run`: a streaming_etl_run job; `--child-batch`:
DuckDB's own GROUP BY over the same files), which prints its measurements as one JSON line.

usage (by spawn_measured): benchlib.py --child-run DB TOPIC NAMED_JSON [WINDOW LATENESS]
                           benchlib.py --child-batch DB PATTERN EXPLICIT [WINDOW]
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

EXT = os.environ.get("STREAMING_ETL_EXTENSION") or os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension")
OUT = os.path.join(ROOT, "bench-out")
WINDOW, LATENESS = 1000, 200


def peak_rss_mb():
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it starts afresh at exec,
    so the benchmark parent's own memory does not leak into the children's figures)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds():
    """CPU time of this process so far (every thread: user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child_run(db, topic, named, window=WINDOW, lateness=LATENESS):
    """Runs one job in this (fresh) process and prints its measurements as JSON."""
    import duckdb

    con = duckdb.connect(db, config={"allow_unsigned_extensions": "true"})
    if os.environ.get("BENCH_MEMORY_LIMIT"):
        con.execute(f"SET memory_limit = '{os.environ['BENCH_MEMORY_LIMIT']}'")
    if os.environ.get("BENCH_THREADS"):
        con.execute(f"SET threads = {int(os.environ['BENCH_THREADS'])}")
    con.execute(f"LOAD '{EXT}'")
    args = "".join(f", {k} := {v}" for k, v in named.items())
    if os.environ.get("BENCH_TABLES_EXIST"):
        # A later run of a job: its tables were created by an earlier statement (here a run of
        # another job over an empty file), so DuckDB can checkpoint while this run writes.
        empty = os.path.join(OUT, "empty", "empty.ndjson")
        os.makedirs(os.path.dirname(empty), exist_ok=True)
        open(empty, "w").close()
        con.execute(f"SELECT * FROM streaming_etl_run('file:{empty}', {window}, {lateness}{args}, job := 'create-tables')").fetchall()
    before_mb = peak_rss_mb()
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    rows = con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {window}, {lateness}{args})").fetchall()
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    # The run's peak, before the checks below read the tables back (a scan of every late event
    # loads all of them into DuckDB's buffer pool and would count as the run's memory).
    run_peak_mb = peak_rss_mb()
    cols = ["job", "events_consumed", "windows_emitted", "late_events", "dead_letters", "watermark_ms",
            "elapsed_ms", "events_per_sec", "open_windows", "partitions", "cycles", "status"]
    last = dict(zip(cols, rows[-1]))
    false_late = con.execute("""SELECT count(*) FROM late_events WHERE payload_json NOT LIKE '%"late":1%'""").fetchone()[0]
    out_rows = con.execute("SELECT count(*) FROM windows").fetchone()[0]
    max_event = con.execute("SELECT max(max_event_time_ms) FROM streaming_etl_checkpoint()").fetchone()[0]
    # Whether two runs wrote the same windows (every column of every row).
    checksum = con.execute("SELECT count(*), sum(hash(w)) FROM windows w").fetchall()[0]
    con.close()
    time.sleep(0.1)  # let the extension release the database so its file is complete
    size = sum(os.path.getsize(p) for p in (db, db + ".wal") if os.path.exists(p))
    print(json.dumps({"stats": last, "wall_s": elapsed, "cpu_s": cpu, "false_late": false_late, "max_event_ms": max_event, "window_rows": out_rows,
                      "windows_checksum": [str(x) for x in checksum],
                      "db_size_kb": size // 1024, "rss_before_run_mb": before_mb, "peak_rss_mb": run_peak_mb}))


def child_batch(db, pattern, explicit, window=WINDOW):
    """DuckDB's own batch equivalent: read the files, GROUP BY window and key, into a table."""
    import duckdb

    window = int(window)
    con = duckdb.connect(db)
    if os.environ.get("BENCH_MEMORY_LIMIT"):
        con.execute(f"SET memory_limit = '{os.environ['BENCH_MEMORY_LIMIT']}'")
    if os.environ.get("BENCH_THREADS"):
        con.execute(f"SET threads = {int(os.environ['BENCH_THREADS'])}")
    source = (f"read_ndjson('{pattern}', columns = {{'key': 'VARCHAR', 'event_time_ms': 'BIGINT', "
              f"'payload': 'STRUCT(value DOUBLE)'}})" if explicit else f"read_ndjson('{pattern}')")
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    n = con.execute(f"""CREATE TABLE windows AS
        SELECT (event_time_ms // {window}) * {window} AS window_start_ms, key, count(*) AS count,
               sum(payload.value) AS sum_value, min(payload.value) AS min_value, max(payload.value) AS max_value
        FROM {source} GROUP BY ALL""").fetchone()
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    run_peak_mb = peak_rss_mb()  # as for our runs: the query's peak, before the check below
    events = con.execute("SELECT sum(count) FROM windows").fetchone()[0]
    print(json.dumps({"elapsed_s": elapsed, "cpu_s": cpu, "events": int(events), "rows": n[0] if n else None,
                      "peak_rss_mb": run_peak_mb}))


def spawn_measured(args, env=None):
    """Runs this script as a child; returns (its JSON output, its peak RSS in MB)."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, **(env or {})))
    if p.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed: {p.stderr}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out, out["peak_rss_mb"]


def best_runs(name, topic, jobs, window=WINDOW, lateness=LATENESS, rounds=2, every=None):
    """Each job (name, named arguments) run `rounds` times in fresh processes, alternating, over
    `topic` with `flush`; the fastest run of each, by name (and every run of each into `every`)."""
    best = {}
    for _ in range(rounds):
        for job, named in jobs:
            db = fresh_db(name)
            run, _ = spawn_measured(["--child-run", db, topic, json.dumps({**named, "flush": "true"}), str(window),
                                     str(lateness)])
            if every is not None:
                every.setdefault(job, []).append(run)
            if job not in best or run["wall_s"] < best[job]["wall_s"]:
                best[job] = run
    return best


def generate(name, events, partitions=4, skew_ms=0, skew_partition=-1, late_pct=5, keys=50, window_ms=WINDOW):
    import duckdb
    from datagen import generate_sql

    d = os.path.join(OUT, "data", f"{name}-{events}")
    if os.path.exists(os.path.join(d, "done")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    generate_sql(duckdb.connect(), d, events, partitions=partitions, keys=keys, late_pct=late_pct,
                 skew_ms=skew_ms, skew_partition=skew_partition, window_ms=window_ms)
    open(os.path.join(d, "done"), "w").close()
    return d


def orders_data(events):
    import duckdb
    from datagen import generate_orders

    d = os.path.join(OUT, "data", f"orders-{events}")
    if not os.path.exists(os.path.join(d, "done")):
        shutil.rmtree(d, ignore_errors=True)
        generate_orders(duckdb.connect(), d, events, partitions=4)
        open(os.path.join(d, "done"), "w").close()
    return d


def fresh_db(name):
    db = os.path.join(OUT, f"{name}.duckdb")
    for p in (db, db + ".wal", db + ".streaming_etl.sqlite"):
        if os.path.exists(p):
            os.remove(p)
    return db


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-run":
        child_run(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), *sys.argv[5:7])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-batch":
        child_batch(sys.argv[2], sys.argv[3], sys.argv[4] == "1", *sys.argv[5:6])
    else:
        sys.exit(__doc__)
