"""The embedded file source: lines appended and files added after a run are read by the next
run, a last line without its newline waits, and a new file never disturbs the others' offsets."""
import json

from conftest import connect


def ev(key, t, v=None):
    d = {"key": key, "event_time_ms": t}
    if v is not None:
        d["payload"] = {"value": v}
    return json.dumps(d)


def test_appends_new_files_and_incomplete_lines(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    p = d / "p.ndjson"
    complete = [ev("a", 1000, 1), ev("a", 1500, 2), ev("b", 1700, 3)]
    partial = ev("a", 2600, 4)
    p.write_text("\n".join(complete) + "\n" + partial[:10])
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT events_consumed, dead_letters FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0)"
    assert con.execute(run).fetchall() == [(3, 0)]
    offset_after_first = sum(len(line) + 1 for line in complete)
    assert con.execute("SELECT next_offset FROM streaming_etl_checkpoint()").fetchall() == [(offset_after_first,)]

    # The line is completed and more is appended; a new file sorts before the old one.
    with open(p, "a") as f:
        f.write(partial[10:] + "\n" + ev("b", 3100, 5) + "\n")
    (d / "a-new.ndjson").write_text(ev("c", 2900, 6) + "\n" + ev("c", 3500, 7) + "\n")
    assert con.execute(run).fetchall() == [(4, 0)]
    rows = con.execute("SELECT partition, regexp_extract(file, '[^/]+$'), next_offset, lag FROM streaming_etl_checkpoint() ORDER BY 1").fetchall()
    assert rows == [(0, "p.ndjson", p.stat().st_size, 0), (1, "a-new.ndjson", (d / "a-new.ndjson").stat().st_size, 0)]
    # Both partitions reached 3000+: the windows up to [2000, 3000) are closed, nothing was late.
    assert con.execute("SELECT window_start_ms, key, count, sum_value FROM windows ORDER BY 1, 2").fetchall() == [
        (1000, "a", 2, 3.0), (1000, "b", 1, 3.0), (2000, "a", 1, 4.0), (2000, "c", 1, 6.0)]
    assert con.execute("SELECT count(*) FROM late_events").fetchall() == [(0,)]


def test_a_line_longer_than_the_read_buffer(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    big_key = "k" * (5 << 20)
    (d / "p.ndjson").write_text(ev(big_key, 1000, 1) + "\n" + ev("x", 3000, 1) + "\n")
    con = connect()
    # Appended: DuckDB 1.4's index refuses keys over 188 KB (`upsert` keys the windows table).
    assert con.execute(f"SELECT events_consumed, windows_emitted FROM streaming_etl_run('file:{d}/p.ndjson', 1000, 0, write_mode := 'append')").fetchall() == [(2, 1)]
    assert con.execute("SELECT length(key) FROM windows").fetchall() == [(5 << 20,)]


def test_partitions_parameter_reads_only_those_files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for i in range(3):
        (d / f"p{i}.ndjson").write_text(ev(f"k{i}", 1000 + i, 1) + "\n")
    con = connect()
    pattern = f"file:{d}/*.ndjson"
    assert con.execute(f"SELECT events_consumed, partitions FROM streaming_etl_run('{pattern}', 1000, 0, partitions := [0, 2], flush := true)").fetchall() == [(2, 2)]
    assert con.execute("SELECT key FROM windows ORDER BY 1").fetchall() == [("k0",), ("k2",)]
    assert con.execute("SELECT partition FROM streaming_etl_checkpoint() ORDER BY 1").fetchall() == [(0,), (2,)]


def test_max_runtime_stops_a_run_and_the_next_resumes(tmp_path):
    import duckdb

    from datagen import generate_sql, scan

    paths = generate_sql(duckdb.connect(), tmp_path / "in", 2_000_000, partitions=2, bad_permille=1)
    total, _ = scan(paths)
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT events_consumed, status FROM streaming_etl_run('file:{tmp_path}/in/*.ndjson', 1000, 200, max_runtime_ms := 100"
    first = con.execute(run + ")").fetchall()[-1]
    assert first[1] == "max_runtime" and 0 < first[0] < total
    done = first[0]
    while True:
        n, status = con.execute(run + ", flush := true)").fetchall()[-1]
        done += n
        if status == "caught_up":
            break
    assert done == total
    accounted = con.execute("SELECT (SELECT sum(count) FROM windows) + (SELECT count(*) FROM late_events) + (SELECT count(*) FROM dead_letters)").fetchone()[0]
    assert accounted == total
