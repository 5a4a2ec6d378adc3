"""Files as they are laid out in production (SPEC 13): hourly files with and without the rolling
rule, log rotation by rename, deleted files, gzip and zstd archives, a mix of them; each with
exact accounting (every event in exactly one of windows, late_events, dead_letters, or still
open)."""
import json
import os

import pytest

from conftest import connect

HOUR = 10_000  # one "hour" of event time in these tests (ms)


def ev(key, t, v=1):
    return json.dumps({"key": key, "event_time_ms": t, "payload": {"value": v}})


def hourly(d, hours, per_hour=20, keys=3):
    """events-00.ndjson, events-01.ndjson, ...: each hour's events in order, in its own file."""
    total = 0
    for h in range(hours):
        lines = [ev(f"k{i % keys}", h * HOUR + i * (HOUR // per_hour), i) for i in range(per_hour)]
        (d / f"events-{h:02d}.ndjson").write_text("\n".join(lines) + "\n")
        total += per_hour
    return total


def accounted(con, job=None):
    """Events in windows + late + dead + still in open windows (from the open windows' count:
    flush them in a throwaway copy is not possible, so the caller flushes when it needs totals)."""
    w = con.execute('SELECT coalesce(sum("count"), 0) FROM windows').fetchone()[0]
    late = con.execute("SELECT count(*) FROM late_events").fetchone()[0]
    dead = con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    return w, late, dead


def watermark(con):
    return con.execute("SELECT max(global_watermark_ms) FROM streaming_etl_checkpoint()").fetchone()[0]


def closed_until(con):
    return con.execute("SELECT max(window_end_ms) FROM windows").fetchone()[0]


@pytest.mark.parametrize("rolling", [False, True])
def test_hourly_files(tmp_path, rolling):
    d = tmp_path / "in"
    d.mkdir()
    total = hourly(d, 3)
    con = connect(tmp_path / "db.duckdb")
    opt = ", files := 'rolling'" if rolling else ""
    run = f"SELECT max(events_consumed) FROM streaming_etl_run('file:{d}/events-*.ndjson', 1000, 0{opt})"
    assert con.execute(run).fetchone()[0] == total
    last_event = 2 * HOUR + 19 * (HOUR // 20)
    if rolling:
        # The finished hours no longer hold the watermark: it is the newest file's.
        assert watermark(con) == last_event
        assert closed_until(con) == (last_event // 1000) * 1000
        statuses = con.execute("SELECT regexp_extract(file, '[^/]+$'), status FROM streaming_etl_checkpoint() ORDER BY 1").fetchall()
        assert statuses == [("events-00.ndjson", "released"), ("events-01.ndjson", "released"), ("events-02.ndjson", "active")]
    else:
        # Today's rule: every file may still grow, so the oldest one holds the watermark back.
        assert watermark(con) == 19 * (HOUR // 20)
        assert closed_until(con) == (19 * (HOUR // 20) // 1000) * 1000
    # A new hour arrives: read by the next run; under the rolling rule it moves the watermark on.
    (d / "events-03.ndjson").write_text("\n".join(ev("k0", 3 * HOUR + i * 500) for i in range(20)) + "\n")
    assert con.execute(run).fetchone()[0] == 20
    if rolling:
        assert watermark(con) == 3 * HOUR + 19 * 500
    # A line appended to a finished hour is still read (late: its window was closed).
    with open(d / "events-00.ndjson", "a") as f:
        f.write(ev("k0", 100) + "\n")
    assert con.execute(run).fetchone()[0] == 1
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/events-*.ndjson', 1000, 0{opt}, flush := true)").fetchall()
    w, late, dead = accounted(con)
    assert (w + late + dead) == total + 21
    assert late == 1
    assert dead == 0


@pytest.mark.parametrize("rolling", [False, True])
def test_deleted_file_is_handled_like_a_kept_one(tmp_path, rolling):
    """Deleting a finished file gives the same watermark as keeping it, under either rule, and
    the checkpoint shows it as deleted."""
    results = []
    for delete in (False, True):
        d = tmp_path / f"in-{delete}"
        d.mkdir()
        hourly(d, 3)
        con = connect(tmp_path / f"db-{delete}.duckdb")
        opt = ", files := 'rolling'" if rolling else ""
        run = f"SELECT max(events_consumed) FROM streaming_etl_run('file:{d}/events-*.ndjson', 1000, 0{opt})"
        assert con.execute(run).fetchone()[0] == 60
        if delete:
            os.remove(d / "events-00.ndjson")
        (d / "events-03.ndjson").write_text(ev("k0", 3 * HOUR + 500) + "\n")
        assert con.execute(run).fetchone()[0] == 1
        status = con.execute("SELECT status FROM streaming_etl_checkpoint() WHERE file LIKE '%events-00.ndjson'").fetchone()[0]
        if delete:
            assert status == "deleted"
        results.append((watermark(con), closed_until(con), accounted(con)))
        # The next run of the job with the file still gone reads nothing and is not an error.
        assert con.execute(run).fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
    assert results[0] == results[1]


def test_deleted_before_read_to_the_end_is_a_dead_letter(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.ndjson").write_text("\n".join(ev("a", i * 100) for i in range(10)) + "\n")
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT coalesce(max(events_consumed), 0) FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, max_messages := 4)"
    assert con.execute(run).fetchone()[0] == 4
    os.remove(d / "a.ndjson")
    (d / "b.ndjson").write_text(ev("b", 5000) + "\n")
    assert con.execute(run).fetchone()[0] == 1
    dead = con.execute("SELECT partition, \"offset\", error FROM dead_letters").fetchall()
    assert len(dead) == 1 and "deleted" in dead[0][2] and dead[0][1] > 0, dead
    # Reported once.
    assert con.execute(run).fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 1


@pytest.mark.parametrize("glob", ["app.ndjson*", "app.ndjson"])
def test_rename_rotation_keeps_the_partition(tmp_path, glob):
    d = tmp_path / "logs"
    d.mkdir()
    app = d / "app.ndjson"
    app.write_text("\n".join(ev("a", i * 100) for i in range(10)) + "\n")
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT coalesce(max(events_consumed), 0) FROM streaming_etl_run('file:{d}/{glob}', 1000, 0)"
    limited = run.replace("1000, 0)", "1000, 0, max_messages := 6)")
    assert con.execute(limited).fetchone()[0] == 6
    # The writer keeps writing to its open file after the rename, then a new file starts.
    with open(app, "a") as f:
        os.rename(app, d / "app.ndjson.1")
        f.write("\n".join(ev("a", 1000 + i * 100) for i in range(5)) + "\n")
    app.write_text("\n".join(ev("b", 1500 + i * 100) for i in range(7)) + "\n")
    assert con.execute(run).fetchone()[0] == 4 + 5 + 7
    rows = con.execute("SELECT partition, regexp_extract(file, '[^/]+$'), lag FROM streaming_etl_checkpoint() ORDER BY 1").fetchall()
    assert rows == [(0, "app.ndjson.1", 0), (1, "app.ndjson", 0)]
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/{glob}', 1000, 0, flush := true)").fetchall()
    w, late, dead = accounted(con)
    assert (w, late, dead) == (22, 0, 0)


def test_copytruncate_is_an_error(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    app = d / "app.ndjson"
    app.write_text("\n".join(ev("a", i * 100) for i in range(10)) + "\n")
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT * FROM streaming_etl_run('file:{d}/app.ndjson', 1000, 0)"
    con.execute(run).fetchall()
    with open(app, "r+") as f:
        f.truncate(0)
    f = open(app, "w")
    f.write(ev("a", 5000) + "\n")
    f.close()
    with pytest.raises(Exception) as e:
        con.execute(run).fetchall()
    assert "copytruncate" in str(e.value)


def compressed(con, path, codec, rows):
    con.execute(f"""COPY (SELECT 'z' || (i % 3) AS key, i * 100 AS event_time_ms, {{'value': i}} AS payload
                       FROM range({rows}) t(i)) TO '{path}' (FORMAT json, COMPRESSION {codec})""")


@pytest.mark.parametrize("codec,suffix", [("gzip", "gz"), ("zstd", "zst")])
def test_compressed_files(tmp_path, codec, suffix):
    d = tmp_path / "in"
    d.mkdir()
    con = connect(tmp_path / "db.duckdb")
    compressed(con, d / f"part.ndjson.{suffix}", codec, 1000)
    run = f"SELECT coalesce(max(events_consumed), 0) FROM streaming_etl_run('file:{d}/*', 1000, 0"
    # Stopped part way and resumed: offsets are positions in the decompressed stream.
    assert con.execute(run + ", max_messages := 333)").fetchone()[0] == 333
    with open(d / f"part.ndjson.{suffix}", "rb") as f:
        raw = f.read()
    import gzip
    if suffix == "gz":
        text = gzip.decompress(raw)
        # The offset is the position in the decompressed stream, right after the 333rd line.
        assert con.execute("SELECT next_offset FROM streaming_etl_checkpoint()").fetchone()[0] == len(b"".join(text.split(b"\n")[:333])) + 333
    assert con.execute(run + ", flush := true)").fetchone()[0] == 667
    assert con.execute(run + ")").fetchone()[0] == 0
    ours = con.execute('SELECT key, window_start_ms, "count", sum_value FROM windows ORDER BY 1, 2').fetchall()
    theirs = con.execute(f"""SELECT key, event_time_ms // 1000 * 1000 AS ws, count(*), sum(payload.value)::DOUBLE
                             FROM read_ndjson('{d}/part.ndjson.{suffix}') GROUP BY ALL ORDER BY 1, 2""").fetchall()
    assert ours == theirs
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0


def test_mix_of_compressed_and_plain_files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    con = connect(tmp_path / "db.duckdb")
    compressed(con, d / "a.ndjson.gz", "gzip", 500)
    compressed(con, d / "b.ndjson.zst", "zstd", 400)
    (d / "c.ndjson").write_text("\n".join(ev("z0", i * 100, i) for i in range(300)) + "\n")
    n = con.execute(f"SELECT max(events_consumed) FROM streaming_etl_run('file:{d}/*', 1000, 0, flush := true)").fetchone()[0]
    assert n == 1200
    w, late, dead = accounted(con)
    assert w + late + dead == 1200 and dead == 0


def test_damaged_compressed_file_is_a_dead_letter(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    con = connect(tmp_path / "db.duckdb")
    compressed(con, d / "a.ndjson.gz", "gzip", 2000)
    data = (d / "a.ndjson.gz").read_bytes()
    (d / "a.ndjson.gz").write_bytes(data[: len(data) // 2])
    (d / "b.ndjson").write_text(ev("b", 100) + "\n")
    res = con.execute(f"SELECT max(events_consumed), sum(dead_letters) FROM streaming_etl_run('file:{d}/*', 1000, 0)").fetchone()
    assert res[1] >= 1
    errors = con.execute("SELECT error FROM dead_letters").fetchall()
    assert any("a.ndjson.gz" in e[0] or "compressed" in e[0] for e in errors), errors
