//! The source a run reads: `topic` (a Kafka topic, or files as `file:<glob>`), where a new job
//! begins (`start`), the files' rolling rule (`files`) and how messages are encoded (`format`,
//! `message`, checked with `schema_registry`).

use streaming_etl_core::{iso8601_ms, Envelope, EtlError, Format, Result, Zone};

use super::given::Given;
use super::table::*;
use crate::host::args::{shown, Arg, Args};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Files { pattern: String },
    Kafka { topic: String },
}

/// Where a new job begins reading (its first run only; the checkpoint decides afterwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Earliest,
    Latest,
    /// The first record whose timestamp is at or after this (epoch ms); Kafka only.
    Time(i64),
}

pub(super) fn parse_topic(args: &dyn Args) -> Result<(String, SourceSpec)> {
    let topic = match args.positional(0) {
        Some(Arg::Text(t)) if !t.trim().is_empty() => t,
        Some(other) => {
            return Err(EtlError::invalid(
                "topic",
                "must be a Kafka topic name or file:<glob>",
                shown(&other),
            ))
        }
        None => return Err(EtlError::invalid("topic", "is required", "nothing")),
    };
    let source = match topic.strip_prefix("file:") {
        Some(pattern) if pattern.trim().is_empty() => {
            return Err(EtlError::invalid(
                "topic",
                "file: must be followed by a path or glob, e.g. file:data/*.ndjson",
                format!("'{topic}'"),
            ))
        }
        Some(pattern) => SourceSpec::Files {
            pattern: pattern.to_string(),
        },
        None => {
            let valid = topic.len() <= 249
                && topic
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !valid {
                return Err(EtlError::invalid(
                    "topic",
                    "a Kafka topic name has at most 249 letters, digits, '.', '_' or '-' (use file:<glob> for files)",
                    format!("'{topic}'"),
                ));
            }
            SourceSpec::Kafka {
                topic: topic.clone(),
            }
        }
    };
    Ok((topic, source))
}

/// `start`: `'earliest'`, `'latest'`, or (Kafka) a point in time: ISO 8601 (UTC when no offset
/// is written, as DuckDB's TIMESTAMP reads), or epoch milliseconds.
pub(super) fn parse_start(given: &Given<'_>, is_kafka: bool) -> Result<Start> {
    let name = given.name(ParamId::Start);
    let text = match given.get(ParamId::Start) {
        None => return Ok(Start::Earliest),
        Some(Arg::Int(i)) => i.to_string(),
        Some(Arg::Text(t)) => t.trim().to_string(),
        Some(other) => {
            return Err(EtlError::invalid(
                name,
                "must be 'earliest', 'latest' or a point in time",
                shown(other),
            ))
        }
    };
    let lower = text.to_ascii_lowercase();
    if lower == "earliest" {
        return Ok(Start::Earliest);
    }
    if lower == "latest" {
        return Ok(Start::Latest);
    }
    let at = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<i64>().ok()
    } else {
        iso8601_ms(text.as_bytes(), Some(&Zone::utc())).ok()
    };
    let Some(at) = at else {
        return Err(EtlError::invalid(
            name,
            "must be 'earliest', 'latest' or a point in time (ISO 8601 such as '2026-01-31 12:00:00', or epoch milliseconds)",
            format!("'{text}'"),
        ));
    };
    if !is_kafka {
        return Err(EtlError::invalid(
            name,
            "a point in time applies to Kafka topics (lines in files carry no record timestamp); use 'earliest' or 'latest'",
            format!("'{text}'"),
        ));
    }
    Ok(Start::Time(at))
}

/// `files`: whether the rolling rule is on.
pub(super) fn parse_files(given: &Given<'_>) -> Result<bool> {
    match given
        .text(ParamId::Files)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("append") => Ok(false),
        Some("rolling") => Ok(true),
        Some(_) => Err(EtlError::invalid(
            given.name(ParamId::Files),
            "must be 'append' or 'rolling'",
            shown(given.get(ParamId::Files).unwrap_or(&Arg::Null)),
        )),
    }
}

/// `format` and `message` (Kafka's binary formats need `schema_registry`, checked with it).
/// `envelope`: what wraps the records (a job written as SQL reads Debezium's change events).
pub(super) fn parse_envelope(given: &Given<'_>) -> Result<Envelope> {
    let envelope =
        match given.text(ParamId::Envelope)?.as_deref() {
            None => Envelope::None,
            Some(e) if e.eq_ignore_ascii_case("debezium") => Envelope::Debezium,
            Some(e) if e.eq_ignore_ascii_case("upsert") => Envelope::Upsert,
            Some(other) => return Err(EtlError::invalid(
                given.name(ParamId::Envelope),
                "must be 'debezium' (Debezium's change events: before, after, op, ts_ms, source) or 'upsert' (a keyed topic: the message is its key's row, a tombstone deletes it)",
                format!("'{other}'"),
            )),
        };
    if envelope == Envelope::Debezium {
        if let Some(f) = given
            .text(ParamId::Format)?
            .filter(|f| f != "json" && f != "avro")
        {
            return Err(EtlError::invalid(
                given.name(ParamId::Envelope),
                format!("reads Debezium's events in JSON or Avro (format := 'json' or 'avro'), not format := '{f}'"),
                "'debezium'",
            ));
        }
    }
    Ok(envelope)
}

/// `primary_key`: the key of an `INSERT OR REPLACE` target the job creates.
pub(super) fn parse_primary_key(given: &Given<'_>) -> Result<Option<Vec<String>>> {
    let Some(key) = given.text_list(ParamId::PrimaryKey)? else {
        return Ok(None);
    };
    if key.is_empty() || key.iter().any(|k| k.trim().is_empty()) {
        return Err(EtlError::invalid(
            given.name(ParamId::PrimaryKey),
            "must name the target's key columns, such as ['id']",
            given
                .get(ParamId::PrimaryKey)
                .map(shown)
                .unwrap_or_default(),
        ));
    }
    Ok(Some(key))
}

pub(super) fn parse_format(given: &Given<'_>, is_kafka: bool) -> Result<Format> {
    let format = match given.text(ParamId::Format)?.as_deref() {
        None | Some("json") => Format::Json,
        Some("avro") => Format::Avro,
        Some("protobuf") if !is_kafka => {
            return Err(EtlError::invalid(
                given.name(ParamId::Format),
                "reads Kafka records in the schema registry's wire format; files may be 'json' (NDJSON) or 'avro' (object container files)",
                "'protobuf'",
            ))
        }
        Some("protobuf") => Format::Protobuf { message: None },
        Some(other) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Format),
                "must be 'json', 'avro' or 'protobuf'",
                format!("'{other}'"),
            ))
        }
    };
    let format = match (given.text(ParamId::Message)?, format) {
        (None, f) => f,
        (Some(m), Format::Protobuf { .. }) if !m.trim().is_empty() => Format::Protobuf {
            message: Some(m.trim().trim_start_matches('.').to_string()),
        },
        (Some(m), Format::Protobuf { .. }) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Message),
                "must name a message type such as 'shop.Order'",
                format!("'{m}'"),
            ))
        }
        (Some(m), _) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Message),
                "applies only with format := 'protobuf'",
                format!("'{m}'"),
            ))
        }
    };
    let registry = given.text(ParamId::SchemaRegistry)?;
    match (&format, registry) {
        (Format::Json, Some(r)) => Err(EtlError::invalid(
            given.name(ParamId::SchemaRegistry),
            "applies only with format := 'avro' or 'protobuf'",
            format!("'{r}'"),
        )),
        (f, None) if is_kafka && f.is_binary() => Err(EtlError::invalid(
            given.name(ParamId::Format),
            "needs schema_registry := 'http://host:port': Kafka records name their schema by its id in the registry",
            format!("'{}'", f.name()),
        )),
        _ => Ok(format),
    }
}
