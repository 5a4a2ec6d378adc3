//! The arguments of `streaming_etl_run` and `streaming_etl_checkpoint`, parsed and checked in
//! one place at bind time, before any connection, file or broker is touched. Every error names
//! the parameter and the value it got.

use crate::decode::FieldPath;
use crate::error::{EtlError, Result};
use crate::ffi::{Arg, Args, ColType};
use crate::state::JobSettings;

pub const SETTING_BROKERS: &str = "streaming_etl_brokers";
pub const SETTING_CHECKPOINT: &str = "streaming_etl_checkpoint";
pub const DEFAULT_BROKERS: &str = "localhost:9092";
/// Bound on reaching the brokers and on waiting for a partition, so a run never hangs.
pub const DEFAULT_KAFKA_TIMEOUT_MS: i64 = 15_000;

/// Named parameters of `streaming_etl_run`.
pub const RUN_NAMED: &[(&str, ColType)] = &[
    ("brokers", ColType::Varchar),
    ("group_id", ColType::Varchar),
    ("job", ColType::Varchar),
    ("key_field", ColType::Varchar),
    ("time_field", ColType::Varchar),
    ("value_field", ColType::Varchar),
    ("windows_table", ColType::Varchar),
    ("late_table", ColType::Varchar),
    ("dead_letter_table", ColType::Varchar),
    ("max_messages", ColType::BigInt),
    ("max_runtime_ms", ColType::BigInt),
    ("idle_timeout_ms", ColType::BigInt),
    ("flush", ColType::Boolean),
    ("partitions", ColType::IntegerList),
    ("kafka", ColType::VarcharMap),
    ("checkpoint", ColType::Varchar),
    ("checkpoint_interval_ms", ColType::BigInt),
    ("timeout_ms", ColType::BigInt),
];

/// Where a job's checkpoint lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointLocation {
    File(String),
    /// In memory, for as long as the database is open (not crash-safe).
    Memory,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Files { pattern: String },
    Kafka { topic: String },
}

/// A table name, possibly qualified (`schema.table`, `catalog.schema.table`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    parts: Vec<String>,
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
            .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(".")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    pub windows: TableName,
    pub late: TableName,
    pub dead: TableName,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaParams {
    pub brokers: String,
    pub group_id: String,
    pub properties: Vec<(String, String)>,
    /// Bound on connecting and on any single broker request.
    pub timeout_ms: i64,
}

/// Everything a run needs, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// The `topic` argument as given; also the `topic` column of late events and dead letters.
    pub topic: String,
    pub source: SourceSpec,
    pub job: String,
    pub window_ms: i64,
    pub lateness_ms: i64,
    pub key_field: FieldPath,
    pub time_field: FieldPath,
    pub value_field: FieldPath,
    pub tables: Tables,
    pub max_messages: Option<u64>,
    pub max_runtime_ms: Option<i64>,
    pub idle_timeout_ms: Option<i64>,
    pub flush: bool,
    pub partitions: Option<Vec<i32>>,
    pub kafka: KafkaParams,
    pub checkpoint: CheckpointLocation,
    pub checkpoint_interval_ms: i64,
}

impl RunConfig {
    pub fn settings(&self) -> JobSettings {
        JobSettings {
            source: self.topic.clone(),
            window_ms: self.window_ms,
            lateness_ms: self.lateness_ms,
            key_field: self.key_field.as_str().to_string(),
            time_field: self.time_field.as_str().to_string(),
            value_field: self.value_field.as_str().to_string(),
        }
    }
}

/// How a value is shown in an error message.
fn shown(a: &Arg) -> String {
    match a {
        Arg::Null => "NULL".into(),
        Arg::Bool(b) => b.to_string(),
        Arg::Int(i) => i.to_string(),
        Arg::Text(s) => format!("'{s}'"),
        Arg::List(items) => format!(
            "[{}]",
            items.iter().map(shown).collect::<Vec<_>>().join(", ")
        ),
        Arg::Map(items) => format!(
            "{{{}}}",
            items
                .iter()
                .map(|(k, v)| format!("{}: {}", shown(k), shown(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn required_int(name: &'static str, a: Option<Arg>) -> Result<i64> {
    match a {
        Some(Arg::Int(i)) => Ok(i),
        Some(other) => Err(EtlError::invalid(name, "must be an integer", shown(&other))),
        None => Err(EtlError::invalid(name, "is required", "nothing")),
    }
}

/// An optional named value; NULL counts as not given.
fn optional(a: Option<Arg>) -> Option<Arg> {
    a.filter(|a| *a != Arg::Null)
}

fn opt_text(name: &'static str, a: Option<Arg>) -> Result<Option<String>> {
    match optional(a) {
        None => Ok(None),
        Some(Arg::Text(s)) => Ok(Some(s)),
        Some(other) => Err(EtlError::invalid(name, "must be text", shown(&other))),
    }
}

fn opt_positive(name: &'static str, a: Option<Arg>) -> Result<Option<i64>> {
    match optional(a) {
        None => Ok(None),
        Some(Arg::Int(i)) if i > 0 => Ok(Some(i)),
        Some(Arg::Int(i)) => Err(EtlError::invalid(name, "must be > 0", i)),
        Some(other) => Err(EtlError::invalid(name, "must be an integer", shown(&other))),
    }
}

fn field(name: &'static str, a: Option<Arg>, default: &str) -> Result<FieldPath> {
    let text = opt_text(name, a)?.unwrap_or_else(|| default.to_string());
    FieldPath::parse(&text).ok_or_else(|| {
        EtlError::invalid(
            name,
            "must be a field name or a dotted path such as payload.value",
            format!("'{text}'"),
        )
    })
}

fn table(name: &'static str, a: Option<Arg>, default: &str) -> Result<TableName> {
    let text = opt_text(name, a)?.unwrap_or_else(|| default.to_string());
    TableName::parse(&text).ok_or_else(|| {
        EtlError::invalid(
            name,
            "must be a table name, optionally qualified as schema.table or catalog.schema.table",
            format!("'{text}'"),
        )
    })
}

/// Resolves the checkpoint location: the `checkpoint` argument, else the
/// `streaming_etl_checkpoint` setting, else next to the database file (in memory for an
/// in-memory database).
pub fn checkpoint_location(args: &dyn Args, db_path: Option<&str>) -> Result<CheckpointLocation> {
    let given = match opt_text("checkpoint", args.named("checkpoint"))? {
        Some(p) => Some(p),
        None => match args.setting(SETTING_CHECKPOINT) {
            Some(Arg::Text(s)) => Some(s),
            _ => None,
        },
    };
    Ok(match given.filter(|p| !p.trim().is_empty()) {
        Some(p) if p == ":memory:" => CheckpointLocation::Memory,
        Some(p) => CheckpointLocation::File(p),
        None => match db_path {
            Some(db) => CheckpointLocation::File(format!("{db}.streaming_etl.sqlite")),
            None => CheckpointLocation::Memory,
        },
    })
}

/// Parses and checks the arguments of `streaming_etl_run`.
pub fn parse_run(args: &dyn Args, db_path: Option<&str>) -> Result<RunConfig> {
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
    let window_ms = match args.positional(1) {
        Some(Arg::Null) => return Err(EtlError::invalid("window_ms", "must not be NULL", "NULL")),
        other => required_int("window_ms", other)?,
    };
    if window_ms <= 0 {
        return Err(EtlError::invalid("window_ms", "must be > 0", window_ms));
    }
    let lateness_ms = match args.positional(2) {
        Some(Arg::Null) => {
            return Err(EtlError::invalid("lateness_ms", "must not be NULL", "NULL"))
        }
        other => required_int("lateness_ms", other)?,
    };
    if lateness_ms < 0 {
        return Err(EtlError::invalid(
            "lateness_ms",
            "must be >= 0",
            lateness_ms,
        ));
    }

    let is_kafka = matches!(source, SourceSpec::Kafka { .. });
    if !is_kafka {
        for name in ["brokers", "group_id", "kafka", "timeout_ms"] {
            if let Some(a) = optional(args.named(name)) {
                return Err(EtlError::invalid(
                    name,
                    "applies to a Kafka topic, not to a file: source",
                    shown(&a),
                ));
            }
        }
    }

    let job = opt_text("job", args.named("job"))?.unwrap_or_else(|| topic.clone());
    if job.trim().is_empty() {
        return Err(EtlError::invalid(
            "job",
            "must not be empty",
            format!("'{job}'"),
        ));
    }

    let key_field = field("key_field", args.named("key_field"), "key")?;
    let time_field = field("time_field", args.named("time_field"), "event_time_ms")?;
    let value_field = field("value_field", args.named("value_field"), "payload.value")?;

    let tables = Tables {
        windows: table("windows_table", args.named("windows_table"), "windows")?,
        late: table("late_table", args.named("late_table"), "late_events")?,
        dead: table(
            "dead_letter_table",
            args.named("dead_letter_table"),
            "dead_letters",
        )?,
    };
    if tables.windows == tables.late || tables.windows == tables.dead || tables.late == tables.dead
    {
        return Err(EtlError::invalid(
            "windows_table",
            "windows_table, late_table and dead_letter_table must be three different tables",
            format!(
                "{}, {}, {}",
                tables.windows.sql(),
                tables.late.sql(),
                tables.dead.sql()
            ),
        ));
    }

    let max_messages = opt_positive("max_messages", args.named("max_messages"))?.map(|m| m as u64);
    let max_runtime_ms = opt_positive("max_runtime_ms", args.named("max_runtime_ms"))?;
    let idle_timeout_ms = opt_positive("idle_timeout_ms", args.named("idle_timeout_ms"))?;
    let checkpoint_interval_ms = opt_positive(
        "checkpoint_interval_ms",
        args.named("checkpoint_interval_ms"),
    )?
    .unwrap_or(1000);
    let timeout_ms =
        opt_positive("timeout_ms", args.named("timeout_ms"))?.unwrap_or(DEFAULT_KAFKA_TIMEOUT_MS);

    let flush = match optional(args.named("flush")) {
        None => false,
        Some(Arg::Bool(b)) => b,
        Some(other) => {
            return Err(EtlError::invalid(
                "flush",
                "must be a BOOLEAN",
                shown(&other),
            ))
        }
    };

    let partitions = match optional(args.named("partitions")) {
        None => None,
        Some(Arg::List(items)) => {
            let shown_list = shown(&Arg::List(items.clone()));
            if items.is_empty() {
                return Err(EtlError::invalid(
                    "partitions",
                    "must list at least one partition",
                    shown_list,
                ));
            }
            let mut out = Vec::with_capacity(items.len());
            for it in &items {
                match it {
                    Arg::Int(p) if (0..=i64::from(i32::MAX)).contains(p) => out.push(*p as i32),
                    _ => {
                        return Err(EtlError::invalid(
                            "partitions",
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
                    "partitions",
                    "must not repeat a partition",
                    shown_list,
                ));
            }
            Some(sorted)
        }
        Some(other) => {
            return Err(EtlError::invalid(
                "partitions",
                "must be a list of partition numbers such as [0, 1]",
                shown(&other),
            ))
        }
    };

    let brokers = match opt_text("brokers", args.named("brokers"))? {
        Some(b) => b,
        None => match args.setting(SETTING_BROKERS) {
            Some(Arg::Text(s)) if !s.trim().is_empty() => s,
            _ => DEFAULT_BROKERS.to_string(),
        },
    };
    if is_kafka && brokers.trim().is_empty() {
        return Err(EtlError::invalid(
            "brokers",
            "must name at least one host:port",
            "''",
        ));
    }
    let group_id = opt_text("group_id", args.named("group_id"))?
        .unwrap_or_else(|| format!("streaming_etl-{job}"));
    if group_id.is_empty() {
        return Err(EtlError::invalid("group_id", "must not be empty", "''"));
    }
    let properties = match optional(args.named("kafka")) {
        None => Vec::new(),
        Some(Arg::Map(items)) => {
            let mut props = Vec::with_capacity(items.len());
            for (k, v) in &items {
                match (k, v) {
                    (Arg::Text(k), Arg::Text(v)) if !k.is_empty() => {
                        props.push((k.clone(), v.clone()))
                    }
                    _ => {
                        return Err(EtlError::invalid(
                            "kafka",
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
                "kafka",
                "must be a MAP of librdkafka properties, e.g. MAP {'security.protocol': 'SSL'}",
                shown(&other),
            ))
        }
    };

    Ok(RunConfig {
        topic,
        source,
        job,
        window_ms,
        lateness_ms,
        key_field,
        time_field,
        value_field,
        tables,
        max_messages,
        max_runtime_ms,
        idle_timeout_ms,
        flush,
        partitions,
        kafka: KafkaParams {
            brokers,
            group_id,
            properties,
            timeout_ms,
        },
        checkpoint: checkpoint_location(args, db_path)?,
        checkpoint_interval_ms,
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
        assert_eq!(c.job, "file:data/*.ndjson");
        assert_eq!(
            c.source,
            SourceSpec::Files {
                pattern: "data/*.ndjson".into()
            }
        );
        assert_eq!(c.value_field.as_str(), "payload.value");
        assert_eq!(c.tables.windows.sql(), "\"windows\"");
        assert_eq!(
            c.checkpoint,
            CheckpointLocation::File("/db/x.duckdb.streaming_etl.sqlite".into())
        );
        assert_eq!(c.kafka.brokers, DEFAULT_BROKERS);
        let c = parse_run(&args("orders", 1000, 0, &[]), None).unwrap();
        assert_eq!(c.checkpoint, CheckpointLocation::Memory);
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
            parse_run(&a, None).unwrap().checkpoint,
            CheckpointLocation::File("jobs.ckpt".into())
        );
        a.named.insert("checkpoint", Arg::Text(":memory:".into()));
        assert_eq!(
            parse_run(&a, None).unwrap().checkpoint,
            CheckpointLocation::Memory
        );
    }
}
