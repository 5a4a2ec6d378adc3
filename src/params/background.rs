//! Running a job in the background: `background := true`, and `every := INTERVAL ...` (bounded
//! runs on a schedule, which implies it). Neither is a setting of the job's checkpoint: the same
//! job may run in the foreground one day and in the background the next.

use streaming_etl_core::{EtlError, Result};

use super::given::Given;
use super::table::ParamId;
use crate::host::args::{shown, Arg};

/// How a job runs beside the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Background {
    /// Bounded runs, one starting every so many milliseconds (None: one run).
    pub every_ms: Option<i64>,
}

/// `background` and `every`, checked against `follow`.
pub(super) fn parse_background(given: &Given, follow: bool) -> Result<Option<Background>> {
    let every = match given.get(ParamId::Every) {
        None => None,
        Some(Arg::Text(t)) => Some(every_ms(t)?),
        Some(other) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Every),
                "must be an INTERVAL",
                shown(other),
            ))
        }
    };
    let background = given.boolean(ParamId::Background)?;
    match (background, every) {
        (Some(false), Some(ms)) => Err(EtlError::invalid(
            given.name(ParamId::Every),
            "runs the job in the background; it cannot be combined with background := false",
            format!("{ms} ms"),
        )),
        (_, Some(ms)) if follow => Err(EtlError::invalid(
            given.name(ParamId::Every),
            "starts a bounded run on a schedule, and follow := true one run that never ends; give one of them",
            format!("{ms} ms"),
        )),
        (Some(true), every_ms) | (None, every_ms @ Some(_)) => Ok(Some(Background { every_ms })),
        _ => Ok(None),
    }
}

/// The length of an `every` interval, in milliseconds, from DuckDB's text of an INTERVAL
/// (`00:05:00`, `1 day 02:00:00`, `2 days`, `00:00:01.5`). Months and years have no fixed
/// length, so they are refused, as is anything not longer than zero.
pub fn every_ms(text: &str) -> Result<i64> {
    let bad = |reason: &str| EtlError::invalid("every", reason.to_string(), format!("'{text}'"));
    let mut total_us: i128 = 0;
    let mut tokens = text.split_whitespace().peekable();
    while let Some(token) = tokens.next() {
        if token.contains(':') {
            total_us += clock_us(token).ok_or_else(|| bad("is not an interval"))?;
            continue;
        }
        let n: i128 = token.parse().map_err(|_| bad("is not an interval"))?;
        let unit = tokens.next().ok_or_else(|| bad("is not an interval"))?;
        let day_us: i128 = 86_400_000_000;
        total_us += match unit.trim_end_matches('s') {
            "day" => n * day_us,
            "year" | "mon" | "month" => {
                return Err(bad(
                    "must be a fixed length of time (days, hours, minutes, seconds), not months or years",
                ))
            }
            _ => return Err(bad("is not an interval")),
        };
    }
    if total_us <= 0 {
        return Err(bad("must be longer than 0"));
    }
    let ms = total_us / 1000;
    if ms == 0 {
        return Err(bad(
            "is shorter than a millisecond, the smallest step of a schedule (a run takes longer than that anyway)",
        ));
    }
    i64::try_from(ms).map_err(|_| bad("is too long"))
}

/// `[-]H:MM:SS[.ffffff]` in microseconds.
fn clock_us(token: &str) -> Option<i128> {
    let (sign, rest) = match token.strip_prefix('-') {
        Some(r) => (-1, r),
        None => (1, token),
    };
    let mut parts = rest.split(':');
    let h: i128 = parts.next()?.parse().ok()?;
    let m: i128 = parts.next()?.parse().ok()?;
    let s = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let whole: i128 = whole.parse().ok()?;
    if frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_us: i128 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    Some(sign * (((h * 60 + m) * 60 + whole) * 1_000_000 + frac_us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_as_duckdb_prints_them() {
        assert_eq!(every_ms("00:05:00").unwrap(), 300_000);
        assert_eq!(every_ms("36:00:00").unwrap(), 36 * 3_600_000);
        assert_eq!(every_ms("1 day 02:00:00").unwrap(), 26 * 3_600_000);
        assert_eq!(every_ms("2 days").unwrap(), 2 * 86_400_000);
        assert_eq!(every_ms("00:00:01.5").unwrap(), 1_500);
        assert_eq!(
            every_ms("00:00:00.000999").unwrap_err().to_string(),
            "invalid parameter 'every': is shorter than a millisecond, the smallest step of a schedule (a run takes longer than that anyway) (got '00:00:00.000999')"
        );
        assert!(every_ms("00:00:00.000001")
            .unwrap_err()
            .to_string()
            .contains("shorter than a millisecond"));
        assert_eq!(every_ms("1 day -01:00:00").unwrap(), 23 * 3_600_000);
    }

    #[test]
    fn months_years_and_nonsense_are_refused_naming_the_value() {
        for text in ["1 month", "2 mons", "1 year", "1 year 00:01:00"] {
            let e = every_ms(text).unwrap_err().to_string();
            assert!(e.contains("not months or years") && e.contains(text), "{e}");
        }
        for text in ["", "00:00:00", "-00:05:00", "-1 day"] {
            assert!(
                every_ms(text)
                    .unwrap_err()
                    .to_string()
                    .contains("longer than 0"),
                "{text}"
            );
        }
        for text in [
            "soon",
            "5",
            "5 fortnights",
            "1:2",
            "00:00:01.1234567",
            "00:00:0x",
        ] {
            assert!(
                every_ms(text)
                    .unwrap_err()
                    .to_string()
                    .contains("is not an interval"),
                "{text}"
            );
        }
    }
}
