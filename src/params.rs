//! The settings and the parameters of the SQL functions, each declared once in a table (name,
//! type, default, meaning) from which registration, parsing and the README's parameter table
//! follow; and the parsing itself, done in one place at bind time before any connection, file or
//! broker is touched. Every error names the parameter and the value it got.
//!
//! Long on purpose: every parameter's check lives here, in one place (about a fifth of the file
//! is the declaration table, the last quarter its tests).

use std::collections::BTreeMap;

use streaming_etl_core::aggregate::{split_alias, AggSpec};
use streaming_etl_core::decode::FieldPath;
use streaming_etl_core::engine::{EngineConfig, TimeSpec, WindowKind, MAX_AGGREGATES};
use streaming_etl_core::error::{EtlError, Result};
use streaming_etl_core::record::KeyColumn;
use streaming_etl_core::state::JobSettings;
use streaming_etl_core::time::{iso8601_ms, TimeFormat, Zone};
use streaming_etl_runtime::config::{CheckpointLocation, JobConfig};
use streaming_etl_runtime::sink::Tables;

use crate::args::{shown, Arg, Args};
use crate::sandbox::Sandbox;
use crate::sink::WriteMode;

/// A setting registered with DuckDB (`SET name = '...'`): name, default, description.
pub struct Setting {
    pub name: &'static str,
    pub default: &'static str,
    pub description: &'static str,
}

pub const SETTING_BROKERS: &str = "streaming_etl_brokers";
pub const SETTING_CHECKPOINT: &str = "streaming_etl_checkpoint";
pub const DEFAULT_BROKERS: &str = "localhost:9092";

pub const SETTINGS: &[Setting] = &[
    Setting {
        name: SETTING_BROKERS,
        default: DEFAULT_BROKERS,
        description: "Kafka bootstrap servers for streaming_etl_run (host:port[,host:port...])",
    },
    Setting {
        name: SETTING_CHECKPOINT,
        default: "",
        description: "SQLite checkpoint file of streaming_etl jobs (default: <database file>.streaming_etl.sqlite; ':memory:' for one that lives as long as the database)",
    },
];

/// Bound on reaching the brokers and on waiting for a partition, so a run never hangs.
pub const DEFAULT_KAFKA_TIMEOUT_MS: i64 = 15_000;
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: i64 = 1000;

/// The SQL type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    Varchar,
    BigInt,
    Boolean,
    IntegerList,
    VarcharList,
    VarcharMap,
}

impl ParamType {
    #[cfg(test)]
    pub fn sql(self) -> &'static str {
        match self {
            ParamType::Varchar => "VARCHAR",
            ParamType::BigInt => "BIGINT",
            ParamType::Boolean => "BOOLEAN",
            ParamType::IntegerList => "INTEGER[]",
            ParamType::VarcharList => "VARCHAR[]",
            ParamType::VarcharMap => "MAP(VARCHAR, VARCHAR)",
        }
    }
}

/// The named parameters, by identity (so a parser cannot misspell one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum P {
    Job,
    WindowKind,
    HopMs,
    GroupBy,
    Aggregates,
    TimeFormat,
    TimeZone,
    KafkaTimestamp,
    NumericStrings,
    MaxFutureMs,
    KeyField,
    TimeField,
    ValueField,
    WindowsTable,
    LateTable,
    DeadLetterTable,
    MaxMessages,
    MaxRuntimeMs,
    IdleTimeoutMs,
    Flush,
    Follow,
    Start,
    QuietFlushMs,
    Files,
    WriteMode,
    Partitions,
    Checkpoint,
    CheckpointIntervalMs,
    Brokers,
    GroupId,
    Kafka,
    TimeoutMs,
}

/// One named parameter.
pub struct Param {
    pub id: P,
    pub name: &'static str,
    pub ty: ParamType,
    /// The default as the README shows it (the README's table is checked against these).
    #[cfg_attr(not(test), allow(dead_code))]
    pub default: &'static str,
    #[cfg_attr(not(test), allow(dead_code))]
    pub meaning: &'static str,
    /// The sources it applies to (given for another one, it is an error).
    pub applies: Applies,
}

/// The sources a parameter applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    Both,
    Kafka,
    Files,
}

const fn param(
    id: P,
    name: &'static str,
    ty: ParamType,
    default: &'static str,
    meaning: &'static str,
) -> Param {
    Param {
        id,
        name,
        ty,
        default,
        meaning,
        applies: Applies::Both,
    }
}

impl Param {
    /// The parameter, for one kind of source only.
    const fn only(self, applies: Applies) -> Param {
        Param { applies, ..self }
    }
}

/// The named parameters of `streaming_etl_run`.
pub const RUN_PARAMS: &[Param] = &[
    param(P::Job, "job", ParamType::Varchar, "the `topic` argument", "name the job's state is kept under in the checkpoint"),
    param(P::WindowKind, "window_kind", ParamType::Varchar, "`tumbling`", "`tumbling`, `hopping` (with `hop_ms`) or `session` (`window_ms` is the gap)"),
    param(P::HopMs, "hop_ms", ParamType::BigInt, "none", "hopping windows: a window of `window_ms` starts every `hop_ms` (divides `window_ms`)"),
    param(P::GroupBy, "group_by", ParamType::VarcharList, "`[key_field]`", "key columns: dotted paths, `path AS name` (string, number or boolean values); `[]`: one row per window"),
    param(P::Aggregates, "aggregates", ParamType::VarcharList, "count, sum/min/max of `value_field`", "`count(*)`, `count(x)`, `sum(x)`, `avg(x)`, `min(x)`, `max(x)`, `approx_count_distinct(x)`, `first(x)`, `last(x)`, each `AS name` optional"),
    param(P::KeyField, "key_field", ParamType::Varchar, "`key`", "dotted path of the key (string or number; Kafka: the message key when absent)"),
    param(P::TimeField, "time_field", ParamType::Varchar, "`event_time_ms`", "dotted path of the event time (its form: `time_format`)"),
    param(P::ValueField, "value_field", ParamType::Varchar, "`payload.value`", "dotted path of the number aggregated (missing or null: counted only)"),
    param(P::TimeFormat, "time_format", ParamType::Varchar, "integer `epoch_ms`", "`epoch_ms`, `epoch_s`, `epoch_us`, `epoch_ns` (fractions truncated to ms) or `iso8601`"),
    param(P::TimeZone, "time_zone", ParamType::Varchar, "none", "`iso8601` only: the zone of times written without `Z` or an offset (`UTC` or an IANA name); without it they are dead letters"),
    param(P::NumericStrings, "numeric_strings", ParamType::Boolean, "false", "a value given as a decimal string (`\"19.90\"`) counts as that number"),
    param(P::MaxFutureMs, "max_future_ms", ParamType::BigInt, "none", "an event whose time is more than this far ahead of the wall clock is a dead letter"),
    param(P::WriteMode, "write_mode", ParamType::Varchar, "`upsert`", "`upsert` (tables with primary keys, rows upserted) or `append` (tables without keys, rows appended; a replayed batch is recognised by its marker in `streaming_etl_batches`)"),
    param(P::WindowsTable, "windows_table", ParamType::Varchar, "`windows`", "output table of closed windows (`schema.table`, `catalog.schema.table`, quoted names allowed)"),
    param(P::LateTable, "late_table", ParamType::Varchar, "`late_events`", "output table of late events"),
    param(P::DeadLetterTable, "dead_letter_table", ParamType::Varchar, "`dead_letters`", "output table of rejected messages"),
    param(P::MaxMessages, "max_messages", ParamType::BigInt, "none", "stop after this many messages"),
    param(P::MaxRuntimeMs, "max_runtime_ms", ParamType::BigInt, "none", "stop after this long"),
    param(P::IdleTimeoutMs, "idle_timeout_ms", ParamType::BigInt, "none", "a partition silent this long (wall clock) stops holding the watermark back"),
    param(P::Flush, "flush", ParamType::Boolean, "false", "once caught up, close every open window (bounded input)"),
    param(P::Follow, "follow", ParamType::Boolean, "false", "keep reading what arrives (messages, partitions, lines, files) until `max_runtime_ms`, `max_messages`, an interrupt or `LIMIT`"),
    param(P::Start, "start", ParamType::Varchar, "`earliest`", "where a new job begins: `earliest`, `latest` (what arrives after its first run starts) or, Kafka only, a point in time (ISO 8601, or epoch ms)"),
    param(P::QuietFlushMs, "quiet_flush_ms", ParamType::BigInt, "none", "once every partition has been silent this long (wall clock), close every open window"),
    param(P::Files, "files", ParamType::Varchar, "`append`", "files only: `append` (every file may grow and holds the watermark back) or `rolling` (a caught-up file stops holding it back once a file sorting after it delivered data)").only(Applies::Files),
    param(P::Partitions, "partitions", ParamType::IntegerList, "all", "read only these partitions (split a topic between processes)"),
    param(P::Checkpoint, "checkpoint", ParamType::Varchar, "the setting", "checkpoint file for this call"),
    param(P::CheckpointIntervalMs, "checkpoint_interval_ms", ParamType::BigInt, "1000", "length of a checkpoint cycle (one result row per cycle)"),
    param(P::Brokers, "brokers", ParamType::Varchar, "the setting", "Kafka only: bootstrap servers").only(Applies::Kafka),
    param(P::GroupId, "group_id", ParamType::Varchar, "`streaming_etl-<job>`", "Kafka only: consumer group the offsets are committed to").only(Applies::Kafka),
    param(P::Kafka, "kafka", ParamType::VarcharMap, "none", "Kafka only: librdkafka properties, passed through (security, tuning)").only(Applies::Kafka),
    param(P::KafkaTimestamp, "kafka_timestamp", ParamType::Boolean, "false", "Kafka only: the record's own timestamp is the event time (no time field is read)").only(Applies::Kafka),
    param(P::TimeoutMs, "timeout_ms", ParamType::BigInt, "15000", "Kafka only: bound on reaching the brokers and on waiting for a partition").only(Applies::Kafka),
];

/// The named parameters of `streaming_etl_checkpoint`.
pub const CHECKPOINT_PARAMS: &[Param] = &[
    param(
        P::Checkpoint,
        "checkpoint",
        ParamType::Varchar,
        "the setting",
        "checkpoint file to read",
    ),
    param(
        P::Job,
        "job",
        ParamType::Varchar,
        "all jobs",
        "show only this job",
    ),
];

/// The README's table of a function's named parameters.
#[cfg(test)]
pub fn markdown_table(params: &[Param]) -> String {
    let mut s = String::from("| parameter | type | default | meaning |\n|---|---|---|---|\n");
    for p in params {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            p.name,
            p.ty.sql(),
            p.default,
            p.meaning
        ));
    }
    s
}

/// The named arguments a call was given (NULL counts as not given).
struct Given<'a> {
    table: &'a [Param],
    values: Vec<(P, Arg)>,
}

impl<'a> Given<'a> {
    fn read(args: &dyn Args, table: &'a [Param]) -> Given<'a> {
        let values = table
            .iter()
            .filter_map(|p| match args.named(p.name) {
                None | Some(Arg::Null) => None,
                Some(a) => Some((p.id, a)),
            })
            .collect();
        Given { table, values }
    }

    fn name(&self, id: P) -> &'static str {
        self.table
            .iter()
            .find(|p| p.id == id)
            .map_or("?", |p| p.name)
    }

    fn get(&self, id: P) -> Option<&Arg> {
        self.values.iter().find(|(p, _)| *p == id).map(|(_, a)| a)
    }

    fn text(&self, id: P) -> Result<Option<String>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::Text(s)) => Ok(Some(s.clone())),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be text",
                shown(other),
            )),
        }
    }

    fn positive(&self, id: P) -> Result<Option<i64>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::Int(i)) if *i > 0 => Ok(Some(*i)),
            Some(Arg::Int(i)) => Err(EtlError::invalid(self.name(id), "must be > 0", i)),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be an integer",
                shown(other),
            )),
        }
    }

    fn boolean(&self, id: P) -> Result<Option<bool>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be a BOOLEAN",
                shown(other),
            )),
        }
    }

    /// A list of text items; None when not given.
    fn text_list(&self, id: P) -> Result<Option<Vec<String>>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::List(items)) => items
                .iter()
                .map(|a| match a {
                    Arg::Text(s) => Ok(s.clone()),
                    other => Err(EtlError::invalid(
                        self.name(id),
                        "must be a list of text",
                        shown(other),
                    )),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be a list such as ['a', 'b']",
                shown(other),
            )),
        }
    }

    fn field(&self, id: P, default: &str) -> Result<FieldPath> {
        let text = self.text(id)?.unwrap_or_else(|| default.to_string());
        FieldPath::parse(&text).ok_or_else(|| {
            EtlError::invalid(
                self.name(id),
                "must be a field name or a dotted path such as payload.value",
                format!("'{text}'"),
            )
        })
    }

    fn table(&self, id: P, default: &str) -> Result<TableName> {
        let text = self.text(id)?.unwrap_or_else(|| default.to_string());
        TableName::parse(&text).ok_or_else(|| {
            EtlError::invalid(
                self.name(id),
                "must be a table name, optionally qualified as schema.table or catalog.schema.table",
                format!("'{text}'"),
            )
        })
    }
}

/// A table name, possibly qualified (`schema.table`, `catalog.schema.table`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub parts: Vec<String>,
}

impl TableName {
    /// Parses `a.b.c`, where each part is an identifier or a double-quoted name.
    pub fn parse(text: &str) -> Option<TableName> {
        let mut parts = Vec::new();
        let mut chars = text.trim().chars().peekable();
        loop {
            let mut part = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next()? {
                        '"' if chars.peek() == Some(&'"') => {
                            chars.next();
                            part.push('"');
                        }
                        '"' => break,
                        c => part.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    if !(c.is_alphanumeric() || c == '_' || c == '$') {
                        return None;
                    }
                    part.push(c);
                    chars.next();
                }
            }
            if part.is_empty() {
                return None;
            }
            parts.push(part);
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(_) => return None,
            }
        }
        (parts.len() <= 3).then_some(TableName { parts })
    }

    /// The name quoted for SQL.
    pub fn sql(&self) -> String {
        self.parts
            .iter()
            .map(|p| quote_ident(p))
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// An identifier in double quotes.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Files { pattern: String },
    Kafka { topic: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaParams {
    pub brokers: String,
    pub group_id: String,
    pub properties: Vec<(String, String)>,
    /// Bound on connecting and on any single broker request.
    pub timeout_ms: i64,
}

/// Everything `streaming_etl_run` was asked to do, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub job: JobConfig,
    pub source: SourceSpec,
    pub kafka: KafkaParams,
    pub partitions: Option<Vec<i32>>,
    /// Where a new job begins.
    pub start: Start,
    /// DuckDB's sandbox as the call found it (file sources list and open under it).
    pub sandbox: Sandbox,
    pub write_mode: WriteMode,
}

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
    let chosen = match given.text(P::Checkpoint)? {
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
    Given::read(args, CHECKPOINT_PARAMS).text(P::Job)
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
    let name = given.name(P::Start);
    let text = match given.get(P::Start) {
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
        .text(P::WriteMode)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("upsert") => Ok(WriteMode::Upsert),
        Some("append") => Ok(WriteMode::Append),
        Some(_) => Err(EtlError::invalid(
            given.name(P::WriteMode),
            "must be 'upsert' or 'append'",
            shown(given.get(P::WriteMode).unwrap_or(&Arg::Null)),
        )),
    }
}

/// `files`: whether the rolling rule is on.
fn parse_files(given: &Given<'_>) -> Result<bool> {
    match given
        .text(P::Files)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("append") => Ok(false),
        Some("rolling") => Ok(true),
        Some(_) => Err(EtlError::invalid(
            given.name(P::Files),
            "must be 'append' or 'rolling'",
            shown(given.get(P::Files).unwrap_or(&Arg::Null)),
        )),
    }
}

/// The window kind from `window_kind` and `hop_ms`.
fn parse_window(given: &Given<'_>, window_ms: i64) -> Result<WindowKind> {
    let hop = given.positive(P::HopMs)?;
    let kind = given.text(P::WindowKind)?;
    let kind_name = given.name(P::WindowKind);
    let hop_name = given.name(P::HopMs);
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

/// `time_format`, `time_zone` and `kafka_timestamp`.
fn parse_time(given: &Given<'_>) -> Result<(TimeFormat, Option<Zone>, bool)> {
    let kafka_ts = given.boolean(P::KafkaTimestamp)?.unwrap_or(false);
    let format = match given.text(P::TimeFormat)? {
        None => TimeFormat::EpochMsInteger,
        Some(f) => TimeFormat::parse(&f).ok_or_else(|| {
            EtlError::invalid(
                given.name(P::TimeFormat),
                "must be 'epoch_ms', 'epoch_s', 'epoch_us', 'epoch_ns' or 'iso8601'",
                format!("'{f}'"),
            )
        })?,
    };
    if kafka_ts {
        for p in [P::TimeField, P::TimeFormat, P::TimeZone] {
            if let Some(a) = given.get(p) {
                return Err(EtlError::invalid(
                    given.name(p),
                    "does not apply with kafka_timestamp := true (the record's timestamp is the event time)",
                    shown(a),
                ));
            }
        }
    }
    let zone = match given.text(P::TimeZone)? {
        None => None,
        Some(_) if format != TimeFormat::Iso8601 => {
            return Err(EtlError::invalid(
                given.name(P::TimeZone),
                "applies to time_format := 'iso8601' (epoch numbers have no zone)",
                shown(given.get(P::TimeZone).unwrap_or(&Arg::Null)),
            ))
        }
        Some(z) if z.eq_ignore_ascii_case("UTC") => Some(Zone::utc()),
        Some(z) => {
            let unknown = || {
                EtlError::invalid(
                    given.name(P::TimeZone),
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
    let (keys, default_key) = match given.text_list(P::GroupBy)? {
        None => (
            vec![KeyColumn {
                path: key_field.clone(),
                name: "key".into(),
            }],
            true,
        ),
        Some(_) if given.get(P::KeyField).is_some() => {
            return Err(EtlError::invalid(
                given.name(P::KeyField),
                "cannot be combined with group_by (name the key fields in group_by)",
                shown(given.get(P::KeyField).unwrap_or(&Arg::Null)),
            ))
        }
        Some(items) => {
            let cols = items
                .iter()
                .map(|i| {
                    parse_key_column(i).map_err(|why| {
                        EtlError::invalid(given.name(P::GroupBy), why, format!("'{i}'"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            (cols, false)
        }
    };
    let aggs = match given.text_list(P::Aggregates)? {
        None => AggSpec::defaults(value_field),
        Some(_) if given.get(P::ValueField).is_some() => {
            return Err(EtlError::invalid(
                given.name(P::ValueField),
                "cannot be combined with aggregates (name the fields in the aggregates)",
                shown(given.get(P::ValueField).unwrap_or(&Arg::Null)),
            ))
        }
        Some(items) if items.is_empty() => {
            return Err(EtlError::invalid(
                given.name(P::Aggregates),
                "must list at least one aggregate, e.g. ['count(*)']",
                "[]",
            ))
        }
        Some(items) if items.len() > MAX_AGGREGATES => {
            return Err(EtlError::invalid(
                given.name(P::Aggregates),
                format!("may list at most {MAX_AGGREGATES} aggregates"),
                items.len(),
            ))
        }
        Some(items) => items
            .iter()
            .map(|i| {
                AggSpec::parse(i).map_err(|why| {
                    EtlError::invalid(given.name(P::Aggregates), why, format!("'{i}'"))
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    // Column names: DuckDB compares identifiers without case.
    let mut seen: Vec<String> = vec!["window_start_ms".into(), "window_end_ms".into()];
    let named = keys
        .iter()
        .map(|k| {
            (
                P::GroupBy,
                k.name.as_str(),
                format!("{} AS {}", k.path.as_str(), k.name),
            )
        })
        .chain(
            aggs.iter()
                .map(|a| (P::Aggregates, a.name.as_str(), a.shown())),
        );
    for (param, name, expr) in named {
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

fn parse_partitions(given: &Given<'_>) -> Result<Option<Vec<i32>>> {
    let name = given.name(P::Partitions);
    let items = match given.get(P::Partitions) {
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

fn parse_kafka(
    given: &Given<'_>,
    args: &dyn Args,
    job: &str,
    is_kafka: bool,
) -> Result<KafkaParams> {
    let brokers = match given.text(P::Brokers)? {
        Some(b) => b,
        None => match args.setting(SETTING_BROKERS) {
            Some(Arg::Text(s)) if !s.trim().is_empty() => s,
            _ => DEFAULT_BROKERS.to_string(),
        },
    };
    if is_kafka && brokers.trim().is_empty() {
        return Err(EtlError::invalid(
            given.name(P::Brokers),
            "must name at least one host:port",
            "''",
        ));
    }
    let group_id = given
        .text(P::GroupId)?
        .unwrap_or_else(|| format!("streaming_etl-{job}"));
    if group_id.is_empty() {
        return Err(EtlError::invalid(
            given.name(P::GroupId),
            "must not be empty",
            "''",
        ));
    }
    let properties = match given.get(P::Kafka) {
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
                            given.name(P::Kafka),
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
                given.name(P::Kafka),
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
            .positive(P::TimeoutMs)?
            .unwrap_or(DEFAULT_KAFKA_TIMEOUT_MS),
    })
}

/// The settings beyond version 0.1's that differ from their defaults, as the checkpoint keeps
/// them (a run with other ones is refused).
fn extra_settings(e: &EngineConfig, value_field: &FieldPath) -> BTreeMap<String, String> {
    let mut extra = BTreeMap::new();
    match e.window {
        WindowKind::Tumbling => {}
        WindowKind::Hopping { hop_ms } => {
            extra.insert("window_kind".into(), "'hopping'".into());
            extra.insert("hop_ms".into(), hop_ms.to_string());
        }
        WindowKind::Session => {
            extra.insert("window_kind".into(), "'session'".into());
        }
    }
    if !e.default_key {
        let cols: Vec<String> = e
            .keys
            .iter()
            .map(|k| format!("'{} AS {}'", k.path.as_str(), k.name))
            .collect();
        extra.insert("group_by".into(), format!("[{}]", cols.join(", ")));
    }
    if e.time_format != TimeFormat::EpochMsInteger {
        extra.insert("time_format".into(), format!("'{}'", e.time_format.name()));
    }
    if let Some(z) = &e.time_zone {
        extra.insert("time_zone".into(), format!("'{}'", z.name()));
    }
    if e.kafka_timestamp {
        extra.insert("kafka_timestamp".into(), "true".into());
    }
    if e.numeric_strings {
        extra.insert("numeric_strings".into(), "true".into());
    }
    if e.aggregates != AggSpec::defaults(value_field) {
        let shown: Vec<String> = e
            .aggregates
            .iter()
            .map(|a| format!("'{}'", a.shown()))
            .collect();
        extra.insert("aggregates".into(), format!("[{}]", shown.join(", ")));
    }
    extra
}

/// Parses and checks the arguments of `streaming_etl_run`.
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
    let job = given.text(P::Job)?.unwrap_or_else(|| topic.clone());
    if job.trim().is_empty() {
        return Err(EtlError::invalid(
            given.name(P::Job),
            "must not be empty",
            format!("'{job}'"),
        ));
    }
    let key_field = given.field(P::KeyField, "key")?;
    let time_field = given.field(P::TimeField, "event_time_ms")?;
    let value_field = given.field(P::ValueField, "payload.value")?;
    let windows = given.table(P::WindowsTable, "windows")?;
    let late = given.table(P::LateTable, "late_events")?;
    let dead = given.table(P::DeadLetterTable, "dead_letters")?;
    if windows == late || windows == dead || late == dead {
        return Err(EtlError::invalid(
            given.name(P::WindowsTable),
            "windows_table, late_table and dead_letter_table must be three different tables",
            format!("{}, {}, {}", windows.sql(), late.sql(), dead.sql()),
        ));
    }
    let window = parse_window(&given, window_ms)?;
    let (keys, default_key, aggregates) =
        parse_keys_and_aggregates(&given, &key_field, &value_field)?;
    let (time_format, time_zone, kafka_timestamp) = parse_time(&given)?;
    let engine = EngineConfig {
        time: TimeSpec {
            window_ms,
            lateness_ms,
            idle_timeout_ms: given.positive(P::IdleTimeoutMs)?,
        },
        window,
        time_field: time_field.clone(),
        time_format,
        time_zone,
        kafka_timestamp,
        numeric_strings: given.boolean(P::NumericStrings)?.unwrap_or(false),
        max_future_ms: given.positive(P::MaxFutureMs)?,
        keys,
        default_key,
        aggregates,
    };
    let rolling = parse_files(&given)?;
    let write_mode = parse_write_mode(&given)?;
    let mut extra = extra_settings(&engine, &value_field);
    if rolling {
        extra.insert("files".into(), "'rolling'".into());
    }
    if write_mode == WriteMode::Append {
        extra.insert("write_mode".into(), "'append'".into());
    }
    let settings = JobSettings {
        source: topic.clone(),
        window_ms,
        lateness_ms,
        key_field: key_field.as_str().to_string(),
        time_field: time_field.as_str().to_string(),
        value_field: value_field.as_str().to_string(),
        extra,
    };
    let job_config = JobConfig {
        job: job.clone(),
        topic,
        settings,
        engine,
        tables: Tables {
            windows: windows.sql(),
            late: late.sql(),
            dead: dead.sql(),
        },
        checkpoint: checkpoint_location(args, db_path, &sandbox)?,
        max_messages: given.positive(P::MaxMessages)?.map(|m| m as u64),
        max_runtime_ms: given.positive(P::MaxRuntimeMs)?,
        checkpoint_interval_ms: given
            .positive(P::CheckpointIntervalMs)?
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL_MS),
        flush: given.boolean(P::Flush)?.unwrap_or(false),
        follow: given.boolean(P::Follow)?.unwrap_or(false),
        rolling,
        quiet_flush_ms: given.positive(P::QuietFlushMs)?,
    };
    let kafka = parse_kafka(&given, args, &job, is_kafka)?;
    match &source {
        SourceSpec::Files { pattern } => sandbox.check_files(pattern)?,
        SourceSpec::Kafka { .. } => sandbox.check_network(&kafka.brokers)?,
    }
    Ok(RunPlan {
        write_mode,
        start: parse_start(&given, is_kafka)?,
        sandbox,
        kafka,
        partitions: parse_partitions(&given)?,
        source,
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
            "invalid parameter 'aggregates': unknown aggregate function 'median' (known: count, sum, avg, min, max, approx_count_distinct, first, last) (got 'median(amount)')"
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
    fn table_names() {
        assert_eq!(
            TableName::parse("main.windows").unwrap().sql(),
            "\"main\".\"windows\""
        );
        assert_eq!(
            TableName::parse("\"my table\"").unwrap().sql(),
            "\"my table\""
        );
        assert_eq!(TableName::parse("\"a\"\"b\"").unwrap().sql(), "\"a\"\"b\"");
        assert!(TableName::parse("a.b.c.d").is_none());
        assert!(TableName::parse("a;drop").is_none());
        assert!(TableName::parse("").is_none());
        assert!(TableName::parse("a.").is_none());
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

    #[test]
    fn every_parameter_has_one_entry_and_the_readme_shows_the_table() {
        let mut names: Vec<&str> = RUN_PARAMS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            RUN_PARAMS.len(),
            "a parameter is declared twice"
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let mut readme = std::fs::read_to_string(path).unwrap();
        let table = markdown_table(RUN_PARAMS);
        if std::env::var_os("STREAMING_ETL_WRITE_README").is_some() {
            // `make readme`: the README's table is rewritten from RUN_PARAMS.
            let start = readme
                .find("| parameter | type | default | meaning |")
                .unwrap();
            let end = start + readme[start..].find("\n\n").unwrap() + 1;
            readme.replace_range(start..end, &table);
            std::fs::write(path, &readme).unwrap();
        }
        assert!(
            readme.contains(&table),
            "README.md must contain the parameter table generated from params::RUN_PARAMS (make readme):\n{table}"
        );
    }
}
