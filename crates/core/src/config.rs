//! What a job is configured with: the engine's settings (time, window kind, fields, keys,
//! aggregates) and, derived from them once, the settings a checkpoint must agree with.

use std::collections::BTreeMap;

use crate::aggregate::AggSpec;
use crate::columns::{Repr, ResolverHandle, TypedColumn};
use crate::decode::FieldPath;
use crate::format::{Envelope, Format, Schemas};
use crate::prefilter::NullTests;
use crate::rows::{Column, ColumnType, Role, TableSchema};
use crate::state::OutputSchemas;
use crate::time::{TimeFormat, Zone};

/// The key field of the default job (`key_field`'s default).
pub const DEFAULT_KEY_FIELD: &str = "key";

/// `emit`: when a window's row is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Emit {
    /// Once, when the watermark closes the window.
    #[default]
    Close,
    /// Each cycle for the windows that changed in it, and once more when it closes.
    Update,
}

impl Emit {
    pub fn name(self) -> &'static str {
        match self {
            Emit::Close => "close",
            Emit::Update => "update",
        }
    }
}

/// The columns a row with revisions ends with, after the aggregates.
pub(crate) const REVISION_COLUMNS: [&str; 3] = ["final", "revision", "retracted"];

/// The hidden column of window rows that tells a late correction (whose DuckDB aggregates see
/// the window's late events) from the row the window's close wrote.
pub const CORRECTION_COLUMN: &str = "__se_correction";

/// The most aggregates a job may have (their inputs live on the stack while an event is read).
pub const MAX_AGGREGATES: usize = 32;

/// One column of a job's key: the field it is read from and its name in the windows table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    pub path: FieldPath,
    pub name: String,
}

/// The event-time settings of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSpec {
    /// The window length (the gap, for sessions).
    pub window_ms: i64,
    pub lateness_ms: i64,
    pub idle_timeout_ms: Option<i64>,
}

/// The kind of windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Tumbling,
    /// Windows of `window_ms` starting every `hop_ms` (which divides `window_ms`).
    Hopping {
        hop_ms: i64,
    },
    /// Per-key sessions; `window_ms` is the gap.
    Session,
}

/// Everything the engine of a job is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    pub time: TimeSpec,
    pub window: WindowKind,
    pub time_field: FieldPath,
    /// Where else the event time may be, tried in order when `time_field` is missing: a topic
    /// of several kinds of record, each with its time in a field of its own (Nexmark's
    /// `Person.date_time`, `Auction.date_time`, `Bid.date_time`).
    pub time_field_alternatives: Vec<FieldPath>,
    pub time_format: TimeFormat,
    /// The zone ISO times without an offset are read in (None: they are dead letters).
    pub time_zone: Option<Zone>,
    /// The Kafka record's timestamp is the event time (the time field is not read).
    pub kafka_timestamp: bool,
    /// Decimal strings count as numbers where an aggregate needs one.
    pub numeric_strings: bool,
    /// An event more than this far ahead of the wall clock is a dead letter.
    pub max_future_ms: Option<i64>,
    /// The key columns (none: one row per window).
    pub keys: Vec<KeyColumn>,
    /// The single default key (`key_field`): falls back to the Kafka message key when absent,
    /// and is a string or a number, as in version 0.1.
    pub default_key: bool,
    pub aggregates: Vec<AggSpec>,
    /// The field the default aggregates read (`value_field`; its default when `aggregates`
    /// names the fields).
    pub value_field: FieldPath,
    /// How messages are encoded (`format`).
    pub format: Format,
    /// What wraps the record (`envelope`).
    pub envelope: Envelope,
    /// Where Avro and Protobuf schemas are found by id (filled by the source's adapter).
    pub schemas: Schemas,
    /// When window rows are written (`emit`).
    pub emit: Emit,
    /// How long past its end a closed window still takes late events (`late_updates_ms`).
    pub late_updates_ms: Option<i64>,
    /// The typed columns (`columns`): fields read as DuckDB types, the inputs of the aggregates
    /// DuckDB computes and the types of the keys among them.
    pub columns: Vec<TypedColumn>,
    /// Where values that only DuckDB can convert are converted (filled by the adapter).
    pub resolver: ResolverHandle,
    /// A job written as SQL: every event read is staged, placed or late (its [`Fate`]), with
    /// its partition and offset, so that DuckDB runs the statement's joins, WHERE and
    /// aggregates over what the engine placed.
    pub stage_all: bool,
    /// Aggregates over a typed column read its converted value (a job written as SQL), not the
    /// field as it is in the message.
    pub typed_inputs: bool,
    /// A NULL typed key is a key (a job written as SQL groups NULLs as SQL does), not a dead
    /// letter.
    pub null_keys: bool,
    /// The events a statement can read at all (a job written as SQL; empty: every event): the
    /// others are not placed or staged, as if its WHERE dropped them.
    pub prefilter: NullTests,
    /// Typed columns no aggregate reads (a parameter job that declares more than its DuckDB
    /// aggregates read): decoded and converted (a value that does not convert is a dead letter),
    /// not staged.
    pub unstaged: Vec<String>,
    /// A job of several statements over one read (empty: a job of one): each statement's own
    /// windows, keys and aggregates. This configuration then decodes every event once, into the
    /// typed columns of all of them; its keys are none and its aggregates theirs, in order.
    pub layers: Vec<EngineConfig>,
}

/// What the engine did with a staged event (a job that stages every event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Placed in its open window(s).
    Placed = 0,
    /// Late: in no window.
    Late = 1,
    /// Late, and applied to a kept window as a correction (`late_updates_ms`).
    Applied = 2,
}

/// The staged events' columns only the extension uses, beside the key columns and the typed
/// values of a job that stages every event.
pub const FATE_COLUMN: &str = "__se_fate";

impl EngineConfig {
    /// A job with the default key and aggregates (SPEC sections 3-5).
    pub fn with_defaults(
        time: TimeSpec,
        key_field: FieldPath,
        time_field: FieldPath,
        value_field: &FieldPath,
    ) -> EngineConfig {
        EngineConfig {
            time,
            window: WindowKind::Tumbling,
            time_field,
            time_field_alternatives: Vec::new(),
            time_format: TimeFormat::EpochMsInteger,
            time_zone: None,
            kafka_timestamp: false,
            numeric_strings: false,
            max_future_ms: None,
            keys: vec![KeyColumn {
                path: key_field,
                name: "key".into(),
            }],
            default_key: true,
            aggregates: AggSpec::defaults(value_field),
            value_field: value_field.clone(),
            format: Format::Json,
            envelope: Envelope::None,
            schemas: Schemas::default(),
            emit: Emit::Close,
            late_updates_ms: None,
            columns: Vec::new(),
            resolver: ResolverHandle::default(),
            stage_all: false,
            typed_inputs: false,
            null_keys: false,
            prefilter: Vec::new(),
            unstaged: Vec::new(),
            layers: Vec::new(),
        }
    }

    /// The job's windows in a few words: `1000 ms windows`, `60000 ms windows every 10000 ms`,
    /// `sessions with a 5000 ms gap`.
    pub fn windows_shown(&self) -> String {
        let ms = self.time.window_ms;
        match self.window {
            WindowKind::Tumbling => format!("{ms} ms windows"),
            WindowKind::Hopping { hop_ms } => format!("{ms} ms windows every {hop_ms} ms"),
            WindowKind::Session => format!("sessions with a {ms} ms gap"),
        }
    }

    /// The typed columns as a job's settings keep them (None: the job has none).
    pub fn columns_setting(&self) -> Option<String> {
        if self.columns.is_empty() {
            return None;
        }
        let shown: Vec<String> = self.columns.iter().map(TypedColumn::shown).collect();
        Some(format!("{{{}}}", shown.join(", ")))
    }

    /// Whether DuckDB computes some of the aggregates (the events of open windows are staged),
    /// or the job stages every event.
    pub fn stages(&self) -> bool {
        self.stage_all || self.aggregates.iter().any(AggSpec::is_duckdb)
    }

    /// The typed column a key is read as, if it is one.
    pub fn typed_key(&self, key: &KeyColumn) -> Option<&TypedColumn> {
        self.columns.iter().find(|c| c.path == key.path)
    }

    /// A key column: VARCHAR, or the type of the typed column it is (its text is cast).
    fn key_column(&self, k: &KeyColumn) -> Column {
        let mut c = Column::new(&k.name, ColumnType::Varchar);
        if let Some(t) = self.typed_key(k).filter(|t| t.repr != Repr::Text) {
            c.role = Role::Cast(t.sql_type.clone());
        }
        c
    }

    /// Whether window rows carry the hidden correction flag.
    pub(crate) fn marks_corrections(&self) -> bool {
        self.stages() && self.late_updates_ms.is_some()
    }

    /// Whether a staged event carries the watermark it was placed under: a window's row then
    /// takes the events placed before the window closed, and a correction all of them (hopping
    /// windows place an event late for one window in the open ones it also belongs to).
    pub fn stamps_events(&self) -> bool {
        matches!(self.window, WindowKind::Hopping { .. }) || self.late_updates_ms.is_some()
    }

    /// The typed columns a staged event carries beside its key (the keys' are in the key, and
    /// those no aggregate reads are not staged).
    pub fn staged_values(&self) -> impl Iterator<Item = &TypedColumn> {
        self.columns.iter().filter(|c| {
            !self.keys.iter().any(|k| k.path == c.path) && !self.unstaged.contains(&c.name)
        })
    }

    /// The events of open windows, as the engine hands them to the sink (a job with DuckDB
    /// aggregates): the key columns, the pane (tumbling and hopping), the event time, the
    /// watermark it was placed under (see [`EngineConfig::stamps_events`]), the typed values.
    pub fn staged_schema(&self) -> TableSchema {
        let mut cols: Vec<Column> = self.keys.iter().map(|k| self.key_column(k)).collect();
        if self.window != WindowKind::Session {
            cols.push(Column::new("__se_pane", ColumnType::BigInt));
        }
        cols.push(Column::new("event_time_ms", ColumnType::BigInt));
        if self.stamps_events() {
            cols.push(Column::new("__se_stamp", ColumnType::BigInt));
        }
        if self.stage_all {
            cols.push(Column::new("partition", ColumnType::Integer));
            cols.push(Column::new("offset", ColumnType::BigInt));
            cols.push(Column::new(FATE_COLUMN, ColumnType::Integer));
        }
        for c in self.staged_values() {
            let mut col = Column::new(&c.name, c.repr.carried());
            col.role = match c.repr {
                Repr::Bool | Repr::Double | Repr::Text => Role::Plain,
                _ => Role::Cast(c.sql_type.clone()),
            };
            cols.push(col);
        }
        TableSchema {
            columns: cols,
            primary_key: Vec::new(),
        }
    }

    /// Whether window rows carry `final`, `revision` and `retracted` (a window's row can be
    /// written more than once).
    pub fn revisions(&self) -> bool {
        self.emit == Emit::Update || self.late_updates_ms.is_some()
    }

    /// The windows table: window bounds, the key columns, the aggregates; keyed by the key
    /// columns and the window start.
    pub fn windows_schema(&self) -> TableSchema {
        let mut cols = vec![
            Column::new("window_start_ms", ColumnType::BigInt),
            Column::new("window_end_ms", ColumnType::BigInt),
        ];
        cols.extend(self.keys.iter().map(|k| self.key_column(k)));
        cols.extend(self.aggregates.iter().map(|a| {
            let mut c = Column::new(&a.name, a.output_type());
            if let Some(d) = &a.duck {
                c.role = Role::Computed(d.sql_type.clone());
            }
            c
        }));
        if self.revisions() {
            let types = [ColumnType::Boolean, ColumnType::BigInt, ColumnType::Boolean];
            for (name, ty) in REVISION_COLUMNS.into_iter().zip(types) {
                cols.push(Column::new(name, ty));
            }
        }
        if self.marks_corrections() {
            let mut c = Column::new(CORRECTION_COLUMN, ColumnType::Boolean);
            c.role = Role::Hidden;
            cols.push(c);
        }
        let mut key: Vec<String> = self.keys.iter().map(|k| k.name.clone()).collect();
        key.push("window_start_ms".into());
        TableSchema {
            columns: cols,
            primary_key: key,
        }
    }

    /// The output tables of a job with these settings.
    pub fn schemas(&self) -> OutputSchemas {
        let mut schemas = OutputSchemas::for_windows(self.windows_schema());
        if self.late_updates_ms.is_some() {
            schemas
                .late
                .columns
                .push(crate::rows::Column::new("applied", ColumnType::Boolean));
        }
        schemas
    }

    /// The settings a checkpoint of this job must agree with: the source as given and the
    /// engine's settings, with `adapters` (the sources' and sinks' own settings that differ
    /// from their defaults, by parameter name) among the extra ones.
    pub fn job_settings(&self, source: &str, adapters: BTreeMap<String, String>) -> JobSettings {
        let mut extra = adapters;
        match self.window {
            WindowKind::Tumbling => {}
            WindowKind::Hopping { hop_ms } => {
                extra.insert("window_kind".into(), "'hopping'".into());
                extra.insert("hop_ms".into(), hop_ms.to_string());
            }
            WindowKind::Session => {
                extra.insert("window_kind".into(), "'session'".into());
            }
        }
        if !self.default_key {
            let cols: Vec<String> = self
                .keys
                .iter()
                .map(|k| format!("'{} AS {}'", k.path.as_str(), k.name))
                .collect();
            extra.insert("group_by".into(), format!("[{}]", cols.join(", ")));
        }
        if self.time_format != TimeFormat::EpochMsInteger {
            extra.insert(
                "time_format".into(),
                format!("'{}'", self.time_format.name()),
            );
        }
        if let Some(z) = &self.time_zone {
            extra.insert("time_zone".into(), format!("'{}'", z.name()));
        }
        match &self.format {
            Format::Json => {}
            Format::Avro => {
                extra.insert("format".into(), "'avro'".into());
            }
            Format::Protobuf { message } => {
                extra.insert("format".into(), "'protobuf'".into());
                if let Some(m) = message {
                    extra.insert("message".into(), format!("'{m}'"));
                }
            }
        }
        if self.envelope != Envelope::None {
            extra.insert("envelope".into(), format!("'{}'", self.envelope.name()));
        }
        if self.emit != Emit::Close {
            extra.insert("emit".into(), format!("'{}'", self.emit.name()));
        }
        if let Some(n) = self.late_updates_ms {
            extra.insert("late_updates_ms".into(), n.to_string());
        }
        if self.kafka_timestamp {
            extra.insert("kafka_timestamp".into(), "true".into());
        }
        if self.numeric_strings {
            extra.insert("numeric_strings".into(), "true".into());
        }
        if let Some(c) = self.columns_setting() {
            extra.insert("columns".into(), c);
        }
        if self.aggregates != AggSpec::defaults(&self.value_field) {
            let shown: Vec<String> = self
                .aggregates
                .iter()
                .map(|a| format!("'{}'", a.shown()))
                .collect();
            extra.insert("aggregates".into(), format!("[{}]", shown.join(", ")));
        }
        // `group_by` excludes `key_field`, so with named keys it is at its default.
        let key_field = match (self.default_key, self.keys.first()) {
            (true, Some(k)) => k.path.as_str().to_string(),
            _ => DEFAULT_KEY_FIELD.to_string(),
        };
        JobSettings {
            source: source.to_string(),
            window_ms: self.time.window_ms,
            lateness_ms: self.time.lateness_ms,
            key_field,
            time_field: self.time_fields_text(),
            value_field: self.value_field.as_str().to_string(),
            extra,
        }
    }

    /// The time fields as the user gives them: one path, or several separated by commas.
    pub fn time_fields_text(&self) -> String {
        std::iter::once(&self.time_field)
            .chain(&self.time_field_alternatives)
            .map(FieldPath::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The predecessor's job: fields `key`, `event_time_ms` and `payload.value`, no idle timeout
    /// (the tests' usual configuration).
    #[cfg(test)]
    pub(crate) fn for_tests(window_ms: i64, lateness_ms: i64) -> EngineConfig {
        let p = |s: &str| crate::decode::FieldPath::parse(s).unwrap();
        EngineConfig::with_defaults(
            TimeSpec {
                window_ms,
                lateness_ms,
                idle_timeout_ms: None,
            },
            p("key"),
            p("event_time_ms"),
            &p("payload.value"),
        )
    }
}

/// The settings a job's state only makes sense with; a run with other ones is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    pub source: String,
    pub window_ms: i64,
    pub lateness_ms: i64,
    pub key_field: String,
    pub time_field: String,
    pub value_field: String,
    /// Every other setting that differs from its default, by parameter name (window kind, hop,
    /// keys, aggregates, time format, ...). A setting left at its default is absent, so a job
    /// checkpointed before a setting existed keeps matching runs that leave it alone.
    pub extra: BTreeMap<String, String>,
}

impl JobSettings {
    /// The settings as (name, shown value) pairs, in a fixed order, for comparison.
    fn entries(&self) -> Vec<(&str, String)> {
        vec![
            ("topic", format!("'{}'", self.source)),
            ("window_ms", self.window_ms.to_string()),
            ("lateness_ms", self.lateness_ms.to_string()),
            ("key_field", format!("'{}'", self.key_field)),
            ("time_field", format!("'{}'", self.time_field)),
            ("value_field", format!("'{}'", self.value_field)),
        ]
    }

    /// The first setting that differs, as (name, stored, requested).
    pub fn first_difference(&self, requested: &JobSettings) -> Option<(String, String, String)> {
        // A job written as SQL: its statements say the window, keys and aggregates.
        let sql = |s: &JobSettings| s.extra.get("sql").cloned();
        if let (Some(a), Some(b)) = (sql(self), sql(requested)) {
            if a != b {
                return Some(("sql".into(), format!("'{a}'"), format!("'{b}'")));
            }
        }
        for ((name, a), (_, b)) in self.entries().into_iter().zip(requested.entries()) {
            if a != b {
                return Some((name.to_string(), a, b));
            }
        }
        let names: std::collections::BTreeSet<&String> =
            self.extra.keys().chain(requested.extra.keys()).collect();
        for name in names {
            let shown = |s: &JobSettings| {
                s.extra
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| "its default".to_string())
            };
            let (a, b) = (shown(self), shown(requested));
            if a != b {
                return Some((name.clone(), a, b));
            }
        }
        None
    }

    /// The extra settings as stored (one `name=value` per line; values have no newlines).
    pub fn extra_text(&self) -> String {
        self.extra
            .iter()
            .map(|(k, v)| format!("{k}={}\n", v.replace('\n', " ")))
            .collect()
    }

    pub fn parse_extra(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_shown_by_their_kind_and_size() {
        let mut cfg = EngineConfig::for_tests(60_000, 0);
        assert_eq!(cfg.windows_shown(), "60000 ms windows");
        cfg.window = WindowKind::Hopping { hop_ms: 10_000 };
        assert_eq!(cfg.windows_shown(), "60000 ms windows every 10000 ms");
        cfg.window = WindowKind::Session;
        assert_eq!(cfg.windows_shown(), "sessions with a 60000 ms gap");
    }

    #[test]
    fn settings_differences_name_the_setting() {
        let base = JobSettings {
            source: "t".into(),
            window_ms: 1000,
            lateness_ms: 0,
            key_field: "key".into(),
            time_field: "ts".into(),
            value_field: "v".into(),
            extra: BTreeMap::new(),
        };
        assert_eq!(base.first_difference(&base.clone()), None);
        let mut other = base.clone();
        other.window_ms = 5;
        assert_eq!(
            base.first_difference(&other),
            Some(("window_ms".into(), "1000".into(), "5".into()))
        );
        let mut hop = base.clone();
        hop.extra.insert("hop_ms".into(), "500".into());
        assert_eq!(
            base.first_difference(&hop),
            Some(("hop_ms".into(), "its default".into(), "500".into()))
        );
        assert_eq!(JobSettings::parse_extra(&hop.extra_text()), hop.extra);
    }

    #[test]
    fn settings_are_derived_from_the_engine_config() {
        let mut cfg = EngineConfig::for_tests(1000, 200);
        let s = cfg.job_settings("t", BTreeMap::new());
        assert_eq!(
            (s.window_ms, s.lateness_ms, s.key_field.as_str()),
            (1000, 200, "key")
        );
        assert_eq!(s.value_field, "payload.value");
        assert!(s.extra.is_empty());
        cfg.window = WindowKind::Hopping { hop_ms: 500 };
        let s = cfg.job_settings("t", BTreeMap::from([("files".into(), "'rolling'".into())]));
        assert_eq!(s.extra["hop_ms"], "500");
        assert_eq!(s.extra["files"], "'rolling'");
    }
}
