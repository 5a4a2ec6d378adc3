//! The Kafka parameters of a run: brokers, consumer group, client properties, partitions.

use streaming_etl_core::{EtlError, Result};

use super::given::Given;
use super::table::*;
use crate::host::args::{shown, Arg, Args};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaParams {
    pub brokers: String,
    pub group_id: String,
    pub properties: Vec<(String, String)>,
    /// Bound on connecting and on any single broker request.
    pub timeout_ms: i64,
    /// Where Avro and Protobuf records' schemas are (`schema_registry`).
    pub registry: Option<RegistryParams>,
}

/// `schema_registry` and `schema_registry_options`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryParams {
    pub url: String,
    /// `user:password` for HTTP basic authentication.
    pub user_info: Option<String>,
    pub ca_location: Option<String>,
    pub certificate_location: Option<String>,
    pub key_location: Option<String>,
    pub timeout_ms: u64,
}

/// The registry's options by their names in Confluent's clients.
const REGISTRY_OPTIONS: &[&str] = &[
    "basic.auth.user.info",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
];

pub(super) fn parse_registry(given: &Given<'_>, timeout_ms: i64) -> Result<Option<RegistryParams>> {
    let options = given.get(ParamId::SchemaRegistryOptions);
    let Some(url) = given.text(ParamId::SchemaRegistry)? else {
        if let Some(o) = options {
            return Err(EtlError::invalid(
                given.name(ParamId::SchemaRegistryOptions),
                "applies only with schema_registry",
                shown(o),
            ));
        }
        return Ok(None);
    };
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
        return Err(EtlError::invalid(
            given.name(ParamId::SchemaRegistry),
            "must be an http:// or https:// URL such as 'http://localhost:8081'",
            format!("'{url}'"),
        ));
    }
    let mut p = RegistryParams {
        url,
        user_info: None,
        ca_location: None,
        certificate_location: None,
        key_location: None,
        timeout_ms: timeout_ms as u64,
    };
    let name = given.name(ParamId::SchemaRegistryOptions);
    match options {
        None => {}
        Some(Arg::Map(items)) => {
            for (k, v) in items {
                let (Arg::Text(k), Arg::Text(v)) = (k, v) else {
                    return Err(EtlError::invalid(
                        name,
                        "must map option names to non-NULL text values",
                        shown(&Arg::Map(items.clone())),
                    ));
                };
                let slot = match k.as_str() {
                    "basic.auth.user.info" => &mut p.user_info,
                    "ssl.ca.location" => &mut p.ca_location,
                    "ssl.certificate.location" => &mut p.certificate_location,
                    "ssl.key.location" => &mut p.key_location,
                    _ => {
                        return Err(EtlError::invalid(
                            name,
                            format!("knows the options {}", REGISTRY_OPTIONS.join(", ")),
                            format!("'{k}'"),
                        ))
                    }
                };
                *slot = Some(v.clone());
            }
        }
        Some(other) => {
            return Err(EtlError::invalid(
                name,
                "must be a MAP such as MAP {'basic.auth.user.info': 'user:secret'}",
                shown(other),
            ))
        }
    }
    if p.certificate_location.is_some() != p.key_location.is_some() {
        return Err(EtlError::invalid(
            name,
            "needs ssl.certificate.location and ssl.key.location together",
            shown(options.unwrap_or(&Arg::Null)),
        ));
    }
    Ok(Some(p))
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
    let timeout_ms = given
        .positive(ParamId::TimeoutMs)?
        .unwrap_or(DEFAULT_KAFKA_TIMEOUT_MS);
    Ok(KafkaParams {
        brokers,
        group_id,
        properties,
        timeout_ms,
        registry: parse_registry(given, timeout_ms)?,
    })
}
