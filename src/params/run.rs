//! Parsing `streaming_etl_run`'s arguments into a [`RunPlan`], checked in one place at bind
//! time before any connection, file or broker is touched. Every error names the parameter and
//! the value it got. Each group of parameters is parsed in a file of its own:
//! [`source`](super::source), [`windows`](super::windows), [`time`](super::time),
//! [`output`](super::output), [`checkpoint`](super::checkpoint) and [`kafka`](super::kafka).

use std::collections::BTreeMap;

use streaming_etl_core::{
    AggSpec, ByTable, EngineConfig, Envelope, EtlError, Result, Schemas, TimeSpec, TypedColumn,
    DEFAULT_KEY_FIELD,
};
use streaming_etl_runtime::config::JobConfig;

use super::background::{parse_background, Background};
use super::checkpoint::checkpoint_location;
use super::columns::parse_columns;
use super::given::Given;
use super::kafka::{parse_kafka, parse_partitions, KafkaParams};
use super::output::{parse_compaction, parse_tables, parse_write_mode, Compaction, WriteMode};
use super::source::{
    parse_envelope, parse_files, parse_format, parse_primary_key, parse_start, parse_topic,
    SourceSpec, Start,
};
use super::sql_name::TableName;
use super::table::*;
use super::time::parse_time;
use super::windows::{check_revision_columns, parse_emit, parse_keys_and_aggregates, parse_window};
use crate::host::args::{shown, Arg, Args};
use crate::host::sandbox::Sandbox;

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
    /// The SQL form: the job's statements as given (planned at bind time, with DuckDB).
    pub sql: Option<String>,
    /// The sources' and sinks' own settings that the checkpoint keeps beside the engine's.
    pub adapters: BTreeMap<String, String>,
    /// Run beside the user, on the extension's own connections (`background`, `every`).
    pub background: Option<Background>,
    /// The key of an `INSERT OR REPLACE` target the job creates (`primary_key`).
    pub primary_key: Option<Vec<String>>,
}

impl RunPlan {
    /// The job's settings again, once DuckDB's binder normalized its typed columns' types (and,
    /// for the SQL form, once its statements set the windows, keys and aggregates: `sql` is
    /// what the settings keep of them).
    pub fn rebind_settings(&mut self, sql: Option<String>) {
        let mut adapters = self.adapters.clone();
        if let Some(sql) = sql {
            adapters.insert("sql".into(), sql);
        }
        self.job.settings = self.job.engine.job_settings(&self.job.source, adapters);
    }
}

fn required_int(name: &'static str, a: Option<Arg>) -> Result<i64> {
    match a {
        Some(Arg::Int(i)) => Ok(i),
        Some(Arg::Null) => Err(EtlError::invalid(name, "must not be NULL", "NULL")),
        Some(other) => Err(EtlError::invalid(name, "must be an integer", shown(&other))),
        None => Err(EtlError::invalid(name, "is required", "nothing")),
    }
}

/// Threads a run may use: DuckDB's `threads` as the run starts (its cores when unreadable).
fn run_threads(args: &dyn Args) -> usize {
    /// More threads than this only add overhead (shards, queues), whatever DuckDB allows.
    const MAX_RUN_THREADS: i64 = 256;
    match args.setting("threads") {
        Some(Arg::Int(n)) if n >= 1 => n.min(MAX_RUN_THREADS) as usize,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// Parses and checks the arguments of `streaming_etl_run`.
pub fn parse_run(args: &dyn Args, db_path: Option<&str>) -> Result<RunPlan> {
    let (topic, source) = parse_topic(args)?;
    let given = Given::read(args, RUN_PARAMS);
    let sql = match args.positional(1) {
        Some(Arg::Text(text)) => Some(text),
        _ => None,
    };
    let (window_ms, lateness_ms) = match &sql {
        // The statement says the window; the placeholder is replaced at bind time.
        Some(_) => {
            if let Some(p) = PARAMETER_FORM_ONLY
                .iter()
                .find(|&&p| given.get(p).is_some())
            {
                return Err(EtlError::invalid(
                    given.name(*p),
                    "belongs to the parameter form, streaming_etl_run(topic, window_ms, lateness_ms, ...); a job written as SQL says it in its statement",
                    given.get(*p).map(shown).unwrap_or_default(),
                ));
            }
            let lateness = match given.get(ParamId::LatenessMs) {
                None => 0,
                Some(Arg::Int(l)) if *l >= 0 => *l,
                Some(Arg::Int(l)) => {
                    return Err(EtlError::invalid("lateness_ms", "must be >= 0", l))
                }
                Some(other) => {
                    return Err(EtlError::invalid(
                        "lateness_ms",
                        "must be an integer",
                        shown(other),
                    ))
                }
            };
            (1, lateness)
        }
        None => {
            if let Some(p) = SQL_FORM_ONLY.iter().find(|&&p| given.get(p).is_some()) {
                return Err(EtlError::invalid(
                    given.name(*p),
                    "belongs to a job written as SQL, streaming_etl_sql(topic, sql, ...)",
                    given.get(*p).map(shown).unwrap_or_default(),
                ));
            }
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
            if let Some(l) = given.get(ParamId::LatenessMs) {
                return Err(EtlError::invalid(
                    "lateness_ms",
                    "is the third argument of streaming_etl_run(topic, window_ms, lateness_ms, ...); the named form is for a job written as SQL",
                    shown(l),
                ));
            }
            (window_ms, lateness_ms)
        }
    };
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
    let envelope = parse_envelope(&given)?;
    // A Debezium event's time is the change's (`ts_ms`: when the connector read it), unless
    // `time_field` names another (`source.ts_ms`: when the database made it).
    let mut time_fields = given.fields(
        ParamId::TimeField,
        match envelope {
            Envelope::Debezium => "ts_ms",
            Envelope::None | Envelope::Upsert => "event_time_ms",
        },
    )?;
    let value_field = given.field(ParamId::ValueField, "payload.value")?;
    let tables = parse_tables(&given)?;
    let window = parse_window(&given, window_ms)?;
    let mut columns = parse_columns(&given)?;
    if sql.is_some() && !columns.iter().any(|c| c.name.eq_ignore_ascii_case("key")) {
        // The stream's `key`, as the parameter form reads its key (read only by a statement
        // that names it).
        columns.push(TypedColumn::message_key(key_field.clone()));
    }
    let (keys, default_key, aggregates) = match &sql {
        Some(_) => (Vec::new(), false, AggSpec::defaults(&value_field)),
        None => parse_keys_and_aggregates(&given, &key_field, &value_field, &columns)?,
    };
    let (time_format, time_zone, mut kafka_timestamp) = parse_time(&given)?;
    // A keyed topic's row seldom carries its time, and a tombstone has none: its records'
    // timestamps are the events' times unless `time_field` names a field.
    if envelope == Envelope::Upsert && is_kafka && given.get(ParamId::TimeField).is_none() {
        kafka_timestamp = true;
    }
    let format = parse_format(&given, is_kafka)?;
    let (emit, late_updates_ms) = parse_emit(&given, window)?;
    let engine = EngineConfig {
        time: TimeSpec {
            window_ms,
            lateness_ms,
            idle_timeout_ms: given.positive(ParamId::IdleTimeoutMs)?,
        },
        window,
        time_field: time_fields.remove(0),
        time_field_alternatives: time_fields,
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
        envelope,
        schemas: Schemas::default(),
        emit,
        late_updates_ms,
        columns,
        resolver: Default::default(),
        stage_all: false,
        typed_inputs: false,
        null_keys: false,
        prefilter: Vec::new(),
        unstaged: Vec::new(),
        layers: Vec::new(),
    };
    if engine.revisions() && sql.is_none() {
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
        // The staged events of a partition carry its number.
        if let Some(c) = engine
            .columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case("partition"))
        {
            return Err(EtlError::invalid(
                given.name(ParamId::Columns),
                "column 'partition' is reserved with subscribe := true (rows carry their partition); give the field another name (AS ...)",
                format!("'{} AS {}'", c.path.as_str(), c.name),
            ));
        }
    }
    let settings = engine.job_settings(&topic, adapters.clone());
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
    let compaction = parse_compaction(&given)?;
    let partitions = parse_partitions(&given)?;
    if subscribe && partitions.is_some() {
        return Err(EtlError::invalid(
            given.name(ParamId::Subscribe),
            "cannot be combined with 'partitions': the consumer group assigns the partitions",
            true,
        ));
    }
    if job_config.flush && job_config.follow {
        return Err(EtlError::invalid(
            given.name(ParamId::Flush),
            "closes every open window once the input is caught up, and a follow run never ends caught up; quiet_flush_ms closes the windows of a stream that goes quiet",
            true,
        ));
    }
    let background = parse_background(&given, job_config.follow)?;
    Ok(RunPlan {
        background,
        primary_key: parse_primary_key(&given)?,
        sql,
        adapters,
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
    use streaming_etl_core::WindowKind;
    use streaming_etl_runtime::config::CheckpointLocation;

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
