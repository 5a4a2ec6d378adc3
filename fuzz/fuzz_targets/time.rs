//! Coverage-guided fuzzing of the event-time parsers (`cargo fuzz run --sanitizer none time`):
//! no panic on any input; every RFC 3339 time chrono accepts is read to the same millisecond
//! (chrono's nanoseconds truncated); whatever is accepted is a valid instant in years 1-9999;
//! epoch numbers agree with exact integer arithmetic.
#![no_main]

use chrono::DateTime;
use libfuzzer_sys::fuzz_target;
use streaming_etl_core::{MAX_EVENT_TIME_MS, MIN_EVENT_TIME_MS, TimeFormat, Zone, epoch_ms, iso8601_ms};

fuzz_target!(|data: &[u8]| {
    let ours = iso8601_ms(data, None);
    if let Ok(ms) = ours {
        assert!((MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&ms));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(theirs) = DateTime::parse_from_rfc3339(text) {
            let want = theirs.timestamp_millis();
            if (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&want) && !text.contains(":60") {
                assert_eq!(ours, Ok(want), "{text}");
            }
        }
    }
    let _ = iso8601_ms(data, Some(&Zone::utc()));
    // Integer literals: floor(n × unit) by exact arithmetic.
    if let Some(n) = std::str::from_utf8(data).ok().and_then(|t| t.parse::<i64>().ok()) {
        let literal = n.to_string();
        for (f, num, den) in [
            (TimeFormat::EpochMs, 1i128, 1i128),
            (TimeFormat::EpochS, 1000, 1),
            (TimeFormat::EpochUs, 1, 1000),
            (TimeFormat::EpochNs, 1, 1_000_000),
        ] {
            let exact = (i128::from(n) * num).div_euclid(den);
            let want = (i128::from(MIN_EVENT_TIME_MS)..=i128::from(MAX_EVENT_TIME_MS))
                .contains(&exact)
                .then_some(exact as i64);
            assert_eq!(epoch_ms(literal.as_bytes(), f).ok(), want, "{literal} {f:?}");
        }
    }
});
