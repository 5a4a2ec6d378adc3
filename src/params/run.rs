//! Parsing `streaming_etl_run`'s arguments into a [`RunPlan`], checked in one place at bind
//! time before any connection, file or broker is touched. Every error names the parameter and
//! the value it got.

use std::collections::BTreeMap;

use streaming_etl_core::{
    iso8601_ms, split_alias, AggSpec, ByTable, Emit, EngineConfig, EtlError, FieldPath, Format,
    KeyColumn, Result, Schemas, TimeFormat, TimeSpec, WindowKind, Zone, DEFAULT_KEY_FIELD,
    MAX_AGGREGATES,
};
use streaming_etl_runtime::config::{CheckpointLocation, JobConfig};

use super::given::Given;
use super::kafka::{parse_kafka, parse_partitions, KafkaParams};
use super::sql_name::TableName;
use super::table::*;
use crate::args::{shown, Arg, Args};
use crate::sandbox::Sandbox;

/// How the output tables are created and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Tables with primary keys; rows upserted (a replay overwrites itself).
    Upsert,
    /// Tables without keys (no index to maintain); rows appended, and each batch recorded in
    /// the marker table in the same transaction (a replay finds its marker and is skipped).
    Append,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Files { pattern: String },
    Kafka { topic: String },
}

/// Everything `streaming_etl_run` was asked to do, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub job: JobConfig,
    pub source: SourceSpec,
    pub kafka: KafkaParams,
    pub partitions: Option<Vec<i32>>,
    /// The consumer group assigns the partitions; each partition is a task of its own whose
    /// state is in the output catalog.
    pub subscribe: bool,
    /// Where a new job begins.
    pub start: Start,
    /// DuckDB's sandbox as the call found it (file sources list and open under it).
    pub sandbox: Sandbox,
    pub write_mode: WriteMode,
    /// The output tables as parsed (the job's `tables` are their SQL text).
    pub tables: ByTable<TableName>,
    /// DuckLake output: compact its files every so many cycles.
    pub compaction: Option<Compaction>,
}

/// `compact_every` and `compact_retain_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub every: i64,
    pub retain_ms: i64,
}

/// Snapshots a compaction keeps by default: readers' queries younger than this never lose the
/// files they read.
pub const DEFAULT_COMPACT_RETAIN_MS: i64 = 600_000;

/// Where a new job begins reading (its first run only; the checkpoint decides afterwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Earliest,
    Latest,
    /// The first record whose timestamp is at or after this (epoch ms); Kafka only.
    Time(i64),
}

fn required_int(name: &'static str, a: Option<Arg>) -> Result<i64> {
    match a {
        Some(Arg::Int(i)) => Ok(i),
        Some(Arg::Null) => Err(EtlError::invalid(name, "must not be NULL", "NULL")),
        Some(other) => Err(EtlError::invalid(name, "must be an integer", shown(&other))),
        None => Err(EtlError::invalid(name, "is required", "nothing")),
    }
}

/// Resolves the checkpoint location: the `checkpoint` argument, else the
/// `streaming_etl_checkpoint` setting, else next to the database file (in memory for an
/// in-memory database). A file the user named must be allowed by DuckDB's sandbox; the default
/// one is the database's own state.
pub fn checkpoint_location(
    args: &dyn Args,
    db_path: Option<&str>,
    sandbox: &Sandbox,
) -> Result<CheckpointLocation> {
    let given = Given::read(args, CHECKPOINT_PARAMS);
    let chosen = match given.text(ParamId::Checkpoint)? {
        Some(p) => Some(p),
        None => match args.setting(SETTING_CHECKPOINT) {
            Some(Arg::Text(s)) => Some(s),
            _ => None,
        },
    };
    let default = db_path.map(|db| format!("{db}.streaming_etl.sqlite"));
    Ok(match chosen.filter(|p| !p.trim().is_empty()) {
        Some(p) if p == ":memory:" => CheckpointLocation::Memory,
        Some(p) => {
            if default.as_deref() != Some(p.as_str()) {
                sandbox.check_checkpoint(&p)?;
            }
            CheckpointLocation::File(p)
        }
        None => match default {
            Some(path) => CheckpointLocation::File(path),
            None => CheckpointLocation::Memory,
        },
    })
}

/// The `job` argument of `streaming_etl_checkpoint`.
pub fn checkpoint_job(args: &dyn Args) -> Result<Option<String>> {
    Given::read(args, CHECKPOINT_PARAMS).text(ParamId::Job)
}

fn parse_topic(args: &dyn Args) -> Result<(String, SourceSpec)> {
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
fn parse_start(given: &Given<'_>, is_kafka: bool) -> Result<Start> {
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

/// `write_mode`.
fn parse_write_mode(given: &Given<'_>) -> Result<WriteMode> {
    match given
        .text(ParamId::WriteMode)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("upsert") => Ok(WriteMode::Upsert),
        Some("append") => Ok(WriteMode::Append),
        Some(_) => Err(EtlError::invalid(
            given.name(ParamId::WriteMode),
            "must be 'upsert' or 'append'",
            shown(given.get(ParamId::WriteMode).unwrap_or(&Arg::Null)),
        )),
    }
}

/// `emit` and `late_updates_ms`: when window rows are written.
fn parse_emit(given: &Given<'_>, window: WindowKind) -> Result<(Emit, Option<i64>)> {
    let emit = match given
        .text(ParamId::Emit)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("close") => Emit::Close,
        Some("update") => Emit::Update,
        Some(_) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Emit),
                "must be 'close' or 'update'",
                shown(given.get(ParamId::Emit).unwrap_or(&Arg::Null)),
            ))
        }
    };
    let late = given.positive(ParamId::LateUpdatesMs)?;
    if let (Some(n), WindowKind::Session) = (late, window) {
        return Err(EtlError::invalid(
            given.name(ParamId::LateUpdatesMs),
            "applies to tumbling and hopping windows, not to sessions",
            n,
        ));
    }
    Ok((emit, late))
}

/// `files`: whether the rolling rule is on.
fn parse_files(given: &Given<'_>) -> Result<bool> {
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

/// The window kind from `window_kind` and `hop_ms`.
fn parse_window(given: &Given<'_>, window_ms: i64) -> Result<WindowKind> {
    let hop = given.positive(ParamId::HopMs)?;
    let kind = given.text(ParamId::WindowKind)?;
    let kind_name = given.name(ParamId::WindowKind);
    let hop_name = given.name(ParamId::HopMs);
    let checked_hop = |h: i64| -> Result<WindowKind> {
        if h > window_ms {
            return Err(EtlError::invalid(
                hop_name,
                format!("must be <= window_ms ({window_ms})"),
                h,
            ));
        }
        if window_ms % h != 0 {
            return Err(EtlError::invalid(
                hop_name,
                format!("must divide window_ms ({window_ms}) into equal steps"),
                h,
            ));
        }
        Ok(if h == window_ms {
            WindowKind::Tumbling
        } else {
            WindowKind::Hopping { hop_ms: h }
        })
    };
    match (kind.as_deref().map(str::to_ascii_lowercase).as_deref(), hop) {
        (None | Some("tumbling"), None) => Ok(WindowKind::Tumbling),
        (Some("tumbling"), Some(h)) if h != window_ms => Err(EtlError::invalid(
            hop_name,
            "applies to hopping windows (window_kind 'tumbling' hops by window_ms)",
            h,
        )),
        (None | Some("hopping") | Some("tumbling"), Some(h)) => checked_hop(h),
        (Some("hopping"), None) => Err(EtlError::invalid(
            kind_name,
            "'hopping' needs hop_ms (how often a window starts)",
            "'hopping'",
        )),
        (Some("session"), None) => Ok(WindowKind::Session),
        (Some("session"), Some(h)) => Err(EtlError::invalid(
            hop_name,
            "does not apply to session windows (window_ms is the gap)",
            h,
        )),
        _ => Err(EtlError::invalid(
            kind_name,
            "must be 'tumbling', 'hopping' or 'session'",
            format!("'{}'", kind.unwrap_or_default()),
        )),
    }
}

/// The directory of the system's IANA zone database.
fn zone_dir() -> String {
    std::env::var("TZDIR").unwrap_or_else(|_| "/usr/share/zoneinfo".to_string())
}

/// `format` and `message` (Kafka's binary formats need `schema_registry`, checked with it).
fn parse_format(given: &Given<'_>, is_kafka: bool) -> Result<Format> {
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

/// `time_format`, `time_zone` and `kafka_timestamp`.
fn parse_time(given: &Given<'_>) -> Result<(TimeFormat, Option<Zone>, bool)> {
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

/// `path [AS name]` of `group_by`.
fn parse_key_column(item: &str) -> std::result::Result<KeyColumn, String> {
    let (expr, alias) = split_alias(item)?;
    let path = FieldPath::parse(expr)
        .filter(|_| !expr.is_empty() && !expr.contains(char::is_whitespace))
        .ok_or_else(|| {
            format!("'{expr}' is not a field name or dotted path such as payload.value")
        })?;
    let name = alias.unwrap_or_else(|| path.last_segment().to_string());
    Ok(KeyColumn { path, name })
}

/// The key columns and aggregates: `group_by` / `aggregates`, or the defaults from
/// `key_field` / `value_field`.
fn parse_keys_and_aggregates(
    given: &Given<'_>,
    key_field: &FieldPath,
    value_field: &FieldPath,
) -> Result<(Vec<KeyColumn>, bool, Vec<AggSpec>)> {
    let (keys, default_key) = match given.text_list(ParamId::GroupBy)? {
        None => (
            vec![KeyColumn {
                path: key_field.clone(),
                name: "key".into(),
            }],
            true,
        ),
        Some(_) if given.get(ParamId::KeyField).is_some() => {
            return Err(EtlError::invalid(
                given.name(ParamId::KeyField),
                "cannot be combined with group_by (name the key fields in group_by)",
                shown(given.get(ParamId::KeyField).unwrap_or(&Arg::Null)),
            ))
        }
        Some(items) => {
            let cols = items
                .iter()
                .map(|i| {
                    parse_key_column(i).map_err(|why| {
                        EtlError::invalid(given.name(ParamId::GroupBy), why, format!("'{i}'"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            (cols, false)
        }
    };
    let aggs = match given.text_list(ParamId::Aggregates)? {
        None => AggSpec::defaults(value_field),
        Some(_) if given.get(ParamId::ValueField).is_some() => {
            return Err(EtlError::invalid(
                given.name(ParamId::ValueField),
                "cannot be combined with aggregates (name the fields in the aggregates)",
                shown(given.get(ParamId::ValueField).unwrap_or(&Arg::Null)),
            ))
        }
        Some(items) if items.is_empty() => {
            return Err(EtlError::invalid(
                given.name(ParamId::Aggregates),
                "must list at least one aggregate, e.g. ['count(*)']",
                "[]",
            ))
        }
        Some(items) if items.len() > MAX_AGGREGATES => {
            return Err(EtlError::invalid(
                given.name(ParamId::Aggregates),
                format!("may list at most {MAX_AGGREGATES} aggregates"),
                items.len(),
            ))
        }
        Some(items) => items
            .iter()
            .map(|i| {
                AggSpec::parse(i).map_err(|why| {
                    EtlError::invalid(given.name(ParamId::Aggregates), why, format!("'{i}'"))
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    // Column names: DuckDB compares identifiers without case.
    let mut seen: Vec<String> = vec!["window_start_ms".into(), "window_end_ms".into()];
    for (param, name, expr) in named_columns(&keys, &aggs) {
        let lower = name.to_ascii_lowercase();
        if seen[..2].contains(&lower) {
            return Err(EtlError::invalid(
                given.name(param),
                format!("column '{name}' is reserved for the window bounds; give the expression another name (AS ...)"),
                format!("'{expr}'"),
            ));
        }
        if seen.contains(&lower) {
            return Err(EtlError::invalid(
                given.name(param),
                format!("column '{name}' would appear twice in the windows table; give one expression another name (AS ...)"),
                format!("'{expr}'"),
            ));
        }
        seen.push(lower);
    }
    Ok((keys, default_key, aggs))
}

/// The columns the key and aggregate expressions name: (parameter, column, expression).
fn named_columns<'a>(
    keys: &'a [KeyColumn],
    aggs: &'a [AggSpec],
) -> impl Iterator<Item = (ParamId, &'a str, String)> {
    let key = |k: &'a KeyColumn| {
        let expr = format!("{} AS {}", k.path.as_str(), k.name);
        (ParamId::GroupBy, k.name.as_str(), expr)
    };
    let agg = |a: &'a AggSpec| (ParamId::Aggregates, a.name.as_str(), a.shown());
    keys.iter().map(key).chain(aggs.iter().map(agg))
}

/// With revisions, `final`, `revision` and `retracted` are the windows table's own columns.
fn check_revision_columns(given: &Given<'_>, engine: &EngineConfig) -> Result<()> {
    for (param, name, expr) in named_columns(&engine.keys, &engine.aggregates) {
        if ["final", "revision", "retracted"].contains(&name.to_ascii_lowercase().as_str()) {
            return Err(EtlError::invalid(
                given.name(param),
                format!("column '{name}' is reserved for a window row's revision (emit := 'update', late_updates_ms); give the expression another name (AS ...)"),
                format!("'{expr}'"),
            ));
        }
    }
    Ok(())
}

/// Parses and checks the arguments of `streaming_etl_run`.
/// Threads a run may use: DuckDB's `threads` as the run starts (its cores when unreadable).
fn run_threads(args: &dyn Args) -> usize {
    /// More threads than this only add overhead (shards, queues), whatever DuckDB allows.
    const MAX_RUN_THREADS: i64 = 256;
    match args.setting("threads") {
        Some(Arg::Int(n)) if n >= 1 => n.min(MAX_RUN_THREADS) as usize,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

pub fn parse_run(args: &dyn Args, db_path: Option<&str>) -> Result<RunPlan> {
    let (topic, source) = parse_topic(args)?;
    let window_ms = required_int("window_ms", args.positional(1))?;
    if window_ms <= 0 {
        return Err(EtlError::invalid("window_ms", "must be > 0", window_ms));
    }
    let lateness_ms = required_int("lateness_ms", args.positional(2))?;
    if lateness_ms < 0 {
        return Err(EtlError::invalid(
            "lateness_ms",
            "must be >= 0",
            lateness_ms,
        ));
    }
    let given = Given::read(args, RUN_PARAMS);
    let sandbox = Sandbox::read(args);
    let is_kafka = matches!(source, SourceSpec::Kafka { .. });
    let (other, why) = if is_kafka {
        (
            Applies::Files,
            "applies to a file: source, not to a Kafka topic",
        )
    } else {
        (
            Applies::Kafka,
            "applies to a Kafka topic, not to a file: source",
        )
    };
    if let Some(p) = RUN_PARAMS
        .iter()
        .find(|p| p.applies == other && given.get(p.id).is_some())
    {
        return Err(EtlError::invalid(
            p.name,
            why,
            given.get(p.id).map(shown).unwrap_or_default(),
        ));
    }
    let job = given.text(ParamId::Job)?.unwrap_or_else(|| topic.clone());
    if job.trim().is_empty() {
        return Err(EtlError::invalid(
            given.name(ParamId::Job),
            "must not be empty",
            format!("'{job}'"),
        ));
    }
    let key_field = given.field(ParamId::KeyField, DEFAULT_KEY_FIELD)?;
    let time_field = given.field(ParamId::TimeField, "event_time_ms")?;
    let value_field = given.field(ParamId::ValueField, "payload.value")?;
    let windows = given.table(ParamId::WindowsTable, TableName::bare("windows"))?;
    // Beside the windows table by default: one catalog, so one transaction writes all three.
    let late = given.table(ParamId::LateTable, windows.sibling("late_events"))?;
    let dead = given.table(ParamId::DeadLetterTable, windows.sibling("dead_letters"))?;
    if windows == late || windows == dead || late == dead {
        return Err(EtlError::invalid(
            given.name(ParamId::WindowsTable),
            "windows_table, late_table and dead_letter_table must be three different tables",
            format!("{}, {}, {}", windows.sql(), late.sql(), dead.sql()),
        ));
    }
    let window = parse_window(&given, window_ms)?;
    let (keys, default_key, aggregates) =
        parse_keys_and_aggregates(&given, &key_field, &value_field)?;
    let (time_format, time_zone, kafka_timestamp) = parse_time(&given)?;
    let format = parse_format(&given, is_kafka)?;
    let (emit, late_updates_ms) = parse_emit(&given, window)?;
    let engine = EngineConfig {
        time: TimeSpec {
            window_ms,
            lateness_ms,
            idle_timeout_ms: given.positive(ParamId::IdleTimeoutMs)?,
        },
        window,
        time_field: time_field.clone(),
        time_format,
        time_zone,
        kafka_timestamp,
        numeric_strings: given.boolean(ParamId::NumericStrings)?.unwrap_or(false),
        max_future_ms: given.positive(ParamId::MaxFutureMs)?,
        keys,
        default_key,
        aggregates,
        value_field,
        format,
        schemas: Schemas::default(),
        emit,
        late_updates_ms,
    };
    if engine.revisions() {
        check_revision_columns(&given, &engine)?;
    }
    let rolling = parse_files(&given)?;
    let write_mode = parse_write_mode(&given)?;
    // The sources' and sinks' settings the checkpoint keeps beside the engine's.
    let mut adapters = BTreeMap::new();
    if rolling {
        adapters.insert("files".into(), "'rolling'".into());
    }
    if write_mode == WriteMode::Append {
        adapters.insert("write_mode".into(), "'append'".into());
    }
    let subscribe = given.boolean(ParamId::Subscribe)?.unwrap_or(false);
    if subscribe {
        adapters.insert("subscribe".into(), "true".into());
    }
    let settings = engine.job_settings(&topic, adapters);
    let tables = ByTable {
        windows,
        late,
        dead,
    };
    let job_config = JobConfig {
        job: job.clone(),
        source: topic,
        settings,
        engine,
        tables: tables.as_ref().map(TableName::sql),
        checkpoint: checkpoint_location(args, db_path, &sandbox)?,
        max_messages: given.positive(ParamId::MaxMessages)?.map(|m| m as u64),
        max_runtime_ms: given.positive(ParamId::MaxRuntimeMs)?,
        checkpoint_interval_ms: given
            .positive(ParamId::CheckpointIntervalMs)?
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL_MS),
        flush: given.boolean(ParamId::Flush)?.unwrap_or(false),
        follow: given.boolean(ParamId::Follow)?.unwrap_or(false),
        rolling,
        quiet_flush_ms: given.positive(ParamId::QuietFlushMs)?,
        threads: run_threads(args),
    };
    let kafka = parse_kafka(&given, args, &job, is_kafka)?;
    match &source {
        SourceSpec::Files { pattern } => sandbox.check_files(pattern)?,
        SourceSpec::Kafka { .. } => sandbox.check_network(&kafka.brokers)?,
    }
    let retain_ms = given.positive(ParamId::CompactRetainMs)?;
    let compaction = match given.positive(ParamId::CompactEvery)? {
        Some(every) => Some(Compaction {
            every,
            retain_ms: retain_ms.unwrap_or(DEFAULT_COMPACT_RETAIN_MS),
        }),
        None if retain_ms.is_some() => {
            return Err(EtlError::invalid(
                given.name(ParamId::CompactRetainMs),
                "applies only with compact_every",
                retain_ms.unwrap_or_default(),
            ))
        }
        None => None,
    };
    let partitions = parse_partitions(&given)?;
    if subscribe && partitions.is_some() {
        return Err(EtlError::invalid(
            given.name(ParamId::Subscribe),
            "cannot be combined with 'partitions': the consumer group assigns the partitions",
            true,
        ));
    }
    Ok(RunPlan {
        subscribe,
        compaction,
        write_mode,
        start: parse_start(&given, is_kafka)?,
        sandbox,
        kafka,
        partitions,
        source,
        tables,
        job: job_config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct FakeArgs {
        pos: Vec<Arg>,
        named: HashMap<&'static str, Arg>,
        settings: HashMap<&'static str, Arg>,
    }

    impl Args for FakeArgs {
        fn positional(&self, idx: usize) -> Option<Arg> {
            self.pos.get(idx).cloned()
        }
        fn named(&self, name: &str) -> Option<Arg> {
            self.named.get(name).cloned()
        }
        fn setting(&self, name: &str) -> Option<Arg> {
            self.settings.get(name).cloned()
        }
    }

    fn args(topic: &str, w: i64, l: i64, named: &[(&'static str, Arg)]) -> FakeArgs {
        FakeArgs {
            pos: vec![Arg::Text(topic.into()), Arg::Int(w), Arg::Int(l)],
            named: named.iter().cloned().collect(),
            settings: HashMap::new(),
        }
    }

    fn err(a: FakeArgs) -> String {
        parse_run(&a, Some("/tmp/x.duckdb"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults() {
        let c = parse_run(
            &args("file:data/*.ndjson", 1000, 200, &[]),
            Some("/db/x.duckdb"),
        )
        .unwrap();
        assert_eq!(c.job.job, "file:data/*.ndjson");
        assert_eq!(
            c.source,
            SourceSpec::Files {
                pattern: "data/*.ndjson".into()
            }
        );
        assert_eq!(c.job.settings.value_field, "payload.value");
        assert_eq!(c.job.engine.window, WindowKind::Tumbling);
        assert!(
            c.job.settings.extra.is_empty(),
            "defaults are not extra settings"
        );
        assert_eq!(c.job.tables.windows, "\"windows\"");
        assert_eq!(
            c.job.checkpoint,
            CheckpointLocation::File("/db/x.duckdb.streaming_etl.sqlite".into())
        );
        assert_eq!(c.kafka.brokers, DEFAULT_BROKERS);
        let c = parse_run(&args("orders", 1000, 0, &[]), None).unwrap();
        assert_eq!(c.job.checkpoint, CheckpointLocation::Memory);
        assert_eq!(c.kafka.group_id, "streaming_etl-orders");
    }

    #[test]
    fn messages_name_the_parameter_and_value() {
        assert_eq!(
            err(args("t", -5, 0, &[])),
            "invalid parameter 'window_ms': must be > 0 (got -5)"
        );
        assert_eq!(
            err(args("t", 0, 0, &[])),
            "invalid parameter 'window_ms': must be > 0 (got 0)"
        );
        assert_eq!(
            err(args("t", 10, -1, &[])),
            "invalid parameter 'lateness_ms': must be >= 0 (got -1)"
        );
        assert_eq!(
            err(args("t", 10, 0, &[("max_messages", Arg::Int(0))])),
            "invalid parameter 'max_messages': must be > 0 (got 0)"
        );
        assert_eq!(
            err(args("t", 10, 0, &[("idle_timeout_ms", Arg::Int(-3))])),
            "invalid parameter 'idle_timeout_ms': must be > 0 (got -3)"
        );
        assert_eq!(
            err(args("t", 10, 0, &[("key_field", Arg::Text("a..b".into()))])),
            "invalid parameter 'key_field': must be a field name or a dotted path such as payload.value (got 'a..b')"
        );
        assert_eq!(
            err(args("file:x", 10, 0, &[("brokers", Arg::Text("h:1".into()))])),
            "invalid parameter 'brokers': applies to a Kafka topic, not to a file: source (got 'h:1')"
        );
        assert_eq!(
            err(args(
                "t",
                10,
                0,
                &[("partitions", Arg::List(vec![Arg::Int(1), Arg::Int(1)]))]
            )),
            "invalid parameter 'partitions': must not repeat a partition (got [1, 1])"
        );
        assert_eq!(
            err(args(
                "t",
                10,
                0,
                &[("partitions", Arg::List(vec![Arg::Int(-1)]))]
            )),
            "invalid parameter 'partitions': must be partition numbers >= 0 (got [-1])"
        );
        assert_eq!(err(args("file:", 10, 0, &[])), "invalid parameter 'topic': file: must be followed by a path or glob, e.g. file:data/*.ndjson (got 'file:')");
        assert!(err(args("bad topic", 10, 0, &[]))
            .starts_with("invalid parameter 'topic': a Kafka topic name"));
        assert_eq!(
            err(args("t", 10, 0, &[("windows_table", Arg::Text("a b".into()))])),
            "invalid parameter 'windows_table': must be a table name, optionally qualified as schema.table or catalog.schema.table (got 'a b')"
        );
        let mut a = args("t", 10, 0, &[]);
        a.pos[1] = Arg::Null;
        assert_eq!(
            err(a),
            "invalid parameter 'window_ms': must not be NULL (got NULL)"
        );
    }

    fn list(items: &[&str]) -> Arg {
        Arg::List(items.iter().map(|s| Arg::Text(s.to_string())).collect())
    }

    #[test]
    fn windows_keys_and_aggregates() {
        let c = parse_run(
            &args(
                "t",
                60_000,
                0,
                &[
                    ("hop_ms", Arg::Int(1000)),
                    ("group_by", list(&["region", "item.sku AS sku"])),
                    ("aggregates", list(&["count(*) AS orders", "sum(amount)"])),
                ],
            ),
            None,
        )
        .unwrap();
        assert_eq!(c.job.engine.window, WindowKind::Hopping { hop_ms: 1000 });
        let schema = c.job.engine.windows_schema();
        let names: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "window_start_ms",
                "window_end_ms",
                "region",
                "sku",
                "orders",
                "sum_amount"
            ]
        );
        assert_eq!(schema.primary_key, ["region", "sku", "window_start_ms"]);
        assert_eq!(c.job.settings.extra["hop_ms"], "1000");
        assert!(c.job.settings.extra["group_by"].contains("item.sku AS sku"));
        let c = parse_run(
            &args(
                "t",
                10,
                0,
                &[
                    ("window_kind", Arg::Text("SESSION".into())),
                    ("group_by", list(&[])),
                ],
            ),
            None,
        )
        .unwrap();
        assert_eq!(c.job.engine.window, WindowKind::Session);
        assert_eq!(
            c.job.engine.windows_schema().primary_key,
            ["window_start_ms"]
        );
        // hop_ms equal to the window is tumbling.
        let c = parse_run(&args("t", 10, 0, &[("hop_ms", Arg::Int(10))]), None).unwrap();
        assert_eq!(c.job.engine.window, WindowKind::Tumbling);
    }

    #[test]
    fn window_and_aggregate_errors_name_the_expression() {
        assert_eq!(
            err(args("t", 1000, 0, &[("hop_ms", Arg::Int(300))])),
            "invalid parameter 'hop_ms': must divide window_ms (1000) into equal steps (got 300)"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("hop_ms", Arg::Int(5000))])),
            "invalid parameter 'hop_ms': must be <= window_ms (1000) (got 5000)"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("window_kind", Arg::Text("sliding".into()))])),
            "invalid parameter 'window_kind': must be 'tumbling', 'hopping' or 'session' (got 'sliding')"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("window_kind", Arg::Text("hopping".into()))])),
            "invalid parameter 'window_kind': 'hopping' needs hop_ms (how often a window starts) (got 'hopping')"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("aggregates", list(&["median(amount)"]))])),
            "invalid parameter 'aggregates': unknown aggregate function 'median' (known: count, sum, avg, min, max, approx_count_distinct, approx_quantile, first, last, arg_max, arg_min) (got 'median(amount)')"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("aggregates", list(&["sum(x) AS window_start_ms"]))])),
            "invalid parameter 'aggregates': column 'window_start_ms' is reserved for the window bounds; give the expression another name (AS ...) (got 'sum(x) AS window_start_ms')"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("aggregates", list(&["count(*)", "count(x) AS COUNT"]))])),
            "invalid parameter 'aggregates': column 'COUNT' would appear twice in the windows table; give one expression another name (AS ...) (got 'count(x) AS COUNT')"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("group_by", list(&["a..b"]))])),
            "invalid parameter 'group_by': 'a..b' is not a field name or dotted path such as payload.value (got 'a..b')"
        );
        assert_eq!(
            err(args("t", 1000, 0, &[("aggregates", list(&[]))])),
            "invalid parameter 'aggregates': must list at least one aggregate, e.g. ['count(*)'] (got [])"
        );
        assert!(err(args(
            "t",
            1000,
            0,
            &[
                ("aggregates", list(&["count(*)"])),
                ("value_field", Arg::Text("v".into()))
            ]
        ))
        .starts_with("invalid parameter 'value_field': cannot be combined with aggregates"));
    }

    #[test]
    fn checkpoint_setting_and_argument() {
        let mut a = args("t", 10, 0, &[]);
        a.settings
            .insert(SETTING_CHECKPOINT, Arg::Text("jobs.ckpt".into()));
        assert_eq!(
            parse_run(&a, None).unwrap().job.checkpoint,
            CheckpointLocation::File("jobs.ckpt".into())
        );
        a.named.insert("checkpoint", Arg::Text(":memory:".into()));
        assert_eq!(
            parse_run(&a, None).unwrap().job.checkpoint,
            CheckpointLocation::Memory
        );
    }
}
