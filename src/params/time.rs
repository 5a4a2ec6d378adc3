//! Event time: how a record's time field is read (`time_format`, `time_zone`, an IANA zone from
//! the system's zone database) or whether the Kafka record's timestamp stands in for it
//! (`kafka_timestamp`).

use streaming_etl_core::{EtlError, Result, TimeFormat, Zone};

use super::given::Given;
use super::table::*;
use crate::host::args::{shown, Arg};

/// The directory of the system's IANA zone database.
fn zone_dir() -> String {
    std::env::var("TZDIR").unwrap_or_else(|_| "/usr/share/zoneinfo".to_string())
}

/// `time_format`, `time_zone` and `kafka_timestamp`.
pub(super) fn parse_time(given: &Given<'_>) -> Result<(TimeFormat, Option<Zone>, bool)> {
    let kafka_ts = given.boolean(ParamId::KafkaTimestamp)?.unwrap_or(false);
    let format = match given.text(ParamId::TimeFormat)? {
        None => TimeFormat::EpochMsInteger,
        Some(f) => TimeFormat::parse(&f).ok_or_else(|| {
            EtlError::invalid(
                given.name(ParamId::TimeFormat),
                "must be 'epoch_ms', 'epoch_s', 'epoch_us', 'epoch_ns' or 'iso8601'",
                format!("'{f}'"),
            )
        })?,
    };
    if kafka_ts {
        for p in [ParamId::TimeField, ParamId::TimeFormat, ParamId::TimeZone] {
            if let Some(a) = given.get(p) {
                return Err(EtlError::invalid(
                    given.name(p),
                    "does not apply with kafka_timestamp := true (the record's timestamp is the event time)",
                    shown(a),
                ));
            }
        }
    }
    let zone = match given.text(ParamId::TimeZone)? {
        None => None,
        Some(_) if format != TimeFormat::Iso8601 => {
            return Err(EtlError::invalid(
                given.name(ParamId::TimeZone),
                "applies to time_format := 'iso8601' (epoch numbers have no zone)",
                shown(given.get(ParamId::TimeZone).unwrap_or(&Arg::Null)),
            ))
        }
        Some(z) if z.eq_ignore_ascii_case("UTC") => Some(Zone::utc()),
        Some(z) => {
            let unknown = || {
                EtlError::invalid(
                    given.name(ParamId::TimeZone),
                    "is not a time zone: UTC or an IANA name such as Europe/Berlin",
                    format!("'{z}'"),
                )
            };
            // Only names of the zone database: no path of the user's choosing is read.
            let valid = !z.is_empty()
                && z.split('/').all(|seg| {
                    !seg.is_empty()
                        && seg != "."
                        && seg != ".."
                        && seg
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_+-".contains(c))
                });
            if !valid {
                return Err(unknown());
            }
            let data = std::fs::read(format!("{}/{z}", zone_dir())).map_err(|_| unknown())?;
            Some(Zone::from_tzif(&z, &data).map_err(|_| unknown())?)
        }
    };
    Ok((format, zone, kafka_ts))
}
