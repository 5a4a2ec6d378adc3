"""Avro and Protobuf: records framed and registered by Confluent's own serializers (the
confluent-kafka package) through a schema registry, read from both brokers, and Avro object
container files written by fastavro. Each run's tables must equal a JSON run over the same
events; bad records are dead letters with their exact bytes; a registry out of reach fails the
run and loses nothing."""
import glob
import json
import os
import uuid

import fastavro
import pytest

from brokers import free_port, produce
from conftest import connect
import registry

SKEW = sorted(glob.glob("test/data/skew/*.ndjson"))

EVENT_AVRO = {
    "type": "record", "name": "Event", "namespace": "test",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "event_time_ms", "type": "long"},
        {"name": "payload", "type": {"type": "record", "name": "Payload",
                                     "fields": [{"name": "value", "type": "double"}]}},
    ],
}


def valid_events(path):
    """The fixture's lines that are events (the rest are its dead letters)."""
    out = []
    for line in open(path, "rb").read().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if (isinstance(e, dict) and isinstance(e.get("key"), str) and type(e.get("event_time_ms")) is int
                and isinstance(e.get("payload"), dict) and type(e["payload"].get("value")) in (int, float)
                and set(e) == {"key", "event_time_ms", "payload"} and set(e["payload"]) == {"value"}):
            e["payload"]["value"] = float(e["payload"]["value"])
            out.append(e)
    return out


def json_tables(tmp_path, parts, *named):
    """The tables of a JSON file run over the same events (one file per partition)."""
    d = tmp_path / f"json-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    for i, events in enumerate(parts):
        (d / f"p{i}.ndjson").write_text("".join(json.dumps(e) + "\n" for e in events))
    con = connect()
    args = "".join(f", {n}" for n in named)
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000, 200, flush := true{args})").fetchall()
    return tables(con)


def tables(con):
    return (sorted(con.execute("SELECT * FROM windows").fetchall()),
            sorted(con.execute("SELECT key, event_time_ms, window_start_ms, partition FROM late_events").fetchall()))


@pytest.fixture
def reg():
    server = registry.serve(0)
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def sr_client(url, **conf):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    return SchemaRegistryClient({"url": url, **conf})


def avro_serializer(url, schema, **conf):
    from confluent_kafka.schema_registry.avro import AvroSerializer
    return AvroSerializer(sr_client(url, **conf), json.dumps(schema))


def serialize(ser, topic, records):
    from confluent_kafka.serialization import MessageField, SerializationContext
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(r, ctx) for r in records]


def topic_name():
    return "f" + uuid.uuid4().hex[:10]


def run(con, topic, broker, url, *named):
    args = "".join(f", {n}" for n in named)
    return con.execute(
        f"SELECT * FROM streaming_etl_run('{topic}', 1000, 200, brokers := '{broker.bootstrap}', "
        f"schema_registry := '{url}', flush := true{args})").fetchall()


def test_avro_from_the_registry_equals_json_and_bad_records_keep_their_bytes(broker, reg, tmp_path):
    parts = [valid_events(p) for p in SKEW]
    topic = topic_name()
    broker.create_topic(topic, len(parts))
    ser = avro_serializer(reg.url, EVENT_AVRO)
    framed = [serialize(ser, topic, events) for events in parts]
    good = framed[0][0]
    bad = [b'{"key":"k0"}', b"\x00\x00\x00\x03\xe7" + good[5:], good[:-3], b"\x00\x00"]
    framed[1] = framed[1][:10] + bad + framed[1][10:]
    produce(broker.bootstrap, topic, framed)
    con = connect()
    stats = run(con, topic, broker, reg.url, "format := 'avro'")[-1]
    assert stats[-1] == "caught_up"
    assert len(tables(con)[0]) > 100 and len(tables(con)[1]) > 10
    assert tables(con) == json_tables(tmp_path, parts)
    # A late Avro record keeps its payload as JSON, every field of it.
    late = con.execute("SELECT payload_json, key, event_time_ms FROM late_events").fetchall()
    assert late and all(json.loads(p) == {"key": k, "event_time_ms": t, "payload": json.loads(p)["payload"]} for p, k, t in late)
    dead = con.execute('SELECT partition, "offset", raw, error FROM dead_letters ORDER BY "offset"').fetchall()
    assert [(p, o, bytes(r)) for p, o, r, _ in dead] == [(1, 10 + i, b) for i, b in enumerate(bad)]
    assert [e for *_, e in dead] == [
        "not in the schema registry's wire format: the first byte is 0x7b, not the magic byte 0",
        "schema id 999 is not in the schema registry",
        "not Avro: unexpected end of data",
        "not in the schema registry's wire format: shorter than its 5-byte header",
    ]
    # Each id was asked for once (999 too), whatever the number of records naming it.
    asked = [p for m, p in reg.RequestHandlerClass.requests if m == "GET" and p.startswith("/schemas/ids/")]
    assert sorted(asked) == sorted(set(asked)) and len(asked) == 2


def proto_event_class():
    """shop.Event (key, event_time_ms, payload.value, at: a Timestamp) built at run time, as
    generated code would define it (no protoc here)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
    pool = descriptor_pool.DescriptorPool()
    ts = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(ts)
    pool.Add(ts)
    f = descriptor_pb2.FileDescriptorProto(name="shop/event.proto", package="shop", syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    other = f.message_type.add(name="Other")
    other.field.add(name="x", number=1, type=5, label=1)
    ev = f.message_type.add(name="Event")
    ev.field.add(name="key", number=1, type=9, label=1)
    ev.field.add(name="event_time_ms", number=2, type=3, label=1)
    ev.field.add(name="payload", number=3, type=11, label=1, type_name=".shop.Event.Payload")
    ev.field.add(name="at", number=4, type=11, label=1, type_name=".google.protobuf.Timestamp")
    pl = ev.nested_type.add(name="Payload")
    pl.field.add(name="value", number=1, type=1, label=1)
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Event"))


def test_protobuf_from_the_registry_equals_json(broker, reg, tmp_path):
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    Event = proto_event_class()
    ser = ProtobufSerializer(Event, sr_client(reg.url), {"use.deprecated.format": False})
    parts = [valid_events(p) for p in SKEW]
    topic = topic_name()
    broker.create_topic(topic, len(parts))

    def msg(e):
        m = Event(key=e["key"], event_time_ms=e["event_time_ms"])
        m.payload.value = e["payload"]["value"]
        m.at.FromMilliseconds(e["event_time_ms"])
        return m

    framed = [serialize(ser, topic, [msg(e) for e in events]) for events in parts]
    produce(broker.bootstrap, topic, framed)
    con = connect()
    run(con, topic, broker, reg.url, "format := 'protobuf'", "message := 'shop.Event'")
    assert len(tables(con)[0]) > 100
    assert tables(con) == json_tables(tmp_path, parts)
    assert con.execute("SELECT count(*) FROM dead_letters").fetchall() == [(0,)]
    # The Timestamp field as the event time: the same windows.
    con2 = connect()
    run(con2, topic, broker, reg.url, "format := 'protobuf'", "time_field := 'at'", "job := 'at'")
    assert tables(con2) == tables(con)


def test_a_schema_that_gains_a_field_mid_stream_loses_nothing(mock, reg, tmp_path):
    v2 = json.loads(json.dumps(EVENT_AVRO))
    v2["fields"].append({"name": "region", "type": ["null", "string"], "default": None})
    topic = topic_name()
    mock.create_topic(topic, 1)
    events = valid_events(SKEW[0])
    half = len(events) // 2
    old = serialize(avro_serializer(reg.url, EVENT_AVRO), topic, events[:half])
    new = serialize(avro_serializer(reg.url, v2), topic, [dict(e, region="eu") for e in events[half:]])
    assert old[0][1:5] != new[0][1:5], "the new schema has an id of its own"
    produce(mock.bootstrap, topic, [old + new])
    con = connect()
    run(con, topic, mock, reg.url, "format := 'avro'")
    assert tables(con) == json_tables(tmp_path, [events])
    assert con.execute("SELECT count(*) FROM dead_letters").fetchall() == [(0,)]


def test_an_unreachable_registry_fails_the_run_and_the_next_run_loses_nothing(mock, tmp_path):
    store_server = registry.serve(0)
    port = store_server.server_address[1]
    url = f"http://127.0.0.1:{port}"
    topic = topic_name()
    mock.create_topic(topic, 1)
    events = valid_events(SKEW[0])
    produce(mock.bootstrap, topic, [serialize(avro_serializer(url, EVENT_AVRO), topic, events)])
    store = store_server.RequestHandlerClass.store
    store_server.shutdown()
    store_server.server_close()
    db = tmp_path / "out.duckdb"
    con = connect(db)
    with pytest.raises(Exception) as e:
        run(con, topic, mock, url, "format := 'avro'")
    assert f"schema registry '{url}'" in str(e.value) and "/schemas/ids/1" in str(e.value), str(e.value)
    assert con.execute("SELECT count(*) FROM windows").fetchall() == [(0,)]
    # The registry is back (same schemas): the next run reads everything, once.
    again = registry.serve(port)
    again.RequestHandlerClass.store = store
    try:
        run(con, topic, mock, url, "format := 'avro'")
    finally:
        again.shutdown()
        again.server_close()
    assert tables(con) == json_tables(tmp_path, [events])


def test_basic_auth_goes_through_schema_registry_options(mock, tmp_path):
    server = registry.serve(0, user="etl:s3cret")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        topic = topic_name()
        mock.create_topic(topic, 1)
        events = valid_events(SKEW[0])[:50]
        ser = avro_serializer(url, EVENT_AVRO, **{"basic.auth.user.info": "etl:s3cret"})
        produce(mock.bootstrap, topic, [serialize(ser, topic, events)])
        con = connect()
        with pytest.raises(Exception, match="HTTP 401"):
            run(con, topic, mock, url, "format := 'avro'")
        run(con, topic, mock, url, "format := 'avro'",
            "schema_registry_options := MAP {'basic.auth.user.info': 'etl:s3cret'}")
        assert tables(con) == json_tables(tmp_path, [events])
    finally:
        server.shutdown()
        server.server_close()


def test_tls_with_the_registry_s_certificate_authority(mock, tmp_path):
    import subprocess
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = registry.serve(0, cert=str(cert), key=str(key))
    url = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        topic = topic_name()
        mock.create_topic(topic, 1)
        events = valid_events(SKEW[0])[:50]
        ser = avro_serializer(url, EVENT_AVRO, **{"ssl.ca.location": str(cert)})
        produce(mock.bootstrap, topic, [serialize(ser, topic, events)])
        con = connect()
        # Without the authority the server's certificate is not trusted.
        with pytest.raises(Exception, match=f"schema registry '{url}'"):
            run(con, topic, mock, url, "format := 'avro'")
        run(con, topic, mock, url, "format := 'avro'", f"schema_registry_options := MAP {{'ssl.ca.location': '{cert}'}}")
        assert tables(con) == json_tables(tmp_path, [events])
    finally:
        server.shutdown()
        server.server_close()


def write_avro(path, events, codec="deflate"):
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(EVENT_AVRO), events, codec=codec, sync_interval=2000)


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy", "zstandard"])
def test_avro_files_equal_json_and_resume_where_they_stopped(tmp_path, codec):
    parts = [valid_events(p) for p in SKEW]
    d = tmp_path / "avro"
    d.mkdir()
    for i, events in enumerate(parts):
        write_avro(d / f"p{i}.avro", events, codec)
    straight = connect()
    straight.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.avro', 1000, 200, format := 'avro', flush := true)").fetchall()
    assert tables(straight) == json_tables(tmp_path, parts)
    # In pieces (a stop every 300 messages), resumed from the checkpoint: the same tables.
    db = tmp_path / "pieces.duckdb"
    con = connect(db)
    for _ in range(20):
        row = con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.avro', 1000, 200, format := 'avro', "
                          "max_messages := 300)").fetchall()[-1]
        if row[1] == 0:
            break
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.avro', 1000, 200, format := 'avro', flush := true)").fetchall()
    assert tables(con) == tables(straight)


def test_avro_timestamp_types_are_event_times_and_a_file_that_is_not_avro_is_reported(tmp_path):
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "k", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "v", "type": "int"}]}
    d = tmp_path / "ts"
    d.mkdir()
    rows = [{"k": "a", "at": 1_700_000_000_000_000 + i * 100_000, "v": i} for i in range(40)]
    with open(d / "a.avro", "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), rows)
    (d / "b.avro").write_bytes(b'{"k":"a"}\n')
    con = connect()
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.avro', 1000, 0, format := 'avro', key_field := 'k', "
                "time_field := 'at', value_field := 'v', flush := true)").fetchall()
    got = con.execute("SELECT window_start_ms, key, count, sum_value FROM windows ORDER BY 1").fetchall()
    assert got == [(1_700_000_000_000 + s * 1000, "a", 10, float(sum(range(s * 10, s * 10 + 10)))) for s in range(4)]
    dead = con.execute("SELECT error FROM dead_letters").fetchall()
    assert len(dead) == 1 and "not an Avro object container file" in dead[0][0], dead


def test_avro_fields_convert_to_typed_columns_as_json_fields_do(tmp_path):
    """columns := {...} over an Avro file: a record's fields (a nested record, an array, a
    timestamp type, a string that is a number) convert as the same events' JSON fields do, and
    DuckDB's aggregates over them are the JSON run's."""
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "key", "type": "string"}, {"name": "event_time_ms", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": "string"}, {"name": "qty", "type": "int"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "dims", "type": {"type": "record", "name": "Dims", "fields": [{"name": "w", "type": "double"}]}}]}
    import datetime
    rows = [{"key": f"k{i % 3}", "event_time_ms": 1000 + i * 37, "at": 1_700_000_000_000 + i * 1000,
             "price": f"{(i * 7) % 50}.{i % 100:02d}", "qty": i % 5, "tags": ["x", "y"][: i % 3],
             "dims": {"w": i / 8}} for i in range(120)]
    d = tmp_path / "typed"
    d.mkdir()
    with open(d / "p0.avro", "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), rows)
    as_json = [dict(r, at=datetime.datetime.fromtimestamp(r["at"] / 1000, datetime.timezone.utc)
                    .strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z") for r in rows]
    (d / "p0.ndjson").write_text("".join(json.dumps(r) + "\n" for r in as_json))
    cols = ("{'price': 'DECIMAL(8,2)', 'qty': 'TINYINT', 'tags': 'VARCHAR[]', 'dims': 'STRUCT(w DOUBLE)', "
            "'at': 'TIMESTAMP'}")
    aggs = ("['count(*) AS n', 'sum(price * qty) AS total', 'list(tags ORDER BY event_time_ms) AS tags', "
            "'max(dims.w) AS widest', 'max(\"at\") AS last_at', 'min(\"at\") AS first_at']")
    results = []
    for name, fmt in (("p0.avro", ", format := 'avro'"), ("p0.ndjson", "")):
        con = connect()
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/{name}', 1000, 0, columns := {cols}, "
                    f"aggregates := {aggs}, flush := true{fmt})").fetchall()
        results.append(con.execute("SELECT window_start_ms, key, n, total, tags, widest, last_at::VARCHAR, "
                                   "first_at::VARCHAR FROM windows ORDER BY 1, 2").fetchall())
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
    assert results[0] == results[1]
    assert len(results[0]) > 10 and results[0][0][6].startswith("2023-11-14 22:13:")
