"""Jobs in the background (SPEC §23): a job started with `background := true` (or `every`) runs
on the extension's own connections while the user's connection is free; `streaming_etl_jobs()`
lists it, `streaming_etl_stop()` ends it at a cycle boundary; DuckDB checkpoints meanwhile; the
user's last close and the process's exit stop it, `streaming_etl_resume()` starts it again;
faults retry; whatever happens, every message counts exactly once."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import duckdb
import pytest

from conftest import EXT, connect, run_child
from datagen import generate

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_COLS = ("job, state, runs, cycles, events_consumed, events_per_sec, lag, windows_emitted, "
            "late_events, dead_letters, last_status, last_error, retries, next_run_ms")


def job(con, name):
    cur = con.execute(f"SELECT {JOB_COLS} FROM streaming_etl_jobs() WHERE job = ?", [name])
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()
    return dict(zip(cols, rows[0])) if rows else None


def wait_for(con, name, cond, timeout=60, what="the job"):
    """Polls the job's row until cond(row) holds; returns the row."""
    deadline = time.time() + timeout
    row = None
    while time.time() < deadline:
        row = job(con, name)
        if row is not None and cond(row):
            return row
        time.sleep(0.05)
    raise AssertionError(f"{what} did not get there in {timeout} s: {row}")


def tables(con, windows="windows", late="late_events", dead="dead_letters"):
    return (
        sorted(con.execute(f"SELECT key, window_start_ms, count, sum_value FROM {windows}").fetchall()),
        sorted(con.execute(f'SELECT partition, "offset" FROM {late}').fetchall()),
        sorted(con.execute(f'SELECT partition, "offset" FROM {dead}').fetchall()),
    )


def straight(tmp_path, pattern, extra=""):
    """The tables of one foreground run of the job over everything."""
    os.makedirs(tmp_path, exist_ok=True)
    con = connect(tmp_path / "straight.duckdb")
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200{extra})").fetchall()
    t = tables(con)
    con.close()
    return t


def test_a_background_job_runs_beside_the_user_and_equals_a_foreground_run(tmp_path):
    g = generate(tmp_path / "data", 40_000, bad_ratio=0.01)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    con = connect(tmp_path / "bg.duckdb")
    t0 = time.time()
    row = con.execute(f"SELECT job, state FROM streaming_etl_run('{pattern}', 1000, 200, job := 'bg', "
                      "background := true, follow := true, checkpoint_interval_ms := 100)").fetchall()
    assert row == [("bg", "running")]
    assert time.time() - t0 < 5, "the statement returns at once"
    # The tables exist when it returns, and the user's connection is free while it runs.
    con.execute("SELECT count(*) FROM windows, late_events, dead_letters").fetchall()
    total = 40_000
    done = wait_for(con, "bg", lambda r: r["events_consumed"] == total and r["lag"] == 0)
    assert done["state"] == "running" and done["cycles"] >= 1 and done["dead_letters"] == g.bad
    stopped = con.execute("SELECT job, state, last_status, events_consumed FROM streaming_etl_stop('bg')").fetchall()
    assert stopped == [("bg", "stopped", "stopped", total)]
    assert tables(con) == straight(tmp_path, pattern)
    con.close()


def test_stop_ends_a_run_at_a_cycle_boundary_and_the_next_run_goes_on_exactly(tmp_path):
    generate(tmp_path / "data", 400_000, late_ratio=0.05)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    con = connect(tmp_path / "bg.duckdb")
    con.execute("SET threads = 1")
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'j', background := true, "
                "follow := true, checkpoint_interval_ms := 50)").fetchall()
    wait_for(con, "j", lambda r: r["events_consumed"] > 0)
    t0 = time.time()
    row = con.execute("SELECT state, events_consumed FROM streaming_etl_stop('j')").fetchall()[0]
    assert time.time() - t0 < 5
    assert row[0] == "stopped"
    # Everything it read is committed: the checkpoint has exactly the events it reports.
    assert con.execute("SELECT sum(next_offset) > 0 FROM streaming_etl_checkpoint()").fetchall()[0][0]
    counted = con.execute("SELECT (SELECT coalesce(sum(count), 0) FROM windows) + (SELECT count(*) FROM late_events)").fetchall()[0][0]
    assert counted <= row[1]
    # A foreground run finishes the job: the same tables as one straight run.
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'j')").fetchall()
    assert tables(con) == straight(tmp_path, pattern)
    con.close()


def test_a_schedule_runs_bounded_runs_one_after_the_other(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    f = d / "p0.ndjson"
    f.write_text("".join(f'{{"key":"k","event_time_ms":{i * 100},"payload":{{"value":1}}}}\n' for i in range(100)))
    con = connect(tmp_path / "s.duckdb")
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, job := 's', "
                "every := INTERVAL '1 second')").fetchall()
    r = wait_for(con, "s", lambda r: r["state"] == "waiting")
    assert r["runs"] == 1 and r["events_consumed"] == 100 and r["next_run_ms"] is not None
    assert r["last_status"] == "caught_up"
    # What arrives between runs is read by the next one.
    with open(f, "a") as out:
        out.write("".join(f'{{"key":"k","event_time_ms":{i * 100},"payload":{{"value":1}}}}\n' for i in range(100, 250)))
    r = wait_for(con, "s", lambda r: r["runs"] >= 2 and r["state"] == "waiting" and r["events_consumed"] == 250)
    r2 = wait_for(con, "s", lambda r: r["runs"] >= 3)
    assert r2["events_consumed"] == 250
    con.execute("SELECT * FROM streaming_etl_stop('s')").fetchall()
    # Windows [0, 24000) closed: 24 of them, 10 events each.
    assert con.execute("SELECT count(*), sum(count) FROM windows").fetchall() == [(24, 240)]
    con.close()


def test_duckdb_checkpoints_while_a_background_job_updates_its_rows(tmp_path):
    """A follow job writing running rows and late corrections (upserts: rows updated every
    cycle) on a new database: DuckDB's automatic checkpoints keep the WAL near its threshold,
    which a foreground statement's transaction would hold back for the job's whole life."""
    d = tmp_path / "data"
    db = tmp_path / "ck.duckdb"
    con = connect(db)
    con.execute("SET checkpoint_threshold = '256KB'")
    d.mkdir()
    files = [open(d / f"p{p}.ndjson", "w") for p in range(2)]
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 200, job := 'u', background := true, "
                "follow := true, emit := 'update', late_updates_ms := 5000, checkpoint_interval_ms := 100)").fetchall()
    wal = str(db) + ".wal"
    biggest = 0
    t = 0
    for batch in range(60):
        for p, f in enumerate(files):
            f.write("".join(f'{{"key":"k{i % 500}","event_time_ms":{t + i},"payload":{{"value":{i}}}}}\n'
                            for i in range(p, 2000, 2)))
            f.flush()
        t += 2000
        time.sleep(0.05)
        try:
            biggest = max(biggest, os.path.getsize(wal))
        except FileNotFoundError:
            pass    # (none yet, or removed by a checkpoint since)
    for f in files:
        f.close()
    r = wait_for(con, "u", lambda r: r["events_consumed"] == 120_000 and r["lag"] == 0)
    assert r["windows_emitted"] > 0
    con.execute("SELECT * FROM streaming_etl_stop('u')").fetchall()
    written = con.execute("SELECT count(*) FROM windows").fetchall()[0][0]
    assert written >= 500 * 100
    # Several MB of updated rows went through; the WAL never held much more than the threshold.
    assert biggest < 2 * 1024 * 1024, f"the WAL reached {biggest} bytes"
    con.close()


def test_the_users_last_close_stops_the_jobs_and_releases_the_database_then_resume_goes_on(tmp_path):
    generate(tmp_path / "data", 200_000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "life.duckdb"
    script = textwrap.dedent(f"""
        import duckdb, subprocess, sys, time
        cfg = {{'allow_unsigned_extensions': 'true'}}
        con = duckdb.connect({str(db)!r}, config=cfg)
        con.execute("LOAD '{EXT}'")
        con.execute("SET threads = 1")
        con.execute("SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'life', background := true, follow := true, checkpoint_interval_ms := 50)").fetchall()
        while con.execute("SELECT events_consumed FROM streaming_etl_jobs()").fetchall()[0][0] == 0:
            time.sleep(0.01)
        t0 = time.time()
        con.close()
        # The job stops at a cycle boundary, then the database is released: another process opens it.
        while True:
            other = subprocess.run([sys.executable, '-c', "import duckdb; duckdb.connect({str(db)!r}).close()"],
                                   capture_output=True, text=True)
            if other.returncode == 0:
                break
            assert time.time() - t0 < 10, other.stderr
        print('released', round(time.time() - t0, 2))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "released" in r.stdout
    assert not os.path.exists(str(db) + ".wal"), "closed cleanly"
    # After the restart, one statement resumes the job from its checkpoint.
    con = connect(db)
    assert con.execute("SELECT count(*) FROM streaming_etl_jobs()").fetchall() == [(0,)], "LOAD starts nothing"
    assert con.execute("SELECT job, state FROM streaming_etl_resume()").fetchall() == [("life", "running")]
    wait_for(con, "life", lambda r: r["lag"] == 0 and r["cycles"] > 0)
    con.execute("SELECT * FROM streaming_etl_stop('life')").fetchall()
    assert tables(con) == straight(tmp_path, pattern)
    # Stopped by its user: not resumed again.
    assert con.execute("SELECT * FROM streaming_etl_resume()").fetchall() == []
    con.close()


def start_in_another_process(db, call):
    """Starts a background job in a process of its own, which then exits (the job is recorded)."""
    script = textwrap.dedent(f"""
        import duckdb
        con = duckdb.connect({str(db)!r}, config={{'allow_unsigned_extensions': 'true'}})
        con.execute("LOAD '{EXT}'")
        con.execute("SELECT * FROM {call}").fetchall()
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def resume_until_caught_up(db, rng, kills_wanted, tries=30, extra_env=None):
    """Starts a process that resumes the database's jobs (or starts job `k` the first time) and
    waits for it to catch up, SIGKILLing it at a random instant, again and again; returns kills."""
    script = os.path.join(HERE, "bg_job.py")
    kills = 0
    for i in range(tries):
        p = subprocess.Popen([sys.executable, script, str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(os.environ, **(extra_env or {})))
        assert p.stdout.readline().strip() == b"started"
        if kills < kills_wanted:
            time.sleep(rng.uniform(0, 0.25))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        try:
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        if p.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert p.returncode == 0, err.decode()[-2000:]
        if b"caught_up" in out:
            return kills
    raise AssertionError("never caught up")


def test_kill_9_anywhere_then_resume_counts_every_message_once(tmp_path):
    generate(tmp_path / "data", 300_000, late_ratio=0.05, bad_ratio=0.005)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "k.duckdb"
    rng = random.Random(7)
    kills = resume_until_caught_up(db, rng, kills_wanted=4,
                                   extra_env={"BG_JOB_CALL": f"streaming_etl_run('{pattern}', 1000, 200, job := 'k', "
                                              "background := true, follow := true, checkpoint_interval_ms := 50)"})
    assert kills >= 3, "kills must land for this test to test anything"
    con = connect(db)
    assert tables(con) == straight(tmp_path, pattern)
    con.close()


def test_process_exit_stops_jobs_cleanly_and_load_alone_starts_nothing(tmp_path):
    generate(tmp_path / "data", 100_000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "exit.duckdb"
    # The process exits with its job running and its connection open.
    script = textwrap.dedent(f"""
        import duckdb, time
        con = duckdb.connect({str(db)!r}, config={{'allow_unsigned_extensions': 'true'}})
        con.execute("LOAD '{EXT}'")
        con.execute("SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'x', background := true, follow := true, checkpoint_interval_ms := 50)").fetchall()
        time.sleep(0.3)
        print('exiting', flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ckpt = str(db) + ".streaming_etl.sqlite"
    before = (os.path.getmtime(ckpt), os.path.getsize(ckpt))
    # A read-only open that loads the extension writes nothing and starts nothing.
    ro = textwrap.dedent(f"""
        import duckdb
        ro = duckdb.connect({str(db)!r}, read_only=True, config={{'allow_unsigned_extensions': 'true'}})
        ro.execute("LOAD '{EXT}'")
        print(ro.execute("SELECT count(*) FROM streaming_etl_jobs()").fetchall())
    """)
    r = subprocess.run([sys.executable, "-c", ro], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[(0,)]", r.stderr
    assert (os.path.getmtime(ckpt), os.path.getsize(ckpt)) == before
    con = connect(db)
    assert [r[0] for r in con.execute("SELECT job FROM streaming_etl_resume()").fetchall()] == ["x"]
    wait_for(con, "x", lambda r: r["lag"] == 0 and r["cycles"] > 0)
    con.execute("SELECT * FROM streaming_etl_stop('x')").fetchall()
    assert tables(con) == straight(tmp_path, pattern)
    con.close()


def test_eight_jobs_at_once_sharing_duckdbs_threads(tmp_path):
    con = connect(tmp_path / "many.duckdb")
    con.execute("SET threads = 8")
    for j in range(8):
        generate(tmp_path / f"d{j}", 20_000, seed=j)
        con.execute(f"SELECT * FROM streaming_etl_run('file:{tmp_path}/d{j}/*.ndjson', 1000, 200, job := 'j{j}', "
                    f"background := true, follow := true, windows_table := 'w{j}', late_table := 'l{j}', "
                    f"dead_letter_table := 'd{j}', checkpoint_interval_ms := 100)").fetchall()
    assert con.execute("SELECT count(*) FROM streaming_etl_jobs() WHERE state = 'running'").fetchall() == [(8,)]
    # Each run took its share of the 8 threads as it started: 8 / (jobs running, itself included).
    threads = [r[0] for r in con.execute("SELECT threads FROM streaming_etl_jobs() ORDER BY job").fetchall()]
    assert threads == [max(1, 8 // (j + 1)) for j in range(8)], threads
    for j in range(8):
        wait_for(con, f"j{j}", lambda r: r["events_consumed"] == 20_000 and r["lag"] == 0)
    for j in range(8):
        con.execute(f"SELECT * FROM streaming_etl_stop('j{j}')").fetchall()
    for j in range(8):
        assert tables(con, f"w{j}", f"l{j}", f"d{j}") == straight(tmp_path / f"s{j}", f"file:{tmp_path}/d{j}/*.ndjson")
    con.close()


def test_a_job_that_cannot_run_any_more_shows_failed_after_a_restart(tmp_path):
    generate(tmp_path / "data", 1000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "f.duckdb"
    start_in_another_process(db, f"streaming_etl_run('{pattern}', 1000, 200, job := 'f', background := true, follow := true)")
    # The operator locks the database down: the job's files are no longer allowed.
    con = connect(db)
    con.execute("SET enable_external_access = false")
    rows = con.execute("SELECT job, state, last_error FROM streaming_etl_resume()").fetchall()
    assert rows[0][:2] == ("f", "failed") and "enable_external_access" in rows[0][2], rows
    assert job(con, "f")["state"] == "failed"
    # Stopping it takes it off the record.
    con.execute("SELECT * FROM streaming_etl_stop('f')").fetchall()
    con.close()
    con = connect(db)
    assert con.execute("SELECT * FROM streaming_etl_resume()").fetchall() == []
    con.close()


def test_a_broker_outage_shows_retrying_then_the_job_goes_on_exactly(mock):
    from brokers import produce
    topic = f"bg_{random.randrange(1 << 30)}"
    mock.create_topic(topic, 2)
    lines = [[b'{"key":"k%d","event_time_ms":%d}' % (i % 7, 1_000_000 + i) for i in range(p, 20_000, 2)] for p in range(2)]
    produce(mock.bootstrap, topic, [l[:5000] for l in lines])
    con = connect()
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 100, 0, brokers := '{mock.bootstrap}', background := true, "
                "follow := true, checkpoint_interval_ms := 100, timeout_ms := 1500, "
                "kafka := MAP {'sasl.password': 'hunter2', 'client.id': 'bg-test'})").fetchall()
    r = wait_for(con, topic, lambda r: r["events_consumed"] == 10_000)
    call = con.execute("SELECT call FROM streaming_etl_jobs()").fetchall()[0][0]
    assert "hunter2" not in call and "'sasl.password': '<hidden>'" in call and "'client.id': 'bg-test'" in call
    mock.command("down 1")
    r = wait_for(con, topic, lambda r: r["state"] == "retrying", timeout=60, what="retrying")
    assert "cannot reach Kafka brokers" in r["last_error"] and r["retries"] >= 1
    mock.command("up 1")
    produce(mock.bootstrap, topic, [l[5000:] for l in lines])
    r = wait_for(con, topic, lambda r: r["state"] == "running" and r["events_consumed"] >= 20_000 and r["lag"] == 0,
                 timeout=90, what="back to running")
    assert r["last_error"] is None
    con.execute(f"SELECT * FROM streaming_etl_stop('{topic}')").fetchall()
    # Exactly once across the retries: once the last windows are flushed, every message is in
    # one window's count, one late row or one dead letter.
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 100, 0, brokers := '{mock.bootstrap}', flush := true)").fetchall()
    assert con.execute("SELECT (SELECT sum(count) FROM windows) + (SELECT count(*) FROM late_events) "
                       "+ (SELECT count(*) FROM dead_letters)").fetchall() == [(20_000,)]
    con.close()


def test_a_scheduled_run_that_cannot_reach_its_broker_retries_with_a_backoff(mock):
    from brokers import produce
    topic = f"bgs_{random.randrange(1 << 30)}"
    mock.create_topic(topic, 1)
    produce(mock.bootstrap, topic, [[b'{"key":"k","event_time_ms":%d}' % (1_000 + i) for i in range(100)]])
    con = connect()
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 100, 0, brokers := '{mock.bootstrap}', "
                "every := INTERVAL '1 second', timeout_ms := 1000)").fetchall()
    wait_for(con, topic, lambda r: r["state"] == "waiting" and r["events_consumed"] == 100)
    mock.command("down 1")
    r = wait_for(con, topic, lambda r: r["state"] == "retrying", timeout=30, what="retrying")
    assert "cannot reach Kafka brokers" in r["last_error"] and r["retries"] >= 1
    assert r["next_run_ms"] is not None
    mock.command("up 1")
    produce(mock.bootstrap, topic, [[b'{"key":"k","event_time_ms":%d}' % (1_100 + i) for i in range(100)]])
    r = wait_for(con, topic, lambda r: r["state"] == "waiting" and r["events_consumed"] == 200, timeout=90,
                 what="back on schedule")
    assert r["last_error"] is None and r["retries"] == 0
    con.execute(f"SELECT * FROM streaming_etl_stop('{topic}')").fetchall()
    assert con.execute("SELECT sum(count) FROM windows").fetchall()[0][0] + \
        con.execute("SELECT sum(open_windows) FROM streaming_etl_checkpoint()").fetchall()[0][0] >= 1
    con.close()


def test_the_cli_starts_a_job_queries_and_exits(tmp_path):
    from conftest import cli_binary
    cli = cli_binary()
    if cli is None:
        pytest.skip("no DuckDB CLI")
    generate(tmp_path / "data", 50_000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "cli.duckdb"
    sql = (f"LOAD '{EXT}';\nSELECT job, state FROM streaming_etl_run('{pattern}', 1000, 200, job := 'c', "
           "background := true, follow := true);\nSELECT count(*) >= 0 FROM windows;\n.exit\n")
    r = subprocess.run([cli, "-unsigned", "-csv", str(db)], input=sql, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "c,running" in r.stdout
    con = connect(db)
    assert con.execute("SELECT job FROM streaming_etl_resume()").fetchall() == [("c",)]
    wait_for(con, "c", lambda r: r["lag"] == 0 and r["cycles"] > 0)
    con.execute("SELECT * FROM streaming_etl_stop('c')").fetchall()
    assert tables(con) == straight(tmp_path, pattern)
    con.close()


def test_the_service_runner_keeps_jobs_running_without_a_statement_and_stops_them_on_sigterm(tmp_path):
    generate(tmp_path / "data", 100_000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "svc.duckdb"
    jobs_sql = tmp_path / "jobs.sql"
    jobs_sql.write_text(f"""
        SET threads = 1;  -- settings first; then the jobs
        SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'svc', background := true,
            follow := true, checkpoint_interval_ms := 100);
    """)
    serve = os.path.join(os.path.dirname(HERE), "..", "scripts", "serve.py")
    p = subprocess.Popen([sys.executable, serve, str(db), "--sql", str(jobs_sql), "--extension", EXT,
                          "--status-every", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        for line in p.stdout:
            if "lag=0" in line and "events_consumed=100000" in line:
                break
            assert time.time() < deadline, "the job did not catch up"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "signal SIGTERM: stopping" in out and "jobs stopped, database closed" in out
    assert not os.path.exists(str(db) + ".wal"), "closed cleanly"
    con = connect(db)
    assert tables(con) == straight(tmp_path, pattern)
    # Stopped with its database: the next service (or a user) resumes it.
    assert con.execute("SELECT job FROM streaming_etl_resume()").fetchall() == [("svc",)]
    con.execute("SELECT * FROM streaming_etl_stop('svc')").fetchall()
    con.close()


def test_a_result_left_unread_holding_checkpoints_back_is_shown_and_clears(tmp_path):
    """DuckDB cannot checkpoint while an older transaction is open: a result left unread on a
    user's connection holds the WAL back. The jobs say so (with the WAL's size) within a minute,
    and not while results are read whole (the job's own connections never hold it back); the
    warning clears once the result is read and DuckDB checkpoints again."""
    import threading
    d = tmp_path / "data"
    d.mkdir()
    files = [open(d / f"p{p}.ndjson", "a") for p in range(2)]
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            for p, f in enumerate(files):
                f.write("".join(f'{{"key":"k{(i + j) % 500}","event_time_ms":{now - j % 300},"payload":{{"value":{j}}}}}\n'
                                for j in range(1000)))
                f.flush()
            i += 1
            time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    con = connect(tmp_path / "w.duckdb")
    con.execute("SET checkpoint_threshold = '1MB'")
    try:
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 200, job := 'w', background := true, "
                    "follow := true, emit := 'update', checkpoint_interval_ms := 200)").fetchall()
        # Results read whole: DuckDB checkpoints as it goes, and nothing is shown.
        deadline = time.time() + 25
        while time.time() < deadline:
            r = job_wal(con)
            assert r["warning"] is None, r
            time.sleep(0.5)
        assert r["wal_bytes"] is not None and r["events_consumed"] > 0
        # A result left unread (read with fetchone and kept).
        held = con.cursor()
        held.execute("SELECT * FROM range(100000)")
        held.fetchone()
        r = wait_for_wal(con, lambda r: r["warning"] is not None, 90)
        assert r["wal_bytes"] > 2_000_000, r
        assert "a result left unread" in r["warning"] and "fetchone()" in r["warning"], r
        held.fetchall()
        held.close()
        r = wait_for_wal(con, lambda r: r["warning"] is None, 60)
        con.execute("SELECT * FROM streaming_etl_stop('w')").fetchall()
    finally:
        stop.set()
        producer.join()
        for f in files:
            f.close()
    con.close()


def job_wal(con):
    cur = con.execute("SELECT events_consumed, wal_bytes, warning, open_windows, state_bytes FROM streaming_etl_jobs() WHERE job = 'w'")
    return dict(zip([c[0] for c in cur.description], cur.fetchall()[0]))


def wait_for_wal(con, cond, timeout):
    deadline = time.time() + timeout
    r = None
    while time.time() < deadline:
        r = job_wal(con)
        if cond(r):
            return r
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {r}")
