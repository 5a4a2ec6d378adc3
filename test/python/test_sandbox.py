"""DuckDB's sandbox holds: with enable_external_access = false the extension reads only allowed
files (no `..` or symlink escape, no listing of forbidden directories), connects to no broker,
opens no checkpoint at a path that is not allowed, and a job resumes exactly across the change."""
import json
import os

import duckdb
import pytest

from conftest import connect


def write(path, events):
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def events(n, key="k", start=0):
    return [{"key": key, "event_time_ms": start + i * 100, "payload": {"value": i}} for i in range(n)]


def locked(db, allowed_dirs=(), allowed_paths=()):
    con = connect(db)
    if allowed_dirs:
        con.execute(f"SET allowed_directories = {[str(d) for d in allowed_dirs]}")
    if allowed_paths:
        con.execute(f"SET allowed_paths = {[str(p) for p in allowed_paths]}")
    con.execute("SET enable_external_access = false")
    return con


def refused(con, sql):
    with pytest.raises(Exception) as e:
        con.execute(sql).fetchall()
    assert "enable_external_access" in str(e.value), str(e.value)
    return str(e.value)


@pytest.fixture
def layout(tmp_path):
    allowed = tmp_path / "allowed"
    outside = tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    write(allowed / "a.ndjson", events(20))
    write(outside / "secret.ndjson", events(5, key="secret"))
    return tmp_path, allowed, outside


def test_files_under_allowed_directories_are_read(layout):
    tmp, allowed, _ = layout
    con = locked(tmp / "db.duckdb", allowed_dirs=[allowed])
    n = con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('file:{allowed}/*.ndjson', 1000, 0)").fetchone()[0]
    assert n == 20
    # The default checkpoint beside the database is the database's own state: allowed.
    assert os.path.exists(tmp / "db.duckdb.streaming_etl.sqlite")
    assert con.execute("SELECT count(*) FROM streaming_etl_checkpoint()").fetchone()[0] == 1


def test_escapes_are_refused_before_anything_is_created(layout):
    tmp, allowed, outside = layout
    # A symlink inside the allowed directory to a file outside it, and one to the directory.
    os.symlink(outside / "secret.ndjson", allowed / "link.ndjson")
    os.symlink(outside, allowed / "linkdir")
    con = locked(tmp / "db.duckdb", allowed_dirs=[allowed])
    for pattern in [f"{outside}/secret.ndjson",
                    f"{allowed}/../outside/secret.ndjson",
                    f"{allowed}/*.ndjson",            # matches link.ndjson
                    f"{allowed}/link.ndjson",
                    f"{allowed}/linkdir/*.ndjson",
                    f"{allowed}/**/*.ndjson",
                    f"{tmp}/*/secret.ndjson",          # lists a forbidden directory
                    "/etc/passwd"]:
        refused(con, f"SELECT * FROM streaming_etl_run('file:{pattern}', 1000, 0)")
    refused(con, "SELECT * FROM streaming_etl_run('orders', 1000, 0, brokers := '127.0.0.1:9')")
    refused(con, f"SELECT * FROM streaming_etl_run('file:{allowed}/a.ndjson', 1000, 0, checkpoint := '{outside}/ck.sqlite')")
    refused(con, f"SELECT * FROM streaming_etl_checkpoint(checkpoint := '{outside}/ck.sqlite')")
    # A checkpoint file through a symlink out of the allowed directory.
    refused(con, f"SELECT * FROM streaming_etl_run('file:{allowed}/a.ndjson', 1000, 0, checkpoint := '{allowed}/linkdir/ck.sqlite')")
    assert not os.path.exists(outside / "ck.sqlite")
    assert not os.path.exists(tmp / "db.duckdb.streaming_etl.sqlite")
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name IN ('windows', 'late_events', 'dead_letters')").fetchone()[0] == 0


@pytest.mark.skipif(tuple(map(int, duckdb.__version__.split(".")[:2])) < (1, 5),
                    reason="DuckDB 1.4 registers no settings (the named parameter is checked above)")
def test_checkpoint_setting_is_checked_like_the_argument(layout):
    tmp, allowed, outside = layout
    con = connect(tmp / "db.duckdb")
    con.execute(f"SET streaming_etl_checkpoint = '{outside}/ck.sqlite'")
    con.execute(f"SET allowed_directories = ['{allowed}']")
    con.execute("SET enable_external_access = false")
    refused(con, f"SELECT * FROM streaming_etl_run('file:{allowed}/a.ndjson', 1000, 0)")
    assert not os.path.exists(outside / "ck.sqlite")
    # An explicit checkpoint inside an allowed directory is fine.
    n = con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('file:{allowed}/a.ndjson', 1000, 0, checkpoint := '{allowed}/ck.sqlite')").fetchone()[0]
    assert n == 20


def test_allowed_paths_are_exact(layout):
    tmp, allowed, _ = layout
    write(allowed / "b.ndjson", events(3, key="b"))
    con = locked(tmp / "db.duckdb", allowed_paths=[allowed / "a.ndjson"])
    assert con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('file:{allowed}/a.ndjson', 1000, 0)").fetchone()[0] == 20
    refused(con, f"SELECT * FROM streaming_etl_run('file:{allowed}/b.ndjson', 1000, 0, job := 'b')")
    refused(con, f"SELECT * FROM streaming_etl_run('file:{allowed}/*.ndjson', 1000, 0, job := 'all')")


def test_job_resumes_exactly_across_lock_down(layout):
    tmp, allowed, _ = layout
    db = tmp / "db.duckdb"
    src = f"file:{allowed}/a.ndjson"
    con = connect(db)
    assert con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('{src}', 1000, 0, max_messages := 7)").fetchone()[0] == 7
    con.close()
    con = locked(db, allowed_dirs=[allowed])
    with open(allowed / "a.ndjson", "a") as f:
        for e in events(5, start=2000):
            f.write(json.dumps(e) + "\n")
    assert con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('{src}', 1000, 0, max_messages := 10)").fetchone()[0] == 10
    con.execute("SET lock_configuration = true")
    with pytest.raises(Exception):
        con.execute("SET enable_external_access = true")
    refused(con, "SELECT * FROM streaming_etl_run('orders', 1000, 0)")
    con.close()
    con = connect(db)  # open access again
    assert con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('{src}', 1000, 0, flush := true)").fetchone()[0] == 8
    total = con.execute('SELECT sum("count") FROM windows').fetchone()[0]
    late = con.execute("SELECT count(*) FROM late_events").fetchone()[0]
    dead = con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    assert total + late + dead == 25
