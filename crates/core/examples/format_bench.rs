//! Decoding alone, per format, on the benchmark's events (key, event_time_ms, payload.value):
//! the job's JSON scanner, its Avro and Protobuf readers, and the formats' own libraries'
//! generic decoders (`apache_avro::from_avro_datum`, `prost_reflect::DynamicMessage::decode`),
//! which build a value tree per record. Prints one JSON line of records per second.
//!
//! usage: format_bench [records]

use std::hint::black_box;
use std::time::Instant;

use apache_avro::types::Value as AValue;
use prost_reflect::{DynamicMessage, Value as PValue};
use streaming_etl_core::{
    FieldPath, Format, RecordDecoder, RegisteredSchema, SchemaCache, SchemaType, Schemas,
};

const AVRO: &str = r#"{"type":"record","name":"Event","fields":[
    {"name":"key","type":"string"},{"name":"event_time_ms","type":"long"},
    {"name":"payload","type":{"type":"record","name":"Payload","fields":[{"name":"value","type":"double"}]}},
    {"name":"late","type":["null","int"],"default":null}]}"#;

const PROTO: &str = r#"syntax = "proto3";
message Event { string key = 1; int64 event_time_ms = 2; Payload payload = 3; optional int32 late = 4;
  message Payload { double value = 1; } }"#;

fn rate(n: usize, f: impl FnMut(usize)) -> f64 {
    let mut f = f;
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let paths: Vec<FieldPath> = ["event_time_ms", "key", "payload.value"]
        .iter()
        .filter_map(|p| FieldPath::parse(p))
        .collect();
    let cache = SchemaCache::new();
    let reg = |kind, text: &str| RegisteredSchema {
        kind,
        text: text.to_string(),
        references: vec![],
    };
    let (Ok(()), Ok(())) = (
        cache.add(1, Some(&reg(SchemaType::Avro, AVRO))),
        cache.add(2, Some(&reg(SchemaType::Protobuf, PROTO))),
    ) else {
        eprintln!("schemas do not parse");
        std::process::exit(1);
    };
    let schemas = Schemas(cache);
    let Ok(avro_schema) = apache_avro::Schema::parse_str(AVRO) else {
        std::process::exit(1)
    };
    let dir = std::env::temp_dir();
    let _ = std::fs::write(dir.join("format_bench_event.proto"), PROTO);
    let Ok(set) = protox::compile(["format_bench_event.proto"], [&dir]) else {
        std::process::exit(1)
    };
    let Ok(pool) = prost_reflect::DescriptorPool::from_file_descriptor_set(set) else {
        std::process::exit(1)
    };
    let Some(desc) = pool.get_message_by_name("Event") else {
        std::process::exit(1)
    };
    let Some(payload_desc) = pool.get_message_by_name("Event.Payload") else {
        std::process::exit(1)
    };
    let (mut json, mut avro, mut proto) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n.min(100_000) {
        let (key, t, v) = (
            format!("k{}", i % 50),
            1_700_000_000_000i64 + i as i64,
            (i % 10001) as f64 / 100.0,
        );
        json.push(
            format!(r#"{{"key":"{key}","event_time_ms":{t},"payload":{{"value":{v}}}}}"#)
                .into_bytes(),
        );
        let rec = AValue::Record(vec![
            ("key".into(), AValue::String(key.clone())),
            ("event_time_ms".into(), AValue::Long(t)),
            (
                "payload".into(),
                AValue::Record(vec![("value".into(), AValue::Double(v))]),
            ),
            ("late".into(), AValue::Union(0, Box::new(AValue::Null))),
        ]);
        let Ok(body) = apache_avro::to_avro_datum(&avro_schema, rec) else {
            std::process::exit(1)
        };
        let mut framed = vec![0, 0, 0, 0, 1];
        framed.extend_from_slice(&body);
        avro.push(framed);
        let mut m = DynamicMessage::new(desc.clone());
        m.set_field_by_name("key", PValue::String(key));
        m.set_field_by_name("event_time_ms", PValue::I64(t));
        let mut p = DynamicMessage::new(payload_desc.clone());
        p.set_field_by_name("value", PValue::F64(v));
        m.set_field_by_name("payload", PValue::Message(p));
        let mut framed = vec![0, 0, 0, 0, 2, 0];
        framed.extend_from_slice(&prost_reflect::prost::Message::encode_to_vec(&m));
        proto.push(framed);
    }
    let k = json.len();
    let mut dj = RecordDecoder::new(paths.clone(), &Format::Json, &schemas);
    let mut da = RecordDecoder::new(paths.clone(), &Format::Avro, &schemas);
    let mut dp = RecordDecoder::new(paths, &Format::Protobuf { message: None }, &schemas);
    let json_rate = rate(n, |i| {
        black_box(dj.decode(&json[i % k], None).is_ok());
    });
    let avro_rate = rate(n, |i| {
        black_box(da.decode(&avro[i % k], None).is_ok());
    });
    let avro_lib = rate(n, |i| {
        black_box(apache_avro::from_avro_datum(&avro_schema, &mut &avro[i % k][5..], None).is_ok());
    });
    let proto_rate = rate(n, |i| {
        black_box(dp.decode(&proto[i % k], None).is_ok());
    });
    let proto_lib = rate(n, |i| {
        black_box(DynamicMessage::decode(desc.clone(), &proto[i % k][6..]).is_ok());
    });
    println!(
        "{{\"records\": {n}, \"json_per_sec\": {json_rate:.0}, \"avro_per_sec\": {avro_rate:.0}, \"apache_avro_value_per_sec\": {avro_lib:.0}, \"protobuf_per_sec\": {proto_rate:.0}, \"prost_reflect_dynamic_per_sec\": {proto_lib:.0}}}"
    );
}
