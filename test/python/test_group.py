"""`subscribe := true`: several processes share a topic through Kafka's consumer group, each
partition a task of its own whose state is committed into the output DuckLake with its rows.
Processes join, are killed with SIGKILL and are paused past the session timeout while a producer
writes; at the end the rows equal one straight single-process `subscribe` run over the same
messages, on librdkafka's mock cluster and on tansu, with the lake's catalog in PostgreSQL.
Two members racing on the same partitions write each row once.

Runs on the DuckDB 1.4 host (DuckLake); other hosts skip it."""
import signal
import threading
import time
import uuid

import duckdb
import pytest

import lake
from group import (EXT, GROUP_KAFKA, PARTITIONS, Member, assert_same, bounded_runs, ends, group_job,
                   job_args, lake_env, messages, new_lake, owned, send, straight, tables, wait_for,
                   wait_until_committed)

pytestmark = pytest.mark.skipif(
    not lake.HAVE_LAKE,
    reason=f"DuckLake's extensions exist for DuckDB 1.4.4 only (this host is {duckdb.__version__}); make pytest runs this file on .venv/lts")


def test_members_that_join_die_and_pause_lose_and_double_nothing(tmp_path, postgres, broker):
    topic, con, env, args = group_job(tmp_path, postgres, broker, "group", "follow=true",
                                      "max_runtime_ms=600000", "checkpoint_interval_ms=300")
    send(broker.bootstrap, topic, messages(0, 3000))
    members = [Member(tmp_path, f"m{i}", env, topic, args) for i in range(3)]
    produced = 3000

    def produce_more():
        nonlocal produced
        for _ in range(30):
            send(broker.bootstrap, topic, messages(produced, 1500))
            produced += 1500
            time.sleep(1)

    producer = threading.Thread(target=produce_more)
    producer.start()
    try:
        wait_for(lambda: len(owned(con, "group")) == 3, members, "three members owning partitions")
        victim = max(members, key=lambda m: owned(con, "group").get(m.proc.pid, 0))
        victim.stop()                                        # killed: its partitions move
        wait_for(lambda: victim.proc.pid not in owned(con, "group"), members, "the killed member's partitions to move")
        members.append(Member(tmp_path, "m3", env, topic, args))    # a new member joins
        wait_for(lambda: members[-1].proc.pid in owned(con, "group"), members, "the new member to own partitions")
        paused = max((m for m in members if m.proc.poll() is None),
                     key=lambda m: owned(con, "group").get(m.proc.pid, 0))
        paused.signal(signal.SIGSTOP)                        # paused past the session timeout
        if broker.name == "tansu":
            # tansu 0.6 expires a silent member only while the group rebalances (after
            # max.poll.interval.ms), not at its session timeout: a member joining makes it.
            members.append(Member(tmp_path, "m4", env, topic, args))
        wait_for(lambda: paused.proc.pid not in owned(con, "group"), members,
                 lambda: f"the partitions of the paused member {paused.proc.pid} to move: {owned(con, 'group')}")
        paused.signal(signal.SIGCONT)
        producer.join()
        wait_until_committed(con, "group", ends(broker.bootstrap, topic), members)
    finally:
        producer.join()
        for m in members:
            m.stop()
    owners = con.execute("SELECT count(DISTINCT owner), max(generation) FROM lake.streaming_etl_partitions WHERE job = 'group'").fetchone()
    assert owners[1] >= 2, owners   # partitions did move
    want = straight(tmp_path, env, con, broker.bootstrap, topic)
    got = tables(con, "")
    assert_same(got, want)
    # Every key is in one partition: merged over partitions, the rows are one per key and window.
    merged = con.execute("SELECT count(*) FROM (SELECT key, window_start_ms FROM lake.windows GROUP BY ALL HAVING count(*) > 1)").fetchone()
    assert merged == (0,)


def test_a_straight_subscribe_run_equals_a_run_in_pieces_by_several_members(tmp_path, postgres, mock):
    """Bounded runs, one after another and two at once, end where one straight run ends."""
    topic = "p" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    env = lake_env(catalog, data)
    args = job_args(mock.bootstrap, "pieces", "")
    for piece in range(3):
        send(mock.bootstrap, topic, messages(piece * 2000, 2000, seed=3, keyed=False))
        bounded_runs(tmp_path, [f"r{piece}{i}" for i in range(1 + piece % 2)], env, topic, args)
    # Whatever the pieces left unread (a member that left early) the next bounded run reads.
    bounded_runs(tmp_path, ["last"], env, topic, args)
    assert_same(tables(con, ""), straight(tmp_path, env, con, mock.bootstrap, topic))


def test_running_rows_of_partition_tasks_end_as_a_straight_close_run(tmp_path, postgres, mock):
    """emit := 'update' with subscribe: each member's partition tasks write running rows that
    their final rows replace (a MERGE into the lake); pieces run by two members at once end with
    the rows of one straight `emit := 'close'` run."""
    topic = "u" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    env = lake_env(catalog, data)
    args = job_args(mock.bootstrap, "updates", "u_", "emit='update'")
    for piece in range(2):
        send(mock.bootstrap, topic, messages(piece * 2000, 2000, seed=5))
        bounded_runs(tmp_path, [f"u{piece}{i}" for i in range(2)], env, topic, args)
    bounded_runs(tmp_path, ["ulast"], env, topic, args)
    # The windows still open hold running rows; the others their final row.
    got = tables(con, "u_")
    final = con.execute("SELECT window_start_ms, window_end_ms, key, count, sum_value, partition "
                        "FROM lake.u_windows WHERE final").fetchall()
    running = con.execute("SELECT count(*), max(revision) FROM lake.u_windows WHERE NOT final").fetchone()
    assert running[0] > 0 and running[1] >= 1, running
    want = straight(tmp_path, env, con, mock.bootstrap, topic)
    assert_same([sorted(final, key=repr), got[1], got[2]], want)


def test_subscribe_needs_a_lake_and_the_group_to_assign_partitions(tmp_path, mock):
    con = lake.connect(tmp_path / "host.duckdb", EXT)
    topic = "b" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, 2)
    with pytest.raises(duckdb.Error) as e:
        con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 0, brokers := '{mock.bootstrap}', subscribe := true)").fetchall()
    assert ("invalid parameter 'subscribe': keeps each partition's state in the output catalog, which every process "
            "of the group must be able to write at once (a DuckLake); the output tables are in catalog 'host' of type "
            "duckdb, which one process at a time can write (got true)") in str(e.value)
    with pytest.raises(duckdb.Error) as e:
        con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 0, brokers := '{mock.bootstrap}', subscribe := true, partitions := [0])").fetchall()
    assert "invalid parameter 'subscribe': cannot be combined with 'partitions': the consumer group assigns the partitions (got true)" in str(e.value)
    assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)


def test_settings_that_differ_from_the_stored_ones_fail_the_claim(tmp_path, postgres, mock):
    topic = "s" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    send(mock.bootstrap, topic, messages(0, 500))
    sql = (f"SELECT * FROM streaming_etl_run('{topic}', WINDOW, 200, brokers := '{mock.bootstrap}', subscribe := true, "
           f"job := 'j', windows_table := 'lake.windows', kafka := {GROUP_KAFKA})")
    assert con.execute(sql.replace('WINDOW', '1000')).fetchall()[-1][1] == 500
    with pytest.raises(duckdb.Error) as e:
        con.execute(sql.replace('WINDOW', '2000')).fetchall()
    assert "window_ms" in str(e.value) and "1000" in str(e.value) and "2000" in str(e.value), str(e.value)


def test_two_members_racing_on_the_same_partitions_write_each_row_once(tmp_path, postgres, mock):
    """Two processes in different consumer groups run one job: each group assigns every
    partition to its member, so both claim and commit the same partitions at once. Each commit
    replaces the partition's state row, so two commits for one partition collide in the lake and
    the one that finds a newer generation writes nothing: the rows are those of one run."""
    topic, con, env, args = group_job(tmp_path, postgres, mock, "race", "follow=true",
                                      "max_runtime_ms=600000", "checkpoint_interval_ms=200")
    members = [Member(tmp_path, f"r{i}", env, topic, [*args, f"group_id='race{i}'"]) for i in range(2)]
    try:
        # Both members hold every partition once their groups have assigned it; meanwhile both
        # keep committing what arrives.
        for i in range(24):
            send(mock.bootstrap, topic, messages(i * 500, 500, seed=5, keyed=False))
            time.sleep(0.5)
        wait_until_committed(con, "race", ends(mock.bootstrap, topic), members)
    finally:
        for m in members:
            m.stop()
    assert any("moved to another member" in m.stderr() for m in members), [m.stderr()[-300:] for m in members]
    assert_same(tables(con, ""), straight(tmp_path, env, con, mock.bootstrap, topic))


def test_avro_records_from_the_registry_in_a_group_equal_the_same_events_as_json(tmp_path, postgres, mock):
    """Members share an Avro topic (records framed by confluent-kafka's serializer, schemas from
    the test registry): the windows and late events of a JSON topic with the same events."""
    import json

    import registry
    from brokers import produce
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = {"type": "record", "name": "Event", "fields": [
        {"name": "key", "type": "string"}, {"name": "event_time_ms", "type": "long"},
        {"name": "payload", "type": {"type": "record", "name": "P", "fields": [{"name": "value", "type": "double"}]}}]}
    reg = registry.serve(0)
    url = f"http://127.0.0.1:{reg.server_address[1]}"
    try:
        parts = messages(0, 4000, seed=9, keyed=False)
        ser = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
        ctx = SerializationContext("avro", MessageField.VALUE)

        def framed(line):
            if line.startswith("{not"):
                return line.encode()  # a dead letter in both topics, at the same offset
            e = json.loads(line)
            e["payload"]["value"] = float(e["payload"]["value"])
            return ser(e, ctx)
        avro_topic, json_topic = "a" + uuid.uuid4().hex[:8], "j" + uuid.uuid4().hex[:8]
        for t in (avro_topic, json_topic):
            mock.create_topic(t, PARTITIONS)
        produce(mock.bootstrap, avro_topic, [[framed(line) for _, line in p] for p in parts])
        send(mock.bootstrap, json_topic, parts)
        catalog, data, con = new_lake(tmp_path, postgres)
        env = lake_env(catalog, data)
        args = job_args(mock.bootstrap, "avro", "", "format='avro'", f"schema_registry='{url}'")
        bounded_runs(tmp_path, ["m0", "m1"], env, avro_topic, args)
        bounded_runs(tmp_path, ["last"], env, avro_topic, args)
        want = straight(tmp_path, env, con, mock.bootstrap, json_topic)
        got = tables(con, "")
        assert len(got[0]) > 100 and len(got[1]) > 10
        assert_same(got[:2], want[:2])
        assert sorted(r[:2] for r in got[2]) == sorted(r[:2] for r in want[2]) and got[2]
    finally:
        reg.shutdown()
        reg.server_close()


def test_duckdb_aggregates_of_partition_tasks_equal_duckdbs_own_over_each_window(tmp_path, postgres, mock):
    """Typed columns and DuckDB's aggregates with subscribe into a DuckLake (PostgreSQL catalog):
    pieces run by two members at once, with running rows; each partition's staged events commit
    with its state and move with it. The final rows equal DuckDB's own aggregates over the events
    each partition placed in each window (late ones excluded), and the staged events left are
    those of the windows still open."""
    import json

    topic = "d" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    env = lake_env(catalog, data)
    aggs = ["count(*) AS n", "sum(v) AS total", "median(v) AS med", "count(DISTINCT v) AS vals",
            "list(v ORDER BY event_time_ms, v) AS vs"]
    args = job_args(mock.bootstrap, "typed", "t_", "emit='update'", "columns={'payload.value AS v': 'DECIMAL(6,1)'}",
                    "aggregates=[" + ", ".join("'" + a + "'" for a in aggs) + "]")
    sent = [[] for _ in range(PARTITIONS)]
    for piece in range(2):
        parts = messages(piece * 2000, 2000, seed=7)
        for p, lines in enumerate(parts):
            sent[p] += [line for _, line in lines]
        send(mock.bootstrap, topic, parts)
        bounded_runs(tmp_path, [f"d{piece}{i}" for i in range(2)], env, topic, args)
    bounded_runs(tmp_path, ["dlast"], env, topic, args)
    late = set(con.execute("SELECT partition, \"offset\" FROM lake.t_late_events").fetchall())
    dead = set(con.execute("SELECT partition, \"offset\" FROM lake.t_dead_letters").fetchall())
    rows = [(p, o, json.loads(line)) for p, lines in enumerate(sent) for o, line in enumerate(lines)
            if (p, o) not in late and (p, o) not in dead]
    con.execute("CREATE TEMP TABLE placed (p INTEGER, ws BIGINT, key VARCHAR, event_time_ms BIGINT, v DECIMAL(6,1))")
    con.executemany("INSERT INTO placed VALUES (?, ?, ?, ?, ?)",
                    [(p, e["event_time_ms"] // 1000 * 1000, e["key"], e["event_time_ms"], e["payload"]["value"])
                     for p, _, e in rows])
    want = con.execute(f"SELECT p, ws, key, {', '.join(aggs)} FROM placed GROUP BY ALL ORDER BY 1, 2, 3").fetchall()
    got = con.execute("SELECT partition, window_start_ms, key, n, total, med, vals, vs FROM lake.t_windows "
                      "QUALIFY revision = max(revision) OVER (PARTITION BY partition, key, window_start_ms) "
                      "ORDER BY 1, 2, 3").fetchall()
    assert got == want, (len(got), len(want), [(a, b) for a, b in zip(got, want) if a != b][:3])
    assert con.execute("SELECT count(*) FROM lake.t_windows WHERE NOT final").fetchone()[0] > 0
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 't_windows'").fetchall())
    assert types["total"] == "DECIMAL(38,1)" and types["vs"] == "DECIMAL(6,1)[]", types
    # What stays staged is the open windows' events: at most the last second of each partition.
    staged = con.execute("SELECT partition, min(__se_pane) FROM lake.streaming_etl_staged_t_windows GROUP BY ALL").fetchall()
    last = {p: max(e["event_time_ms"] for q, _, e in rows if q == p) for p in range(PARTITIONS)}
    for p, pane in staged:
        assert pane + 1000 > last[p] - 200, (p, pane, last[p])


def test_partition_tasks_on_one_or_several_threads_write_the_same_rows(tmp_path, postgres, mock):
    """A member's partition tasks take their turns on DuckDB's `threads` at once; each task has
    its own engine, so the rows are those of one thread: bounded runs in pieces (max_messages
    shared out among the tasks) under threads = 3, 1 and 2 end with the rows of a straight run
    under threads = 1."""
    topic = "h" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    send(mock.bootstrap, topic, messages(0, 6000, seed=11))
    results = {}
    for name, pieces in (("one", [(1, None)]), ("many", [(3, 1000), (1, 700), (2, None)])):
        for i, (threads, most) in enumerate(pieces):
            env = dict(lake_env(catalog, data), STREAMING_ETL_THREADS=str(threads))
            extra = [f"max_messages={most}"] if most else []
            [last] = bounded_runs(tmp_path, [f"{name}{i}"], env, topic, job_args(mock.bootstrap, name, f"{name}_", *extra))
            assert last["status"] == ("max_messages" if most else "caught_up"), last
        results[name] = tables(con, f"{name}_")
    assert_same(results["many"], results["one"])


def test_a_lake_that_inlines_rows_keeps_what_members_delete_from_in_files(tmp_path, postgres, mock):
    """A lake whose `data_inlining_row_limit` is set: DuckLake 1.4 takes any two
    commits that delete inlined rows of one table as a conflict, so the state table and the
    merged windows table are kept in files (a table option every member sets). Inlined, every
    two members' commits conflicted until the run failed; kept in files, two members at once, in
    pieces, end with the rows of one straight run."""
    topic = "i" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    env = lake_env(catalog, data)
    con.execute("CALL lake.set_option('data_inlining_row_limit', 100000)")
    args = job_args(mock.bootstrap, "inl", "")
    for piece in range(2):
        send(mock.bootstrap, topic, messages(piece * 3000, 3000, seed=13, keyed=False))
        bounded_runs(tmp_path, [f"i{piece}{i}" for i in range(2)], env, topic, args)
    # A member that attached the lake before the others set the option: DuckLake read the lake's
    # options at its ATTACH, so only its own set_option keeps its commits out of inlined data
    # (inlined, its state row's BLOB failed every commit on PostgreSQL).
    send(mock.bootstrap, topic, messages(6000, 3000, seed=13, keyed=False))
    named = "".join(f", {a.split('=', 1)[0]} := {a.split('=', 1)[1]}" for a in args)
    rows = con.execute(f"SELECT status FROM streaming_etl_run('{topic}', 1000, 200{named})").fetchall()
    assert rows[-1] == ("caught_up",), rows
    bounded_runs(tmp_path, ["last"], env, topic, args)
    options = con.execute("SELECT DISTINCT scope_entry FROM ducklake_options('lake') WHERE option_name = 'data_inlining_row_limit' "
                          "AND scope = 'TABLE' AND value = '0' ORDER BY 1").fetchall()
    assert options == [("main.streaming_etl_partitions",), ("main.windows",)], options
    files = {t: con.execute(f"SELECT count(*) FROM ducklake_list_files('lake', '{t}')").fetchone()[0]
             for t in ("streaming_etl_partitions", "windows")}
    assert files["streaming_etl_partitions"] > 0 and files["windows"] > 0, files
    assert_same(tables(con, ""), straight(tmp_path, env, con, mock.bootstrap, topic))


SQL_JOB = """INSERT INTO lake.{prefix}by_region
SELECT o.key, c.region, window_start, count(*) AS n, sum(o.value) AS total, median(o.value) AS med
FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o LEFT JOIN lake.customers AS c ON c.key = o.key
WHERE o.value > 1
GROUP BY ALL"""


# A set: a transform and a HOP statement beside it, over one read.
SQL_SET = SQL_JOB + """;
INSERT INTO lake.{prefix}big SELECT o.key, o.value, o.partition, o."offset" FROM stream AS o WHERE o.value > 8;
INSERT INTO lake.{prefix}by_key SELECT key, window_start, count(*) AS n
FROM HOP(stream, event_time, INTERVAL 1 SECOND, INTERVAL 2 SECOND) GROUP BY ALL"""

SET_ROWS = ["SELECT key, value, partition, \"offset\" FROM lake.{p}big",
            "SELECT key, epoch_ms(window_start), n, partition FROM lake.{p}by_key"]


@pytest.mark.parametrize("text,more", [(SQL_JOB, []), (SQL_SET, SET_ROWS)], ids=["one statement", "a set"])
def test_a_sql_job_in_a_group_equals_one_process(tmp_path, postgres, mock, text, more):
    """A job written as SQL (a lookup join with a table of the lake, WHERE, DuckDB's aggregates;
    or a set of statements over one read): a member killed with SIGKILL while it follows the
    topic, then bounded runs by two members at once, end with the rows of one straight process:
    each partition's staged rows, rows and state (every statement's) move together."""
    topic = "q" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    con.execute("CREATE TABLE lake.customers AS SELECT 'k' || range AS key, 'r' || (range % 3) AS region FROM range(30)")
    env = lake_env(catalog, data)
    columns = "columns={'key': 'VARCHAR', 'payload.value AS value': 'DECIMAL(6,1)'}"
    common = [f"brokers='{mock.bootstrap}'", "subscribe=true", f"kafka={GROUP_KAFKA}", columns, "lateness_ms=200"]
    job = tmp_path / "job.sql"
    job.write_text(text.format(prefix=""))
    send(mock.bootstrap, topic, messages(0, 3000))
    member = Member(tmp_path, "q", env, topic, [*common, "job='q'", "follow=true", "checkpoint_interval_ms=200"],
                    form=("sql", job))
    try:
        wait_for(lambda: len(owned(con, "q")) == 1, [member], "the member owning partitions")
        time.sleep(1)
    finally:
        member.stop()
    for piece in range(2):
        send(mock.bootstrap, topic, messages(3000 + piece * 2000, 2000, seed=piece))
        bounded_runs(tmp_path, [f"q{piece}{i}" for i in range(2)], env, topic, [*common, "job='q'"], form=("sql", job))
    bounded_runs(tmp_path, ["qlast"], env, topic, [*common, "job='q'"], form=("sql", job))
    straight_job = tmp_path / "straight.sql"
    straight_job.write_text(text.format(prefix="s_"))
    [last] = bounded_runs(tmp_path, ["qs"], env, topic, [*common, "job='qs'", "late_table='lake.s_late_events'",
                                                       "dead_letter_table='lake.s_dead_letters'"], form=("sql", straight_job))
    assert last["status"] == "caught_up", last
    rows = "SELECT key, region, epoch_ms(window_start), n, total, med, partition FROM lake.{p}by_region"
    late = "SELECT partition, \"offset\", replace(output, 's_', '') FROM lake.{p}late_events"
    for q in (rows, late, *more):
        got = sorted(con.execute(q.format(p="")).fetchall(), key=repr)
        want = sorted(con.execute(q.format(p="s_")).fetchall(), key=repr)
        assert_same([got, [], []], [want, [], []])
    assert con.execute("SELECT count(*) FROM lake.by_region").fetchone()[0] > 100
    assert all(con.execute(q.format(p="")).fetchall() for q in more)


def test_a_background_member_stops_at_a_cycle_boundary_and_shows_retrying_through_an_outage(tmp_path, postgres):
    """A `subscribe` job in the background: a stop ends its cycle early (a 30 s cycle does not make
    the stop wait it out), and a broker outage shows as `retrying` with the member waiting, then
    `running` again; everything read is committed."""
    from brokers import MockBroker
    mock = MockBroker()
    try:
        topic = "g" + uuid.uuid4().hex[:8]
        mock.create_topic(topic, PARTITIONS)
        catalog, data, con = new_lake(tmp_path, postgres)
        send(mock.bootstrap, topic, messages(0, 3000))
        job = (f"streaming_etl_run('{topic}', 1000, 200, brokers := '{mock.bootstrap}', subscribe := true, "
               "job := 'bgsub', windows_table := 'lake.windows', late_table := 'lake.late_events', "
               f"dead_letter_table := 'lake.dead_letters', kafka := {GROUP_KAFKA}, timeout_ms := 1500")
        call = job + ", background := true, follow := true, checkpoint_interval_ms := {ms})"

        def row():
            return con.execute("SELECT state, events_consumed, last_error, lag FROM streaming_etl_jobs() "
                               "WHERE job = 'bgsub'").fetchone()

        def until(cond, what, timeout=90):
            deadline = time.time() + timeout
            while time.time() < deadline:
                r = row()
                if cond(r):
                    return r
                time.sleep(0.1)
            raise AssertionError(f"{what}: {row()}")

        con.execute("SELECT * FROM " + call.replace("{ms}", "500")).fetchall()
        until(lambda r: r[1] == 3000 and r[3] == 0, "caught up")
        mock.command("down 1")
        r = until(lambda r: r[0] == "retrying", "retrying through the outage")
        assert "cannot reach Kafka brokers" in r[2] and "the member waits for them" in r[2], r
        mock.command("up 1")
        send(mock.bootstrap, topic, messages(3000, 3000))
        until(lambda r: r[0] == "running" and r[1] == 6000 and r[3] == 0 and r[2] is None, "running again")
        con.execute("SELECT * FROM streaming_etl_stop('bgsub')").fetchall()
        # With a long cycle, a stop does not wait it out.
        con.execute("SELECT * FROM " + call.replace("{ms}", "30000")).fetchall()
        until(lambda r: r[0] == "running", "running", timeout=30)
        time.sleep(3)
        t0 = time.time()
        stopped = con.execute("SELECT state FROM streaming_etl_stop('bgsub')").fetchall()
        assert stopped == [("stopped",)] and time.time() - t0 < 15, time.time() - t0
        # Everything read is committed with the partitions' state.
        committed = con.execute("SELECT sum(next_offset) FROM lake.streaming_etl_partitions WHERE job = 'bgsub'").fetchone()
        assert committed == (6000,)
    finally:
        mock.stop()


def test_a_changelog_kept_by_a_group_equals_the_upstream_table(tmp_path, postgres, mock):
    """`INSERT OR REPLACE` with `subscribe`: a Debezium topic keyed by the row's id (each key in one
    partition, so one member writes its row), a member killed with SIGKILL while it follows, then
    bounded runs by two members at once: the lake's table equals the upstream table. A statement
    whose key is not the message key fails its cycle, naming the event; a plain stream is refused."""
    import random
    import subprocess
    import sys

    from group import RUN_JOB, produce
    from test_changelog import COLUMNS, KEEP, changelog, expected, with_tombstones
    rng = random.Random(70)
    parts, state, bad = changelog(rng, 240, 6000, PARTITIONS)
    records = [with_tombstones(p, rng) for p in parts]
    topic = "k" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    env = lake_env(catalog, data)
    job = tmp_path / "keep.sql"
    job.write_text(KEEP.replace("INTO customers", "INTO lake.customers"))
    common = [f"brokers='{mock.bootstrap}'", "subscribe=true", f"kafka={GROUP_KAFKA}", "job='cdc'", "envelope='debezium'",
              "primary_key=['id']", f"columns={COLUMNS}", "dead_letter_table='lake.dead_letters'",
              "late_table='lake.late_events'"]
    produce(mock.bootstrap, topic, [r[: len(r) // 2] for r in records])
    member = Member(tmp_path, "m", env, topic, [*common, "follow=true", "checkpoint_interval_ms=100"], form=("sql", job))
    try:
        wait_for(lambda: len(owned(con, "cdc")) == 1, [member], "the member owning partitions")
        time.sleep(1)
    finally:
        member.stop()
    produce(mock.bootstrap, topic, [r[len(r) // 2:] for r in records])
    bounded_runs(tmp_path, ["a", "b"], env, topic, common, form=("sql", job))
    [last] = bounded_runs(tmp_path, ["c"], env, topic, common, form=("sql", job))
    assert last["status"] == "caught_up", last
    got = sorted((i, n, t, None if s is None else f"{s:.2f}")
                 for i, n, t, s in con.execute("SELECT id, name, tier, score FROM lake.customers").fetchall())
    assert got == expected(state)
    assert con.execute("SELECT count(*) FROM lake.dead_letters").fetchone()[0] == bad
    # Keyed by another number, the rows' keys are not their messages' keys ({"id": ...}).
    by_name = tmp_path / "by_name.sql"
    by_name.write_text("INSERT OR REPLACE INTO lake.by_name SELECT id + 1000 AS n, name FROM stream")
    args = [a.replace("'cdc'", "'n'").replace("['id']", "['n']") for a in common]
    run = subprocess.run([sys.executable, RUN_JOB, str(tmp_path / "n.duckdb"), topic, "sql", str(by_name), *args],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and ("with subscribe := true, each row's key (n) must be its message's key, so that "
                                    "a key lives in one partition and one member writes its row; the event at partition ") in run.stderr, run.stderr
    plain = tmp_path / "plain.sql"
    plain.write_text("INSERT OR REPLACE INTO lake.plain SELECT id, name FROM stream")
    args = [a.replace("'cdc'", "'p'") for a in common if not a.startswith("envelope=")]
    run = subprocess.run([sys.executable, RUN_JOB, str(tmp_path / "p.duckdb"), topic, "sql", str(plain), *args],
                         env=env, capture_output=True, text=True, timeout=300)
    assert ("with subscribe := true, INSERT OR REPLACE INTO lake.plain reads a changelog keyed by its rows' key "
            "(envelope := 'debezium' or 'upsert')") in run.stderr, run.stderr


def test_a_window_join_in_a_group_joins_each_partitions_windows_as_one_process(tmp_path, postgres, mock):
    """A window join with `subscribe`: a partition's windows are its own, so the join pairs the
    events of one partition (orders and payments keyed by customer); two members at once, then a
    third run, write the rows of one straight process."""
    import json
    import random

    from group import RUN_JOB, produce, partition_of  # noqa: F401
    rng = random.Random(71)
    parts = [[] for _ in range(PARTITIONS)]
    for i in range(6000):
        c = f"c{rng.randrange(60)}"
        e = {"kind": rng.choice(["order", "payment"]), "customer": c, "paid": rng.randint(1, 50),
             "ts": 1_700_000_000_000 + i * 5}
        parts[partition_of(c)].append(json.dumps(e))
    topic = "w" + uuid.uuid4().hex[:8]
    mock.create_topic(topic, PARTITIONS)
    produce(mock.bootstrap, topic, parts)
    catalog, data, con = new_lake(tmp_path, postgres)
    env = lake_env(catalog, data)
    text = """INSERT INTO lake.{p}paid SELECT o.customer, o.window_start, count(*) AS pairs, sum(p.paid) AS paid
        FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o JOIN TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS p
          ON o.customer = p.customer AND o.window_start = p.window_start
        WHERE o.kind = 'order' AND p.kind = 'payment' GROUP BY ALL"""
    common = [f"brokers='{mock.bootstrap}'", "subscribe=true", f"kafka={GROUP_KAFKA}", "time_field='ts'",
              "columns={'kind': 'VARCHAR', 'customer': 'VARCHAR', 'paid': 'BIGINT'}", "lateness_ms=0"]
    for prefix, job, names in (("", "wj", ["a", "b"]), ("s_", "wjs", ["s"])):
        f = tmp_path / f"{job}.sql"
        f.write_text(text.format(p=prefix))
        args = [*common, f"job='{job}'", f"late_table='lake.{prefix}late_events'",
                f"dead_letter_table='lake.{prefix}dead_letters'"]
        bounded_runs(tmp_path, names, env, topic, args, form=("sql", f))
        bounded_runs(tmp_path, [n + "2" for n in names[:1]], env, topic, [*args, "flush=true"], form=("sql", f))
    rows = "SELECT customer, epoch_ms(window_start), pairs, paid, partition FROM lake.{p}paid"
    got = sorted(con.execute(rows.format(p="")).fetchall())
    want = sorted(con.execute(rows.format(p="s_")).fetchall())
    assert len(got) > 100 and got == want
