"""The Kafka source against real brokers started here: librdkafka's mock cluster (tools/mock-kafka)
and tansu (an independent implementation, SQLite storage)."""
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from brokers import ClientMockBroker, MockBroker, committed, produce
from conftest import HERE, connect

SKEW = sorted(glob.glob("test/data/skew/*.ndjson"))


def lines_of(path):
    with open(path, "rb") as f:
        return f.read().splitlines()


def topic_name():
    return "t" + uuid.uuid4().hex[:10]


def run(con, topic, bootstrap, *named, window=1000, lateness=200):
    args = "".join(f", {n}" for n in named)
    return con.execute(
        f"SELECT * FROM streaming_etl_run('{topic}', {window}, {lateness}, brokers := '{bootstrap}'{args})").fetchall()


def skew_topic(broker):
    topic = topic_name()
    broker.create_topic(topic, 4)
    produce(broker.bootstrap, topic, [lines_of(p) for p in SKEW])
    return topic


LATE_COLS = "key, event_time_ms, payload_json, window_start_ms, window_end_ms, watermark_ms, partition"


def test_the_same_fixture_through_kafka_and_files_gives_the_same_tables(broker):
    topic = skew_topic(broker)
    k = connect()
    stats = run(k, topic, broker.bootstrap, "flush := true")[-1]
    assert stats[1] == 2000 and stats[-1] == "caught_up"
    f = connect()
    f.execute("SELECT * FROM streaming_etl_run('file:test/data/skew/*.ndjson', 1000, 200, flush := true)").fetchall()
    assert sorted(k.execute("SELECT * FROM windows").fetchall()) == sorted(f.execute("SELECT * FROM windows").fetchall())
    assert sorted(k.execute(f"SELECT {LATE_COLS} FROM late_events").fetchall()) == \
        sorted(f.execute(f"SELECT {LATE_COLS} FROM late_events").fetchall())
    assert sorted(k.execute("SELECT partition, raw, error FROM dead_letters").fetchall()) == \
        sorted(f.execute("SELECT partition, raw, error FROM dead_letters").fetchall())
    # Kafka offsets are message numbers; the topic column holds the topic.
    assert k.execute("SELECT min(\"offset\") >= 0, max(\"offset\") < 500, min(topic) FROM late_events").fetchone() == (True, True, topic)


def test_resume_in_pieces_equals_one_run(broker, tmp_path):
    topic = skew_topic(broker)
    straight = connect()
    run(straight, topic, broker.bootstrap, "flush := true", "job := 'straight'")
    db = tmp_path / "pieces.duckdb"
    for i in range(6):
        con = connect(db)
        rows = run(con, topic, broker.bootstrap, "max_messages := 300")
        assert rows[-1][1] == 300
        con.close()
    con = connect(db)
    assert run(con, topic, broker.bootstrap, "flush := true")[-1][1] == 200
    assert sorted(con.execute("SELECT * FROM windows").fetchall()) == sorted(straight.execute("SELECT * FROM windows").fetchall())
    assert sorted(con.execute(f"SELECT {LATE_COLS}, \"offset\" FROM late_events").fetchall()) == \
        sorted(straight.execute(f"SELECT {LATE_COLS}, \"offset\" FROM late_events").fetchall())


def test_wide_messages_parsed_ahead_equal_the_files_and_end_with_lag_0(broker, tmp_path):
    """Messages over 160 bytes are parsed ahead of the merge once a run has read 4,096 of them:
    runs in pieces of 5,000 end with the tables of the same lines read from files, and lag 0."""
    import random
    rng = random.Random(3)
    parts = []
    for p in range(4):
        t = 1_000_000 - (3000 if p == 3 else 0)
        lines = []
        for i in range(3000):
            t += rng.randint(0, 40)
            et = t - rng.randint(500, 3000) if rng.random() < 0.05 else t
            lines.append(json.dumps({"key": f"k{rng.randint(0, 30)}", "event_time_ms": et,
                                     "payload": {"value": rng.randint(0, 100)}, "note": "x" * rng.randint(150, 350)}))
        lines[rng.randint(0, 2999)] = '{"event_time_ms": "bad"' + "x" * 200
        parts.append(lines)
    d = tmp_path / "in"
    d.mkdir()
    for i, lines in enumerate(parts):
        (d / f"p{i}.ndjson").write_text("".join(line + "\n" for line in lines))
    files = connect()
    files.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 200, flush := true)").fetchall()
    topic = topic_name()
    broker.create_topic(topic, 4)
    produce(broker.bootstrap, topic, parts)
    con = connect(tmp_path / "k.duckdb")
    while run(con, topic, broker.bootstrap, "max_messages := 5000")[-1][-1] != "caught_up":
        pass
    run(con, topic, broker.bootstrap, "flush := true")
    assert sorted(con.execute("SELECT * FROM windows").fetchall()) == sorted(files.execute("SELECT * FROM windows").fetchall())
    assert sorted(con.execute(f"SELECT {LATE_COLS} FROM late_events").fetchall()) == \
        sorted(files.execute(f"SELECT {LATE_COLS} FROM late_events").fetchall())
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 4
    assert con.execute("SELECT sum(lag), sum(next_offset) FROM streaming_etl_checkpoint()").fetchone() == (0, 12000)


def test_offsets_are_committed_to_the_group_and_lag_is_shown(broker):
    topic = skew_topic(broker)
    con = connect()
    run(con, topic, broker.bootstrap, "max_messages := 1000", f"group_id := 'g-{topic}'")
    ckpt = dict(con.execute("SELECT partition, next_offset FROM streaming_etl_checkpoint()").fetchall())
    assert sum(ckpt.values()) == 1000
    assert committed(broker.bootstrap, f"g-{topic}", topic, 4) == ckpt
    lags = dict(con.execute("SELECT partition, lag FROM streaming_etl_checkpoint()").fetchall())
    assert {p: 500 - ckpt[p] for p in ckpt} == lags
    run(con, topic, broker.bootstrap, f"group_id := 'g-{topic}'")
    assert con.execute("SELECT sum(lag), sum(next_offset) FROM streaming_etl_checkpoint()").fetchone() == (0, 2000)


def test_the_message_key_is_the_key_when_the_json_has_none(mock):
    topic = topic_name()
    mock.create_topic(topic, 1)
    msgs = [json.dumps({"event_time_ms": 1000 + i, "payload": {"value": i}}).encode() for i in range(4)]
    produce(mock.bootstrap, topic, [msgs], key_of=lambda line: b"from-key" if b'"value": 3' not in line else None)
    con = connect()
    run(con, topic, mock.bootstrap, "flush := true")
    assert con.execute("SELECT key, count FROM windows").fetchall() == [("from-key", 3)]
    assert con.execute("SELECT \"offset\", error FROM dead_letters").fetchall() == [(3, "missing key field 'key'")]
    # A job written as SQL reads the same key as the stream's `key` (NULL where there is none).
    con.execute(f"""SELECT * FROM streaming_etl_sql('{topic}', $$ INSERT INTO keys SELECT key, "offset" FROM stream $$,
                   brokers := '{mock.bootstrap}', job := 'sqlkeys')""").fetchall()
    assert con.execute('SELECT key, "offset" FROM keys ORDER BY 2').fetchall() == [
        ("from-key", 0), ("from-key", 1), ("from-key", 2), (None, 3)]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_topics(mock, codec):
    topic = topic_name()
    mock.create_topic(topic, 2)
    msgs = [json.dumps({"key": f"k{i % 3}", "event_time_ms": 1000 + i, "payload": {"value": 1}}) for i in range(3000)]
    produce(mock.bootstrap, topic, [msgs[::2], msgs[1::2]], compression=codec)
    con = connect()
    assert run(con, topic, mock.bootstrap, "flush := true")[-1][1] == 3000
    assert con.execute("SELECT sum(count), sum(sum_value) FROM windows").fetchone() == (3000, 3000.0)


def test_two_processes_splitting_the_partitions_equal_one(mock, tmp_path):
    topic = topic_name()
    mock.create_topic(topic, 4)
    # Keys live in one partition each (as with Kafka's key partitioning); late events are far
    # behind, so any process's watermark judges them the same way.
    parts = [[json.dumps({"key": f"p{p}k{i % 7}", "event_time_ms": 100_000 + i * 10 - (5000 if i % 37 == 5 else 0),
                          "payload": {"value": i % 11}}) for i in range(3000)] for p in range(4)]
    produce(mock.bootstrap, topic, parts)
    one = connect()
    run(one, topic, mock.bootstrap, "flush := true")
    procs = [subprocess.run([sys.executable, os.path.join(HERE, "run_job.py"), str(tmp_path / f"{name}.duckdb"), topic,
                             "1000", "200", f"brokers='{mock.bootstrap}'", f"partitions={parts_}", "flush=true"],
                            capture_output=True, text=True, timeout=120)
             for name, parts_ in (("a", "[0, 1]"), ("b", "[2, 3]"))]
    for p in procs:
        assert p.returncode == 0, p.stderr
    both = connect()
    both.execute(f"ATTACH '{tmp_path}/a.duckdb' AS a (READ_ONLY); ATTACH '{tmp_path}/b.duckdb' AS b (READ_ONLY)")
    merged = both.execute("SELECT * FROM a.windows UNION ALL SELECT * FROM b.windows").fetchall()
    assert sorted(merged) == sorted(one.execute("SELECT * FROM windows").fetchall())
    late = both.execute("SELECT partition, \"offset\" FROM a.late_events UNION ALL SELECT partition, \"offset\" FROM b.late_events").fetchall()
    assert sorted(late) == sorted(one.execute("SELECT partition, \"offset\" FROM late_events").fetchall())
    assert len(late) > 0


def test_a_broker_that_goes_away_fails_the_run_and_the_next_resumes_exactly(tmp_path):
    broker = MockBroker()
    try:
        topic = topic_name()
        broker.create_topic(topic, 2)
        n = 300_000
        parts = [[b'{"key":"k%d","event_time_ms":%d}' % (i % 10, 1_000_000 + i) for i in range(p, n, 2)] for p in range(2)]
        produce(broker.bootstrap, topic, parts, compression="lz4")
        db = tmp_path / "down.duckdb"
        con = connect(db)
        result = {}

        def go():
            try:
                result["rows"] = run(con, topic, broker.bootstrap, "timeout_ms := 2000", "checkpoint_interval_ms := 20")
            except Exception as e:  # noqa: BLE001
                result["error"] = str(e)

        t = threading.Thread(target=go)
        t.start()
        # The broker goes away once the run committed a cycle (a loaded machine may take longer
        # than any fixed pause to get there), while it still has most of the topic to read.
        probe = con.cursor()
        deadline = time.time() + 60
        while t.is_alive() and time.time() < deadline:
            if probe.execute("SELECT coalesce(sum(next_offset), 0) FROM streaming_etl_checkpoint()").fetchone()[0] > 0:
                break
            time.sleep(0.005)
        probe.close()
        broker.command("down 1")
        t.join(timeout=60)
        assert not t.is_alive(), "the run hung with the broker down"
        if "error" in result:
            assert "no message from partition" in result["error"] or "cannot reach" in result["error"], result["error"]
            done = con.execute("SELECT sum(next_offset) FROM streaming_etl_checkpoint()").fetchone()[0]
            assert done is not None and 0 < done < n, "what was processed before the failure is checkpointed"
        broker.command("up 1")
        run(con, topic, broker.bootstrap, "flush := true")
        assert con.execute("SELECT sum(count) FROM windows").fetchone()[0] == n
    finally:
        broker.stop()


def test_fetch_errors_latency_and_a_leader_move_are_ridden_out():
    broker = MockBroker(3)
    try:
        topic = topic_name()
        broker.create_topic(topic, 3)
        n = 60_000
        parts = [[b'{"key":"k%d","event_time_ms":%d}' % (i % 10, 1_000_000 + i) for i in range(p, n, 3)] for p in range(3)]
        produce(broker.bootstrap, topic, parts)
        broker.command("errors Fetch 8 6")
        broker.command("errors ListOffsets 2 7")
        broker.command("rtt 1 100")
        con = connect()
        half = run(con, topic, broker.bootstrap, "max_messages := 30000")[-1]
        assert half[1] == 30000
        broker.command("leader " + topic + " 0 2")
        broker.command("errors OffsetCommit 3 16")
        run(con, topic, broker.bootstrap, "flush := true")
        assert con.execute("SELECT sum(count) FROM windows").fetchone()[0] == n
    finally:
        broker.stop()


def test_unreachable_broker_fails_within_the_default_timeout():
    con = connect()
    started = time.monotonic()
    with pytest.raises(Exception) as e:
        run(con, "orders", "127.0.0.1:1")
    assert "cannot reach Kafka brokers '127.0.0.1:1' within 15000 ms" in str(e.value)
    # Bounded: the run gave up instead of hanging (not a speed assertion).
    assert time.monotonic() - started < 30


def test_unknown_topic_and_missing_partitions_are_named(mock):
    con = connect()
    with pytest.raises(Exception) as e:
        run(con, "no-such-topic", mock.bootstrap, "timeout_ms := 5000")
    assert f"topic 'no-such-topic' does not exist on '{mock.bootstrap}'" in str(e.value)
    topic = topic_name()
    mock.create_topic(topic, 2)
    with pytest.raises(Exception) as e:
        run(con, topic, mock.bootstrap, "partitions := [1, 5]")
    assert "partitions [5] do not exist" in str(e.value)


def test_failed_authentication_fails_clearly(mock):
    con = connect()
    with pytest.raises(Exception) as e:
        run(con, "orders", mock.bootstrap, "timeout_ms := 3000",
            "kafka := MAP {'security.protocol': 'SASL_PLAINTEXT', 'sasl.mechanism': 'PLAIN', "
            "'sasl.username': 'u', 'sasl.password': 'wrong'}")
    assert f"cannot reach Kafka brokers '{mock.bootstrap}'" in str(e.value)


def test_kafka_properties_pass_through_and_bad_ones_are_named(mock):
    topic = skew_topic(mock)
    con = connect()
    rows = run(con, topic, mock.bootstrap, "kafka := MAP {'fetch.min.bytes': '1', 'client.id': 'mine'}")
    assert rows[-1][1] == 2000
    with pytest.raises(Exception) as e:
        run(con, topic, mock.bootstrap, "job := 'x'", "windows_table := 'wx'", "kafka := MAP {'no.such.property': '1'}")
    assert "invalid Kafka configuration" in str(e.value) and "no.such.property" in str(e.value)
    # Values with the characters DuckDB's MAP text quotes (, = ' \ and spaces) arrive intact.
    tricky = "1, x='y' \\z"
    with pytest.raises(Exception) as e:
        run(con, topic, mock.bootstrap, "job := 'y'", "windows_table := 'wy'", f"kafka := MAP {{'security.protocol': '{tricky.replace(chr(39), chr(39) * 2)}'}}")
    assert tricky in str(e.value), str(e.value)


def test_partitions_the_job_has_not_seen_are_read_from_the_start(mock):
    # Neither test broker can add partitions to a topic (no CreatePartitions), so this takes the
    # same path another way: the job first knows partitions 0-1 only; the next run finds 2 more.
    topic = topic_name()
    mock.create_topic(topic, 4)
    produce(mock.bootstrap, topic, [[json.dumps({"key": f"p{p}", "event_time_ms": 1000 + i}) for i in range(10)] for p in range(4)])
    con = connect()
    first = run(con, topic, mock.bootstrap, "partitions := [0, 1]")[-1]
    assert (first[1], first[9]) == (20, 2)
    second = run(con, topic, mock.bootstrap, "flush := true")[-1]
    assert (second[1], second[9]) == (20, 4)
    assert con.execute("SELECT key, count FROM windows ORDER BY 1").fetchall() == [("p0", 10), ("p1", 10), ("p2", 10), ("p3", 10)]
    assert con.execute("SELECT partition, next_offset FROM streaming_etl_checkpoint() ORDER BY 1").fetchall() == [(0, 10), (1, 10), (2, 10), (3, 10)]


def test_messages_deleted_by_retention_before_they_were_read_are_a_dead_letter(mock):
    # The mock broker keeps 5 MiB per partition and drops older data, like retention would.
    topic = topic_name()
    mock.create_topic(topic, 1)
    produce(mock.bootstrap, topic, [[json.dumps({"key": "a", "event_time_ms": 1000 + i}) for i in range(100)]])
    con = connect()
    assert run(con, topic, mock.bootstrap, "max_messages := 10")[-1][1] == 10
    pad = "x" * 200
    produce(mock.bootstrap, topic, [[json.dumps({"key": "a", "event_time_ms": 2000 + i, "pad": pad}) for i in range(40000)]])
    rows = run(con, topic, mock.bootstrap)[-1]
    (offset, error), = con.execute('SELECT "offset", error FROM dead_letters').fetchall()
    first_kept = int(error.split(" to ")[1].split(" ")[0]) + 1
    assert offset == 10 and error.endswith("were deleted by the broker (retention) before this job read them")
    assert rows[4] == 1 and rows[1] == 40100 - first_kept
    assert con.execute("SELECT next_offset FROM streaming_etl_checkpoint()").fetchone()[0] == 40100


def test_record_timestamps_as_event_time(broker):
    """kafka_timestamp := true: the record's own timestamp (set by the producer here) is the
    event time; the payload need not have a time field."""
    from confluent_kafka import Producer

    topic = topic_name()
    broker.create_topic(topic, 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    base = 1_700_000_000_000
    sent = []
    for i in range(40):
        part, ts = i % 2, base + i * 250
        value = json.dumps({"key": f"k{i % 3}", "payload": {"value": i}})
        p.produce(topic, value=value, partition=part, timestamp=ts)
        sent.append((part, ts, f"k{i % 3}", i))
    assert p.flush(30) == 0
    con = connect()
    stats = run(con, topic, broker.bootstrap, "kafka_timestamp := true", "flush := true", lateness=0)[-1]
    assert stats[1] == 40 and stats[3] == 0 and stats[4] == 0, stats
    want = {}
    for _, ts, key, v in sent:
        w = want.setdefault(((ts // 1000) * 1000, key), [0, 0.0])
        w[0] += 1
        w[1] += v
    got = {(s, k): [c, sv] for s, k, c, sv in con.execute("SELECT window_start_ms, key, count, sum_value FROM windows").fetchall()}
    assert got == want
    # The job remembers that it reads record timestamps.
    with pytest.raises(Exception, match="was checkpointed with kafka_timestamp = true"):
        run(con, topic, broker.bootstrap, lateness=0)


@pytest.fixture(params=["mock-2.16", "tansu"])
def txn_broker(request):
    if request.param == "tansu":
        yield request.getfixturevalue("tansu")
        return
    b = ClientMockBroker()
    yield b
    b.stop()


def test_a_transactional_topic_ends_with_lag_0(txn_broker):
    """Committed and aborted transactions: after the partition's end, the checkpoint's next
    offset is past the final commit marker, so lag is 0 (not 1 forever), and a next run reads
    nothing. (The aborted transaction's messages are never sent here: the mock broker does not
    filter aborted messages for read_committed consumers, a real broker does.)"""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    broker = txn_broker
    topic = topic_name()
    broker.create_topic(topic, 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-" + topic,
                  "transaction.timeout.ms": 10000, "linger.ms": 5000})
    try:
        p.init_transactions(20)
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=json.dumps({"key": "committed", "event_time_ms": i * 100, "payload": {"value": 1}}), partition=0)
        p.commit_transaction(20)
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, value=json.dumps({"key": "aborted", "event_time_ms": i * 100, "payload": {"value": 100}}), partition=i % 2)
        p.abort_transaction(20)
        p.begin_transaction()
        for i in range(7):
            p.produce(topic, value=json.dumps({"key": "committed", "event_time_ms": 1000 + i * 100, "payload": {"value": 1}}), partition=i % 2)
        p.commit_transaction(20)
    except KafkaException as e:
        if "not supported by broker" in str(e):
            pytest.skip(f"{broker.name} does not support transactions: {e}")
        raise
    con = connect()
    stats = run(con, topic, broker.bootstrap, "flush := true", lateness=0)[-1]
    assert stats[1] == 17 and stats[4] == 0, stats
    assert con.execute("SELECT key, sum(count), sum(sum_value) FROM windows GROUP BY 1").fetchall() == [("committed", 17, 17.0)]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "probe-" + topic})
    try:
        highs = {q: c.get_watermark_offsets(TopicPartition(topic, q), timeout=20)[1] for q in range(2)}
    finally:
        c.close()
    rows = con.execute("SELECT partition, next_offset, end_offset, lag FROM streaming_etl_checkpoint() WHERE partition < 2 ORDER BY 1").fetchall()
    assert rows == [(q, highs[q], highs[q], 0) for q in range(2)], (rows, highs)
    # The markers are there: the ends are past the 10 + 4 and 3 data messages.
    assert highs[0] > 14 and highs[1] > 3, highs
    # The next run reads nothing and stays at lag 0.
    assert run(con, topic, broker.bootstrap, lateness=0)[-1][1] == 0
    assert con.execute("SELECT max(lag) FROM streaming_etl_checkpoint()").fetchone()[0] == 0


def test_follow_reads_messages_as_they_arrive(broker):
    """follow := true on a topic: messages produced while the run goes on are read; closed
    windows and the checkpoint's lag are visible from other connections during the run; the
    run stops at max_runtime_ms with every message in exactly one place."""
    from test_follow import Background, totals, wait_for

    topic = topic_name()
    broker.create_topic(topic, 2)

    def step_lines(step):
        return [[json.dumps({"key": f"p{q}", "event_time_ms": step * 1000 + i * 100, "payload": {"value": 1}})
                 for i in range(10)] for q in range(2)]

    produce(broker.bootstrap, topic, step_lines(0))
    con = connect()
    watcher = con.cursor()
    run_ = Background(con.cursor(), f"""SELECT * FROM streaming_etl_run('{topic}', 1000, 0, brokers := '{broker.bootstrap}',
        follow := true, max_runtime_ms := 15000, checkpoint_interval_ms := 200)""")
    wait_for(lambda: watcher.execute("SELECT count(*) FROM streaming_etl_checkpoint()").fetchone()[0] == 2)
    for step in range(1, 5):
        produce(broker.bootstrap, topic, step_lines(step))
        wait_for(lambda: watcher.execute("SELECT max(window_end_ms) FROM windows").fetchone()[0] == step * 1000)
        assert run_.thread.is_alive()
    wait_for(lambda: watcher.execute("SELECT sum(next_offset) FROM streaming_etl_checkpoint()").fetchone()[0] == 100)
    assert watcher.execute("SELECT max(lag) FROM streaming_etl_checkpoint()").fetchone()[0] == 0
    rows = run_.join(timeout=60)
    assert rows[-1][1] == 100 and rows[-1][-1] == "max_runtime" and len(rows) > 5
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 0, brokers := '{broker.bootstrap}', flush := true)").fetchall()
    assert totals(con) == (100, 0, 0)


def test_start_latest_and_at_a_point_in_time(broker):
    from confluent_kafka import Producer

    topic = topic_name()
    broker.create_topic(topic, 2)
    base = 1_700_000_000_000
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    for i in range(20):
        p.produce(topic, value=json.dumps({"key": "old", "event_time_ms": base + i * 1000}), partition=i % 2,
                  timestamp=base + i * 1000)
    assert p.flush(30) == 0
    con = connect()
    # (Each job its own windows table: a windows table is one job's.)
    # 'latest': the first run starts at the end; what is produced after it is read.
    assert run(con, topic, broker.bootstrap, "start := 'latest'", "job := 'latest'", "windows_table := 'w_latest'")[-1][1] == 0
    produce(broker.bootstrap, topic, [[json.dumps({"key": "new", "event_time_ms": base + 50_000})]] * 2)
    assert run(con, topic, broker.bootstrap, "start := 'latest'", "job := 'latest'", "windows_table := 'w_latest'")[-1][1] == 2
    # 'earliest' (the default) reads everything.
    assert run(con, topic, broker.bootstrap, "job := 'earliest'", "windows_table := 'w_earliest'")[-1][1] == 22
    # A point in time: the offsets for the records' timestamps (epoch ms or ISO 8601).
    if broker.name == "mock":
        pytest.skip("librdkafka's mock cluster does not look up offsets for times")
    assert run(con, topic, broker.bootstrap, f"start := '{base + 10_000}'", "job := 'by-ms'", "windows_table := 'w_ms'")[-1][1] == 12
    assert run(con, topic, broker.bootstrap, "start := '2023-11-14 22:13:30'", "job := 'by-iso'", "windows_table := 'w_iso'")[-1][1] == 12
