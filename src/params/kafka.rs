//! The Kafka parameters of a run: brokers, consumer group, client properties, partitions.

use streaming_etl_core::{EtlError, Result};

use super::given::Given;
use super::table::*;
use crate::args::{shown, Arg, Args};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaParams {
    pub brokers: String,
    pub group_id: String,
    pub properties: Vec<(String, String)>,
    /// Bound on connecting and on any single broker request.
    pub timeout_ms: i64,
}

pub(super) fn parse_partitions(given: &Given<'_>) -> Result<Option<Vec<i32>>> {
    let name = given.name(ParamId::Partitions);
    let items = match given.get(ParamId::Partitions) {
        None => return Ok(None),
        Some(Arg::List(items)) => items,
        Some(other) => {
            return Err(EtlError::invalid(
                name,
                "must be a list of partition numbers such as [0, 1]",
                shown(other),
            ))
        }
    };
    let shown_list = shown(&Arg::List(items.clone()));
    if items.is_empty() {
        return Err(EtlError::invalid(
            name,
            "must list at least one partition",
            shown_list,
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for it in items {
        match it {
            Arg::Int(p) if (0..=i64::from(i32::MAX)).contains(p) => out.push(*p as i32),
            _ => {
                return Err(EtlError::invalid(
                    name,
                    "must be partition numbers >= 0",
                    shown_list,
                ))
            }
        }
    }
    let mut sorted = out.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != out.len() {
        return Err(EtlError::invalid(
            name,
            "must not repeat a partition",
            shown_list,
        ));
    }
    Ok(Some(sorted))
}

pub(super) fn parse_kafka(
    given: &Given<'_>,
    args: &dyn Args,
    job: &str,
    is_kafka: bool,
) -> Result<KafkaParams> {
    let brokers = match given.text(ParamId::Brokers)? {
        Some(b) => b,
        None => match args.setting(SETTING_BROKERS) {
            Some(Arg::Text(s)) if !s.trim().is_empty() => s,
            _ => DEFAULT_BROKERS.to_string(),
        },
    };
    if is_kafka && brokers.trim().is_empty() {
        return Err(EtlError::invalid(
            given.name(ParamId::Brokers),
            "must name at least one host:port",
            "''",
        ));
    }
    let group_id = given
        .text(ParamId::GroupId)?
        .unwrap_or_else(|| format!("streaming_etl-{job}"));
    if group_id.is_empty() {
        return Err(EtlError::invalid(
            given.name(ParamId::GroupId),
            "must not be empty",
            "''",
        ));
    }
    let properties = match given.get(ParamId::Kafka) {
        None => Vec::new(),
        Some(Arg::Map(items)) => {
            let mut props = Vec::with_capacity(items.len());
            for (k, v) in items {
                match (k, v) {
                    (Arg::Text(k), Arg::Text(v)) if !k.is_empty() => {
                        props.push((k.clone(), v.clone()))
                    }
                    _ => {
                        return Err(EtlError::invalid(
                            given.name(ParamId::Kafka),
                            "must map librdkafka property names to non-NULL text values",
                            shown(&Arg::Map(items.clone())),
                        ))
                    }
                }
            }
            props
        }
        Some(other) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Kafka),
                "must be a MAP of librdkafka properties, e.g. MAP {'security.protocol': 'SSL'}",
                shown(other),
            ))
        }
    };
    Ok(KafkaParams {
        brokers,
        group_id,
        properties,
        timeout_ms: given
            .positive(ParamId::TimeoutMs)?
            .unwrap_or(DEFAULT_KAFKA_TIMEOUT_MS),
    })
}
