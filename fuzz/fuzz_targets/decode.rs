//! Coverage-guided fuzzing of the message decoder (`cargo fuzz run --sanitizer none decode`):
//! it must never panic, every rejection must come with a reason, and a message it accepts must
//! be JSON for serde_json too (with the three fields of the types it reported).
#![no_main]

use streaming_etl_core::decode::{DecodeError, Decoder, FieldPath};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = |p: &str| FieldPath::parse(p).expect("valid path");
    let mut d = Decoder::new(path("key"), path("event_time_ms"), path("payload.value"));
    match d.decode(data) {
        Ok(dec) => {
            let v: serde_json::Value = match serde_json::from_slice(data) {
                Ok(v) => v,
                // JSON has no range limit; serde_json refuses numbers beyond f64 even in members
                // the decoder only skips.
                Err(e) if e.to_string().contains("number out of range") => return,
                Err(e) => panic!("accepted, so it is JSON: {e}"),
            };
            let t = v.get("event_time_ms").expect("a time field");
            // serde_json reads "-0" as a float; it is the integer 0 all the same.
            assert!(
                t.as_i64() == Some(dec.event_time_ms) || (t.as_f64() == Some(0.0) && dec.event_time_ms == 0),
                "time {t} decoded as {}",
                dec.event_time_ms
            );
            match (dec.key, v.get("key")) {
                (Some(k), Some(serde_json::Value::String(s))) => assert_eq!(k, s),
                (Some(_), Some(j)) => assert!(j.is_number(), "a key is a string or a number"),
                (None, j) => assert!(j.is_none(), "a key field was there"),
                (Some(_), None) => panic!("a key without a key field"),
            }
        }
        Err(e) => {
            assert!(!d.describe(e).is_empty());
            if matches!(e, DecodeError::NotJson(_) | DecodeError::Empty) {
                assert!(serde_json::from_slice::<serde_json::Value>(data).is_err(), "rejected as not JSON: {e:?}");
            }
        }
    }
});
