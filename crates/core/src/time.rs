//! Event time as producers send it: epoch numbers in milliseconds, seconds, microseconds or
//! nanoseconds (fractions truncated to the millisecond, exactly, from the literal's digits), or
//! ISO 8601 / RFC 3339 text with `Z` or a numeric offset; text without an offset is read in a
//! zone the job names (UTC or an IANA zone), never guessed. Parsing allocates nothing.

/// Event times outside years 1..=9999 are rejected: they are almost always unit mistakes
/// (seconds or microseconds), and inside this range window arithmetic cannot overflow.
pub const MIN_EVENT_TIME_MS: i64 = -62_135_596_800_000;
pub const MAX_EVENT_TIME_MS: i64 = 253_402_300_799_999;

/// How a message's event time is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    /// Integer epoch milliseconds, as version 0.1 read them (the default when no format is
    /// named: a fractional number is a dead letter).
    EpochMsInteger,
    /// Epoch numbers in the unit; fractional values are truncated to the millisecond.
    EpochMs,
    EpochS,
    EpochUs,
    EpochNs,
    /// ISO 8601 / RFC 3339 text.
    Iso8601,
}

impl TimeFormat {
    pub fn parse(name: &str) -> Option<TimeFormat> {
        Some(match name.to_ascii_lowercase().as_str() {
            "epoch_ms" => TimeFormat::EpochMs,
            "epoch_s" => TimeFormat::EpochS,
            "epoch_us" => TimeFormat::EpochUs,
            "epoch_ns" => TimeFormat::EpochNs,
            "iso8601" => TimeFormat::Iso8601,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TimeFormat::EpochMsInteger | TimeFormat::EpochMs => "epoch_ms",
            TimeFormat::EpochS => "epoch_s",
            TimeFormat::EpochUs => "epoch_us",
            TimeFormat::EpochNs => "epoch_ns",
            TimeFormat::Iso8601 => "iso8601",
        }
    }

    /// The power of ten that turns the unit into milliseconds.
    fn exp10(self) -> i32 {
        match self {
            TimeFormat::EpochS => 3,
            TimeFormat::EpochUs => -3,
            TimeFormat::EpochNs => -6,
            _ => 0,
        }
    }

    /// What the field is expected to be, for dead-letter reasons.
    pub(crate) fn expected(self) -> &'static str {
        match self {
            TimeFormat::EpochMsInteger => "integer epoch milliseconds",
            TimeFormat::EpochMs => "epoch milliseconds",
            TimeFormat::EpochS => "epoch seconds",
            TimeFormat::EpochUs => "epoch microseconds",
            TimeFormat::EpochNs => "epoch nanoseconds",
            TimeFormat::Iso8601 => "an ISO 8601 date-time such as 2026-11-30T12:00:01.250Z",
        }
    }
}

/// Why a time could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeError {
    OutOfRange,
    /// ISO text that is not a date-time; the detail says what is wrong.
    BadIso(&'static str),
    /// ISO text without an offset, and no zone to assume.
    NoZone,
}

/// The zone local times (ISO text without an offset) are read in.
#[derive(Debug, Clone)]
pub struct Zone {
    name: String,
    tz: Option<tz::TimeZone>,
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl Zone {
    pub fn utc() -> Zone {
        Zone {
            name: "UTC".into(),
            tz: None,
        }
    }

    /// An IANA zone from its TZif data (read by the caller from the system's zone database).
    pub fn from_tzif(name: &str, data: &[u8]) -> Result<Zone, String> {
        let tz = tz::TimeZone::from_tz_data(data).map_err(|e| e.to_string())?;
        Ok(Zone {
            name: name.to_string(),
            tz: Some(tz),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn offset_at(&self, unix_s: i64) -> Option<i64> {
        match &self.tz {
            None => Some(0),
            Some(tz) => tz
                .find_local_time_type(unix_s)
                .ok()
                .map(|t| i64::from(t.ut_offset())),
        }
    }

    /// The instant of a local wall-clock time. A time that occurs twice (clocks turned back) is
    /// the first occurrence; one that does not occur (clocks turned forward) is read with the
    /// offset before the change, i.e. moved forward by the gap (as ECMAScript Temporal's
    /// "compatible" and java.time do).
    pub(crate) fn local_to_utc_ms(&self, local_ms: i64) -> Option<i64> {
        let Some(_) = &self.tz else {
            return Some(local_ms);
        };
        let local_s = local_ms.div_euclid(1000);
        let sub = local_ms.rem_euclid(1000);
        let before = self.offset_at(local_s - 86_400)?;
        let after = self.offset_at(local_s + 86_400)?;
        let valid = |o: i64| self.offset_at(local_s - o) == Some(o);
        let utc_s = match (valid(before), valid(after)) {
            (true, true) => (local_s - before).min(local_s - after),
            (true, false) => local_s - before,
            (false, true) => local_s - after,
            (false, false) => local_s - before.min(after),
        };
        Some(utc_s * 1000 + sub)
    }
}

/// Epoch milliseconds from a JSON number literal in the format's unit: floor(literal × unit in
/// ms), computed from the digits (no floating point), so `1.7e9` seconds and
/// `1700000000.123999` seconds give exact milliseconds.
pub fn epoch_ms(literal: &[u8], format: TimeFormat) -> Result<i64, TimeError> {
    let (neg, body) = match literal.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, literal),
    };
    let (mantissa, exp) = match body.iter().position(|&c| c == b'e' || c == b'E') {
        Some(i) => {
            let e = std::str::from_utf8(&body[i + 1..])
                .ok()
                .and_then(|s| s.parse::<i32>().ok())
                .ok_or(TimeError::OutOfRange)?;
            (&body[..i], e)
        }
        None => (body, 0),
    };
    let (int_digits, frac_digits) = match mantissa.iter().position(|&c| c == b'.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, &mantissa[..0]),
    };
    // The decimal point moves right by `shift` digits.
    let shift = exp.saturating_add(format.exp10());
    let digits = int_digits.iter().chain(frac_digits.iter());
    let point = int_digits.len() as i64 + i64::from(shift);
    let mut whole: i64 = 0;
    let mut rest_nonzero = false;
    for (i, &d) in digits.enumerate() {
        let v = i64::from(d - b'0');
        if (i as i64) < point {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(v))
                .ok_or(TimeError::OutOfRange)?;
        } else if v != 0 {
            rest_nonzero = true;
        }
    }
    // Trailing zeros the shift adds beyond the digits (none matter for zero, and any other
    // value is out of range after at most 19 of them).
    let written = (int_digits.len() + frac_digits.len()) as i64;
    let zeros = if whole == 0 {
        0
    } else {
        (point - written).clamp(0, 20)
    };
    for _ in 0..zeros {
        whole = whole.checked_mul(10).ok_or(TimeError::OutOfRange)?;
        if whole > MAX_EVENT_TIME_MS {
            return Err(TimeError::OutOfRange);
        }
    }
    let ms = if neg {
        -whole - i64::from(rest_nonzero)
    } else {
        whole
    };
    if (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(TimeError::OutOfRange)
    }
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian).
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date (proleptic Gregorian) of a day counted from 1970-01-01.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Epoch milliseconds as RFC 3339 text in UTC (`2023-11-14T22:13:20.000Z`).
pub(crate) fn rfc3339_ms(ms: i64) -> String {
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

fn num(b: &[u8], at: usize, n: usize) -> Result<i64, TimeError> {
    let s = b.get(at..at + n).ok_or(TimeError::BadIso("too short"))?;
    s.iter().try_fold(0i64, |v, &c| {
        if c.is_ascii_digit() {
            Ok(v * 10 + i64::from(c - b'0'))
        } else {
            Err(TimeError::BadIso("expected digits"))
        }
    })
}

/// Reads `YYYY-MM-DD(T| )HH:MM[:SS[.fraction]][Z|±HH[:MM]|±HHMM]` into epoch milliseconds;
/// without an offset, the local time is read in `zone` (or refused).
pub fn iso8601_ms(b: &[u8], zone: Option<&Zone>) -> Result<i64, TimeError> {
    let bad = TimeError::BadIso;
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return Err(bad("expected YYYY-MM-DD"));
    }
    let (y, mo, d) = (num(b, 0, 4)?, num(b, 5, 2)?, num(b, 8, 2)?);
    // Year 0000 is a date (RFC 3339, proleptic Gregorian): whether the instant falls within
    // years 1-9999 is decided once the offset is applied (0000-12-31T23:00-02:00 is in year 1).
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
        return Err(bad("no such date"));
    }
    match b.get(10) {
        Some(b'T' | b't' | b' ') => {}
        None => return Err(bad("a date without a time")),
        _ => return Err(bad("expected 'T' or a space between date and time")),
    }
    if b.get(13) != Some(&b':') {
        return Err(bad("expected HH:MM"));
    }
    let (h, mi) = (num(b, 11, 2)?, num(b, 14, 2)?);
    let mut i = 16;
    let mut s = 0;
    let mut ms = 0;
    if b.get(i) == Some(&b':') {
        s = num(b, i + 1, 2)?;
        i += 3;
        if matches!(b.get(i), Some(b'.' | b',')) {
            i += 1;
            let start = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                if i - start < 3 {
                    ms = ms * 10 + i64::from(b[i] - b'0');
                }
                i += 1;
            }
            let n = i - start;
            if n == 0 {
                return Err(bad("expected digits after the decimal point"));
            }
            for _ in n..3 {
                ms *= 10;
            }
        }
    }
    if h > 23 || mi > 59 || s > 59 {
        return Err(bad(
            "hour, minute or second out of range (a leap second 60 is not accepted)",
        ));
    }
    let local_ms = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60_000 + s * 1000 + ms;
    let utc = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => local_ms,
        Some(&sign @ (b'+' | b'-')) => {
            let oh = num(b, i + 1, 2)?;
            let om = match b.len() - (i + 3) {
                0 => 0,
                3 if b[i + 3] == b':' => num(b, i + 4, 2)?,
                2 => num(b, i + 3, 2)?,
                _ => return Err(bad("expected an offset ±HH:MM")),
            };
            if oh > 23 || om > 59 {
                return Err(bad("offset out of range"));
            }
            let off = (oh * 60 + om) * 60_000;
            if sign == b'+' {
                local_ms - off
            } else {
                local_ms + off
            }
        }
        None => match zone {
            Some(z) => z.local_to_utc_ms(local_ms).ok_or(TimeError::OutOfRange)?,
            None => return Err(TimeError::NoZone),
        },
        _ => return Err(bad("unexpected characters after the time")),
    };
    if (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&utc) {
        Ok(utc)
    } else {
        Err(TimeError::OutOfRange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso(s: &str) -> Result<i64, TimeError> {
        iso8601_ms(s.as_bytes(), None)
    }

    #[test]
    fn year_zero_is_a_date_and_only_the_instant_must_be_in_years_1_to_9999() {
        // Found by the fuzzer: RFC 3339 (and chrono) read year 0000; with a negative offset
        // the instant can be in year 1.
        assert_eq!(
            iso("0000-12-31T23:00:09-22:52"),
            iso("0001-01-01T21:52:09Z")
        );
        assert!(iso("0001-01-01T21:52:09Z").is_ok());
        assert_eq!(iso("0000-12-31T23:59:59Z"), Err(TimeError::OutOfRange));
        assert_eq!(iso("0000-02-29T00:00:00+00:00"), Err(TimeError::OutOfRange));
        assert!(matches!(
            iso("0000-02-30T00:00:00Z"),
            Err(TimeError::BadIso(_))
        ));
        assert_eq!(iso("9999-12-31T23:59:59.999Z").map(|_| ()), Ok(()));
        assert_eq!(iso("9999-12-31T23:59:59-00:01"), Err(TimeError::OutOfRange));
    }

    #[test]
    fn epoch_units_and_fractions_are_exact() {
        let e = |s: &str, f| epoch_ms(s.as_bytes(), f);
        assert_eq!(e("1700000000", TimeFormat::EpochS), Ok(1_700_000_000_000));
        assert_eq!(
            e("1700000000.123999", TimeFormat::EpochS),
            Ok(1_700_000_000_123)
        );
        assert_eq!(e("1.7e9", TimeFormat::EpochS), Ok(1_700_000_000_000));
        assert_eq!(
            e("1700000000123456", TimeFormat::EpochUs),
            Ok(1_700_000_000_123)
        );
        assert_eq!(
            e("1700000000123456789", TimeFormat::EpochNs),
            Ok(1_700_000_000_123)
        );
        assert_eq!(
            e("1700000000123.9", TimeFormat::EpochMs),
            Ok(1_700_000_000_123)
        );
        assert_eq!(e("0", TimeFormat::EpochS), Ok(0));
        assert_eq!(
            e("-0.0005", TimeFormat::EpochS),
            Ok(-1),
            "floor, also before 1970"
        );
        assert_eq!(e("-1.5", TimeFormat::EpochMs), Ok(-2));
        assert_eq!(e("-1000", TimeFormat::EpochUs), Ok(-1));
        assert_eq!(e("12E-1", TimeFormat::EpochMs), Ok(1));
        assert_eq!(e("1e30", TimeFormat::EpochS), Err(TimeError::OutOfRange));
        assert_eq!(
            e("1e999999999", TimeFormat::EpochS),
            Err(TimeError::OutOfRange)
        );
        assert_eq!(e("0e999999999", TimeFormat::EpochS), Ok(0));
        assert_eq!(
            e("253402300800", TimeFormat::EpochS),
            Err(TimeError::OutOfRange)
        );
        assert_eq!(
            e("99999999999999999999999", TimeFormat::EpochNs),
            Err(TimeError::OutOfRange)
        );
    }

    #[test]
    fn iso_dates_times_offsets_and_fractions() {
        assert_eq!(iso("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(iso("2026-11-30T12:00:01.250Z"), Ok(1_796_040_001_250));
        assert_eq!(iso("2026-11-30 12:00:01.250Z"), Ok(1_796_040_001_250));
        assert_eq!(iso("2026-11-30T12:00:01.250999999Z"), Ok(1_796_040_001_250));
        assert_eq!(iso("2026-11-30T12:00:01.2Z"), Ok(1_796_040_001_200));
        assert_eq!(iso("2026-11-30T17:45:01.250+05:45"), Ok(1_796_040_001_250));
        assert_eq!(iso("2026-11-30T07:00:01.250-0500"), Ok(1_796_040_001_250));
        assert_eq!(iso("2026-11-30T13:00:01.250+01"), Ok(1_796_040_001_250));
        assert_eq!(iso("2026-11-30T12:00Z"), Ok(1_796_040_000_000));
        assert_eq!(iso("1969-12-31T23:59:59.999Z"), Ok(-1));
        assert_eq!(iso("0001-01-01T00:00:00Z"), Ok(MIN_EVENT_TIME_MS));
        assert_eq!(iso("9999-12-31T23:59:59.999Z"), Ok(MAX_EVENT_TIME_MS));
        // Leap years and year boundaries.
        assert_eq!(iso("2024-02-29T00:00:00Z"), Ok(1_709_164_800_000));
        assert!(iso("2023-02-29T00:00:00Z").is_err());
        assert!(iso("1900-02-29T00:00:00Z").is_err());
        assert_eq!(iso("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        assert_eq!(
            iso("2025-12-31T23:59:59.999Z").unwrap() + 1,
            iso("2026-01-01T00:00:00Z").unwrap()
        );
        for bad in [
            "2026-11-30",
            "2026-13-01T00:00:00Z",
            "2026-11-31T00:00:00Z",
            "2026-11-30T24:00:00Z",
            "2026-11-30T12:00:60Z",
            "2026-11-30T12:00:00+24:00",
            "2026-11-30T12:00:00.Z",
            "2026/11/30T12:00:00Z",
            "2026-11-30T12:00:00Zx",
            "2026-11-30X12:00:00Z",
            "1700000000",
            "",
        ] {
            assert!(
                matches!(iso(bad), Err(TimeError::BadIso(_))),
                "{bad}: {:?}",
                iso(bad)
            );
        }
        assert_eq!(iso("2026-11-30T12:00:01"), Err(TimeError::NoZone));
        assert_eq!(
            iso8601_ms(b"2026-11-30T12:00:01", Some(&Zone::utc())),
            Ok(1_796_040_001_000)
        );
    }

    #[test]
    fn named_zones_with_daylight_saving() {
        let Ok(data) = std::fs::read("/usr/share/zoneinfo/Europe/Berlin") else {
            return; // no zone database on this machine
        };
        let z = Zone::from_tzif("Europe/Berlin", &data).unwrap();
        let at = |s: &str| iso8601_ms(s.as_bytes(), Some(&z)).unwrap();
        assert_eq!(
            at("2026-01-15T13:00:00"),
            iso("2026-01-15T12:00:00Z").unwrap()
        );
        assert_eq!(
            at("2026-07-15T14:00:00"),
            iso("2026-07-15T12:00:00Z").unwrap()
        );
        // 2026-10-25 02:30 happens twice in Berlin: the first (summer time) is taken.
        assert_eq!(
            at("2026-10-25T02:30:00"),
            iso("2026-10-25T00:30:00Z").unwrap()
        );
        // 2026-03-29 02:30 does not happen: read with the offset before the change (+01:00).
        assert_eq!(
            at("2026-03-29T02:30:00"),
            iso("2026-03-29T01:30:00Z").unwrap()
        );
    }
}
