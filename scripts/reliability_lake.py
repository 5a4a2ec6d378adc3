#!/usr/bin/env python3
"""The DuckLake scenarios of `make reliability` (scripts/reliability.py runs this script with
DuckDB 1.4.4's Python, .venv/lts/bin/python: the DuckLake and postgres extensions exist for
1.4.4 only, and the extension is its 1.4 build, build/release/v1.4/).

- kill -9 loops: a job writing into a DuckLake whose catalog is in PostgreSQL (a real server of
  its own, test/python/lake.py), in write_mode 'append' and in 'upsert', SIGKILLed at random
  instants after it has loaded and attached, again and again, then resumed to the end.
- PostgreSQL SIGKILLed (the postmaster; its backends follow) and restarted mid-run, several
  times, in both write modes: each run either rides it out or fails with a clear error (the
  table and the lost connection named); the next run resumes.

Each is compared with one straight run of the same job into a DuckDB file: the windows,
late_events and dead_letters rows as multisets (late and dead rows without their wall-clock
columns), plus the count of messages: lost (in the straight run, missing here) and doubled
(here more often than there), both counted in messages.

usage: reliability_lake.py short|long [scenario ...]   prints one JSON row per scenario
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXT = os.environ.get("STREAMING_ETL_LTS_EXTENSION") or os.path.join(ROOT, "build", "release", "v1.4", "streaming_etl.duckdb_extension")
os.environ["STREAMING_ETL_EXTENSION"] = EXT  # for test/python/conftest.py, imported by reliability
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

import duckdb  # noqa: E402

import lake  # noqa: E402
from datagen import generate_sql  # noqa: E402
from reliability import integrity, row, workdir  # noqa: E402

CHILD = os.path.join(ROOT, "test", "python", "run_job.py")
WINDOW, LATENESS = 1000, 200
# A DuckLake commit takes tens of milliseconds: cycles of 20 ms give many commits to land in.
CYCLE_MS = 20


def tables(con, prefix=""):
    """The three output tables as multisets, without the columns that hold wall-clock times."""
    w = Counter(con.execute(f"SELECT window_start_ms, window_end_ms, key, count, round(sum_value, 6), min_value, max_value "
                            f"FROM {prefix}windows").fetchall())
    late = Counter(con.execute(f'SELECT key, event_time_ms, payload_json, window_start_ms, window_end_ms, topic, partition, "offset" '
                               f"FROM {prefix}late_events").fetchall())
    dead = Counter(con.execute(f'SELECT topic, partition, "offset", raw, error FROM {prefix}dead_letters').fetchall())
    return w, late, dead


def compare(got, want, messages):
    """(lost, doubled, exact): lost and doubled in messages (a window row's count, a late or dead
    row's message); exact: the same multisets and every message accounted for once."""
    def by_window(w):
        c = Counter()
        for (start, _end, key, n, *_), times in w.items():
            c[(key, start)] += n * times
        return c

    def by_message(rows, at):
        return Counter({r[at:at + 2]: n for r, n in rows.items()})

    pairs = [(by_window(got[0]), by_window(want[0])), (by_message(got[1], 6), by_message(want[1], 6)),
             (by_message(got[2], 1), by_message(want[2], 1))]
    lost = sum(sum((w - g).values()) for g, w in pairs)
    doubled = sum(sum((g - w).values()) for g, w in pairs)
    total = sum(pairs[0][0].values()) + sum(pairs[1][0].values()) + sum(pairs[2][0].values())
    return lost, doubled, got == want and total == messages


def named(mode, ckpt, interval=CYCLE_MS):
    return ["job='lake'", "windows_table='lake.windows'", f"write_mode='{mode}'", f"checkpoint='{ckpt}'",
            f"checkpoint_interval_ms={interval}"]


def fixture(d, messages):
    generate_sql(duckdb.connect(), os.path.join(d, "data"), messages, partitions=4, late_pct=5, bad_permille=2)
    topic = f"file:{d}/data/*.ndjson"
    con = lake.connect(os.path.join(d, "straight.duckdb"), EXT)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, flush := true, "
                f"checkpoint := '{d}/straight.ckpt')").fetchall()
    ref = tables(con)
    con.close()
    return topic, ref


def start_job(db, topic, args, env):
    p = subprocess.Popen([sys.executable, CHILD, db, topic, str(WINDOW), str(LATENESS), *args, "--announce"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.readline()  # "loaded": the extension is loaded and the lake attached
    return p


def finish(db, topic, args, catalog, data_path):
    """The last run, in this process: to the end, flushing the open windows; returns the tables."""
    con = lake.connect(db, EXT, catalog, data_path)
    sql = "".join(f", {a.split('=', 1)[0]} := {a.split('=', 1)[1]}" for a in args)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, flush := true{sql})").fetchall()
    got = tables(con, "lake.")
    con.close()
    return got


def kill_lake(scale):
    """SIGKILL at random instants of a job writing into a DuckLake on PostgreSQL, append and upsert."""
    messages, kills_wanted = (100_000, 4) if scale == "short" else (500_000, 15)
    d = workdir("lakekill")
    pg = None
    try:
        topic, ref = fixture(d, messages)
        pg = lake.Postgres(os.path.join(d, "pg"))
        rng = random.Random(11)
        kills = rounds = 0
        ckpt = ""
        for mode in ("append", "upsert"):
            landed = 0
            while landed < kills_wanted:
                catalog, data_path = pg.new_database(), os.path.join(d, f"lake-{mode}-{rounds}")
                db, ckpt = os.path.join(d, f"{mode}-{rounds}.duckdb"), os.path.join(d, f"{mode}-{rounds}.ckpt")
                args = named(mode, ckpt)
                env = dict(os.environ, **lake.child_env(EXT, catalog, data_path))
                for _ in range(kills_wanted * 4 + 20):
                    p = start_job(db, topic, args, env)
                    time.sleep(rng.uniform(0, 1.2))
                    if p.poll() is None:
                        p.send_signal(signal.SIGKILL)
                        landed += 1
                    out, err = p.communicate()
                    assert p.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
                    if p.returncode == 0 and b"caught_up" in out:
                        break
                lost, doubled, exact = compare(finish(db, topic, args, catalog, data_path), ref, messages)
                assert exact, (mode, rounds, lost, doubled)
                rounds += 1
            kills += landed
        return row("SIGKILL at random instants, DuckLake on PostgreSQL (append and upsert)", kills, messages, 0, 0, True,
                   ckpt, f"{rounds} job(s) of {messages} messages; straight run into a DuckDB file as reference")
    finally:
        if pg:
            pg.stop()
        shutil.rmtree(d, ignore_errors=True)


def error_of(err):
    """The exception a child's run ended with (its first line and what follows), or ''."""
    at = err.rfind("_duckdb.")
    return err[at:].strip() if at >= 0 else err.strip()[-1500:]


def clear_error(err):
    """The kind of the run's error, if it names the lake (its table, or DuckLake) and the lost
    server or the Postgres statement that failed; else None."""
    msg = error_of(err)
    low = msg.lower()
    if not msg or "lake" not in low:
        return None
    if "server closed the connection" in low:
        return "server closed the connection unexpectedly"
    if any(s in low for s in ("connection", "terminat", "could not connect", "shutting down", "starting up", "recovery mode",
                              "no such file or directory")):
        return msg.splitlines()[0][-120:]
    if "failed to execute query" in low:
        # DuckDB 1.4.4's postgres extension: libpq's message for a statement on a dead
        # connection can be empty (seen: 'Failed to execute query "ROLLBACK": ').
        q = msg[low.find("failed to execute query"):].splitlines()[0]
        return q if q.rstrip()[-1:] != ":" else q.rstrip() + " (no reason given)"
    return None


def postgres_kill(scale):
    """PostgreSQL SIGKILLed and restarted mid-run: rides out or fails clearly; the next run resumes."""
    messages, faults_wanted = (200_000, 2) if scale == "short" else (1_000_000, 5)
    d = workdir("pgkill")
    pg = None
    try:
        topic, ref = fixture(d, messages)
        pg = lake.Postgres(os.path.join(d, "pg"))
        rng = random.Random(12)
        faults = rode_out = failed = 0
        errors = Counter()
        ckpt = ""
        for mode in ("append", "upsert"):
            catalog, data_path = pg.new_database(), os.path.join(d, f"lake-{mode}")
            db, ckpt = os.path.join(d, f"{mode}.duckdb"), os.path.join(d, f"{mode}.ckpt")
            args = named(mode, ckpt)
            env = dict(os.environ, **lake.child_env(EXT, catalog, data_path))
            for _ in range(faults_wanted):
                p = start_job(db, topic, args, env)
                time.sleep(rng.uniform(0.2, 1.5))
                if p.poll() is not None:
                    break  # the job had finished
                pg.kill()
                faults += 1
                time.sleep(rng.uniform(0.0, 1.0))
                pg.start()
                try:
                    out, err = p.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    raise AssertionError(f"{mode}: the run hung after PostgreSQL was killed")
                out, err = out.decode(), err.decode()
                last = [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1:]
                # Judged by the statement's outcome, not the exit code: after losing its server,
                # DuckDB 1.4.4's postgres extension may abort as the process exits.
                if last and last[0]["status"] == "caught_up":
                    rode_out += 1
                else:
                    e = clear_error(err)
                    if not e:
                        with open(os.path.join(ROOT, "bench-out", "reliability-lake-unclear.txt"), "w") as f:
                            f.write(err)
                    assert e, f"{mode}: a run failed without a clear error (exit {p.returncode}): {error_of(err)[:1000]}"
                    errors[e] += 1
                    failed += 1
            got = finish(db, topic, args, catalog, data_path)
            lost, doubled, exact = compare(got, ref, messages)
            assert exact, (mode, lost, doubled)
        note = (f"{faults} kills of the postmaster, restarted after 0-1 s, append and upsert: {rode_out} run(s) rode it out, "
                f"{failed} failed with an error naming the table ("
                + "; ".join(f"{n}x {k}" for k, n in errors.most_common()) + "); every next run resumed")
        r = row("PostgreSQL (DuckLake catalog) SIGKILLed and restarted mid-run", faults, messages, 0, 0, True, ckpt, note)
        r["errors"] = dict(errors)
        return r
    finally:
        if pg:
            pg.stop()
        shutil.rmtree(d, ignore_errors=True)


SCENARIOS = [kill_lake, postgres_kill]


def main():
    scale = sys.argv[1] if len(sys.argv) > 1 else "long"
    wanted = sys.argv[2:]
    if not lake.HAVE_LAKE:
        raise SystemExit(f"DuckLake needs DuckDB 1.4.4 with duckdb-ext-ducklake (make configure); this is {sys.executable}")
    for scenario in SCENARIOS:
        if wanted and scenario.__name__ not in wanted:
            continue
        started = time.time()
        try:
            r = scenario(scale)
        except AssertionError as e:
            r = {"scenario": scenario.__name__, "faults": "-", "messages": "-", "lost": "?", "doubled": "?",
                 "exact": False, "integrity": "?", "note": f"FAILED: {str(e)[:300]}"}
        r["seconds"] = round(time.time() - started, 1)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
