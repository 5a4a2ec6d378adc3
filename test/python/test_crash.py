"""Crash safety: a DuckDB process running a job is SIGKILLed at random instants (and at the
narrow points a random kill rarely hits); the job is resumed; every input line must end up
counted exactly once (one window count, one late_events row or one dead_letters row), and the
tables must equal those of one straight run."""
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import HERE, connect, run_child
import duckdb

from datagen import generate_sql, scan

WINDOW, LATENESS = 1000, 200


def straight_run(tmp_path, pattern, name="straight"):
    db = tmp_path / f"{name}.duckdb"
    con = connect(db)
    rows = con.execute(
        f"SELECT * FROM streaming_etl_run('file:{pattern}', {WINDOW}, {LATENESS}, flush := true)").fetchall()
    assert rows[-1][-1] == "caught_up"
    return con


class Data:
    def __init__(self, directory, events, partitions, seed):
        self.paths = generate_sql(duckdb.connect(), directory, events, partitions=partitions,
                                  late_pct=5, bad_permille=2, seed=seed)
        self.pattern = f"{directory}/*.ndjson"
        self.events, self.bad_at = scan(self.paths)


def check_exact(con, ref, g):
    """Every message counted once, and the same tables as the straight run `ref`."""
    windows = con.execute("SELECT sum(count) FROM windows").fetchone()[0] or 0
    late = con.execute("SELECT count(*) FROM late_events").fetchone()[0]
    dead = con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    assert windows + late + dead == g.events, (windows, late, dead, g.events)
    assert set(con.execute('SELECT partition, "offset" FROM dead_letters').fetchall()) == g.bad_at
    w = sorted(con.execute("SELECT * FROM windows").fetchall())
    assert w == sorted(ref.execute("SELECT * FROM windows").fetchall())
    cols = 'key, event_time_ms, payload_json, window_start_ms, window_end_ms, watermark_ms, topic, partition, "offset"'
    assert sorted(con.execute(f"SELECT {cols} FROM late_events").fetchall()) == \
        sorted(ref.execute(f"SELECT {cols} FROM late_events").fetchall())


def integrity_ok(path):
    c = sqlite3.connect(path)
    try:
        return c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        c.close()


def child_cmd(db, pattern, *named):
    return [sys.executable, os.path.join(HERE, "run_job.py"), str(db), f"file:{pattern}",
            str(WINDOW), str(LATENESS), *named]


def test_sigkill_at_random_instants_loses_and_doubles_nothing(tmp_path):
    g = Data(tmp_path / "data", 2_000_000, partitions=4, seed=3)
    pattern = g.pattern
    ref = straight_run(tmp_path, pattern)
    db = tmp_path / "killed.duckdb"
    rng = random.Random(11)
    kills = 0
    for attempt in range(60):
        p = subprocess.Popen(child_cmd(db, pattern, "checkpoint_interval_ms=15"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.1, 0.5))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        out, err = p.communicate()
        assert p.returncode in (0, -signal.SIGKILL), err.decode()
        assert integrity_ok(str(db) + ".streaming_etl.sqlite")
        if p.returncode == 0 and b"caught_up" in out:
            break
    print(f"{kills} kills over {attempt + 1} runs")
    assert kills >= 5, f"only {kills} kills landed: make the data larger"
    con = connect(db)
    con.execute(f"SELECT * FROM streaming_etl_run('file:{pattern}', {WINDOW}, {LATENESS}, flush := true)").fetchall()
    check_exact(con, ref, g)


@pytest.mark.parametrize("point", [
    "checkpoint-before-commit:3",   # inside the SQLite transaction of the 3rd cycle
    "sink-before-commit:2",         # inside the DuckDB transaction of the 2nd cycle
    "after-sink-commit:2",          # DuckDB committed, the outbox not yet cleared
])
def test_kill_inside_the_narrow_windows(tmp_path, point):
    g = Data(tmp_path / "data", 60_000, partitions=3, seed=5)
    pattern = g.pattern
    ref = straight_run(tmp_path, pattern)
    db = tmp_path / "killed.duckdb"
    r = run_child(db, f"file:{pattern}", WINDOW, LATENESS, "checkpoint_interval_ms=1", "max_messages=40000",
                  env={"STREAMING_ETL_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    ckpt = str(db) + ".streaming_etl.sqlite"
    assert integrity_ok(ckpt)
    if point == "after-sink-commit:2":
        # The batch is in DuckDB and still in the outbox: the next run must not apply it twice.
        pending = sqlite3.connect(ckpt).execute("SELECT count(*) FROM outbox").fetchone()[0]
        assert pending == 1
    con = connect(db)
    con.execute(f"SELECT * FROM streaming_etl_run('file:{pattern}', {WINDOW}, {LATENESS}, flush := true)").fetchall()
    check_exact(con, ref, g)
    assert con.execute("SELECT sum(pending_batches) FROM streaming_etl_checkpoint()").fetchone()[0] == 0
