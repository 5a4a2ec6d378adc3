"""Continuous jobs (SPEC 8) on files: `follow := true` reads lines and files that arrive while it
runs, windows become visible to other connections during the run, it stops at max_runtime_ms /
max_messages / LIMIT / Ctrl-C with everything exactly once; `start`, `max_future_ms` and the
quiet-stream rule `quiet_flush_ms`."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import EXT, cli_binary, connect


def ev(key, t, v=1):
    return json.dumps({"key": key, "event_time_ms": t, "payload": {"value": v}})


def append(path, lines):
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()


class Background:
    """A statement running on its own connection (DuckDB releases the GIL while it runs)."""

    def __init__(self, con, sql):
        self.rows, self.error = None, None
        self.thread = threading.Thread(target=self._go, args=(con, sql), daemon=True)
        self.thread.start()

    def _go(self, con, sql):
        try:
            self.rows = con.execute(sql).fetchall()
        except Exception as e:  # reported by join()
            self.error = e

    def join(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not stop"
        if self.error:
            raise self.error
        return self.rows


def wait_for(check, timeout=20, every=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = check()
        except Exception:
            v = None
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def totals(con):
    w = con.execute('SELECT coalesce(sum("count"), 0) FROM windows').fetchone()[0]
    late = con.execute("SELECT count(*) FROM late_events").fetchone()[0]
    dead = con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    return w, late, dead


def one_file_of_ten_events(tmp_path):
    """A source directory with one file of ten events of key x (0-900 ms), and a database."""
    d = tmp_path / "in"
    d.mkdir()
    a = d / "a.ndjson"
    append(a, [ev("x", i * 100) for i in range(10)])
    db = tmp_path / "db.duckdb"
    return d, a, db, connect(db)


def test_follow_reads_what_arrives_and_windows_appear_during_the_run(tmp_path):
    d, a, db, con = one_file_of_ten_events(tmp_path)
    watcher = con.cursor()
    run = Background(con.cursor(), f"""SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0,
        follow := true, max_runtime_ms := 8000, checkpoint_interval_ms := 200)""")
    wait_for(lambda: watcher.execute("SELECT count(*) FROM streaming_etl_checkpoint()").fetchone()[0] >= 1)
    seen = []
    # A producer writes while the job runs: lines to a.ndjson, and a new file mid-run.
    for step in range(1, 6):
        append(a, [ev("x", step * 1000 + i * 100) for i in range(10)])
        if step >= 3:
            append(d / "b.ndjson", [ev("y", step * 1000 + i * 100) for i in range(10)])
        if step == 3:
            # New files are looked for every second; the new partition holds the watermark
            # back from then on.
            wait_for(lambda: watcher.execute("SELECT count(*) FROM streaming_etl_checkpoint()").fetchone()[0] == 2)
        closed_to = step * 1000
        got = wait_for(lambda: watcher.execute(
            "SELECT max(window_end_ms) FROM windows WHERE key = 'x'").fetchone()[0] == closed_to and closed_to)
        seen.append((got, run.thread.is_alive()))
    # Every window through step 5 became visible while the run was still going.
    assert all(alive for _, alive in seen), seen
    # Progress is observable from another connection, with current lag.
    rows = watcher.execute("SELECT regexp_extract(file, '[^/]+$'), lag FROM streaming_etl_checkpoint() ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["a.ndjson", "b.ndjson"] and all(r[1] == 0 for r in rows), rows
    out = run.join()
    assert len(out) >= 5, "a row per checkpoint cycle"
    assert out[-1][1] == 90
    assert out[-1][-1] == "max_runtime"
    # Nothing was lost or doubled: a bounded run with flush finishes it.
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, flush := true)").fetchall()
    assert totals(con) == (90, 0, 0)


@pytest.mark.parametrize("mode,first_run", [("upsert", False), ("append", False), ("append", True)])
def test_duckdb_checkpoints_while_a_follow_run_writes(tmp_path, mode, first_run):
    """A long-running job must not keep DuckDB from checkpointing: what it writes reaches the
    database file during the run (its WAL and memory stay bounded) and a user's CHECKPOINT or
    backup works meanwhile. Holds once the job's tables exist, or, for the run that creates them,
    when it is called by its qualified name, as docs/semantics.md advises for a long follow job on a
    new database (the calling statement then starts no transaction in the database, which would keep
    DuckDB from checkpointing the tables' creation until the run ends)."""
    d, a, db, con = one_file_of_ten_events(tmp_path)
    fn = "system.main.streaming_etl_run" if first_run else "streaming_etl_run"
    sql = f"""SELECT * FROM {fn}('file:{d}/*.ndjson', 1000, 0, write_mode := '{mode}'"""
    if not first_run:
        con.execute(sql + ")").fetchall()  # creates the tables (and checkpoints the job)
    watcher = con.cursor()
    run = Background(con.cursor(), sql + ", follow := true, max_runtime_ms := 8000, checkpoint_interval_ms := 100)")
    for step in range(1, 4):
        append(a, [ev("x", step * 1000 + i * 100) for i in range(10)])
        closed_to = step * 1000
        wait_for(lambda: watcher.execute("SELECT max(window_end_ms) FROM windows").fetchone()[0] == closed_to)
        # Written by the run a moment ago, while it is still running: DuckDB can fold it into
        # the database file now.
        watcher.execute("CHECKPOINT")
        assert run.thread.is_alive()
        wal = f"{db}.wal"
        try:
            size = os.path.getsize(wal)
        except FileNotFoundError:
            size = 0    # (a checkpoint removed it)
        assert size < 64 * 1024, size
    run.join()
    con.execute(sql + ", flush := true)").fetchall()
    assert totals(con) == (40, 0, 0)


def test_follow_stops_at_max_messages_and_limit(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    append(d / "a.ndjson", [ev("x", i * 100) for i in range(50)])
    con = connect(tmp_path / "db.duckdb")
    rows = con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, follow := true, max_messages := 30)").fetchall()
    assert rows[-1][1] == 30 and rows[-1][-1] == "max_messages"
    # LIMIT: the run stops after the rows asked for; its cycles are checkpointed.
    rows = con.execute(f"""SELECT events_consumed FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0,
        follow := true, checkpoint_interval_ms := 100) LIMIT 3""").fetchall()
    assert len(rows) == 3
    assert rows[-1][0] == 20
    assert con.execute("SELECT next_offset = end_offset FROM streaming_etl_checkpoint()").fetchone()[0]


def test_start_latest_and_new_files_from_their_beginning(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    append(d / "a.ndjson", [ev("old", i * 100) for i in range(20)])
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT coalesce(max(events_consumed), 0) FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, start := 'latest')"
    assert con.execute(run).fetchone()[0] == 0
    append(d / "a.ndjson", [ev("new", 5000 + i * 100) for i in range(5)])
    append(d / "b.ndjson", [ev("b", 5000 + i * 100) for i in range(3)])
    # Only the first run uses `start`: the lines after it and the new file are read.
    assert con.execute(run).fetchone()[0] == 8
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, flush := true)").fetchall()
    assert con.execute("SELECT DISTINCT key FROM windows ORDER BY 1").fetchall() == [("b",), ("new",)]


def test_start_parameter_errors(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    append(d / "a.ndjson", [ev("x", 1)])
    con = connect()
    with pytest.raises(Exception, match="invalid parameter 'start': a point in time applies to Kafka topics"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/a.ndjson', 1000, 0, start := '2026-01-01 00:00:00')")
    with pytest.raises(Exception, match=r"invalid parameter 'start': must be 'earliest', 'latest' or a point in time .* \(got 'yesterday'\)"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/a.ndjson', 1000, 0, start := 'yesterday')")
    with pytest.raises(Exception, match=r"invalid parameter 'files': applies to a file: source, not to a Kafka topic \(got 'rolling'\)"):
        con.execute("SELECT * FROM streaming_etl_run('orders', 1000, 0, files := 'rolling')")
    with pytest.raises(Exception, match=r"invalid parameter 'files': must be 'append' or 'rolling' \(got 'hourly'\)"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/a.ndjson', 1000, 0, files := 'hourly')")
    with pytest.raises(Exception, match=r"invalid parameter 'quiet_flush_ms': must be > 0 \(got 0\)"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/a.ndjson', 1000, 0, quiet_flush_ms := 0)")


def test_max_future_ms_sends_a_bad_clock_to_dead_letters(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    now = int(time.time() * 1000)
    lines = [ev("k", now - 10_000 + i * 1000) for i in range(5)]
    lines.insert(2, ev("bad-clock", now + 3_600_000))
    append(d / "a.ndjson", lines)
    con = connect()
    rows = con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/a.ndjson', 1000, 0, max_future_ms := 60000)").fetchall()
    assert rows[-1][1] == 6 and rows[-1][4] == 1
    (err,) = con.execute("SELECT error FROM dead_letters").fetchone()
    assert "max_future_ms" in err, err
    # The watermark was not moved by the bad clock: no event of the others is late.
    assert con.execute("SELECT count(*) FROM late_events").fetchone()[0] == 0
    assert con.execute("SELECT max(global_watermark_ms) FROM streaming_etl_checkpoint()").fetchone()[0] < now


def test_quiet_flush_closes_the_last_windows_of_a_quiet_stream(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    append(d / "a.ndjson", [ev("x", i * 300) for i in range(10)])
    con = connect(tmp_path / "db.duckdb")
    watcher = con.cursor()
    # Without the rule, the last window stays open in a follow run.
    rows = con.execute(f"""SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, job := 'plain',
        follow := true, max_runtime_ms := 1500, checkpoint_interval_ms := 200)""").fetchall()
    assert con.execute('SELECT sum("count") FROM windows').fetchone()[0] == 7
    con.execute("DROP TABLE windows")
    run = Background(con.cursor(), f"""SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, job := 'quiet',
        follow := true, quiet_flush_ms := 500, max_runtime_ms := 6000, checkpoint_interval_ms := 200)""")
    # The stream is quiet from the start: within the bound all 10 events are in closed windows.
    wait_for(lambda: watcher.execute('SELECT sum("count") FROM windows').fetchone()[0] == 10, timeout=5)
    assert run.thread.is_alive()
    # Later data for a flushed window is late, as after `flush`.
    append(d / "a.ndjson", [ev("x", 2800), ev("x", 9000)])
    wait_for(lambda: watcher.execute("SELECT count(*) FROM late_events").fetchone()[0] == 1, timeout=5)
    wait_for(lambda: watcher.execute('SELECT sum("count") FROM windows').fetchone()[0] == 11, timeout=5)
    run.join()


CLI = cli_binary()


@pytest.mark.skipif(CLI is None, reason="duckdb-cli is not installed")
def test_ctrl_c_stops_a_follow_run_in_the_cli(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    a = d / "a.ndjson"
    append(a, [ev("x", i * 100) for i in range(100)])
    db = tmp_path / "db.duckdb"
    p = subprocess.Popen([CLI, "-unsigned", str(db), "-c",
                          f"LOAD '{EXT}'; SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, follow := true, checkpoint_interval_ms := 100);"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = str(db) + ".streaming_etl.sqlite"
    wait_for(lambda: os.path.exists(ckpt))
    # A producer keeps writing while the run follows.
    stop = threading.Event()
    written = [100]

    def producer():
        t = 10_000
        while not stop.is_set():
            append(a, [ev("x", t)])
            written[0] += 1
            t += 50
            time.sleep(0.005)

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    stop.set()
    th.join()
    assert p.returncode == 1, (p.returncode, out, err)
    con = connect(db)
    assert con.execute("SELECT sum(pending_batches) FROM streaming_etl_checkpoint()").fetchone()[0] == 0
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, flush := true)").fetchall()
    assert totals(con) == (written[0], 0, 0)
