//! Coverage-guided fuzzing of the message decoder (`cargo fuzz run --sanitizer none decode`):
//! it must never panic, a message it accepts must be JSON for serde_json too, and every field it
//! reports must be what serde_json finds at that path (kind and text).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use streaming_etl_core::{DecodeError, Decoder, FieldPath, Kind};

const PATHS: [&str; 5] = ["key", "event_time_ms", "payload.value", "payload", "a.b.c"];

fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |cur, seg| cur.as_object()?.get(seg))
}

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(PATHS.iter().map(|p| FieldPath::parse(p).expect("valid path")).collect());
    match d.decode(data) {
        Ok(fields) => {
            let v: Value = match serde_json::from_slice(data) {
                Ok(v) => v,
                // JSON has no range limit; serde_json refuses numbers beyond f64 even in members
                // the decoder only skips.
                Err(e) if e.to_string().contains("number out of range") => return,
                Err(e) => panic!("accepted, so it is JSON: {e}"),
            };
            for (i, path) in PATHS.iter().enumerate() {
                let f = fields.get(i);
                if f.duplicate {
                    continue; // serde_json keeps the last occurrence, the decoder flags it
                }
                let theirs = at(&v, path);
                match (f.kind, theirs) {
                    (Kind::Missing, None) => {}
                    (Kind::Null, Some(Value::Null)) => {}
                    (Kind::Bool, Some(Value::Bool(b))) => {
                        assert_eq!(f.text(), Some(if *b { "true" } else { "false" }))
                    }
                    (Kind::Number, Some(Value::Number(_))) => {}
                    (Kind::String, Some(Value::String(s))) => assert_eq!(f.text(), Some(s.as_str())),
                    (Kind::Object, Some(Value::Object(_))) | (Kind::Array, Some(Value::Array(_))) => {
                        let raw: Value = serde_json::from_slice(f.bytes).expect("an object's text is JSON");
                        assert_eq!(Some(&raw), theirs);
                    }
                    (k, t) => {
                        // A path below a duplicated member may differ; serde keeps the last one.
                        let dup_above = PATHS.iter().enumerate().any(|(j, p)| {
                            j != i && path.starts_with(&format!("{p}.")) && fields.get(j).duplicate
                        });
                        assert!(dup_above, "path {path}: decoder {k:?}, serde_json {t:?}");
                    }
                }
            }
        }
        Err(e) => {
            if matches!(e, DecodeError::NotJson(_) | DecodeError::Empty | DecodeError::InvalidUtf8) {
                assert!(
                    serde_json::from_slice::<Value>(data).is_err(),
                    "rejected as not JSON: {e:?}"
                );
            }
            assert!(!e.describe().is_empty());
        }
    }
});
