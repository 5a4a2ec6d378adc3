"""A table kept from a changelog (SPEC section 25, `INSERT OR REPLACE INTO ... SELECT ... FROM
stream`): a Debezium topic of a table's changes (snapshot reads, creates, updates, deletes, keys
deleted and created again, events bare and inside the JSON converter's schema wrapper, logical
messages, bad records) leaves the table equal to the upstream table at the last change read:
in one run, in runs of a few hundred messages, under SIGKILL at random instants, replayed from
earliest by a new job, from files and from a Kafka topic keyed by the row's id. Runs on every host
`make test` uses (2.0.1, 1.5.6 and 1.4.4)."""
import json
import random
import time
import uuid

from brokers import MockBroker, produce
from conftest import connect, kill_until_caught_up

COLUMNS = "{'id': 'BIGINT', 'name': 'VARCHAR', 'tier': 'VARCHAR', 'score': 'DECIMAL(10,2)'}"
KEEP = "INSERT OR REPLACE INTO customers SELECT id, name, tier, score FROM stream"
HISTORY = "INSERT INTO history SELECT op, id, \"partition\", \"offset\" FROM stream"


def changelog(rng, keys, n, partitions):
    """A Debezium changelog of `customers`, each key in partition `id % partitions`: the events of
    each partition (JSON lines), the upstream table after them ({id: row}) and how many lines are
    not JSON."""
    state, parts, ts, bad = {}, [[] for _ in range(partitions)], 1_700_000_000_000, 0

    def event(op, before, after):
        nonlocal ts
        ts += rng.randint(0, 3)
        e = {"before": before, "after": after, "op": op, "ts_ms": ts,
             "source": {"connector": "postgresql", "table": "customers", "ts_ms": ts - 2}}
        if rng.random() < 0.3:
            e = {"schema": {"type": "struct", "name": "shop.public.customers.Envelope", "fields": []}, "payload": e}
        return json.dumps(e)

    def row(k, i):
        return {"id": k, "name": f"c{k}-{i}", "tier": rng.choice(["gold", "silver", None]),
                "score": round(rng.uniform(0, 100), 2)}

    for k in range(0, keys, 3):
        state[k] = row(k, 0)
        parts[k % partitions].append(event("r", None, state[k]))
    for i in range(n):
        k = rng.randrange(keys)
        p = parts[k % partitions]
        r = rng.random()
        if r < 0.01:
            p.append('{"op": "c", "after": ')
            bad += 1
        elif r < 0.02:
            p.append(json.dumps({"op": "m", "ts_ms": ts, "message": {"prefix": "x"}}))
        elif k in state and r < 0.12:
            # (Postgres with REPLICA IDENTITY DEFAULT sends only the key of a deleted row.)
            p.append(event("d", {"id": k, "name": None, "tier": None, "score": None}, None))
            del state[k]
        elif k in state:
            new = row(k, i + 1)
            p.append(event("u", state[k], new))
            state[k] = new
        else:
            state[k] = row(k, i + 1)
            p.append(event("c", None, state[k]))
    return parts, state, bad


def debezium_key(line):
    """A change's Kafka key as Debezium writes it: {"id": ...} (none for a bad record)."""
    try:
        e = json.loads(line)
    except ValueError:
        return None
    e = e.get("payload", e)
    row = e.get("after") or e.get("before")
    return json.dumps({"id": row["id"]}).encode() if row else None


def write_files(d, parts):
    d.mkdir(parents=True, exist_ok=True)
    for p, lines in enumerate(parts):
        (d / f"p{p}.ndjson").write_text("".join(line + "\n" for line in lines))
    return f"file:{d}/*.ndjson"


def expected(state):
    return sorted((r["id"], r["name"], r["tier"], None if r["score"] is None else f"{r['score']:.2f}")
                  for r in state.values())


def table(con):
    return sorted((i, n, t, None if s is None else f"{s:.2f}")
                  for i, n, t, s in con.execute("SELECT id, name, tier, score FROM customers").fetchall())


def run(con, topic, sql=KEEP + "; " + HISTORY, **named):
    extra = "".join(f", {k} := {v}" for k, v in named.items())
    return con.execute(f"SELECT * FROM streaming_etl_sql('{topic}', $${sql}$$, envelope := 'debezium', "
                       f"primary_key := ['id'], columns := {COLUMNS}{extra})").fetchall()


def test_a_changelog_keeps_the_table_equal_to_the_upstream_table_in_one_run_and_in_pieces(tmp_path):
    rng = random.Random(61)
    parts, state, bad = changelog(rng, 300, 6000, 3)
    topic = write_files(tmp_path / "in", parts)
    con = connect(tmp_path / "one.duckdb")
    last = run(con, topic)[-1]
    assert last[1] == sum(len(p) for p in parts)
    assert table(con) == expected(state)
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == bad
    # The history holds every change once.
    assert con.execute("SELECT count(*), count(DISTINCT (\"partition\", \"offset\")) FROM history").fetchone() == (
        sum(len(p) for p in parts) - bad,) * 2
    con.close()
    # Runs of 400 messages, cycles of a few ms: the same table (and, between runs, the table as
    # it was at some change).
    con = connect(tmp_path / "pieces.duckdb")
    while run(con, topic, max_messages=400, checkpoint_interval_ms=5)[-1][-1] != "caught_up":
        pass
    assert table(con) == expected(state)
    con.close()


def test_a_changelog_killed_at_random_instants_leaves_the_table_of_a_straight_run(tmp_path):
    rng = random.Random(62)
    parts, state, _ = changelog(rng, 200, 8000, 2)
    topic = write_files(tmp_path / "in", parts)
    sql = tmp_path / "job.sql"
    sql.write_text(KEEP + "; " + HISTORY)
    db = tmp_path / "killed.duckdb"
    args = [db, topic, "sql", sql, "envelope='debezium'", "primary_key=['id']", f"columns={COLUMNS}",
            "max_messages=1500", "checkpoint_interval_ms=20"]
    assert kill_until_caught_up(args, random.Random(63), 0.5) > 0
    con = connect(db)
    assert table(con) == expected(state)
    # Every change in the history once, none twice.
    n = sum(len(p) for p in parts)
    assert con.execute("SELECT count(*), count(DISTINCT (\"partition\", \"offset\")) FROM history").fetchone()[0] == \
        n - con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    con.close()


def with_tombstones(lines, rng):
    """The partition's records as Debezium writes them to Kafka: each change keyed by its row's
    id ({"id": ...}, or inside the JSON converter's wrapper), each delete followed by a tombstone
    (the key with a null value)."""
    out = []
    for line in lines:
        key = debezium_key(line)
        if key is not None and rng.random() < 0.3:
            key = json.dumps({"schema": {"type": "struct"}, "payload": json.loads(key)}).encode()
        out.append((key, line.encode()))
        if '"op": "d"' in line:
            out.append((key, None))
    return out


def test_a_debezium_topic_on_kafka_keyed_by_id_is_kept_and_replayed_from_earliest(tmp_path):
    """With Debezium's tombstones: each reads as the delete of its key (the row is already gone)."""
    rng = random.Random(64)
    parts, state, bad = changelog(rng, 150, 4000, 3)
    broker = MockBroker()
    try:
        topic = "c" + uuid.uuid4().hex[:10]
        broker.create_topic(topic, 3)
        produce(broker.bootstrap, topic, [with_tombstones(p, rng) for p in parts])
        con = connect(tmp_path / "k.duckdb")
        rows = run(con, topic, sql=KEEP, brokers=f"'{broker.bootstrap}'", max_messages=2000)
        assert rows[-1][1] == 2000
        run(con, topic, sql=KEEP, brokers=f"'{broker.bootstrap}'")
        assert table(con) == expected(state)
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == bad
        con.close()
        # A new job reading the topic from earliest reaches the same table.
        con = connect(tmp_path / "replay.duckdb")
        run(con, topic, sql=KEEP, brokers=f"'{broker.bootstrap}'", job="'replay'")
        assert table(con) == expected(state)
        con.close()
    finally:
        broker.stop()


def test_a_table_kept_in_the_background_is_current_while_users_query_it(tmp_path):
    rng = random.Random(65)
    parts, state, _ = changelog(rng, 100, 3000, 2)
    d = tmp_path / "in"
    d.mkdir()
    con = connect(tmp_path / "bg.duckdb")
    # The first half is there when the job starts; the rest arrives while it runs.
    half = [p[: len(p) // 2] for p in parts]
    for i, lines in enumerate(half):
        (d / f"p{i}.ndjson").write_text("".join(line + "\n" for line in lines))
    run(con, f"file:{d}/*.ndjson", sql=KEEP, job="'bg'", follow="true", background="true",
        checkpoint_interval_ms=50)
    for i, p in enumerate(parts):
        with open(d / f"p{i}.ndjson", "a") as f:
            f.write("".join(line + "\n" for line in p[len(p) // 2:]))
    total = sum(len(p) for p in parts)
    deadline = time.time() + 60
    while time.time() < deadline:
        done = con.execute("SELECT events_consumed FROM streaming_etl_jobs() WHERE job = 'bg'").fetchone()
        if done and done[0] == total:
            break
        time.sleep(0.2)
    con.execute("SELECT * FROM streaming_etl_stop('bg')").fetchall()
    assert table(con) == expected(state)
    con.close()


def test_an_existing_tables_key_is_the_key_kept(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "p0.ndjson").write_text(json.dumps({"op": "c", "ts_ms": 5, "after": {"id": 1, "name": "a"}}) + "\n")
    con = connect(tmp_path / "t.duckdb")
    con.execute("CREATE TABLE customers (id BIGINT, name VARCHAR, tier VARCHAR, score DECIMAL(10,2), PRIMARY KEY (id, name))")
    try:
        run(con, f"file:{d}/*.ndjson", sql=KEEP)
        raise AssertionError("a primary_key other than the table's was taken")
    except Exception as e:  # noqa: BLE001
        assert "has the PRIMARY KEY (id, name)" in str(e), str(e)
    con.close()


VALUE_AVRO = {"type": "record", "name": "Value", "namespace": "shop.public.customers", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "tier", "type": ["null", "string"], "default": None},
    {"name": "score", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}],
     "default": None}]}
ENVELOPE_AVRO = {"type": "record", "name": "Envelope", "namespace": "shop.public.customers", "fields": [
    {"name": "before", "type": ["null", VALUE_AVRO], "default": None},
    {"name": "after", "type": ["null", "shop.public.customers.Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "connector", "type": "string"}, {"name": "table", "type": "string"},
                                           {"name": "ts_ms", "type": "long"}]}},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def test_debeziums_avro_events_with_decimal_columns_keep_the_same_table(tmp_path):
    """Debezium's Avro envelope (as its Avro converter writes it, a DECIMAL column as the
    `decimal` logical type), here in Avro files (the registry's framing is the formats' tests')."""
    import fastavro
    from decimal import Decimal
    parts, state, _ = changelog(random.Random(67), 100, 2000, 2)
    d = tmp_path / "avro"
    d.mkdir()

    def row(r):
        return None if r is None else dict(r, score=None if r["score"] is None else Decimal(f"{r['score']:.2f}"))

    changes = 0
    for p, lines in enumerate(parts):
        records = []
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            e = e.get("payload", e)
            if e.get("op") in ("c", "r", "u", "d"):
                records.append({"before": row(e["before"]), "after": row(e["after"]), "op": e["op"],
                                "ts_ms": e["ts_ms"], "source": {"connector": "postgresql", "table": "customers",
                                                                "ts_ms": e["source"]["ts_ms"]}})
        changes += len(records)
        with open(d / f"p{p}.avro", "wb") as f:
            fastavro.writer(f, fastavro.parse_schema(ENVELOPE_AVRO), records)
    con = connect(tmp_path / "avro.duckdb")
    sql = KEEP + "; INSERT INTO history SELECT op, id, source->>'table' AS tbl, after.score AS score FROM stream"
    last = run(con, f"file:{d}/*.avro", sql=sql, format="'avro'")[-1]
    assert (last[1], last[4]) == (changes, 0)
    assert table(con) == expected(state)
    assert con.execute("SELECT count(*) FROM history WHERE tbl = 'customers'").fetchone()[0] == changes


def upsert_records(parts, key_style, rng):
    """The changelog as a keyed topic (`envelope := 'upsert'`): each change's value is its row
    (the after image), each delete a tombstone; the key is {"id": ...} (`json`, sometimes in the
    JSON converter's wrapper) or the id as text (`text`). Bad records stay; logical messages go."""
    out = []
    for lines in parts:
        recs = []
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                recs.append((b"bad", line.encode()))
                continue
            e = e.get("payload", e)
            if e.get("op") not in ("c", "r", "u", "d"):
                continue
            row = e["after"] or e["before"]
            key = json.dumps({"id": row["id"]}) if key_style == "json" else str(row["id"])
            if key_style == "json" and rng.random() < 0.3:
                key = json.dumps({"schema": {"type": "struct"}, "payload": {"id": row["id"]}})
            recs.append((key.encode(), None if e["op"] == "d" else json.dumps(e["after"]).encode()))
        out.append(recs)
    return out


def test_a_keyed_topic_keeps_a_row_per_key_and_its_tombstones_delete(tmp_path):
    """`envelope := 'upsert'`: a message is the row of its key and a tombstone deletes it, the key
    read from the message key (its fields, or `key` itself); in pieces and replayed, as the
    upstream table."""
    rng = random.Random(68)
    parts, state, bad = changelog(rng, 150, 4000, 3)
    broker = MockBroker()
    try:
        for style, select in (("json", "id"), ("text", "CAST(key AS BIGINT) AS id")):
            topic = "u" + uuid.uuid4().hex[:10]
            broker.create_topic(topic, 3)
            produce(broker.bootstrap, topic, upsert_records(parts, style, rng))
            sql = f"INSERT OR REPLACE INTO customers SELECT {select}, name, tier, score FROM stream"
            for name, pieces in ((style, 700), (style + "_replay", None)):
                con = connect(tmp_path / f"{name}.duckdb")
                named = f"brokers := '{broker.bootstrap}', envelope := 'upsert', primary_key := ['id'], columns := {COLUMNS}"
                while pieces:
                    last = con.execute(f"SELECT * FROM streaming_etl_sql('{topic}', $${sql}$$, {named}, "
                                       f"max_messages := {pieces})").fetchall()[-1]
                    if last[1] < pieces:
                        break
                con.execute(f"SELECT * FROM streaming_etl_sql('{topic}', $${sql}$$, {named})").fetchall()
                assert table(con) == expected(state), (style, name)
                assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == bad
                con.close()
    finally:
        broker.stop()


def test_avro_tombstones_on_a_registry_topic_delete_their_key(tmp_path):
    """Debezium's Avro converter and an Avro keyed topic, through a schema registry: a tombstone's
    key is Avro of the key's own schema, read from the registry, and deletes its row."""
    from decimal import Decimal

    import pytest
    pytest.importorskip("confluent_kafka.schema_registry.avro", reason="the venv of this host has no Avro serializer")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    import registry
    server = registry.serve(0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = SchemaRegistryClient({"url": url})
    key_schema = {"type": "record", "name": "Key", "namespace": "shop.public.customers",
                  "fields": [{"name": "id", "type": "long"}]}
    parts, state, _ = changelog(random.Random(69), 100, 2000, 2)
    broker = MockBroker()

    def row(r):
        return None if r is None else dict(r, score=None if r["score"] is None else Decimal(f"{r['score']:.2f}"))

    try:
        for envelope, value_schema in (("debezium", ENVELOPE_AVRO), ("upsert", VALUE_AVRO)):
            topic = "a" + uuid.uuid4().hex[:10]
            broker.create_topic(topic, 2)
            keys = AvroSerializer(client, json.dumps(key_schema))
            values = AvroSerializer(client, json.dumps(value_schema))
            kctx = SerializationContext(topic, MessageField.KEY)
            vctx = SerializationContext(topic, MessageField.VALUE)
            records = []
            for lines in parts:
                recs = []
                for line in lines:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    e = e.get("payload", e)
                    if e.get("op") not in ("c", "r", "u", "d"):
                        continue
                    k = keys({"id": (e["after"] or e["before"])["id"]}, kctx)
                    if envelope == "debezium":
                        v = {"before": row(e["before"]), "after": row(e["after"]), "op": e["op"], "ts_ms": e["ts_ms"],
                             "source": {"connector": "postgresql", "table": "customers", "ts_ms": e["source"]["ts_ms"]}}
                        recs.append((k, values(v, vctx)))
                        if e["op"] == "d":
                            recs.append((k, None))
                    else:
                        recs.append((k, None if e["op"] == "d" else values(row(e["after"]), vctx)))
                records.append(recs)
            produce(broker.bootstrap, topic, records)
            con = connect(tmp_path / f"{envelope}.duckdb")
            # (The stream's `key` of an Avro key is its JSON.)
            sql = KEEP + "; INSERT INTO seen SELECT key, id FROM stream"
            got = con.execute(
                f"SELECT * FROM streaming_etl_sql('{topic}', $${sql}$$, brokers := '{broker.bootstrap}', "
                f"schema_registry := '{url}', format := 'avro', envelope := '{envelope}', primary_key := ['id'], "
                f"columns := {COLUMNS}" + (", time_field := 'ts_ms'" if envelope == "debezium" else "") + ")").fetchall()
            assert got[-1][4] == 0, got
            assert table(con) == expected(state), envelope
            assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
            assert con.execute("SELECT count(*), count(*) FILTER (WHERE key = '{\"id\":' || id || '}') FROM seen "
                               "WHERE id IS NOT NULL").fetchone() == (sum(map(len, records)),) * 2
            con.close()
    finally:
        broker.stop()
        server.shutdown()
        server.server_close()
