#!/usr/bin/env python3
"""`make bench` (formats): the same events as JSON, Avro and Protobuf, end to end.

- Files: the benchmark's 50-key workload as NDJSON and as Avro object container files (written
  by fastavro, null and snappy codecs), each run in a fresh process.
- Kafka (the mock cluster): the same events as JSON, and as Avro and Protobuf records framed by
  confluent-kafka's serializers through the test schema registry (test/python/registry.py).
- Decoding alone (crates/core/examples/format_bench.rs): the job's readers next to the formats'
  own libraries' generic decoders.

Runs alternate (JSON, Avro, Protobuf, then again); the best of each is reported. Prints a table
and writes it into docs/benchmarks.md (section 'formats') unless --quick.

usage: bench_formats.py [--quick]
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchlib  # noqa: E402
from docs_section import write_section  # noqa: E402

AVRO_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "bench",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "event_time_ms", "type": "long"},
        {"name": "payload", "type": {"type": "record", "name": "Payload",
                                     "fields": [{"name": "value", "type": "double"}]}},
        {"name": "late", "type": ["null", "int"], "default": None},
    ],
}


def events_of(path):
    for line in open(path, "rb"):
        e = json.loads(line)
        e["payload"]["value"] = float(e["payload"]["value"])
        e.setdefault("late", None)
        yield e


def avro_files(d, codec):
    import fastavro
    out = os.path.join(benchlib.OUT, "data", f"{os.path.basename(d)}-avro-{codec}")
    if os.path.exists(os.path.join(out, "done")):
        return out
    os.makedirs(out, exist_ok=True)
    schema = fastavro.parse_schema(AVRO_SCHEMA)
    for f in sorted(os.listdir(d)):
        if f.endswith(".ndjson"):
            with open(os.path.join(out, f.replace(".ndjson", ".avro")), "wb") as fh:
                fastavro.writer(fh, schema, events_of(os.path.join(d, f)), codec=codec)
    open(os.path.join(out, "done"), "w").close()
    return out


def measure(source, named):
    db = benchlib.fresh_db("formats")
    run, rss = benchlib.spawn_measured(["--child-run", db, source, json.dumps(named)])
    s = run["stats"]
    return {"events": s["events_consumed"], "dead": s["dead_letters"], "windows": run["window_rows"],
            "late": s["late_events"], "rate": s["events_consumed"] / run["wall_s"], "rss_mb": round(rss, 1)}


def best(runs):
    b = max(runs, key=lambda r: r["rate"])
    return dict(b, rate=round(b["rate"]), all_rates=[round(r["rate"]) for r in runs])


def files_section(events, rounds):
    d = benchlib.generate("formats", events)
    jobs = {
        "json (NDJSON)": (f"file:{d}/*.ndjson", {}),
        "avro (null codec)": (f"file:{avro_files(d, 'null')}/*.avro", {"format": "'avro'"}),
        "avro (snappy)": (f"file:{avro_files(d, 'snappy')}/*.avro", {"format": "'avro'"}),
    }
    runs = {k: [] for k in jobs}
    for _ in range(rounds):
        for k, (src, named) in jobs.items():
            runs[k].append(measure(src, named))
    return {k: best(v) for k, v in runs.items()}


def proto_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    pool = descriptor_pool.DescriptorPool()
    f = descriptor_pb2.FileDescriptorProto(name="bench/event.proto", package="bench", syntax="proto3")
    ev = f.message_type.add(name="Event")
    ev.field.add(name="key", number=1, type=9, label=1)
    ev.field.add(name="event_time_ms", number=2, type=3, label=1)
    ev.field.add(name="payload", number=3, type=11, label=1, type_name=".bench.Event.Payload")
    late = ev.field.add(name="late", number=4, type=5, label=1, proto3_optional=True, oneof_index=0)
    ev.oneof_decl.add(name="_late")
    del late
    ev.nested_type.add(name="Payload").field.add(name="value", number=1, type=1, label=1)
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))


def kafka_section(events, rounds):
    import registry
    from brokers import MockBroker, produce
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    d = benchlib.generate("formats-kafka", events)
    paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".ndjson"))
    reg = registry.serve(0)
    url = f"http://127.0.0.1:{reg.server_address[1]}"
    client = SchemaRegistryClient({"url": url})
    Event = proto_class()
    broker = MockBroker()
    try:
        topics = {"json": [open(p, "rb").read().splitlines() for p in paths]}
        ctx = SerializationContext("bench-avro", MessageField.VALUE)
        ser = AvroSerializer(client, json.dumps(AVRO_SCHEMA))
        topics["avro"] = [[ser(e, ctx) for e in events_of(p)] for p in paths]
        ctx = SerializationContext("bench-protobuf", MessageField.VALUE)
        pser = ProtobufSerializer(Event, client, {"use.deprecated.format": False})

        def msg(e):
            m = Event(key=e["key"], event_time_ms=e["event_time_ms"])
            m.payload.value = e["payload"]["value"]
            if e["late"] is not None:
                m.late = e["late"]
            return m
        topics["protobuf"] = [[pser(msg(e), ctx) for e in events_of(p)] for p in paths]
        for name, parts in topics.items():
            broker.create_topic(f"bench-{name}", len(parts))
            # The mock broker keeps 5 MiB per partition: zstd keeps 1M small messages within it.
            produce(broker.bootstrap, f"bench-{name}", parts, compression="zstd")
        runs = {k: [] for k in topics}
        for _ in range(rounds):
            for name in topics:
                named = {"brokers": f"'{broker.bootstrap}'"}
                if name != "json":
                    named.update({"format": f"'{name}'", "schema_registry": f"'{url}'"})
                runs[name].append(measure(f"bench-{name}", named))
    finally:
        broker.stop()
        reg.shutdown()
    return {k: best(v) for k, v in runs.items()}


def decode_only(records):
    exe = os.path.join(ROOT, "target", "release", "examples", "format_bench")
    r = subprocess.run([exe, str(records)], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()}


def table(title, results):
    base = results[next(iter(results))]["rate"]
    lines = [f"**{title}**", "", "| format | events/s | vs JSON | events | dead letters | windows | peak RSS MB | all runs |",
             "|---|---|---|---|---|---|---|---|"]
    for k, r in results.items():
        lines.append(f"| {k} | {r['rate']:,} | {r['rate'] / base:.2f}x | {r['events']:,} | {r['dead']} | {r['windows']:,} | "
                     f"{r['rss_mb']} | {', '.join(f'{x:,}' for x in r['all_rates'])} |")
    return "\n".join(lines)


def main():
    quick = "--quick" in sys.argv
    files_events, kafka_events, rounds = (200_000, 100_000, 1) if quick else (4_000_000, 1_000_000, 2)
    files = files_section(files_events, rounds)
    kafka = kafka_section(kafka_events, rounds)
    dec = decode_only(200_000 if quick else 2_000_000)
    os.makedirs(benchlib.OUT, exist_ok=True)
    with open(os.path.join(benchlib.OUT, "formats.json"), "w") as f:
        json.dump({"files": files, "kafka": kafka, "decode_only": dec}, f, indent=1)
    dec_rows = ["**Decoding alone** (records/s, one thread; `crates/core/examples/format_bench.rs`)", "",
                "| reader | records/s |", "|---|---|"]
    for k, v in dec.items():
        if k != "records":
            dec_rows.append(f"| {k.replace('_per_sec', '')} | {v:,} |" if isinstance(v, (int, float)) else f"| {k} | {v} |")
    text = "\n\n".join([
        table(f"Files, {files_events:,} events, 50 keys, 4 files (fresh process per run)", files),
        table(f"Kafka (mock cluster), {kafka_events:,} events, 4 partitions, zstd batches", kafka),
        "\n".join(dec_rows),
    ])
    print(text)
    if not quick:
        write_section("docs/benchmarks.md", "formats", "make bench (scripts/bench_formats.py)", text)


if __name__ == "__main__":
    main()
