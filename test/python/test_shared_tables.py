"""Several jobs in one database (SPEC §5): no job overwrites or drops another's rows. Two jobs
over one topic with different windows, and a SQL job beside them, in the foreground one after the
other and in the background side by side: each job's windows, late events and dead letters are
exactly what the job writes alone, its result row and `streaming_etl_jobs()` count what its tables
hold, across retries and kills."""
import os
import random
import time

from conftest import connect
from datagen import generate
from test_background import resume_until_caught_up, wait_for

# Three jobs over the same files: 1 s tumbling windows on the default tables, 5 s windows every
# second into a table of its own, and a SQL job of 2 s windows per key over the events its WHERE
# keeps. All three share late_events and dead_letters.
JOBS = {
    "a": "streaming_etl_run('{p}', 1000, 200, job := 'a'{x})",
    "b": "streaming_etl_run('{p}', 5000, 200, window_kind := 'hopping', hop_ms := 1000, job := 'b', "
         "windows_table := 'windows_b'{x})",
    "c": "streaming_etl_sql('{p}', $$ INSERT INTO by_key_c SELECT key, window_start, window_end, count(*) AS n, "
         "sum(amount) AS total FROM TUMBLE(stream, event_time, INTERVAL '2 seconds') WHERE amount >= 10 GROUP BY ALL $$, "
         "lateness_ms := 200, job := 'c', columns := {{'payload.value AS amount': 'DOUBLE'}}{x})",
}
WINDOWS = {"a": "windows", "b": "windows_b",
           "c": "(SELECT key, window_start::VARCHAR, window_end::VARCHAR, n, total FROM by_key_c)"}


def rounded(row):
    """A row with its floats rounded (a sum's last digits depend on the order it added in)."""
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def job_rows(con, job):
    """What the job's tables hold: its windows, late events and dead letters."""
    windows = sorted(rounded(r) for r in con.execute(f"SELECT * FROM {WINDOWS[job]}").fetchall())
    late = sorted(con.execute('SELECT key, event_time_ms, window_start_ms, watermark_ms, "partition", "offset" '
                              "FROM late_events WHERE job = ?", [job]).fetchall())
    dead = sorted(con.execute('SELECT "partition", "offset", error FROM dead_letters WHERE job = ?', [job]).fetchall())
    return windows, late, dead


def alone(tmp_path, job, pattern):
    """The job's rows when it runs alone in a database of its own."""
    con = connect(tmp_path / f"alone_{job}.duckdb")
    con.execute("SELECT * FROM " + JOBS[job].format(p=pattern, x="")).fetchall()
    rows = job_rows(con, job)
    con.close()
    return rows


def counts_agree(con, job, row):
    """The job's counts (a result row or a `streaming_etl_jobs()` row) are what its tables hold."""
    windows, late, dead = job_rows(con, job)
    assert (row["windows_emitted"], row["late_events"], row["dead_letters"]) == (len(windows), len(late), len(dead)), job


def test_jobs_in_the_foreground_one_after_the_other_keep_their_own_rows(tmp_path):
    g = generate(tmp_path / "data", 30_000, late_ratio=0.05, bad_ratio=0.01)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    con = connect(tmp_path / "fg.duckdb")
    cols = "job, events_consumed, windows_emitted, late_events, dead_letters"
    for j in JOBS:
        if j == "b":
            # On the default windows table, the second job is refused before it reads anything.
            try:
                con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 5000, 200, window_kind := 'hopping', "
                            "hop_ms := 1000, job := 'b')").fetchall()
                raise AssertionError("refused")
            except Exception as e:  # noqa: BLE001
                assert ("invalid parameter 'windows_table': \"windows\" holds the windows of job 'a' (1000 ms windows); "
                        "give job 'b' its own windows_table (got 'windows')") in str(e)
            assert con.execute("SELECT count(*) FROM streaming_etl_checkpoint(job := 'b')").fetchall() == [(0,)]
        cur = con.execute(f"SELECT {cols} FROM " + JOBS[j].format(p=pattern, x=""))
        row = dict(zip([d[0] for d in cur.description], cur.fetchall()[-1]))
        assert row["events_consumed"] == g.events
        counts_agree(con, j, row)
    for j in JOBS:
        assert job_rows(con, j) == alone(tmp_path, j, pattern), j
    # Every message is accounted for once per job (a window's count, a late row or a dead letter).
    assert con.execute("SELECT count(*) FROM dead_letters WHERE job = 'a'").fetchall() == [(g.bad,)]
    con.close()


def test_jobs_in_the_background_side_by_side_keep_their_own_rows(tmp_path):
    generate(tmp_path / "data", 30_000, late_ratio=0.05, bad_ratio=0.01)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    con = connect(tmp_path / "bg.duckdb")
    extra = ", background := true, follow := true, checkpoint_interval_ms := 100"
    for j in JOBS:
        assert con.execute("SELECT state FROM " + JOBS[j].format(p=pattern, x=extra)).fetchall() == [("running",)]
    for j in JOBS:
        wait_for(con, j, lambda r: r["lag"] == 0 and r["events_consumed"] == 30_000)
    for j in JOBS:
        cur = con.execute("SELECT * FROM streaming_etl_stop(?)", [j])
        row = dict(zip([d[0] for d in cur.description], cur.fetchall()[0]))
        # A follow job keeps its last windows open: a bounded run flushes them, as alone.
        counts_agree(con, j, row)
    for j in JOBS:
        con.execute("SELECT * FROM " + JOBS[j].format(p=pattern, x="")).fetchall()
        assert job_rows(con, j) == alone(tmp_path, j, pattern), j
    con.close()


def test_a_retry_mid_run_counts_every_line_once(tmp_path):
    """The target's catalog goes away (DETACH) while the job runs and lines arrive; the job retries
    and, once the catalog is back, goes on: its counts are what its tables hold."""
    d = tmp_path / "data"
    generate(d, 10_000, partitions=2, late_ratio=0.05, bad_ratio=0.01, seed=3)
    pattern = f"file:{d}/*.ndjson"
    con = connect(tmp_path / "main.duckdb")
    out = tmp_path / "out.duckdb"
    con.execute(f"ATTACH '{out}' AS o")
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'r', windows_table := 'o.windows', "
                "background := true, follow := true, checkpoint_interval_ms := 100)").fetchall()
    wait_for(con, "r", lambda r: r["lag"] == 0 and r["events_consumed"] == 10_000)
    con.execute("DETACH o")
    more = generate(tmp_path / "more", 5_000, partitions=2, late_ratio=0.05, bad_ratio=0.01, seed=4)
    for p in range(2):
        with open(d / f"part-{p}.ndjson", "ab") as f, open(tmp_path / "more" / f"part-{p}.ndjson", "rb") as m:
            f.write(m.read())
    wait_for(con, "r", lambda r: r["state"] == "retrying", what="retrying")
    con.execute(f"ATTACH '{out}' AS o")
    row = wait_for(con, "r", lambda r: r["state"] == "running" and r["lag"] == 0 and r["events_consumed"] >= 15_000,
                   timeout=120, what="caught up again")
    assert row["events_consumed"] == 10_000 + more.events
    con.execute("SELECT * FROM streaming_etl_stop('r')").fetchall()
    row = wait_for(con, "r", lambda r: r["state"] == "stopped")
    windows = con.execute("SELECT count(*), sum(count) FROM o.windows").fetchall()[0]
    late = con.execute("SELECT count(*) FROM o.late_events WHERE job = 'r'").fetchall()[0][0]
    dead = con.execute("SELECT count(*) FROM o.dead_letters WHERE job = 'r'").fetchall()[0][0]
    assert (row["windows_emitted"], row["late_events"], row["dead_letters"]) == (windows[0], late, dead)
    open_events = con.execute("SELECT sum(open_windows) FROM streaming_etl_checkpoint(job := 'r')").fetchall()[0][0]
    assert open_events >= 1
    # Every line once: flushed, the windows' counts, the late events and the dead letters are all.
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'r', windows_table := 'o.windows', "
                "flush := true)").fetchall()
    total = con.execute("SELECT (SELECT sum(count) FROM o.windows) + (SELECT count(*) FROM o.late_events) "
                        "+ (SELECT count(*) FROM o.dead_letters)").fetchall()[0][0]
    assert total == 15_000
    con.close()


def test_kill_9_while_two_jobs_share_late_events_then_resume_both_exactly(tmp_path):
    generate(tmp_path / "data", 600_000, late_ratio=0.05, bad_ratio=0.005)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "k.duckdb"
    bg = ", background := true, follow := true, checkpoint_interval_ms := 50"
    calls = "\n".join(JOBS[j].format(p=pattern, x=bg) for j in ("a", "c"))
    kills = resume_until_caught_up(db, random.Random(11), kills_wanted=4, extra_env={"BG_JOB_CALL": calls})
    assert kills >= 3, "kills must land for this test to test anything"
    con = connect(db)
    for j in ("a", "c"):
        con.execute("SELECT * FROM " + JOBS[j].format(p=pattern, x=", flush := true")).fetchall()
    for j in ("a", "c"):
        con2 = connect(tmp_path / f"alone2_{j}.duckdb")
        con2.execute("SELECT * FROM " + JOBS[j].format(p=pattern, x=", flush := true")).fetchall()
        assert job_rows(con, j) == job_rows(con2, j), j
        con2.close()
    con.close()


def test_the_sixteenth_job_is_refused_and_a_recorded_job_stops_without_a_phantom(tmp_path):
    d = tmp_path / "data"
    generate(d, 100, partitions=1)
    pattern = f"file:{d}/*.ndjson"
    con = connect(tmp_path / "many.duckdb")
    started = 0
    error = None
    for j in range(20):
        try:
            con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'm{j}', windows_table := 'w{j}', "
                        "background := true, follow := true)").fetchall()
            started += 1
        except Exception as e:  # noqa: BLE001
            error = str(e)
            break
    assert started == 15, started
    assert ("invalid parameter 'background': 15 background jobs run in this database, and the extension has 16 "
            "connections to it (opened when it loaded), one of which stays free for your statements; stop a job "
            "(streaming_etl_stop), or run this one in another process (got true)") in error
    assert con.execute("SELECT count(*) FROM streaming_etl_jobs()").fetchall() == [(15,)]
    for j in range(15):
        con.execute(f"SELECT * FROM streaming_etl_stop('m{j}')").fetchall()
    con.close()


def test_stop_of_a_job_recorded_by_an_earlier_process_leaves_no_row(tmp_path):
    from test_background import start_in_another_process
    generate(tmp_path / "data", 1000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    db = tmp_path / "r.duckdb"
    start_in_another_process(db, f"streaming_etl_run('{pattern}', 1000, 200, job := 'r2', background := true, follow := true)")
    ckpt = str(db) + ".streaming_etl.sqlite"
    # A read-only open writes nothing, and says why it cannot stop or resume a recorded job.
    ro = connect_read_only(db)
    before = (os.path.getmtime(ckpt), os.path.getsize(ckpt))
    for q, why in [("SELECT * FROM streaming_etl_stop('r2')", "open read-only, which writes nothing"),
                   ("SELECT * FROM streaming_etl_resume()", "is open read-only (access_mode = 'read_only')")]:
        try:
            ro.execute(q).fetchall()
            raise AssertionError("refused")
        except Exception as e:  # noqa: BLE001
            assert why in str(e), str(e)
    ro.close()
    time.sleep(0.05)
    assert (os.path.getmtime(ckpt), os.path.getsize(ckpt)) == before
    con = connect(db)
    assert con.execute("SELECT job, state FROM streaming_etl_stop('r2')").fetchall() == [("r2", "stopped")]
    assert con.execute("SELECT count(*) FROM streaming_etl_jobs()").fetchall() == [(0,)]
    assert con.execute("SELECT * FROM streaming_etl_resume()").fetchall() == []
    con.close()


def connect_read_only(db):
    import duckdb
    from conftest import EXT
    con = duckdb.connect(str(db), read_only=True, config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    return con


def test_the_checkpoint_function_shows_jobs_with_a_checkpoint_of_their_own(tmp_path):
    generate(tmp_path / "data", 2000)
    pattern = f"file:{tmp_path}/data/*.ndjson"
    con = connect(tmp_path / "c.duckdb")
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'own', "
                f"checkpoint := '{tmp_path}/own.sqlite')").fetchall()
    con.execute(f"SELECT * FROM streaming_etl_run('{pattern}', 1000, 200, job := 'usual', windows_table := 'w2')").fetchall()
    rows = con.execute("SELECT DISTINCT job, checkpoint FROM streaming_etl_checkpoint() ORDER BY job").fetchall()
    assert rows == [("own", f"{tmp_path}/own.sqlite"), ("usual", f"{tmp_path}/c.duckdb.streaming_etl.sqlite")]
    # Named, one checkpoint alone.
    assert con.execute(f"SELECT DISTINCT job FROM streaming_etl_checkpoint(checkpoint := '{tmp_path}/own.sqlite')"
                       ).fetchall() == [("own",)]
    con.close()
