//! Avro and Protobuf records encoded by the formats' own libraries (apache-avro, prost-reflect)
//! and read back through the job's decoder: every kind of field, framing errors, and agreement
//! with the libraries' own decoders.

use std::sync::Arc;

use apache_avro::types::{Record, Value as AValue};
use apache_avro::Schema;
use prost_reflect::{DynamicMessage, Value as PValue};

use super::*;
use crate::decode::{FieldPath, Kind};

fn paths(p: &[&str]) -> Vec<FieldPath> {
    p.iter().map(|s| FieldPath::parse(s).unwrap()).collect()
}

fn framed(id: u32, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// (kind, text, timestamp) of each path.
fn read(
    d: &mut RecordDecoder,
    raw: &[u8],
    n: usize,
) -> Result<Vec<(Kind, String, bool)>, DecodeError> {
    let f = d.decode(raw, None)?;
    Ok((0..n)
        .map(|i| {
            let v = f.get(i);
            (
                v.kind,
                String::from_utf8_lossy(v.bytes).into_owned(),
                v.timestamp,
            )
        })
        .collect())
}

const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
    {"name":"id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-micros"}},
    {"name":"region","type":{"type":"enum","name":"Region","symbols":["EU","US"]}},
    {"name":"note","type":["null","string"],"default":null},
    {"name":"tags","type":{"type":"array","items":"string"}},
    {"name":"attrs","type":{"type":"map","values":"int"}},
    {"name":"price","type":"float"},
    {"name":"payload","type":{"type":"record","name":"Payload","fields":[
        {"name":"value","type":"double"},{"name":"ok","type":"boolean"},
        {"name":"blob","type":"bytes"}]}},
    {"name":"next","type":["null","Payload"],"default":null}]}"#;

fn order(schema: &Schema, note: Option<&str>) -> Vec<u8> {
    let mut r = Record::new(schema).unwrap();
    r.put("id", AValue::Long(-42));
    r.put("ts", AValue::TimestampMicros(1_700_000_000_123_999));
    r.put("region", AValue::Enum(1, "US".into()));
    r.put(
        "note",
        match note {
            Some(n) => AValue::Union(1, Box::new(AValue::String(n.into()))),
            None => AValue::Union(0, Box::new(AValue::Null)),
        },
    );
    r.put("tags", AValue::Array(vec![AValue::String("a".into())]));
    r.put(
        "attrs",
        AValue::Map(
            [("color".to_string(), AValue::Int(7))]
                .into_iter()
                .collect(),
        ),
    );
    r.put("price", AValue::Float(0.1));
    let payload = AValue::Record(vec![
        ("value".into(), AValue::Double(2.5)),
        ("ok".into(), AValue::Boolean(true)),
        ("blob".into(), AValue::Bytes(vec![0xff, 0x00])),
    ]);
    r.put("payload", payload.clone());
    r.put("next", AValue::Union(1, Box::new(payload)));
    apache_avro::to_avro_datum(schema, r).unwrap()
}

fn avro_cache(id: u32, text: &str) -> Schemas {
    let cache = SchemaCache::new();
    let s = RegisteredSchema {
        kind: SchemaType::Avro,
        text: text.into(),
        references: vec![],
    };
    cache.add(id, Some(&s)).unwrap();
    Schemas(cache)
}

#[test]
fn avro_fields_of_every_kind_by_dotted_path() {
    let schema = Schema::parse_str(ORDER).unwrap();
    let schemas = avro_cache(7, ORDER);
    let p = paths(&[
        "id",
        "ts",
        "region",
        "note",
        "tags",
        "attrs.color",
        "price",
        "payload.value",
        "payload.ok",
        "payload.blob",
        "next.value",
        "missing",
        "payload",
        "attrs.none",
    ]);
    let mut d = RecordDecoder::new(p.clone(), &Format::Avro, &schemas);
    let got = read(&mut d, &framed(7, &order(&schema, Some("hi"))), p.len()).unwrap();
    let want = [
        (Kind::Number, "-42", false),
        (Kind::Number, "1700000000123", true),
        (Kind::String, "US", false),
        (Kind::String, "hi", false),
        (Kind::Array, "", false),
        (Kind::Number, "7", false),
        (Kind::Number, "0.1", false),
        (Kind::Number, "2.5", false),
        (Kind::Bool, "true", false),
        (Kind::Bytes, "\u{fffd}\u{0}", false),
        (Kind::Number, "2.5", false),
        (Kind::Missing, "", false),
        (Kind::Object, "", false),
        (Kind::Missing, "", false),
    ];
    for (i, (k, t, ts)) in want.iter().enumerate() {
        assert_eq!(got[i], (*k, t.to_string(), *ts), "path {}", p[i].as_str());
    }
    let null = read(&mut d, &framed(7, &order(&schema, None)), 4).unwrap();
    assert_eq!(null[3].0, Kind::Null);
}

#[test]
fn avro_framing_and_bad_bytes_are_dead_letter_reasons() {
    let schema = Schema::parse_str(ORDER).unwrap();
    let schemas = avro_cache(7, ORDER);
    schemas.0.add(8, None).unwrap();
    let mut d = RecordDecoder::new(paths(&["id"]), &Format::Avro, &schemas);
    let body = order(&schema, None);
    let err =
        |d: &mut RecordDecoder, raw: &[u8]| d.decode(raw, None).err().map(DecodeError::describe);
    assert_eq!(
        err(&mut d, br#"{"id":1}"#).unwrap(),
        "not in the schema registry's wire format: the first byte is 0x7b, not the magic byte 0"
    );
    assert!(err(&mut d, &[0, 0, 0]).unwrap().contains("5-byte header"));
    assert_eq!(
        err(&mut d, &framed(8, &body)).unwrap(),
        "schema id 8 is not in the schema registry"
    );
    assert_eq!(
        err(&mut d, &framed(9, &body)).unwrap(),
        "schema id 9 is not in the schema registry"
    );
    let cut = framed(7, &body[..body.len() - 3]);
    assert_eq!(
        err(&mut d, &cut).unwrap(),
        "not Avro: unexpected end of data"
    );
    let mut extra = framed(7, &body);
    extra.push(1);
    assert_eq!(
        err(&mut d, &extra).unwrap(),
        "not Avro: bytes left after the record"
    );
    let mut p = RecordDecoder::new(
        paths(&["id"]),
        &Format::Protobuf { message: None },
        &schemas,
    );
    assert_eq!(
        err(&mut p, &framed(7, &[0])).unwrap(),
        "schema id 7 is a Avro schema, not the job's format"
    );
}

#[test]
fn avro_agrees_with_apache_avro_on_generated_records() {
    let text = r#"{"type":"record","name":"E","fields":[
        {"name":"k","type":["null","string","long"]},{"name":"v","type":["double","null"]},
        {"name":"xs","type":{"type":"array","items":{"type":"map","values":"string"}}},
        {"name":"t","type":"long"}]}"#;
    let schema = Schema::parse_str(text).unwrap();
    let schemas = avro_cache(1, text);
    let mut d = RecordDecoder::new(paths(&["k", "v", "t"]), &Format::Avro, &schemas);
    let mut seed = 12345u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..500 {
        let k = match rnd() % 3 {
            0 => AValue::Union(0, Box::new(AValue::Null)),
            1 => AValue::Union(1, Box::new(AValue::String(format!("key{}", rnd() % 100)))),
            _ => AValue::Union(2, Box::new(AValue::Long(rnd() as i64))),
        };
        let v = if rnd() % 4 == 0 {
            AValue::Union(1, Box::new(AValue::Null))
        } else {
            AValue::Union(0, Box::new(AValue::Double((rnd() % 100000) as f64 / 7.0)))
        };
        let xs = (0..rnd() % 3)
            .map(|i| {
                AValue::Map(
                    [(format!("m{i}"), AValue::String("x".repeat(i as usize)))]
                        .into_iter()
                        .collect(),
                )
            })
            .collect();
        let rec = AValue::Record(vec![
            ("k".into(), k),
            ("v".into(), v),
            ("xs".into(), AValue::Array(xs)),
            ("t".into(), AValue::Long(rnd() as i64 >> 20)),
        ]);
        let body = apache_avro::to_avro_datum(&schema, rec).unwrap();
        let back = apache_avro::from_avro_datum(&schema, &mut body.as_slice(), None).unwrap();
        let AValue::Record(fields) = back else {
            panic!()
        };
        let got = read(&mut d, &framed(1, &body), 3).unwrap();
        for (i, (_, want)) in fields.iter().filter(|(n, _)| n != "xs").enumerate() {
            let want = match want {
                AValue::Union(_, b) => &**b,
                other => other,
            };
            let expect = match want {
                AValue::Null => (Kind::Null, String::new()),
                AValue::String(s) => (Kind::String, s.clone()),
                AValue::Long(n) => (Kind::Number, n.to_string()),
                AValue::Double(x) => (Kind::Number, format!("{x:?}")),
                other => panic!("{other:?}"),
            };
            assert_eq!((got[i].0, got[i].1.clone()), expect);
        }
    }
}

const PROTO: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Other { int32 x = 1; }
message Order {
  string key = 1;
  int64 amount = 2;
  double price = 3;
  google.protobuf.Timestamp at = 4;
  Payload payload = 5;
  repeated string tags = 6;
  Status status = 7;
  optional int32 maybe = 8;
  sint64 delta = 9;
  bool vip = 10;
  message Payload { float value = 1; string note = 2; }
  enum Status { NEW = 0; PAID = 1; }
}
"#;

fn proto_cache(id: u32, text: &str) -> (Schemas, prost_reflect::MessageDescriptor) {
    let cache = SchemaCache::new();
    let s = RegisteredSchema {
        kind: SchemaType::Protobuf,
        text: text.into(),
        references: vec![],
    };
    cache.add(id, Some(&s)).unwrap();
    let Some(Entry::Known(c)) = cache.get(id) else {
        panic!()
    };
    let Compiled::Protobuf(p) = &*c else { panic!() };
    let m = p.message(&[1]).unwrap();
    (Schemas(cache), m)
}

#[test]
fn protobuf_fields_defaults_timestamps_and_message_indexes() {
    let (schemas, desc) = proto_cache(3, PROTO);
    let mut m = DynamicMessage::new(desc.clone());
    m.set_field_by_name("key", PValue::String("k1".into()));
    m.set_field_by_name("amount", PValue::I64(-5));
    let mut ts = DynamicMessage::new(
        desc.parent_pool()
            .get_message_by_name("google.protobuf.Timestamp")
            .unwrap(),
    );
    ts.set_field_by_name("seconds", PValue::I64(1_700_000_000));
    ts.set_field_by_name("nanos", PValue::I32(250_999_999));
    m.set_field_by_name("at", PValue::Message(ts));
    let mut payload = DynamicMessage::new(
        desc.parent_pool()
            .get_message_by_name("shop.Order.Payload")
            .unwrap(),
    );
    payload.set_field_by_name("value", PValue::F32(0.1));
    m.set_field_by_name("payload", PValue::Message(payload));
    m.set_field_by_name("tags", PValue::List(vec![PValue::String("a".into())]));
    m.set_field_by_name("status", PValue::EnumNumber(1));
    m.set_field_by_name("delta", PValue::I64(-3));
    let body = prost_reflect::prost::Message::encode_to_vec(&m);
    // Message indexes [1] (Order is the second top-level message): count 1, index 1, zigzag.
    let mut raw = framed(3, &[2, 2]);
    raw.extend_from_slice(&body);
    let p = paths(&[
        "key",
        "amount",
        "price",
        "at",
        "payload.value",
        "payload.note",
        "tags",
        "status",
        "maybe",
        "delta",
        "vip",
        "nope",
    ]);
    let mut d = RecordDecoder::new(p.clone(), &Format::Protobuf { message: None }, &schemas);
    let got = read(&mut d, &raw, p.len()).unwrap();
    let want = [
        (Kind::String, "k1", false),
        (Kind::Number, "-5", false),
        (Kind::Number, "0.0", false),
        (Kind::Number, "1700000000250", true),
        (Kind::Number, "0.1", false),
        (Kind::String, "", false),
        (Kind::Array, "", false),
        (Kind::String, "PAID", false),
        (Kind::Missing, "", false),
        (Kind::Number, "-3", false),
        (Kind::Bool, "false", false),
        (Kind::Missing, "", false),
    ];
    for (i, (k, t, ts)) in want.iter().enumerate() {
        assert_eq!(got[i], (*k, t.to_string(), *ts), "path {}", p[i].as_str());
    }
    // Framed as the first message (Other) while the job reads shop.Order.
    let mut other = framed(3, &[0]);
    other.extend_from_slice(&[8, 1]);
    let mut strict = RecordDecoder::new(
        p.clone(),
        &Format::Protobuf {
            message: Some("shop.Order".into()),
        },
        &schemas,
    );
    assert_eq!(
        strict
            .decode(&other, None)
            .err()
            .map(DecodeError::describe)
            .unwrap(),
        "the record is another message of schema id 3 than the job's 'message'"
    );
    assert!(strict.decode(&raw, None).is_ok());
    let mut bad = framed(3, &[2, 8]);
    bad.extend_from_slice(&body);
    assert_eq!(
        d.decode(&bad, None)
            .err()
            .map(DecodeError::describe)
            .unwrap(),
        "not Protobuf: the message indexes name no message of schema id 3"
    );
    let mut cut = raw.clone();
    cut.truncate(raw.len() - 1);
    assert!(matches!(
        d.decode(&cut, None),
        Err(DecodeError::Undecodable("Protobuf", _))
    ));
}

#[test]
fn protobuf_schemas_as_serialized_descriptors_with_references() {
    // What Confluent's clients register: base64 FileDescriptorProtos, imports as references.
    use base64::Engine as _;
    let (_, desc) = proto_cache(1, PROTO);
    let file = desc.parent_file().file_descriptor_proto().clone();
    let b64 = base64::engine::general_purpose::STANDARD
        .encode(prost_reflect::prost::Message::encode_to_vec(&file));
    let ts = desc
        .parent_pool()
        .get_file_by_name("google/protobuf/timestamp.proto")
        .unwrap()
        .file_descriptor_proto()
        .clone();
    let ts64 = base64::engine::general_purpose::STANDARD
        .encode(prost_reflect::prost::Message::encode_to_vec(&ts));
    let cache: Arc<SchemaCache> = SchemaCache::new();
    let s = RegisteredSchema {
        kind: SchemaType::Protobuf,
        text: b64,
        references: vec![("google/protobuf/timestamp.proto".into(), ts64)],
    };
    cache.add(4, Some(&s)).unwrap();
    let schemas = Schemas(cache);
    let mut m = DynamicMessage::new(desc);
    m.set_field_by_name("key", PValue::String("z".into()));
    let mut raw = framed(4, &[2, 2]);
    raw.extend_from_slice(&prost_reflect::prost::Message::encode_to_vec(&m));
    let mut d = RecordDecoder::new(
        paths(&["key"]),
        &Format::Protobuf { message: None },
        &schemas,
    );
    assert_eq!(read(&mut d, &raw, 1).unwrap()[0].1, "z");
    let broken = RegisteredSchema {
        kind: SchemaType::Protobuf,
        text: "syntax = \"proto3\"; message {".into(),
        references: vec![],
    };
    assert!(SchemaCache::new().add(5, Some(&broken)).is_err());
}

#[test]
fn a_debezium_event_is_read_bare_or_as_the_payload_of_its_schema_wrapper() {
    let p = paths(&["op", "ts_ms", "after.id", "before.name"]);
    let mut d = RecordDecoder::new(p.clone(), &Format::Json, &Schemas::default())
        .envelope(Envelope::Debezium);
    let bare = br#"{"before":{"id":1,"name":"a"},"after":{"id":1,"name":"b"},"op":"u","ts_ms":7}"#;
    let wrapped = br#" { "schema" : {"type":"struct","fields":[{"field":"op"}]}, "payload": {"before":{"id":1,"name":"a"},"after":{"id":1,"name":"b"},"op":"u","ts_ms":7}}"#;
    let want = vec![
        (Kind::String, "u".to_string(), false),
        (Kind::Number, "7".to_string(), false),
        (Kind::Number, "1".to_string(), false),
        (Kind::String, "a".to_string(), false),
    ];
    assert_eq!(read(&mut d, bare, 4).unwrap(), want);
    assert_eq!(read(&mut d, wrapped, 4).unwrap(), want);
    // The wrapper is still checked as JSON, and a payload of null reads nothing.
    assert!(read(&mut d, br#"{"schema":{},"payload":{"op":"c"}"#, 1).is_err());
    let none = read(&mut d, br#"{"schema":null,"payload":null}"#, 1).unwrap();
    assert_eq!(none[0].0, Kind::Missing);
    // Without the envelope, the wrapper's fields are not looked into.
    let mut plain = RecordDecoder::new(p, &Format::Json, &Schemas::default());
    assert_eq!(read(&mut plain, wrapped, 1).unwrap()[0].0, Kind::Missing);
}

#[test]
fn a_debezium_tombstone_reads_as_the_delete_of_its_key() {
    let p = paths(&["op", "ts_ms", "before.id", "after.id"]);
    let mut d = RecordDecoder::new(p.clone(), &Format::Json, &Schemas::default())
        .envelope(Envelope::Debezium);
    let got = |d: &mut RecordDecoder, key: &[u8], ts| {
        let f = d.decode_message(b"", None, Some(key), ts).unwrap();
        (0..4)
            .map(|i| String::from_utf8_lossy(f.get(i).bytes).into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(got(&mut d, br#"{"id":5}"#, Some(9)), ["d", "9", "5", ""]);
    // The key in the JSON converter's wrapper.
    let wrapped = br#"{"schema":{"type":"struct"},"payload":{"id":6}}"#;
    assert_eq!(got(&mut d, wrapped, Some(9)), ["d", "9", "6", ""]);
    // A key that is not JSON is an error; an empty value without a key is an empty message.
    assert!(d.decode_message(b"", None, Some(b"k1"), Some(9)).is_err());
    assert_eq!(
        d.decode_message(b"", None, None, Some(9)).err(),
        Some(DecodeError::Empty)
    );
    // Without the envelope, an empty value is an empty message whatever its key.
    let mut plain = RecordDecoder::new(p, &Format::Json, &Schemas::default());
    assert_eq!(
        plain
            .decode_message(b"", None, Some(br#"{"id":5}"#), Some(9))
            .err(),
        Some(DecodeError::Empty)
    );
}

#[test]
fn an_upsert_tombstone_reads_as_its_keys_fields_marked_deleted() {
    let p = paths(&[TOMBSTONE_FIELD, "id", "name"]);
    let mut d = RecordDecoder::new(p.clone(), &Format::Json, &Schemas::default())
        .envelope(Envelope::Upsert);
    let got = |d: &mut RecordDecoder, value: &[u8], key: Option<&[u8]>| {
        let f = d.decode_message(value, None, key, Some(9)).unwrap();
        (0..3)
            .map(|i| String::from_utf8_lossy(f.get(i).bytes).into_owned())
            .collect::<Vec<_>>()
    };
    assert!(d.is_tombstone(b"", Some(b"{}")));
    assert!(!d.is_tombstone(b"", None) && !d.is_tombstone(b"", Some(b"")));
    assert_eq!(got(&mut d, b"", Some(br#" {"id":5} "#)), ["true", "5", ""]);
    // The key in the JSON converter's wrapper; a key that is not an object names no field.
    let wrapped = br#"{"schema":{"type":"struct"},"payload":{"id":6}}"#;
    assert_eq!(got(&mut d, b"", Some(wrapped)), ["true", "6", ""]);
    assert_eq!(got(&mut d, b"", Some(b"customer-7")), ["true", "", ""]);
    assert_eq!(got(&mut d, b"", Some(b"{ }")), ["true", "", ""]);
    // A message with a value is its row, wrapped or not.
    let row = br#"{"id":8,"name":"x"}"#;
    assert_eq!(got(&mut d, row, Some(b"8")), ["", "8", "x"]);
    let wrapped_row = br#"{"schema":{},"payload":{"id":8,"name":"x"}}"#;
    assert_eq!(got(&mut d, wrapped_row, None), ["", "8", "x"]);
    // An Avro topic's key is read with the key's own schema from the registry.
    let key_schema = r#"{"type":"record","name":"Key","fields":[{"name":"id","type":"long"}]}"#;
    let schemas = avro_cache(11, key_schema);
    let mut avro =
        RecordDecoder::new(p.clone(), &Format::Avro, &schemas).envelope(Envelope::Upsert);
    let parsed = Schema::parse_str(key_schema).unwrap();
    let mut rec = apache_avro::types::Record::new(&parsed).unwrap();
    rec.put("id", 42i64);
    let key = framed(11, &apache_avro::to_avro_datum(&parsed, rec).unwrap());
    assert_eq!(got(&mut avro, b"", Some(&key)), ["true", "42", ""]);
    assert_eq!(
        avro.decode_message(b"", None, Some(&framed(12, b"\x02")), None)
            .err(),
        Some(DecodeError::UnknownSchema(12))
    );
    let mut debezium = RecordDecoder::new(paths(&["op", "before.id"]), &Format::Avro, &schemas)
        .envelope(Envelope::Debezium);
    let f = debezium
        .decode_message(b"", None, Some(&key), Some(9))
        .unwrap();
    assert_eq!((f.get(0).bytes, f.get(1).bytes), (&b"d"[..], &b"42"[..]));
}

#[test]
fn avro_decimals_read_as_the_numbers_they_are() {
    let t = |b: &[u8], scale| avro::decimal_text(b, scale).unwrap();
    assert_eq!(t(&[0x04, 0xD2], 2), "12.34");
    assert_eq!(t(&[0xFB, 0x2E], 2), "-12.34");
    assert_eq!(t(&[0x05], 3), "0.005");
    assert_eq!(t(&[0xFF], 1), "-0.1");
    assert_eq!(t(&[0x04, 0xD2], 0), "1234");
    assert_eq!(t(&[], 2), "0.00");
    assert!(avro::decimal_text(&[1; 17], 2).is_err());
}
