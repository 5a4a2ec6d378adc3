"""The extension in the DuckDB CLI (PyPI duckdb-cli): load, settings, a run, and Ctrl-C
stopping a long run with everything processed so far written and checkpointed."""
import csv
import io
import os
import shutil
import signal
import subprocess
import time

import duckdb
import pytest

from conftest import EXT, cli_binary, connect
from datagen import generate_sql, scan

CLI = cli_binary()
pytestmark = pytest.mark.skipif(CLI is None, reason="duckdb-cli is not installed")


def cli(db, sql, timeout=120):
    r = subprocess.run([CLI, "-unsigned", "-csv", str(db), "-c", sql], capture_output=True, text=True, timeout=timeout)
    return r.returncode, list(csv.reader(io.StringIO(r.stdout))), r.stderr


def test_cli_loads_sets_runs_and_inspects(tmp_path):
    db = tmp_path / "cli.duckdb"
    ckpt = tmp_path / "jobs.ckpt"
    rc, rows, err = cli(db, f"""
        LOAD '{EXT}';
        PRAGMA streaming_etl_checkpoint = '{ckpt}';
        SELECT job, events_consumed, windows_emitted, watermark_ms, status
          FROM streaming_etl_run('file:test/data/basic/*.ndjson', 1000, 200, job := 'cli');
        SELECT count(*) AS n FROM windows;
        CALL streaming_etl_checkpoint();
    """)
    assert rc == 0, err
    assert rows[0] == ["job", "events_consumed", "windows_emitted", "watermark_ms", "status"]
    assert rows[1] == ["cli", "10", "5", "3700", "caught_up"]
    assert rows[2:4] == [["n"], ["5"]]
    assert rows[4][0] == "job" and [r[0] for r in rows[5:]] == ["cli", "cli"]
    assert ckpt.exists()
    # The CLI exited and released the file: another process opens it and sees the output.
    assert duckdb.connect(str(db)).execute("SELECT count(*) FROM windows").fetchone()[0] == 5


def test_cli_reports_bad_arguments(tmp_path):
    rc, rows, err = cli(tmp_path / "e.duckdb", f"LOAD '{EXT}'; SELECT * FROM streaming_etl_run('file:x', 1000, -3);")
    assert rc != 0
    assert "invalid parameter 'lateness_ms': must be >= 0 (got -3)" in err


def test_ctrl_c_stops_a_long_run_with_everything_checkpointed(tmp_path):
    paths = generate_sql(duckdb.connect(), tmp_path / "data", 4_000_000, partitions=2, bad_permille=1)
    total, _ = scan(paths)
    db = tmp_path / "int.duckdb"
    p = subprocess.Popen([CLI, "-unsigned", str(db), "-c",
                          f"LOAD '{EXT}'; SELECT * FROM streaming_etl_run('file:{tmp_path}/data/*.ndjson', 1000, 200, checkpoint_interval_ms := 20);"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = str(db) + ".streaming_etl.sqlite"
    for _ in range(400):
        if os.path.exists(ckpt) and os.path.getsize(ckpt) > 0:
            break
        time.sleep(0.01)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    # The CLI caught the signal and interrupted the query (it was not killed by it).
    assert p.returncode == 1, (p.returncode, out, err)
    con = connect(db)
    consumed = con.execute("SELECT sum(next_offset) FROM streaming_etl_checkpoint()").fetchone()[0]
    assert 0 < consumed < sum(os.path.getsize(x) for x in paths), "stopped part-way"
    assert con.execute("SELECT sum(pending_batches) FROM streaming_etl_checkpoint()").fetchone()[0] == 0
    # Resuming finishes the job with every message accounted for once.
    con.execute(f"SELECT * FROM streaming_etl_run('file:{tmp_path}/data/*.ndjson', 1000, 200, flush := true)").fetchall()
    n = con.execute("SELECT (SELECT sum(count) FROM windows) + (SELECT count(*) FROM late_events) + (SELECT count(*) FROM dead_letters)").fetchone()[0]
    assert n == total


README_SHELL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".venv", "bin", "duckdb")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_ctrl_c_in_the_readmes_shell_stops_a_follow_job_and_the_shell_stays(tmp_path):
    """The README's shell (.venv/bin/duckdb) under a terminal: Ctrl-C stops a `follow` job, the
    shell stays and answers the next statement, and the windows closed before it are there."""
    paths = generate_sql(duckdb.connect(), tmp_path / "data", 200_000, partitions=2)
    db = tmp_path / "tty.duckdb"
    session = f"setl-{os.getpid()}"

    def keys(*k):
        subprocess.run(["tmux", "send-keys", "-t", session, *k], check=True)

    def pane():
        return subprocess.run(["tmux", "capture-pane", "-p", "-S", "-200", "-t", session],
                              capture_output=True, text=True).stdout

    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "60",
                    README_SHELL, "-unsigned", str(db)], check=True)
    try:
        # (tmux reads a last `;` as its own separator: it is escaped.)
        keys(f"LOAD '{EXT}'\\;", "Enter")
        keys(f"SELECT events_consumed FROM streaming_etl_run('file:{tmp_path}/data/*.ndjson', 1000, 200, "
             f"follow := true, checkpoint_interval_ms := 100)\\;", "Enter")
        ckpt = str(db) + ".streaming_etl.sqlite"
        for _ in range(500):
            if os.path.exists(ckpt) and os.path.getsize(ckpt) > 0:
                break
            time.sleep(0.01)
        time.sleep(1.5)
        keys("C-c")
        time.sleep(1)
        keys("SELECT 'alive' AS shell, count(*) > 0 AS closed_windows FROM windows\\;", "Enter")
        deadline = time.time() + 30
        while time.time() < deadline and "alive" not in pane().split("SELECT 'alive'")[-1]:
            time.sleep(0.2)
        text = pane()
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
        tail = text.split("SELECT 'alive'")[-1]
        assert "alive" in tail and "true" in tail, text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
