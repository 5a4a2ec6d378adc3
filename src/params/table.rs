//! The declaration: every setting and named parameter of the SQL functions, once (name, type,
//! default, meaning), from which registration, parsing and the README's parameter table follow.

/// A setting registered with DuckDB (`SET name = '...'`): name, default, description.
#[cfg_attr(feature = "capi-v1-2", allow(dead_code))]
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
    Interval,
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
            ParamType::Interval => "INTERVAL",
        }
    }
}

/// The named parameters, by identity (so a parser cannot misspell one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamId {
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
    CompactEvery,
    CompactRetainMs,
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
    Subscribe,
    Checkpoint,
    CheckpointIntervalMs,
    Brokers,
    GroupId,
    Kafka,
    TimeoutMs,
    Format,
    Message,
    SchemaRegistry,
    SchemaRegistryOptions,
    Emit,
    LateUpdatesMs,
    Columns,
    LatenessMs,
    Background,
    Every,
    Envelope,
    PrimaryKey,
}

/// One named parameter.
pub struct Param {
    pub id: ParamId,
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
    id: ParamId,
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

/// The positional parameters of `streaming_etl_run`: source, window_ms, lateness_ms.
pub const RUN_POSITIONAL: &[ParamType] =
    &[ParamType::Varchar, ParamType::BigInt, ParamType::BigInt];

/// The positional parameters of its SQL form, `streaming_etl_run(topic, sql)`.
pub const RUN_SQL_POSITIONAL: &[ParamType] = &[ParamType::Varchar, ParamType::Varchar];

/// Parameters of the parameter form only: a statement of the SQL form says these.
pub const PARAMETER_FORM_ONLY: &[ParamId] = &[
    ParamId::WindowKind,
    ParamId::HopMs,
    ParamId::GroupBy,
    ParamId::Aggregates,
    ParamId::ValueField,
];

/// Parameters of the SQL form only: they say how its statements read the stream or write.
pub const SQL_FORM_ONLY: &[ParamId] = &[ParamId::Envelope, ParamId::PrimaryKey];

/// The declared type of a named parameter of either function.
#[cfg_attr(not(feature = "capi-v1-2"), allow(dead_code))]
pub fn param_type(name: &str) -> Option<ParamType> {
    RUN_PARAMS
        .iter()
        .chain(CHECKPOINT_PARAMS)
        .find(|p| p.name == name)
        .map(|p| p.ty)
}

/// The named parameters of `streaming_etl_run`.
pub const RUN_PARAMS: &[Param] = &[
    param(ParamId::Job, "job", ParamType::Varchar, "the `topic` argument", "name the job's state is kept under in the checkpoint"),
    param(ParamId::LatenessMs, "lateness_ms", ParamType::BigInt, "0", "`streaming_etl_sql`: how far behind a partition's newest event time an event may still count"),
    param(ParamId::WindowKind, "window_kind", ParamType::Varchar, "`tumbling`", "`tumbling`, `hopping` (with `hop_ms`) or `session` (`window_ms` is the gap)"),
    param(ParamId::HopMs, "hop_ms", ParamType::BigInt, "none", "hopping windows: a window of `window_ms` starts every `hop_ms` (divides `window_ms`)"),
    param(ParamId::GroupBy, "group_by", ParamType::VarcharList, "`[key_field]`", "key columns: dotted paths, `path AS name` (string, number or boolean values); `[]`: one row per window"),
    param(ParamId::Aggregates, "aggregates", ParamType::VarcharList, "count, sum/min/max of `value_field`", "`count(*)`, `sum(x)`, `avg`, `min`, `max`, `approx_quantile(x, q)`, `arg_max(x, y)`, ..., `FILTER (WHERE ...)`, `AS name`; with `columns`, any DuckDB aggregate ([more](docs/semantics.md#aggregates))"),
    param(ParamId::Columns, "columns", ParamType::VarcharMap, "none", "typed fields, as `read_json`'s: `{'path [AS name]': 'DuckDB type', ...}` ([more](#typed-columns-aggregates-running-results))"),
    param(ParamId::Envelope, "envelope", ParamType::Varchar, "none", "SQL: `debezium` or `upsert` ([changelogs](docs/sql.md#changelogs-into-tables))"),
    param(ParamId::PrimaryKey, "primary_key", ParamType::VarcharList, "the table's", "SQL: the key of an `INSERT OR REPLACE` target the job creates"),
    param(ParamId::Emit, "emit", ParamType::Varchar, "`close`", "`close` (a window's row when it closes) or `update` (also each cycle's running values) ([more](#typed-columns-aggregates-running-results))"),
    param(ParamId::LateUpdatesMs, "late_updates_ms", ParamType::BigInt, "none", "a late event this close to its window's end corrects the row"),
    param(ParamId::KeyField, "key_field", ParamType::Varchar, "`key`", "dotted path of the key (string or number; Kafka: the message key when absent; SQL: the stream's `key`)"),
    param(ParamId::TimeField, "time_field", ParamType::Varchar, "`event_time_ms`", "dotted path of the event time, or paths, comma-separated: the first present (form: `time_format`)"),
    param(ParamId::ValueField, "value_field", ParamType::Varchar, "`payload.value`", "dotted path of the number aggregated (missing or null: counted only)"),
    param(ParamId::TimeFormat, "time_format", ParamType::Varchar, "integer `epoch_ms`", "`epoch_ms`, `epoch_s`, `epoch_us`, `epoch_ns` (fractions truncated to ms) or `iso8601`"),
    param(ParamId::TimeZone, "time_zone", ParamType::Varchar, "none", "`iso8601`: the zone (`UTC`, IANA name) of times without `Z` or offset; else they are dead letters"),
    param(ParamId::NumericStrings, "numeric_strings", ParamType::Boolean, "false", "a value given as a decimal string (`\"19.90\"`) counts as that number"),
    param(ParamId::MaxFutureMs, "max_future_ms", ParamType::BigInt, "none", "an event more than this far ahead of the wall clock is a dead letter"),
    param(ParamId::WriteMode, "write_mode", ParamType::Varchar, "`upsert`", "`upsert` (keyed tables, rows upserted) or `append` (no keys: no index to maintain, faster)"),
    param(ParamId::WindowsTable, "windows_table", ParamType::Varchar, "`windows`", "output table of windows (may be `[catalog.]schema.table`)"),
    param(ParamId::LateTable, "late_table", ParamType::Varchar, "`late_events` beside it", "output table of late events"),
    param(ParamId::DeadLetterTable, "dead_letter_table", ParamType::Varchar, "`dead_letters` beside it", "output table of rejected messages"),
    param(ParamId::CompactEvery, "compact_every", ParamType::BigInt, "none", "DuckLake: every n cycles, merge small files and expire snapshots"),
    param(ParamId::CompactRetainMs, "compact_retain_ms", ParamType::BigInt, "600000", "with `compact_every`: keep snapshots younger than this"),
    param(ParamId::MaxMessages, "max_messages", ParamType::BigInt, "none", "stop after this many messages"),
    param(ParamId::MaxRuntimeMs, "max_runtime_ms", ParamType::BigInt, "none", "stop after this long"),
    param(ParamId::IdleTimeoutMs, "idle_timeout_ms", ParamType::BigInt, "none", "a partition silent this long (wall clock) stops holding the watermark back"),
    param(ParamId::Flush, "flush", ParamType::Boolean, "false", "once caught up, close every open window (bounded input)"),
    param(ParamId::Follow, "follow", ParamType::Boolean, "false", "keep reading what arrives (until a limit, an interrupt, `LIMIT`)"),
    param(ParamId::Background, "background", ParamType::Boolean, "false", "run on the extension's own connections and return at once ([more](#jobs-in-the-background))"),
    param(ParamId::Every, "every", ParamType::Interval, "none", "in the background, a bounded run on this schedule (the next starts after the last ended)"),
    param(ParamId::Start, "start", ParamType::Varchar, "`earliest`", "a new job's start: `earliest`, `latest` or (Kafka) a time (ISO 8601, epoch ms)"),
    param(ParamId::QuietFlushMs, "quiet_flush_ms", ParamType::BigInt, "none", "close every open window once all partitions are silent this long (wall clock)"),
    param(ParamId::Files, "files", ParamType::Varchar, "`append`", "`append` (every file may grow) or `rolling` (a caught-up file stops holding the watermark back once a later file delivered)").only(Applies::Files),
    param(ParamId::Partitions, "partitions", ParamType::IntegerList, "all", "read only these partitions (split a topic between processes)"),
    param(ParamId::Subscribe, "subscribe", ParamType::Boolean, "false", "Kafka: the consumer group `group_id` shares the partitions among the job's processes ([more](#output-into-a-ducklake-and-scale-out-subscribe))").only(Applies::Kafka),
    param(ParamId::Checkpoint, "checkpoint", ParamType::Varchar, "the setting", "checkpoint file for this call"),
    param(ParamId::CheckpointIntervalMs, "checkpoint_interval_ms", ParamType::BigInt, "1000", "length of a checkpoint cycle (one result row per cycle)"),
    param(ParamId::Brokers, "brokers", ParamType::Varchar, "the setting", "Kafka: bootstrap servers").only(Applies::Kafka),
    param(ParamId::GroupId, "group_id", ParamType::Varchar, "`streaming_etl-<job>`", "Kafka: the consumer group offsets are committed to (with `subscribe`: that assigns the partitions)").only(Applies::Kafka),
    param(ParamId::Kafka, "kafka", ParamType::VarcharMap, "none", "Kafka: librdkafka properties, passed through (security, tuning)").only(Applies::Kafka),
    param(ParamId::KafkaTimestamp, "kafka_timestamp", ParamType::Boolean, "false", "Kafka: the record's own timestamp is the event time").only(Applies::Kafka),
    param(ParamId::TimeoutMs, "timeout_ms", ParamType::BigInt, "15000", "Kafka: bound on reaching the brokers and on waiting for a partition").only(Applies::Kafka),
    param(ParamId::Format, "format", ParamType::Varchar, "`json`", "`json`, `avro` or `protobuf` ([formats](docs/semantics.md#message-formats))"),
    param(ParamId::Message, "message", ParamType::Varchar, "as framed", "Protobuf: the message type records must be"),
    param(ParamId::SchemaRegistry, "schema_registry", ParamType::Varchar, "none", "Kafka: the schema registry's URL").only(Applies::Kafka),
    param(ParamId::SchemaRegistryOptions, "schema_registry_options", ParamType::VarcharMap, "none", "Kafka: the registry's `basic.auth.user.info` and `ssl.*.location` options").only(Applies::Kafka),
];

/// The named parameters of `streaming_etl_checkpoint`.
pub const CHECKPOINT_PARAMS: &[Param] = &[
    param(
        ParamId::Checkpoint,
        "checkpoint",
        ParamType::Varchar,
        "the setting",
        "checkpoint file to read",
    ),
    param(
        ParamId::Job,
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

#[cfg(test)]
mod tests {
    use super::*;

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
