"""The extension inside its host database: it must not pin the database, its writes are its
own transactions, and one job cannot run twice at once."""
import os
import subprocess
import sys
import textwrap
import threading

import duckdb
import pytest

from conftest import EXT, connect, run_child
from datagen import generate_sql

BASIC = "file:test/data/basic/*.ndjson"


def test_closing_the_last_connection_releases_the_database(tmp_path):
    db = tmp_path / "pin.duckdb"
    # In a child process with a timeout: a pinned database makes the reopen spin forever.
    script = textwrap.dedent(f"""
        import duckdb, subprocess, sys, os
        cfg = {{'allow_unsigned_extensions': 'true'}}
        con = duckdb.connect({str(db)!r}, config=cfg)
        con.execute("LOAD '{EXT}'")
        con.execute("SELECT * FROM streaming_etl_run('{BASIC}', 1000, 200)").fetchall()
        con.close()
        # Another process can open the file at once (the extension lets go of the database
        # within its watcher's 20 ms; a loaded machine may take longer to run it) ...
        import time
        for attempt in range(50):
            other = subprocess.run([sys.executable, '-c',
                "import duckdb; print(duckdb.connect({str(db)!r}).execute('SELECT count(*) FROM windows').fetchall()[0][0])"],
                capture_output=True, text=True)
            if other.returncode == 0 or 'Could not set lock' not in other.stderr:
                break
            time.sleep(0.05)
        assert other.returncode == 0, other.stderr
        assert other.stdout.strip() == '5', other.stdout
        # ... and this process can reopen it, with another configuration too.
        con = duckdb.connect({str(db)!r})
        assert con.execute('SELECT count(*) FROM windows').fetchall()[0][0] == 5
        con.close()
        print('ok')
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=os.getcwd(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
    # The database was closed cleanly: checkpointed, no WAL left behind.
    assert not os.path.exists(str(db) + ".wal")


def test_loading_without_running_does_not_pin_either(tmp_path):
    db = tmp_path / "idle.duckdb"
    script = textwrap.dedent(f"""
        import duckdb, time
        cfg = {{'allow_unsigned_extensions': 'true'}}
        con = duckdb.connect({str(db)!r}, config=cfg)
        con.execute("LOAD '{EXT}'")
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
        con.close()
        # At once with the same configuration ...
        con = duckdb.connect({str(db)!r}, config=cfg)
        assert con.execute('SELECT x FROM t').fetchall()[0][0] == 1
        con.close()
        # ... and with another one, once the extension has let go (20 ms without a user
        # connection, then the watcher's next look).
        time.sleep(0.2)
        con = duckdb.connect({str(db)!r})
        print(con.execute('SELECT x FROM t').fetchall()[0][0])
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_a_callers_rollback_does_not_undo_the_run(tmp_path):
    con = connect(tmp_path / "tx.duckdb")
    con.execute("BEGIN")
    con.execute(f"SELECT * FROM streaming_etl_run('{BASIC}', 1000, 200)").fetchall()
    con.execute("ROLLBACK")
    assert con.execute("SELECT count(*) FROM windows").fetchall()[0][0] == 5
    # The checkpoint agrees: nothing is read twice.
    assert con.execute(f"SELECT events_consumed FROM streaming_etl_run('{BASIC}', 1000, 200)").fetchall()[0][0] == 0


def test_in_memory_database_keeps_an_in_memory_checkpoint():
    con = connect()
    assert con.execute(f"SELECT events_consumed FROM streaming_etl_run('{BASIC}', 1000, 200)").fetchall()[0][0] == 10
    assert con.execute(f"SELECT events_consumed FROM streaming_etl_run('{BASIC}', 1000, 200)").fetchall()[0][0] == 0
    rows = con.execute("SELECT partition, next_offset FROM streaming_etl_checkpoint() ORDER BY 1").fetchall()
    assert rows == [(0, 314), (1, 220)]
    # Another in-memory database starts from scratch.
    other = connect()
    assert other.execute(f"SELECT events_consumed FROM streaming_etl_run('{BASIC}', 1000, 200)").fetchall()[0][0] == 10


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    generate_sql(duckdb.connect(), d, 3_000_000, partitions=2)
    return f"file:{d}/*.ndjson"


def test_a_second_concurrent_run_of_a_job_fails_clearly(tmp_path, big):
    db = tmp_path / "a.duckdb"
    ckpt = tmp_path / "shared.ckpt"
    first = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "run_job.py"),
                              str(db), big, "1000", "200", f"checkpoint='{ckpt}'", "checkpoint_interval_ms=50"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until the first run holds the job (its first cycle is in the checkpoint).
        for _ in range(200):
            if ckpt.exists() and os.path.getsize(ckpt) > 0 and first.poll() is None:
                break
            threading.Event().wait(0.05)
        second = run_child(tmp_path / "b.duckdb", big, 1000, 200, f"checkpoint='{ckpt}'")
        assert second.returncode != 0
        assert f"job '{big}' is already running (checkpoint '{ckpt}')" in second.stderr
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert '"status": "caught_up"' in out.splitlines()[-1]
    # Once the first is over, the job runs again (the lock went with it).
    again = run_child(tmp_path / "a.duckdb", big, 1000, 200, f"checkpoint='{ckpt}'")
    assert again.returncode == 0, again.stderr
    assert '"events_consumed": 0' in again.stdout


def test_concurrent_runs_in_one_process(tmp_path, big):
    con = connect(tmp_path / "threads.duckdb")
    results = {}

    def run(name, job):
        cur = con.cursor()
        try:
            results[name] = cur.execute(
                f"SELECT events_consumed FROM streaming_etl_run('{big}', 1000, 200, job := '{job}', "
                f"windows_table := 'w_{name}', late_table := 'l_{name}', dead_letter_table := 'd_{name}', "
                f"checkpoint_interval_ms := 50)").fetchall()[-1][0]
        except duckdb.Error as e:
            results[name] = str(e)

    a = threading.Thread(target=run, args=("a", "same"))
    a.start()
    threading.Event().wait(0.3)
    b = threading.Thread(target=run, args=("b", "same"))
    c = threading.Thread(target=run, args=("c", "other"))
    b.start()
    c.start()
    for t in (a, b, c):
        t.join(timeout=120)
    assert results["a"] == 3_000_000
    assert "job 'same' is already running" in results["b"]
    assert results["c"] == 3_000_000, "another job runs alongside"
