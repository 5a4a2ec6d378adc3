//! What a message means for a job: its event time, its key and each aggregate's input, read from
//! the decoded fields with the job's rules. A message that breaks them is a dead letter whose
//! reason names the field and what was expected (`event time field 'ts' is a string, not an
//! integer`). The job's fields are read in one pass; each path is decoded once however many
//! roles it has. (The second part of the file is its tests.)

use crate::aggregate::{AggFunc, Input};
use crate::columns::{convert, Converted, OwnedTyped, Repr};
use crate::config::{EngineConfig, MAX_AGGREGATES};
use crate::decode::{
    json_number, json_string, parse_f64, parse_i64, DecodeError, Field, FieldPath, Fields, Kind,
};
use crate::filter::Filter;
use crate::format::{Envelope, Format, RecordDecoder, Schemas};
use crate::hll::hash64;
use crate::time::{
    epoch_ms, iso8601_ms, TimeError, TimeFormat, Zone, MAX_EVENT_TIME_MS, MIN_EVENT_TIME_MS,
};

/// What a field is to the job (for dead-letter reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Key,
    Time,
    Value,
}

impl Role {
    fn shown(self) -> &'static str {
        match self {
            Role::Key => "key",
            Role::Time => "event time",
            Role::Value => "value",
        }
    }
}

/// Why a message is a dead letter. Cheap to build; the text is only made for dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reject {
    Syntax(DecodeError),
    Missing(Role, usize),
    Null(Role, usize),
    WrongType(Role, usize, &'static str),
    OutOfRange(Role, usize),
    Duplicate(Role, usize),
    /// No key field, and the Kafka message key is not UTF-8.
    KeyNotUtf8,
    /// An ISO time that is not a date-time (what is wrong).
    BadTime(usize, &'static str),
    /// An ISO time without an offset, and no zone to assume.
    NoZone(usize),
    /// The job reads the Kafka record's timestamp and the record has none.
    NoKafkaTimestamp,
    /// The event time is further ahead of the wall clock than `max_future_ms`.
    TooFarAhead,
    /// A typed column's value does not convert to its type: the reason's place among its
    /// chunk's reasons (they name the field, the type, the value and DuckDB's message).
    Unconverted(u32),
}

/// The fields a job reads and what each is for.
#[derive(Debug, Clone)]
pub(crate) struct FieldPlan {
    paths: Vec<FieldPath>,
    /// The time field's path (None: the Kafka record's timestamp is the time).
    time: Option<usize>,
    /// The paths tried in order when the time field is missing (`time_field_alternatives`).
    time_else: Vec<usize>,
    format: TimeFormat,
    zone: Option<Zone>,
    numeric_strings: bool,
    max_future_ms: Option<i64>,
    keys: Vec<usize>,
    /// The default single key, which falls back to the Kafka message key when absent and is
    /// a string or a number (never a boolean), as in version 0.1.
    default_key: bool,
    /// Per aggregate, how its input is read.
    inputs: Vec<AggInput>,
    /// How messages are encoded, and the schemas of binary ones.
    encoding: Format,
    envelope: Envelope,
    schemas: Schemas,
    /// The typed columns (`columns`), in order.
    typed: Vec<TypedInput>,
    /// Per key column: the typed column it is read as, if any.
    key_typed: Vec<Option<usize>>,
    /// A NULL typed key is a key of its own ([`NULL_KEY`]), not a dead letter.
    null_keys: bool,
    /// Aggregates that take their input from a typed column's converted value (a job written
    /// as SQL: `sum(amount)` sums the DOUBLE DuckDB's conversion gives), with that column.
    typed_inputs: Vec<(usize, usize)>,
}

/// How a typed column is read.
#[derive(Debug, Clone)]
pub(crate) struct TypedInput {
    pub path: usize,
    pub repr: Repr,
    pub sql_type: String,
    /// A missing or null value falls back to the Kafka message key.
    pub message_key: bool,
}

/// The path of a typed column that is not read (its value is NULL).
const NOT_READ: usize = usize::MAX;

/// The aggregates of most jobs fit in this many inputs.
const FEW_INPUTS: usize = 8;

/// Runs `f` over `n` fresh inputs on the stack. They are made anew for every event, so the
/// array is only as large as the common case needs (a 32-input array cost a copy per event).
#[inline(always)]
pub(crate) fn with_inputs<'a, R>(n: usize, f: impl FnOnce(&mut [Input<'a>]) -> R) -> R {
    if n <= FEW_INPUTS {
        let mut few = [Input::Skip; FEW_INPUTS];
        f(&mut few[..n])
    } else {
        let mut all = [Input::Skip; MAX_AGGREGATES];
        f(&mut all[..n.min(MAX_AGGREGATES)])
    }
}

/// How one aggregate reads its input.
#[derive(Debug, Clone)]
struct AggInput {
    func: AggFunc,
    /// The input path (None for count(*)).
    path: Option<usize>,
    /// An earlier aggregate that reads the same path the same way, unfiltered: its input is
    /// copied, not read again (sum, min and max of one field parse the number once).
    same: Option<usize>,
    /// arg_max/arg_min: the path of the value compared.
    by: Option<usize>,
    filter: Option<Filter>,
}

/// How an aggregate reads its input (aggregates that read a path the same way share it).
fn input_class(f: AggFunc) -> u8 {
    match f {
        AggFunc::Sum | AggFunc::Avg | AggFunc::Min | AggFunc::Max | AggFunc::ApproxQuantile => 0,
        AggFunc::ApproxCountDistinct => 1,
        AggFunc::First | AggFunc::Last => 2,
        AggFunc::Count | AggFunc::CountStar => 3,
        AggFunc::ArgMax | AggFunc::ArgMin => 4,
        AggFunc::Duck => 5,
    }
}

/// The typed column each aggregate reads the converted value of (a job written as SQL), by its
/// place among the job's typed columns. A job of several statements: each statement's own
/// aggregates, after one another, each reading its statement's column (two typed columns may
/// read one field).
fn typed_input_columns(cfg: &EngineConfig) -> Vec<Option<usize>> {
    let of = |l: &EngineConfig, a: &crate::aggregate::AggSpec| {
        let p = a
            .path
            .as_ref()
            .filter(|_| l.typed_inputs && a.filter.is_none() && a.by.is_none())?;
        let col = l.columns.iter().find(|c| c.path == *p)?;
        cfg.columns.iter().position(|c| c.name == col.name)
    };
    if cfg.layers.is_empty() {
        return cfg.aggregates.iter().map(|a| of(cfg, a)).collect();
    }
    cfg.layers
        .iter()
        .flat_map(|l| l.aggregates.iter().map(move |a| of(l, a)))
        .collect()
}

impl FieldPlan {
    pub fn new(cfg: &EngineConfig) -> FieldPlan {
        let mut paths: Vec<FieldPath> = Vec::new();
        let mut index = |p: &FieldPath| match paths.iter().position(|q| q == p) {
            Some(i) => i,
            None => {
                paths.push(p.clone());
                paths.len() - 1
            }
        };
        let time = (!cfg.kafka_timestamp).then(|| index(&cfg.time_field));
        let time_else = if cfg.kafka_timestamp {
            Vec::new()
        } else {
            cfg.time_field_alternatives.iter().map(&mut index).collect()
        };
        let keys = cfg.keys.iter().map(|k| index(&k.path)).collect();
        // A column no aggregate reads is converted only to find the values that do not convert:
        // JSON's every value converts to VARCHAR or JSON, so such a column is not even read.
        let never_fails = |c: &crate::columns::TypedColumn| {
            cfg.unstaged.contains(&c.name)
                && cfg.format == Format::Json
                && matches!(c.repr, Repr::Text | Repr::Json { any: true })
        };
        let typed: Vec<TypedInput> = cfg
            .columns
            .iter()
            .map(|c| TypedInput {
                path: if never_fails(c) {
                    NOT_READ
                } else {
                    index(&c.path)
                },
                repr: c.repr,
                sql_type: c.sql_type.clone(),
                message_key: c.message_key,
            })
            .collect();
        let key_typed = cfg
            .keys
            .iter()
            .map(|k| cfg.columns.iter().position(|c| c.path == k.path))
            .collect();
        let mut inputs: Vec<AggInput> = Vec::new();
        let mut typed_inputs = Vec::new();
        let typed_cols = typed_input_columns(cfg);
        for (k, a) in cfg.aggregates.iter().enumerate() {
            let typed_col = typed_cols.get(k).copied().flatten();
            if let Some(j) = typed_col {
                typed_inputs.push((k, j));
                inputs.push(AggInput {
                    func: a.func,
                    path: None,
                    same: None,
                    by: None,
                    filter: None,
                });
                continue;
            }
            let path = a.path.as_ref().map(&mut index);
            let by = a.by.as_ref().map(&mut index);
            let filter = a.filter.clone().map(|mut f| {
                f.bind(&mut index);
                f
            });
            let plain = filter.is_none() && by.is_none();
            let same = path.filter(|_| plain).and_then(|p| {
                inputs.iter().position(|b| {
                    b.path == Some(p)
                        && b.filter.is_none()
                        && b.by.is_none()
                        && input_class(b.func) == input_class(a.func)
                })
            });
            inputs.push(AggInput {
                func: a.func,
                path,
                same,
                by,
                filter,
            });
        }
        FieldPlan {
            paths,
            time,
            time_else,
            format: cfg.time_format,
            zone: cfg.time_zone.clone(),
            numeric_strings: cfg.numeric_strings,
            max_future_ms: cfg.max_future_ms,
            keys,
            default_key: cfg.default_key,
            inputs,
            encoding: cfg.format.clone(),
            envelope: cfg.envelope,
            schemas: cfg.schemas.clone(),
            typed,
            key_typed,
            typed_inputs,
            null_keys: cfg.null_keys,
        }
    }

    /// The aggregates whose input is a typed column's converted value: (aggregate, column).
    pub(crate) fn typed_inputs(&self) -> &[(usize, usize)] {
        &self.typed_inputs
    }

    /// Aggregate `k`'s input from a typed value (see [`FieldPlan::typed_inputs`]): a count
    /// counts it when it is not NULL, the others take its number.
    #[inline]
    pub(crate) fn typed_input(&self, k: usize, v: &OwnedTyped) -> Input<'static> {
        let count = matches!(self.inputs.get(k).map(|a| a.func), Some(AggFunc::Count));
        match v {
            OwnedTyped::Null | OwnedTyped::Pending => Input::Skip,
            _ if count => Input::Present,
            OwnedTyped::Double(x) => Input::Num(*x),
            OwnedTyped::Int(x) => Input::Num(*x as f64),
            _ => Input::Skip,
        }
    }

    /// The typed columns, in order.
    pub(crate) fn typed(&self) -> &[TypedInput] {
        &self.typed
    }

    /// Typed column `j` of a message, converted where that is certain (see `columns`).
    #[inline]
    pub(crate) fn convert<'a>(&self, f: &Fields<'a>, j: usize) -> Result<Converted<'a>, Reject> {
        let t = &self.typed[j];
        let v = f.get(t.path);
        if v.duplicate {
            return Err(Reject::Duplicate(Role::Value, t.path));
        }
        Ok(convert(t.repr, &v))
    }

    /// Typed column `j`'s value in a binary message (Avro, Protobuf) rendered as JSON: for a
    /// record, map or array, which the decoder reads without text.
    pub(crate) fn binary_field_json(&self, raw: &[u8], schema: Option<u32>, j: usize) -> String {
        let rendered = crate::format::record_json(&self.schemas, raw, schema);
        let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&rendered) else {
            return "null".into();
        };
        if let Some(p) = self.paths.get(self.typed[j].path) {
            for seg in p.segments() {
                let key = String::from_utf8_lossy(seg);
                v = v
                    .get(key.as_ref())
                    .cloned()
                    .unwrap_or(serde_json::Value::Null);
            }
        }
        v.to_string()
    }

    /// A binary message key as JSON: a record of the registry's wire format (an Avro or
    /// Protobuf key) whose schema the source looked up; None for other bytes.
    pub(crate) fn message_key_json(&self, key: &[u8]) -> Option<String> {
        let json = crate::format::record_json(&self.schemas, key, None);
        (json != "null").then_some(json)
    }

    /// The name of typed column `j`'s field.
    pub(crate) fn typed_path(&self, j: usize) -> &str {
        self.paths
            .get(self.typed[j].path)
            .map_or("?", |p| p.as_str())
    }

    #[cfg(test)]
    pub fn paths(&self) -> &[FieldPath] {
        &self.paths
    }

    /// A decoder of this job's messages for its paths.
    pub fn decoder(&self) -> RecordDecoder {
        RecordDecoder::new(self.paths.clone(), &self.encoding, &self.schemas)
            .numbers_only(self.numeric_only())
            .envelope(self.envelope)
    }

    /// The paths only numeric aggregates read: a binary format's floats need no text there.
    fn numeric_only(&self) -> u64 {
        let mut numeric = 0u64;
        let mut other = 0u64;
        for a in &self.inputs {
            if let Some(i) = a.path.filter(|&i| i < 64) {
                if a.func.numeric() {
                    numeric |= 1 << i;
                } else {
                    other |= 1 << i;
                }
            }
            if let Some(i) = a.by.filter(|&i| i < 64) {
                numeric |= 1 << i;
            }
            for p in a.filter.iter().flat_map(|f| f.paths()) {
                if let Some(i) = self.paths.iter().position(|q| *q == p).filter(|&i| i < 64) {
                    other |= 1 << i;
                }
            }
        }
        let typed = self.typed.iter().map(|t| &t.path);
        let time = self.time.iter().chain(&self.time_else);
        for &i in self.keys.iter().chain(time).chain(typed) {
            if i < 64 {
                other |= 1 << i;
            }
        }
        numeric & !other
    }

    /// The dead-letter reason for a rejection.
    pub fn describe(&self, r: Reject) -> String {
        let name = |i: usize| self.paths.get(i).map_or("?", |p| p.as_str());
        match r {
            Reject::Syntax(e) => e.describe(),
            Reject::Missing(Role::Time, _) if !self.time_else.is_empty() => {
                let tried = std::iter::once(self.time)
                    .flatten()
                    .chain(self.time_else.iter().copied())
                    .map(|i| format!("'{}'", name(i)))
                    .collect::<Vec<_>>();
                format!("missing event time field: none of {}", tried.join(", "))
            }
            Reject::Missing(role, i) => format!("missing {} field '{}'", role.shown(), name(i)),
            Reject::Null(role, i) => format!("{} field '{}' is null", role.shown(), name(i)),
            Reject::WrongType(role, i, why) => {
                format!("{} field '{}' {}", role.shown(), name(i), why)
            }
            Reject::OutOfRange(Role::Time, i) if self.format == TimeFormat::EpochMsInteger => format!(
                "event time field '{}' is out of range (must be epoch milliseconds between {} and {})",
                name(i),
                MIN_EVENT_TIME_MS,
                MAX_EVENT_TIME_MS
            ),
            Reject::OutOfRange(Role::Time, i) => format!(
                "event time field '{}' is out of range (must be between years 1 and 9999 as {})",
                name(i),
                self.format.expected()
            ),
            Reject::OutOfRange(role, i) => format!(
                "{} field '{}' is out of range (not a finite double)",
                role.shown(),
                name(i)
            ),
            Reject::Duplicate(role, i) => format!(
                "{} field '{}' appears more than once",
                role.shown(),
                name(i)
            ),
            Reject::KeyNotUtf8 => {
                "missing key: no key field and the message key is not valid UTF-8".to_string()
            }
            Reject::BadTime(i, why) => format!(
                "event time field '{}' is not {} ({why})",
                name(i),
                self.format.expected()
            ),
            Reject::NoZone(i) => format!(
                "event time field '{}' has no time zone (no Z or offset such as +01:00); name the zone to assume with time_zone := 'UTC' or an IANA name",
                name(i)
            ),
            Reject::NoKafkaTimestamp => {
                "the Kafka record has no timestamp (kafka_timestamp := true reads it as the event time)"
                    .to_string()
            }
            Reject::TooFarAhead => match self.max_future_ms {
                Some(m) => format!(
                    "event time is more than max_future_ms ({m} ms) ahead of the wall clock"
                ),
                None => "event time is too far ahead of the wall clock".to_string(),
            },
            // (Its text is its chunk's; see `Chunk::reason`.)
            Reject::Unconverted(_) => "a value does not convert to its column's type".into(),
        }
    }

    /// Why typed column `j`'s value does not convert (`json`: the value, `why`: DuckDB's
    /// message, or what is wrong with it).
    pub(crate) fn unconverted(&self, j: usize, json: &str, why: &str) -> String {
        const SHOWN: usize = 200;
        let shown = match json.char_indices().nth(SHOWN) {
            Some((at, _)) => format!("{}...", &json[..at]),
            None => json.to_string(),
        };
        format!(
            "field '{}' does not convert to {}: {shown} ({why})",
            self.typed_path(j),
            self.typed[j].sql_type
        )
    }

    /// The event time, epoch milliseconds (`record_ms`: the Kafka record's timestamp).
    #[inline]
    pub fn time(&self, f: &Fields<'_>, record_ms: Option<i64>) -> Result<i64, Reject> {
        let Some(mut i) = self.time else {
            return match record_ms {
                Some(t) if (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&t) => Ok(t),
                _ => Err(Reject::NoKafkaTimestamp),
            };
        };
        let mut v = f.get(i);
        if v.kind == Kind::Missing {
            if let Some(&j) = self
                .time_else
                .iter()
                .find(|&&j| f.get(j).kind != Kind::Missing)
            {
                i = j;
                v = f.get(j);
            }
        }
        if v.duplicate {
            return Err(Reject::Duplicate(Role::Time, i));
        }
        let wrong = |why| Err(Reject::WrongType(Role::Time, i, why));
        let from = |r: Result<i64, TimeError>| {
            r.map_err(|e| match e {
                TimeError::OutOfRange => Reject::OutOfRange(Role::Time, i),
                TimeError::BadIso(why) => Reject::BadTime(i, why),
                TimeError::NoZone => Reject::NoZone(i),
            })
        };
        if v.timestamp {
            // An Avro or Protobuf timestamp type: epoch milliseconds whatever time_format says.
            return match parse_i64(v.bytes) {
                Some(t) if (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&t) => Ok(t),
                _ => Err(Reject::OutOfRange(Role::Time, i)),
            };
        }
        match (v.kind, self.format) {
            (Kind::Missing, _) => Err(Reject::Missing(Role::Time, i)),
            (Kind::Null, _) => Err(Reject::Null(Role::Time, i)),
            (Kind::Number, TimeFormat::EpochMsInteger) if !v.integer => {
                wrong("is not an integer (epoch milliseconds)")
            }
            (Kind::Number, TimeFormat::EpochMsInteger) => {
                let t = parse_i64(v.bytes).ok_or(Reject::OutOfRange(Role::Time, i))?;
                if (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&t) {
                    Ok(t)
                } else {
                    Err(Reject::OutOfRange(Role::Time, i))
                }
            }
            (Kind::String, TimeFormat::EpochMsInteger) => wrong("is a string, not an integer"),
            (Kind::Number, TimeFormat::Iso8601) => {
                wrong("is a number, not an ISO 8601 date-time string")
            }
            (Kind::String, TimeFormat::Iso8601) => from(iso8601_ms(v.bytes, self.zone.as_ref())),
            (Kind::Number, format) => from(epoch_ms(v.bytes, format)),
            (Kind::String, _) => wrong("is a string, not a number"),
            (Kind::Bool, _) => wrong("is a boolean"),
            (Kind::Object, _) => wrong("is an object"),
            (Kind::Array, _) => wrong("is an array"),
            (Kind::Bytes, _) => wrong("is binary data"),
        }
    }

    /// The key, encoded into `out` (see [`key_parts`]); `message_key` is the Kafka key;
    /// `typed`: the message's typed columns as converted (their texts in `texts`). Returns
    /// whether the key is complete: a typed key part that waits for DuckDB's answer is not.
    #[inline]
    pub(crate) fn key(
        &self,
        f: &Fields<'_>,
        message_key: Option<&[u8]>,
        (typed, texts): (&[OwnedTyped], &[u8]),
        out: &mut Vec<u8>,
    ) -> Result<bool, Reject> {
        out.clear();
        let single = self.keys.len() == 1;
        for (k, &i) in self.keys.iter().enumerate() {
            let v = f.get(i);
            if v.duplicate {
                return Err(Reject::Duplicate(Role::Key, i));
            }
            if let Some(j) = self.key_typed.get(k).copied().flatten() {
                let owned;
                let text: &[u8] = match typed.get(j).copied().unwrap_or(OwnedTyped::Null) {
                    // A job written as SQL groups NULL keys as SQL does.
                    OwnedTyped::Null if self.null_keys => &NULL_KEY,
                    OwnedTyped::Null if v.kind == Kind::Missing => {
                        return Err(Reject::Missing(Role::Key, i))
                    }
                    OwnedTyped::Null => return Err(Reject::Null(Role::Key, i)),
                    OwnedTyped::Pending => return Ok(false),
                    OwnedTyped::Text(a, b) => texts.get(a as usize..b as usize).unwrap_or(&[]),
                    other => {
                        owned = other.key_text();
                        owned.as_bytes()
                    }
                };
                if !single {
                    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
                }
                out.extend_from_slice(text);
                continue;
            }
            let text: &[u8] = match v.kind {
                Kind::String | Kind::Number => v.bytes,
                Kind::Bool if !self.default_key => v.bytes,
                Kind::Missing if self.default_key => match message_key {
                    Some(k) if std::str::from_utf8(k).is_ok() => k,
                    Some(_) => return Err(Reject::KeyNotUtf8),
                    None => return Err(Reject::Missing(Role::Key, i)),
                },
                Kind::Missing => return Err(Reject::Missing(Role::Key, i)),
                Kind::Null => return Err(Reject::Null(Role::Key, i)),
                other => return Err(Reject::WrongType(Role::Key, i, wrong_kind(other))),
            };
            if !single {
                out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            }
            out.extend_from_slice(text);
        }
        Ok(true)
    }

    /// Each aggregate's input, checked, into `out` (a value of the wrong type rejects the
    /// message before any window sees it).
    #[inline]
    pub(crate) fn inputs<'a>(&self, f: &Fields<'a>, out: &mut [Input<'a>]) -> Result<(), Reject> {
        for k in 0..self.inputs.len().min(out.len()) {
            let a = &self.inputs[k];
            if let Some(filter) = &a.filter {
                // An event the filter leaves out is not read for this aggregate at all.
                if !filter.passes(f, self.numeric_strings) {
                    out[k] = Input::Skip;
                    continue;
                }
            }
            let Some(i) = a.path else {
                out[k] = Input::Present;
                continue;
            };
            if let Some(j) = a.same {
                out[k] = out[j];
                continue;
            }
            let v = f.get(i);
            if v.duplicate {
                return Err(Reject::Duplicate(Role::Value, i));
            }
            out[k] = match a.by {
                None => input(a.func, i, &v, self.numeric_strings)?,
                Some(b) => {
                    let y = f.get(b);
                    if y.duplicate {
                        return Err(Reject::Duplicate(Role::Value, b));
                    }
                    // Rows where x or y is NULL are skipped, as DuckDB's arg_max skips them.
                    match (
                        input(AggFunc::First, i, &v, false)?,
                        input(AggFunc::Max, b, &y, self.numeric_strings)?,
                    ) {
                        (Input::Text(x), Input::Num(by)) => Input::Arg(by, x),
                        _ => Input::Skip,
                    }
                }
            };
        }
        Ok(())
    }
}

fn wrong_kind(k: Kind) -> &'static str {
    match k {
        Kind::Bool => "is a boolean",
        Kind::Object => "is an object",
        Kind::Array => "is an array",
        Kind::String => "is a string, not a number",
        _ => "has the wrong type",
    }
}

#[inline]
fn input<'a>(
    func: AggFunc,
    i: usize,
    v: &Field<'a>,
    numeric_strings: bool,
) -> Result<Input<'a>, Reject> {
    if matches!(v.kind, Kind::Missing | Kind::Null) {
        return Ok(Input::Skip);
    }
    if func.numeric() {
        let number = |bytes: &[u8]| {
            let x =
                parse_f64(bytes).ok_or(Reject::Syntax(DecodeError::NotJson("invalid number")))?;
            if x.is_finite() {
                Ok(Input::Num(x))
            } else {
                Err(Reject::OutOfRange(Role::Value, i))
            }
        };
        return match v.kind {
            Kind::Number => match v.number {
                Some(x) if x.is_finite() => Ok(Input::Num(x)),
                Some(_) => Err(Reject::OutOfRange(Role::Value, i)),
                None => number(v.bytes),
            },
            Kind::String if numeric_strings && json_number(v.bytes) => number(v.bytes),
            Kind::String if numeric_strings => Err(Reject::WrongType(
                Role::Value,
                i,
                "is a string that is not a decimal number",
            )),
            other => Err(Reject::WrongType(Role::Value, i, wrong_kind(other))),
        };
    }
    Ok(match func {
        AggFunc::ApproxCountDistinct => Input::Hash(hash64(v.bytes)),
        AggFunc::First | AggFunc::Last => {
            Input::Text(v.text().ok_or(Reject::Syntax(DecodeError::InvalidUtf8))?)
        }
        _ => Input::Present,
    })
}

/// The key columns' values of an encoded key (`n` columns).
pub(crate) fn key_parts(key: &[u8], n: usize) -> impl Iterator<Item = Option<&str>> {
    let mut rest = key;
    let mut left = n;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        left -= 1;
        let part = if n == 1 {
            std::mem::take(&mut rest)
        } else {
            let len = rest
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .min(rest.len().saturating_sub(4));
            let p = &rest[4.min(rest.len())..4.min(rest.len()) + len];
            rest = &rest[(4 + len).min(rest.len())..];
            p
        };
        Some((part != NULL_KEY).then(|| std::str::from_utf8(part).unwrap_or_default()))
    })
}

/// A NULL key part: one byte no key's UTF-8 text can be.
pub(crate) const NULL_KEY: [u8; 1] = [0xFF];

/// Appends a typed value as a part of a key of `parts` parts, in the form [`FieldPlan::key`]
/// gives a typed key of a job written as SQL (NULL is [`NULL_KEY`]).
pub(crate) fn push_typed_key(v: OwnedTyped, texts: &[u8], parts: usize, out: &mut Vec<u8>) {
    let owned;
    let text: &[u8] = match v {
        OwnedTyped::Null | OwnedTyped::Pending => &NULL_KEY,
        OwnedTyped::Text(a, b) => texts.get(a as usize..b as usize).unwrap_or(&[]),
        other => {
            owned = other.key_text();
            owned.as_bytes()
        }
    };
    if parts != 1 {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(text);
}

/// The `key` column of a late event: the key itself for one key column, a JSON array of the
/// values for several, NULL for none.
pub(crate) fn late_key(key: &[u8], n: usize, out: &mut String) -> bool {
    out.clear();
    match n {
        0 => false,
        1 if key == NULL_KEY => false,
        1 => {
            out.push_str(std::str::from_utf8(key).unwrap_or_default());
            true
        }
        _ => {
            out.push('[');
            for (i, part) in key_parts(key, n).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match part {
                    Some(p) => json_string(p, out),
                    None => out.push_str("null"),
                }
            }
            out.push(']');
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyColumn;
    use crate::decode::Decoder;

    fn config() -> EngineConfig {
        EngineConfig::for_tests(1000, 0)
    }

    fn plan() -> FieldPlan {
        FieldPlan::new(&config())
    }

    /// (key, time, value) or the dead-letter reason.
    fn read(line: &[u8]) -> Result<(String, i64, Option<f64>), String> {
        let plan = plan();
        let mut d = Decoder::new(plan.paths().to_vec());
        let f = d
            .decode(line)
            .map_err(|e| plan.describe(Reject::Syntax(e)))?;
        let t = plan.time(&f, None).map_err(|e| plan.describe(e))?;
        let mut key = Vec::new();
        plan.key(&f, None, (&[], &[]), &mut key)
            .map_err(|e| plan.describe(e))?;
        let mut inputs = [Input::Skip; 4];
        plan.inputs(&f, &mut inputs).map_err(|e| plan.describe(e))?;
        let v = match inputs[1] {
            Input::Num(x) => Some(x),
            _ => None,
        };
        Ok((String::from_utf8(key).unwrap(), t, v))
    }

    fn err(line: &[u8]) -> String {
        read(line).unwrap_err()
    }

    #[test]
    fn reads_the_predecessor_format() {
        assert_eq!(
            read(br#"{"key":"k1","event_time_ms":1700000000123,"payload":{"value":42.5}}"#),
            Ok(("k1".into(), 1_700_000_000_123, Some(42.5)))
        );
    }

    #[test]
    fn fields_in_any_order_with_other_members_and_whitespace() {
        assert_eq!(
            read(b" { \"x\": [1, {\"key\": \"no\"}], \"payload\" : {\"a\":null, \"value\" : -1e2 } ,\r\n \"event_time_ms\" : -5, \"key\" : \"a\\\"b\" } "),
            Ok(("a\"b".into(), -5, Some(-100.0)))
        );
    }

    #[test]
    fn missing_or_null_value_is_not_an_error() {
        assert_eq!(read(br#"{"key":"a","event_time_ms":1}"#).unwrap().2, None);
        assert_eq!(
            read(br#"{"key":"a","event_time_ms":1,"payload":{"value":null}}"#)
                .unwrap()
                .2,
            None
        );
        assert_eq!(
            read(br#"{"key":"a","event_time_ms":1,"payload":7}"#)
                .unwrap()
                .2,
            None
        );
    }

    #[test]
    fn numeric_keys_keep_their_text_and_escapes_are_undone() {
        assert_eq!(read(br#"{"key":42,"event_time_ms":1}"#).unwrap().0, "42");
        assert_eq!(
            read(br#"{"key":"\u00e9\ud83d\ude00","event_time_ms":1}"#)
                .unwrap()
                .0,
            "é😀"
        );
        assert_eq!(
            read(br#"{"k\u0065y":"x","event_time_ms":1}"#).unwrap().0,
            "x"
        );
    }

    #[test]
    fn rejections_name_the_reason_and_field() {
        assert_eq!(err(b""), "empty message");
        assert_eq!(err(b"   "), "empty message");
        assert_eq!(err(b"not json"), "not JSON: expected a value");
        assert_eq!(err(b"[1,2]"), "not a JSON object");
        assert_eq!(
            err(b"{\"key\":\"a\""),
            "not JSON: unexpected end of message"
        );
        assert_eq!(
            err(b"{\"key\":\"a\",\"event_time_ms\":1} x"),
            "not JSON: unexpected characters after the JSON object"
        );
        assert_eq!(
            err(b"{\"key\":\"\xff\",\"event_time_ms\":1}"),
            "not JSON: invalid UTF-8"
        );
        assert_eq!(
            err(br#"{"key":"a"}"#),
            "missing event time field 'event_time_ms'"
        );
        assert_eq!(err(br#"{"event_time_ms":1}"#), "missing key field 'key'");
        assert_eq!(
            err(br#"{"key":null,"event_time_ms":1}"#),
            "key field 'key' is null"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":"1"}"#),
            "event time field 'event_time_ms' is a string, not an integer"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1.5}"#),
            "event time field 'event_time_ms' is not an integer (epoch milliseconds)"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1e3}"#),
            "event time field 'event_time_ms' is not an integer (epoch milliseconds)"
        );
        assert!(err(br#"{"key":"a","event_time_ms":99999999999999999999}"#)
            .starts_with("event time field 'event_time_ms' is out of range"));
        assert!(err(br#"{"key":"a","event_time_ms":253402300800000}"#).contains("out of range"));
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1,"payload":{"value":"x"}}"#),
            "value field 'payload.value' is a string, not a number"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1,"payload":{"value":true}}"#),
            "value field 'payload.value' is a boolean"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1,"payload":{"value":1e999}}"#),
            "value field 'payload.value' is out of range (not a finite double)"
        );
        assert_eq!(
            err(br#"{"key":{"a":1},"event_time_ms":1}"#),
            "key field 'key' is an object"
        );
        assert_eq!(
            err(br#"{"key":true,"event_time_ms":1}"#),
            "key field 'key' is a boolean"
        );
        assert_eq!(
            err(br#"{"key":"a","key":"b","event_time_ms":1}"#),
            "key field 'key' appears more than once"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":NaN}"#),
            "not JSON: expected a value"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":01}"#),
            "not JSON: expected ',' or '}' in an object"
        );
        assert_eq!(
            err(b"{\"key\":\"a\tb\",\"event_time_ms\":1}"),
            "not JSON: unescaped control character in a string"
        );
    }

    #[test]
    fn composite_keys_and_late_key_text() {
        let p = |s: &str| FieldPath::parse(s).unwrap();
        let mut cfg = config();
        cfg.time_field = p("ts");
        cfg.keys = ["region", "item.sku", "vip"]
            .iter()
            .map(|k| KeyColumn {
                path: p(k),
                name: k.to_string(),
            })
            .collect();
        cfg.default_key = false;
        cfg.aggregates = vec![];
        let plan = FieldPlan::new(&cfg);
        let mut d = Decoder::new(plan.paths().to_vec());
        let f = d
            .decode(br#"{"ts":1,"region":"eu","item":{"sku":"A\"1"},"vip":true}"#)
            .unwrap();
        let mut key = Vec::new();
        plan.key(&f, None, (&[], &[]), &mut key).unwrap();
        assert_eq!(
            key_parts(&key, 3)
                .map(Option::unwrap_or_default)
                .collect::<Vec<_>>(),
            vec!["eu", "A\"1", "true"]
        );
        let mut late = String::new();
        assert!(late_key(&key, 3, &mut late));
        assert_eq!(late, r#"["eu","A\"1","true"]"#);
        let f = d.decode(br#"{"ts":1,"region":"eu","vip":1}"#).unwrap();
        assert_eq!(
            plan.describe(plan.key(&f, None, (&[], &[]), &mut key).unwrap_err()),
            "missing key field 'item.sku'"
        );
        assert!(!late_key(b"", 0, &mut late));
    }

    fn time_with(cfg: &EngineConfig, line: &str) -> Result<i64, String> {
        let plan = FieldPlan::new(cfg);
        let mut d = Decoder::new(plan.paths().to_vec());
        let f = d.decode(line.as_bytes()).unwrap();
        plan.time(&f, Some(7)).map_err(|e| plan.describe(e))
    }

    /// Listed time fields: the first one an event has is its time; a present but null one is
    /// not skipped; an event with none names them all.
    #[test]
    fn the_first_listed_time_field_present_is_the_time() {
        let p = |s: &str| FieldPath::parse(s).unwrap();
        let mut cfg = config();
        cfg.time_field = p("Person.date_time");
        cfg.time_field_alternatives = vec![p("Auction.date_time"), p("Bid.date_time")];
        assert_eq!(
            cfg.time_fields_text(),
            "Person.date_time, Auction.date_time, Bid.date_time"
        );
        assert_eq!(time_with(&cfg, r#"{"Person":{"date_time":5}}"#), Ok(5));
        assert_eq!(time_with(&cfg, r#"{"Bid":{"date_time":9}}"#), Ok(9));
        assert_eq!(
            time_with(&cfg, r#"{"Auction":{"date_time":7},"Bid":{"date_time":9}}"#),
            Ok(7)
        );
        assert_eq!(
            time_with(
                &cfg,
                r#"{"Auction":{"date_time":null},"Bid":{"date_time":9}}"#
            ),
            Err("event time field 'Auction.date_time' is null".into())
        );
        assert_eq!(
            time_with(&cfg, r#"{"Unknown":{"date_time":1}}"#),
            Err("missing event time field: none of 'Person.date_time', 'Auction.date_time', 'Bid.date_time'".into())
        );
    }

    #[test]
    fn time_formats_and_their_reasons() {
        let mut cfg = config();
        cfg.time_format = TimeFormat::EpochS;
        assert_eq!(time_with(&cfg, r#"{"event_time_ms":1.5}"#), Ok(1500));
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":"1"}"#),
            Err("event time field 'event_time_ms' is a string, not a number".into())
        );
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":1e20}"#),
            Err("event time field 'event_time_ms' is out of range (must be between years 1 and 9999 as epoch seconds)".into())
        );
        cfg.time_format = TimeFormat::Iso8601;
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":"1970-01-01T00:00:01.5Z"}"#),
            Ok(1500)
        );
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":"1970-01-01T00:00:01"}"#),
            Err("event time field 'event_time_ms' has no time zone (no Z or offset such as +01:00); name the zone to assume with time_zone := 'UTC' or an IANA name".into())
        );
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":"yesterday"}"#),
            Err("event time field 'event_time_ms' is not an ISO 8601 date-time such as 2026-11-30T12:00:01.250Z (expected YYYY-MM-DD)".into())
        );
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":5}"#),
            Err(
                "event time field 'event_time_ms' is a number, not an ISO 8601 date-time string"
                    .into()
            )
        );
        cfg.time_zone = Some(Zone::utc());
        assert_eq!(
            time_with(&cfg, r#"{"event_time_ms":"1970-01-01T00:00:01"}"#),
            Ok(1000)
        );
        cfg.kafka_timestamp = true;
        assert_eq!(time_with(&cfg, r#"{"x":1}"#), Ok(7));
    }

    #[test]
    fn numeric_strings_only_when_asked() {
        let mut cfg = config();
        let value = |cfg: &EngineConfig, line: &str| -> Result<Option<f64>, String> {
            let plan = FieldPlan::new(cfg);
            let mut d = Decoder::new(plan.paths().to_vec());
            let f = d.decode(line.as_bytes()).unwrap();
            let mut inputs = [Input::Skip; 4];
            plan.inputs(&f, &mut inputs).map_err(|e| plan.describe(e))?;
            Ok(match inputs[1] {
                Input::Num(x) => Some(x),
                _ => None,
            })
        };
        let line = r#"{"payload":{"value":"19.90"}}"#;
        assert_eq!(
            value(&cfg, line),
            Err("value field 'payload.value' is a string, not a number".into())
        );
        cfg.numeric_strings = true;
        assert_eq!(value(&cfg, line), Ok(Some(19.9)));
        assert_eq!(
            value(&cfg, r#"{"payload":{"value":"-1e3"}}"#),
            Ok(Some(-1000.0))
        );
        for bad in ["19,90", " 1", "1.", "0x10", "NaN", ""] {
            assert_eq!(
                value(&cfg, &format!(r#"{{"payload":{{"value":"{bad}"}}}}"#)),
                Err("value field 'payload.value' is a string that is not a decimal number".into()),
                "{bad}"
            );
        }
    }
}
