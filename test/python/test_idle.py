"""idle_timeout_ms: a partition that delivers nothing for that long (wall clock) stops holding
the global watermark back until it delivers again."""
import json
import time

from conftest import connect


def line(key, t):
    return json.dumps({"key": key, "event_time_ms": t, "payload": {"value": 1}}) + "\n"


def test_a_silent_partition_holds_the_watermark_until_it_is_idle(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "p0.ndjson").write_text("".join(line("a", t) for t in (1000, 2000, 3000)))
    (d / "p1.ndjson").write_text("")
    con = connect(tmp_path / "db.duckdb")
    run = f"SELECT windows_emitted, watermark_ms FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, idle_timeout_ms := 200)"
    # p1 has delivered nothing: as in Flink, it holds the global watermark back.
    assert con.execute(run).fetchall() == [(0, None)]
    time.sleep(0.4)
    with open(d / "p0.ndjson", "a") as f:
        f.write(line("a", 4000))
    # p1 has now been silent for longer than the idle timeout: p0 alone moves the watermark.
    assert con.execute(run).fetchall() == [(3, 4000)]
    # p1 wakes up behind the watermark: its old event is late, and the watermark does not go back.
    with open(d / "p1.ndjson", "a") as f:
        f.write(line("b", 1500))
    assert con.execute(f"SELECT late_events, watermark_ms FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0, idle_timeout_ms := 200)").fetchall() == [(1, 4000)]
    assert con.execute("SELECT key, event_time_ms, watermark_ms, partition FROM late_events").fetchall() == [("b", 1500, 4000, 1)]


def test_without_idle_timeout_a_silent_partition_holds_it_for_good(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "p0.ndjson").write_text("".join(line("a", t) for t in (1000, 2000, 3000)))
    (d / "p1.ndjson").write_text("")
    con = connect()
    run = f"SELECT windows_emitted FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 0)"
    assert con.execute(run).fetchall() == [(0,)]
    time.sleep(0.3)
    with open(d / "p0.ndjson", "a") as f:
        f.write(line("a", 9000))
    assert con.execute(run).fetchall() == [(0,)]
