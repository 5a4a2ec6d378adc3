"""Output into a DuckLake (DuckDB 1.4.4, whose DuckLake and postgres extensions PyPI has): with the
catalog in a DuckDB file and in a real PostgreSQL server. The rows equal those written into a
DuckDB file, in both write modes and across pieces, kills and a lost catalog; other processes
read the lake while a job writes it and see whole cycles only; tables in two catalogs are an
error at bind time.

`make pytest` runs this file with the DuckDB 1.4 host and the 1.4 build of the extension; other
hosts skip it (they cannot load DuckLake)."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest

import lake
from conftest import EXT, HERE
from datagen import append_lines, generate

pytestmark = pytest.mark.skipif(
    not lake.HAVE_LAKE,
    reason=f"DuckLake's extensions exist for DuckDB 1.4.4 only (this host is {duckdb.__version__}); make pytest runs this file on .venv/lts")

SKEW = os.path.join(os.path.dirname(HERE), "data", "skew", "*.ndjson")
WINDOWS = "SELECT window_start_ms, window_end_ms, key, count, sum_value, min_value, max_value FROM {t}"
LATE = "SELECT key, event_time_ms, payload_json, window_start_ms, window_end_ms, watermark_ms, topic, partition, \"offset\" FROM {t}"
DEAD = "SELECT topic, partition, \"offset\", raw, error FROM {t}"


@pytest.fixture(params=["file", "postgres"])
def catalog(request, tmp_path, postgres):
    """(catalog, data path) of a fresh lake: a DuckDB-file catalog or a Postgres database."""
    if request.param == "file":
        return str(tmp_path / "meta.ducklake"), str(tmp_path / "lakedata")
    return postgres.new_database(), str(tmp_path / "lakedata")


def rows(con, sql, table):
    return sorted(con.execute(sql.format(t=table)).fetchall(), key=repr)


def tables_of(con, prefix):
    return (rows(con, WINDOWS, f"{prefix}windows"), rows(con, LATE, f"{prefix}late_events"),
            rows(con, DEAD, f"{prefix}dead_letters"))


def reference(tmp_path, source, mode, window_ms=1000, lateness_ms=200):
    """The same job written into a DuckDB file."""
    con = lake.connect(tmp_path / "reference.duckdb", EXT)
    con.execute(f"SELECT * FROM streaming_etl_run('{source}', {window_ms}, {lateness_ms}, job := 'ref', write_mode := '{mode}', flush := true)").fetchall()
    out = tables_of(con, "")
    con.close()
    return out


def run_sql(source, mode, job="j", extra=""):
    return (f"SELECT * FROM streaming_etl_run('{source}', 1000, 200, job := '{job}', write_mode := '{mode}', "
            f"windows_table := 'lake.windows'{extra})")


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_lake_gets_the_rows_a_duckdb_file_gets(tmp_path, catalog, mode):
    cat, data = catalog
    con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
    last = con.execute(run_sql(f"file:{SKEW}", mode, extra=", flush := true")).fetchall()[-1]
    assert last[1] == 2000
    got = tables_of(con, "lake.")
    # late_events and dead_letters went beside the windows table, into the lake.
    assert {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'").fetchall()} >= {
        "windows", "late_events", "dead_letters"}
    assert got == reference(tmp_path, f"file:{SKEW}", mode)
    # A run over a caught-up job changes nothing.
    again = con.execute(run_sql(f"file:{SKEW}", mode)).fetchall()[-1]
    assert again[1] == 0
    assert tables_of(con, "lake.") == got
    con.close()


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_job_in_pieces_with_restarts_equals_one_straight_run(tmp_path, catalog, mode):
    cat, data = catalog
    for i in range(8):
        con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
        con.execute(run_sql(f"file:{SKEW}", mode, extra=", max_messages := 300")).fetchall()
        con.close()
    con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
    con.execute(run_sql(f"file:{SKEW}", mode, extra=", flush := true")).fetchall()
    got = tables_of(con, "lake.")
    con.close()
    assert got == reference(tmp_path, f"file:{SKEW}", mode)
    assert sum(r[3] for r in got[0]) + len(got[1]) + len(got[2]) == 2000


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_running_rows_and_withdrawn_sessions_reach_a_lake_as_a_duckdb_file(tmp_path, catalog, mode):
    """emit := 'update' into a lake: `upsert` MERGEs the latest revision of each window and deletes
    the rows of sessions a merge absorbed; `append` adds every revision. In pieces of 97
    messages (a cycle each), the lake's rows equal a DuckDB file's."""
    cat, data = catalog
    extra = (", window_kind := 'session', emit := 'update', max_messages := 97, checkpoint_interval_ms := 600000,"
             " aggregates := ['count(*) AS count', 'approx_quantile(payload.value, [0.5, 0.9]) AS q',"
             " 'count(*) FILTER (WHERE payload.value > 0.5) AS high']")
    cols = "SELECT * FROM {t}"
    got, want = None, None
    for target in ("lake.windows", "windows"):
        con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
        sql = (f"SELECT status FROM streaming_etl_run('file:{SKEW}', 1000, 200, job := '{target}', write_mode := '{mode}', "
               f"windows_table := '{target}'{extra})")
        for _ in range(100):
            if con.execute(sql).fetchall()[-1][0] == "caught_up":
                break
        con.execute(sql.replace("max_messages := 97", "flush := true")).fetchall()
        out = rows(con, cols, target)
        if target == "windows":
            want = out
        else:
            got = out
        con.close()
    assert got == want
    if mode == "append":
        assert any(r[-1] for r in got), "a session merge withdrew a running row"
    assert all(r[-3] for r in got) or mode == "append", "upsert: only final rows are left"


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_postgres_database_attached_directly_is_a_catalog_too(tmp_path, postgres, mode):
    con = lake.connect(tmp_path / "host.duckdb", EXT)
    con.execute(f"LOAD postgres; ATTACH '{postgres.new_database()}' AS pg (TYPE postgres)")
    con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, job := 'j', write_mode := '{mode}', "
                "windows_table := 'pg.public.windows', flush := true)").fetchall()
    got = tables_of(con, "pg.public.")
    con.close()
    assert got == reference(tmp_path, f"file:{SKEW}", mode)


def test_tables_in_two_catalogs_and_other_misuse_fail_at_bind_time(tmp_path):
    cat = str(tmp_path / "meta.ducklake")
    con = lake.connect(tmp_path / "host.duckdb", EXT, cat, str(tmp_path / "lakedata"))
    with pytest.raises(duckdb.Error, match=r"invalid parameter 'late_table': is in catalog 'host' but windows_table is in 'lake': one transaction writes one catalog"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, windows_table := 'lake.w', late_table := 'main.late')").fetchall()
    with pytest.raises(duckdb.Error, match=r"invalid parameter 'dead_letter_table': is in catalog 'lake' but windows_table is in 'host'"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, dead_letter_table := 'lake.main.dead')").fetchall()
    with pytest.raises(duckdb.Error, match=r"invalid parameter 'windows_table': no catalog named 'elsewhere' is attached \(ATTACH it first\) \(got 'elsewhere.main.w'\)"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, windows_table := 'elsewhere.main.w')").fetchall()
    with pytest.raises(duckdb.Error, match=r"invalid parameter 'compact_every': compacts a DuckLake, but the output tables are in catalog 'host' of type duckdb \(got 10\)"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, compact_every := 10)").fetchall()
    with pytest.raises(duckdb.Error, match=r"invalid parameter 'compact_retain_ms': applies only with compact_every"):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, windows_table := 'lake.w', compact_retain_ms := 10)").fetchall()
    # Nothing was consumed or written by the refused calls.
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name IN ('w', 'windows', 'late', 'dead')").fetchall()[0][0] == 0
    # A schema of the host's own named like the lake resolves to the host, as DuckDB does.
    con.execute("CREATE SCHEMA lake2")
    con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, windows_table := 'lake2.w', flush := true)").fetchall()
    # The three tables, and the batch marker and the registry of jobs beside them.
    assert con.execute("SELECT database_name FROM duckdb_tables() WHERE schema_name = 'lake2'").fetchall() == [("host",)] * 5
    con.close()


def live_files(con, table):
    return con.execute(f"SELECT count(*) FROM ducklake_list_files('lake', '{table}')").fetchall()[0][0]


def test_compaction_keeps_the_file_count_bounded_and_the_rows_the_same(tmp_path):
    counts = {}
    outs = {}
    for compact in (False, True):
        d = tmp_path / ("c" if compact else "n")
        d.mkdir()
        con = lake.connect(d / "host.duckdb", EXT, str(d / "meta.ducklake"), str(d / "lakedata"))
        extra = ", compact_every := 5, compact_retain_ms := 1" if compact else ""
        # 30 runs of 60 events each: a file per table per cycle that closed windows, without
        # compaction.
        for _ in range(30):
            con.execute(run_sql(f"file:{SKEW}", "append", extra=f", max_messages := 60{extra}")).fetchall()
        con.execute(run_sql(f"file:{SKEW}", "append", extra=f", flush := true{extra}")).fetchall()
        counts[compact] = (live_files(con, "windows"), live_files(con, "streaming_etl_batches"))
        outs[compact] = tables_of(con, "lake.")
        con.close()
    assert outs[True] == outs[False]
    # The windows table and the marker table (a file per commit each) are both merged.
    for table in (0, 1):
        assert counts[False][table] >= 15, counts
        assert counts[True][table] <= counts[False][table] / 3, counts


def reader(catalog, data, stop, seen, errors):
    """Another process's view: each poll reads the three tables and the job's marker in one
    snapshot."""
    con = lake.connect(":memory:", EXT, catalog, data)
    try:
        while not stop.is_set():
            try:
                con.execute("BEGIN")
                seen.append(con.execute(
                    "SELECT (SELECT count(*) FROM lake.windows), (SELECT count(*) FROM lake.late_events), "
                    "(SELECT count(*) FROM lake.dead_letters), "
                    "(SELECT max(seq) FROM lake.streaming_etl_batches WHERE job = 'j')").fetchall()[0])
                con.execute("COMMIT")
            except duckdb.Error as e:
                con.execute("ROLLBACK")
                if "does not exist" not in str(e):
                    errors.append(str(e))
            time.sleep(0.02)
    finally:
        con.close()


def committed_states(con):
    """The (windows, late, dead, marker) of every snapshot of the lake, by time travel."""
    states = set()
    for (v,) in con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake')").fetchall():
        try:
            states.add(con.execute(
                f"SELECT (SELECT count(*) FROM lake.windows AT (VERSION => {v})), "
                f"(SELECT count(*) FROM lake.late_events AT (VERSION => {v})), "
                f"(SELECT count(*) FROM lake.dead_letters AT (VERSION => {v})), "
                f"(SELECT max(seq) FROM lake.streaming_etl_batches AT (VERSION => {v}) WHERE job = 'j')").fetchall()[0])
        except duckdb.Error:
            pass  # before the tables existed
    return states


def test_other_processes_read_and_write_the_lake_while_a_follow_job_runs(tmp_path, postgres):
    """A follow job in one process, a reader in this one and another job writing the same lake
    in a third: the reader sees only states the job committed (whole cycles), and all rows."""
    cat, data = postgres.new_database(), str(tmp_path / "lakedata")
    src = tmp_path / "in"
    src.mkdir()
    generate(str(tmp_path / "gen"), 6000, partitions=2, keys=20)
    # The lake is created once (two processes attaching a new lake at once would both create it).
    lake.connect(":memory:", EXT, cat, data).close()
    env = lake.child_env(EXT, cat, data)
    job = subprocess.Popen(
        [str(a) for a in [sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / "job.duckdb"), f"file:{src}/*.ndjson", 100, 20,
         "job='j'", "write_mode='append'", "windows_table='lake.windows'", "follow=true", "checkpoint_interval_ms=200",
         "quiet_flush_ms=1000", "max_runtime_ms=12000", "--announce"]],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    other = subprocess.Popen(
        [str(a) for a in [sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / "other.duckdb"), f"file:{SKEW}",
                          1000, 200, "job='other'", "write_mode='append'", "windows_table='lake.other_windows'",
                          "late_table='lake.other_late'", "dead_letter_table='lake.other_dead'",
                          "checkpoint_interval_ms=20", "flush=true"]],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop, seen, errors = threading.Event(), [], []
    t = threading.Thread(target=reader, args=(cat, data, stop, seen, errors))
    t.start()
    try:
        assert job.stdout.readline().strip() == "loaded"
        # The producer: the files grow in pieces while the job follows them.
        grow(str(src), str(tmp_path / "gen"), 20, 0.3)
        out, err = job.communicate(timeout=90)
        other_out, other_err = other.communicate(timeout=60)
    finally:
        stop.set()
        t.join()
        for p in (job, other):
            if p.poll() is None:
                p.kill()
    assert job.returncode == 0, err
    assert other.returncode == 0, other_err
    assert not errors, errors[:3]
    con = lake.connect(tmp_path / "check.duckdb", EXT, cat, data)
    states = committed_states(con)
    final = tables_of(con, "lake.")
    assert con.execute("SELECT count(*) FROM lake.other_windows").fetchall()[0][0] > 0
    con.close()
    observed = [s for s in seen if s[3] is not None]
    assert len({s[3] for s in observed}) >= 3, "the reader saw the job's cycles land one by one"
    assert not [s for s in observed if s not in states], "a reader saw a state no commit of the job made"
    # All of it, once: the job followed everything the producer wrote.
    assert final == reference(tmp_path, f"file:{src}/*.ndjson", "append", 100, 20)


def test_jobs_starting_at_once_share_one_lake(tmp_path, postgres):
    """Three processes start jobs into one lake at the same moment: they create the shared marker
    table (and their own tables) concurrently, which DuckLake reports as a conflict to all but one;
    each retries and writes its own rows exactly."""
    cat, data = postgres.new_database(), str(tmp_path / "lakedata")
    lake.connect(":memory:", EXT, cat, data).close()
    env = {**os.environ, **lake.child_env(EXT, cat, data)}
    jobs = [subprocess.Popen([str(a) for a in [
        sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / f"h{i}.duckdb"), f"file:{SKEW}", 1000, 200,
        f"job='j{i}'", "write_mode='append'", f"windows_table='lake.w{i}'", f"late_table='lake.l{i}'",
        f"dead_letter_table='lake.d{i}'", "flush=true"]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for i in range(3)]
    outs = [p.communicate(timeout=120) for p in jobs]
    for p, (_, err) in zip(jobs, outs):
        assert p.returncode == 0, err
    con = lake.connect(tmp_path / "check.duckdb", EXT, cat, data)
    got = [(rows(con, WINDOWS, f"lake.w{i}"), rows(con, LATE, f"lake.l{i}"), rows(con, DEAD, f"lake.d{i}")) for i in range(3)]
    assert con.execute("SELECT count(DISTINCT job) FROM lake.streaming_etl_batches").fetchall() == [(3,)]
    con.close()
    want = reference(tmp_path, f"file:{SKEW}", "append")
    assert all(g == want for g in got)


def kill_at_random(cmd, env, rng, kills, low_s, high_s):
    """Starts `cmd` `kills` times, each killed with SIGKILL at a random instant."""
    for _ in range(kills):
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(low_s, high_s))
        p.send_signal(signal.SIGKILL)
        p.communicate()


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_kill_9_while_writing_a_lake_on_postgres_loses_and_doubles_nothing(tmp_path, postgres, mode):
    cat, data = postgres.new_database(), str(tmp_path / "lakedata")
    generate(str(tmp_path / "in"), 60000, partitions=4, keys=50, bad_ratio=0.01)
    source = f"file:{tmp_path}/in/*.ndjson"
    env = {**os.environ, **lake.child_env(EXT, cat, data)}
    cmd = [str(c) for c in [sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / "host.duckdb"), source,
                            1000, 200, "job='j'", f"write_mode='{mode}'", "windows_table='lake.windows'",
                            "checkpoint_interval_ms=20", "max_messages=2000"]]
    kill_at_random(cmd, env, random.Random(7), 6, 0.6, 2.0)
    con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
    con.execute(run_sql(source, mode, extra=", flush := true")).fetchall()
    got = tables_of(con, "lake.")
    con.close()
    assert got == reference(tmp_path, source, mode)


def grow(src, gen, pieces, pause_s):
    """Appends the generated files to `src` in `pieces` parts (a producer writing as it goes)."""
    lines = {}
    for name in sorted(os.listdir(gen)):
        with open(os.path.join(gen, name)) as f:
            lines[name] = f.read().splitlines()
        open(os.path.join(src, name), "a").close()
    n = max(len(v) for v in lines.values())
    step = -(-n // pieces)
    for i in range(0, n, step):
        for name, ls in lines.items():
            append_lines(os.path.join(src, name), ls[i:i + step])
        time.sleep(pause_s)


def test_a_catalog_that_goes_away_fails_the_run_or_is_ridden_out_and_the_next_run_resumes(tmp_path, postgres):
    cat, data = postgres.new_database(), str(tmp_path / "lakedata")
    lake.connect(":memory:", EXT, cat, data).close()
    generate(str(tmp_path / "gen"), 40000, partitions=4, keys=50)
    src = tmp_path / "in"
    src.mkdir()
    source = f"file:{src}/*.ndjson"
    env = {**os.environ, **lake.child_env(EXT, cat, data)}
    cmd = [str(c) for c in [sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / "host.duckdb"), source, 100,
                            20, "job='j'", "write_mode='append'", "windows_table='lake.windows'", "follow=true",
                            "checkpoint_interval_ms=100", "max_runtime_ms=7000"]]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    producer = threading.Thread(target=grow, args=(str(src), str(tmp_path / "gen"), 40, 0.15))
    producer.start()
    time.sleep(2.0)
    postgres.kill()
    time.sleep(1.5)
    postgres.start()
    producer.join()
    out, err = p.communicate(timeout=120)
    # DuckDB 1.4's postgres extension may abort at exit once it lost its server: the statement's
    # outcome is what counts. Either the run finished (rode it out), or it failed with an error.
    printed = out.strip().splitlines()
    finished = bool(printed) and json.loads(printed[-1])["status"] != "running"
    if not finished:
        assert "Error" in err, (p.returncode, out[-2000:], err[-2000:])
    con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
    con.execute(f"SELECT * FROM streaming_etl_run('{source}', 100, 20, job := 'j', write_mode := 'append', "
                "windows_table := 'lake.windows', flush := true)").fetchall()
    got = tables_of(con, "lake.")
    con.close()
    assert got == reference(tmp_path, source, "append", 100, 20)


CONFLICTED = re.compile(
    r'(?s)writing to table "lake"."windows": the commit failed 8 times in a row \(conflicting with other writers, or refused by the catalog\); nothing of this '
    r'cycle was written, and the next run resumes it \(last error: .*Transaction conflict')


def test_commits_that_conflict_are_retried_then_fail_naming_the_table_and_the_next_run_resumes(tmp_path):
    """Another connection alters the windows table over and over (a DuckLake commit that inserts
    into a table altered since it began conflicts): the job's commits are retried, a bounded number
    of times, after which the run fails naming the table; once the other stops, the job's tables
    are exactly those of an undisturbed run. (Two connections altering one table at once make
    DuckLake 1.4.4 itself fail with "Duplicate field_id": one is enough to conflict.)"""
    con = lake.connect(tmp_path / "host.duckdb", EXT, str(tmp_path / "meta.ducklake"), str(tmp_path / "lakedata"))
    con.execute("CREATE TABLE lake.windows (window_start_ms BIGINT, window_end_ms BIGINT, key VARCHAR, count BIGINT, "
                "sum_value DOUBLE, min_value DOUBLE, max_value DOUBLE)")
    stop = threading.Event()
    altered = [0]

    def alter(column):
        c = con.cursor()
        while not stop.is_set():
            try:
                c.execute(f"ALTER TABLE lake.windows ADD COLUMN IF NOT EXISTS {column} INTEGER")
                c.execute(f"ALTER TABLE lake.windows DROP COLUMN IF EXISTS {column}")
                altered[0] += 1
            except duckdb.Error:
                pass

    threads = [threading.Thread(target=alter, args=("scratch",))]
    for t in threads:
        t.start()
    job = con.cursor()
    failures = []
    try:
        for _ in range(6):
            try:
                job.execute(run_sql(f"file:{SKEW}", "append", extra=", max_messages := 300")).fetchall()
            except duckdb.Error as e:
                failures.append(str(e))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert altered[0] > 8
    assert all(CONFLICTED.search(f) for f in failures), failures
    job.execute(run_sql(f"file:{SKEW}", "append", extra=", flush := true")).fetchall()
    assert tables_of(con, "lake.") == reference(tmp_path, f"file:{SKEW}", "append")
    con.close()


def test_jobs_share_a_lakes_late_and_dead_tables_and_not_its_windows(tmp_path, postgres):
    """A lake has no key to catch two jobs' rows in one table: a job's windows table is its own (a
    second job naming it is refused at bind), and late events and dead letters carry the job.
    Three processes starting at once into one lake's late and dead tables write each job's rows."""
    cat, data = postgres.new_database(), str(tmp_path / "lakedata")
    con = lake.connect(tmp_path / "first.duckdb", EXT, cat, data)
    con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 1000, 200, job := 'a', windows_table := 'lake.windows', flush := true)").fetchall()
    with pytest.raises(duckdb.Error) as e:
        con.execute(f"SELECT * FROM streaming_etl_run('file:{SKEW}', 2000, 200, job := 'b', windows_table := 'lake.windows')").fetchall()
    assert ("invalid parameter 'windows_table': \"lake.windows\" holds the windows of job 'a' (1000 ms windows); "
            "give job 'b' its own windows_table (got 'lake.windows')") in str(e.value)
    con.close()
    env = {**os.environ, **lake.child_env(EXT, cat, data)}
    jobs = [subprocess.Popen([str(a) for a in [
        sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / f"h{i}.duckdb"), f"file:{SKEW}", 1000, 200,
        f"job='j{i}'", f"windows_table='lake.w{i}'", "late_table='lake.late_events'",
        "dead_letter_table='lake.dead_letters'", "flush=true"]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for i in range(3)]
    outs = [p.communicate(timeout=120) for p in jobs]
    for p, (_, err) in zip(jobs, outs):
        assert p.returncode == 0, err
    con = lake.connect(tmp_path / "check.duckdb", EXT, cat, data)
    want = reference(tmp_path, f"file:{SKEW}", "upsert")
    for job, windows in [("a", "lake.windows")] + [(f"j{i}", f"lake.w{i}") for i in range(3)]:
        got = (rows(con, WINDOWS, windows), rows(con, LATE + f" WHERE job = '{job}'", "lake.late_events"),
               rows(con, DEAD + f" WHERE job = '{job}'", "lake.dead_letters"))
        assert got == want, job
    owners = con.execute("SELECT table_name, job FROM lake.streaming_etl_tables WHERE exclusive ORDER BY ALL").fetchall()
    assert owners == [("w0", "j0"), ("w1", "j1"), ("w2", "j2"), ("windows", "a")]
    con.close()


def test_a_changelog_keeps_a_lake_table_in_runs_of_a_few_hundred_changes(tmp_path, catalog):
    """A DuckLake has no primary key: the kept table's key is `primary_key`'s, and each cycle
    deletes its changed keys and inserts their rows again in one DuckLake commit."""
    from test_changelog import COLUMNS, KEEP, changelog, expected, write_files
    parts, state, bad = changelog(random.Random(66), 120, 2500, 2)
    topic = write_files(tmp_path / "in", parts)
    cat, data = catalog
    con = lake.connect(tmp_path / "host.duckdb", EXT, cat, data)
    sql = KEEP.replace("INTO customers", "INTO lake.customers")
    status = None
    while status != "caught_up":
        status = con.execute(f"SELECT status FROM streaming_etl_sql('{topic}', $${sql}$$, envelope := 'debezium', "
                             f"primary_key := ['id'], columns := {COLUMNS}, max_messages := 700, "
                             "checkpoint_interval_ms := 20)").fetchall()[-1][0]
    got = sorted((i, n, t, None if s is None else f"{s:.2f}")
                 for i, n, t, s in con.execute("SELECT id, name, tier, score FROM lake.customers").fetchall())
    assert got == expected(state)
    assert con.execute("SELECT count(*) FROM lake.dead_letters").fetchone()[0] == bad
    con.close()
