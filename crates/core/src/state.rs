//! The checkpoint model: what a job must remember between cycles and runs (its settings, each
//! partition's next offset and event-time progress, the watermark floor, the open windows) and
//! the output of one cycle (a [`Batch`] of rows per output table), with the compact binary form
//! the output is stored in.

use std::collections::BTreeMap;

use crate::rows::{ColumnType, Rows, RowsError, TableSchema};

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

/// One partition's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: i32,
    /// What the partition is: the file's absolute path for the file source, empty for Kafka.
    pub name: String,
    /// A file's device and inode (it keeps its partition when renamed); empty for Kafka.
    pub identity: String,
    pub next_offset: i64,
    pub max_event_time_ms: Option<i64>,
    /// Wall clock (epoch ms) of the last delivery, or of when the job first saw the partition.
    pub last_delivery_ms: i64,
    /// The end offset the source last reported (file size, Kafka high watermark).
    pub end_offset: Option<i64>,
    /// '' (read), 'released' (rolling files: no longer holds the watermark back) or 'deleted'.
    pub status: String,
}

/// The shapes of a job's three output tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSchemas {
    pub windows: TableSchema,
    pub late: TableSchema,
    pub dead: TableSchema,
}

impl OutputSchemas {
    pub fn new(windows: TableSchema) -> OutputSchemas {
        OutputSchemas {
            windows,
            late: TableSchema::late_events(),
            dead: TableSchema::dead_letters(),
        }
    }

    pub fn tables(&self) -> [&TableSchema; 3] {
        [&self.windows, &self.late, &self.dead]
    }
}

/// The output of one checkpoint cycle, applied to DuckDB as one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub windows: Rows,
    pub late: Rows,
    pub dead: Rows,
}

impl Batch {
    pub fn new(schemas: &OutputSchemas) -> Batch {
        Batch {
            windows: Rows::new(schemas.windows.types()),
            late: Rows::new(schemas.late.types()),
            dead: Rows::new(schemas.dead.types()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.late.is_empty() && self.dead.is_empty()
    }

    pub fn clear(&mut self) {
        self.windows.clear();
        self.late.clear();
        self.dead.clear();
    }

    pub fn rows(&self) -> usize {
        self.windows.len() + self.late.len() + self.dead.len()
    }

    /// Reports a row written with the wrong shape (a bug).
    pub fn check(&self) -> Result<(), String> {
        self.windows.check()?;
        self.late.check()?;
        self.dead.check()
    }

    /// The stored form: the three tables' schemas and rows, so a batch can be applied again
    /// after a crash without the run's configuration.
    pub fn encode(&self, schemas: &OutputSchemas, out: &mut Vec<u8>) {
        out.push(FORMAT);
        for (schema, rows) in schemas.tables().into_iter().zip(self.tables()) {
            encode_schema(schema, out);
            rows.encode(out);
        }
    }

    fn tables(&self) -> [&Rows; 3] {
        [&self.windows, &self.late, &self.dead]
    }

    /// Decodes a stored batch. `legacy_topic` fills the topic column of batches stored by
    /// version 0.1, which kept it beside the batch.
    pub fn decode(data: &[u8], legacy_topic: &str) -> Result<(OutputSchemas, Batch), CodecError> {
        match data.first() {
            Some(&FORMAT) => {}
            Some(&1) => return legacy::decode_batch(data, legacy_topic),
            _ => return Err(CodecError("unknown format version")),
        }
        let mut at = 1;
        let mut next = || -> Result<(TableSchema, Rows), CodecError> {
            let schema = decode_schema(data, &mut at)?;
            let rows = Rows::decode(data, &mut at).map_err(CodecError::from)?;
            if rows.types() != schema.types().as_slice() {
                return Err(CodecError("rows do not match their table"));
            }
            Ok((schema, rows))
        };
        let (ws, w) = next()?;
        let (ls, l) = next()?;
        let (ds, d) = next()?;
        if at != data.len() {
            return Err(CodecError("trailing bytes"));
        }
        Ok((
            OutputSchemas {
                windows: ws,
                late: ls,
                dead: ds,
            },
            Batch {
                windows: w,
                late: l,
                dead: d,
            },
        ))
    }
}

/// Version of the binary forms, stored first so that a later version can read old checkpoints.
const FORMAT: u8 = 2;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("corrupt checkpoint data: {0}")]
pub struct CodecError(pub &'static str);

impl From<RowsError> for CodecError {
    fn from(_: RowsError) -> Self {
        CodecError("unreadable output rows")
    }
}

fn encode_schema(s: &TableSchema, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.u64(s.columns.len() as u64);
    for c in &s.columns {
        w.bytes(c.name.as_bytes());
        w.bytes(c.ty.sql().as_bytes());
    }
    w.u64(s.primary_key.len() as u64);
    for k in &s.primary_key {
        w.bytes(k.as_bytes());
    }
}

fn decode_schema(data: &[u8], at: &mut usize) -> Result<TableSchema, CodecError> {
    let mut r = Reader { b: data, i: *at };
    let n = r.count()?;
    let mut columns = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let name = r.string()?;
        let ty = match r.string()?.as_str() {
            "BOOLEAN" => ColumnType::Boolean,
            "INTEGER" => ColumnType::Integer,
            "BIGINT" => ColumnType::BigInt,
            "DOUBLE" => ColumnType::Double,
            "VARCHAR" => ColumnType::Varchar,
            "BLOB" => ColumnType::Blob,
            _ => return Err(CodecError("unknown column type")),
        };
        columns.push(crate::rows::Column { name, ty });
    }
    let k = r.count()?;
    let mut primary_key = Vec::with_capacity(k.min(1024));
    for _ in 0..k {
        primary_key.push(r.string()?);
    }
    *at = r.i;
    Ok(TableSchema {
        columns,
        primary_key,
    })
}

pub(crate) struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

pub(crate) struct Reader<'a> {
    pub b: &'a [u8],
    pub i: usize,
}

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .i
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(CodecError("truncated"))?;
        let s = &self.b[self.i..end];
        self.i = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    pub fn u64(&mut self) -> Result<u64, CodecError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    pub fn i64(&mut self) -> Result<i64, CodecError> {
        self.u64().map(|v| v as i64)
    }
    pub fn i32(&mut self) -> Result<i32, CodecError> {
        i32::try_from(self.i64()?).map_err(|_| CodecError("partition out of range"))
    }
    pub fn f64(&mut self) -> Result<f64, CodecError> {
        self.u64().map(f64::from_bits)
    }
    pub fn count(&mut self) -> Result<usize, CodecError> {
        let n = usize::try_from(self.u64()?).map_err(|_| CodecError("bad count"))?;
        // A count can never exceed the bytes left (every item takes at least one byte).
        if n > self.b.len().saturating_sub(self.i) {
            return Err(CodecError("bad count"));
        }
        Ok(n)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.count()?;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String, CodecError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| CodecError("invalid text"))
    }
    pub fn end(&self) -> Result<(), CodecError> {
        if self.i == self.b.len() {
            Ok(())
        } else {
            Err(CodecError("trailing bytes"))
        }
    }
}

/// What version 0.1 stored (format 1: fixed tables, tumbling windows only), still readable so a
/// job checkpointed by that version resumes after an upgrade.
pub(crate) mod legacy {
    use super::*;
    use crate::aggregate::{AggState, SumState};
    use crate::engine::EngineConfig;
    use crate::rows::Cell;
    use crate::window::PaneStore;

    /// Open windows: (start, key, count, values, sum, compensation, min, max) each.
    pub fn decode_windows(
        cfg: &EngineConfig,
        floor_ms: i64,
        data: &[u8],
    ) -> Result<PaneStore, CodecError> {
        let size = cfg.time.window_ms;
        let mut store = PaneStore::new(size, size, 1, floor_ms);
        let mut r = Reader { b: data, i: 0 };
        r.u8()?;
        for _ in 0..r.count()? {
            let start = r.i64()?;
            let key: Box<[u8]> = r.bytes()?.into();
            let (count, values) = (r.i64()?, r.i64()?);
            let (sum, comp, min, max) = (r.f64()?, r.f64()?, r.f64()?, r.f64()?);
            let has = values > 0;
            let states: Box<[AggState]> = Box::new([
                AggState::Count(count),
                AggState::Sum(SumState {
                    n: values,
                    sum,
                    comp,
                }),
                AggState::Min(has.then_some(min)),
                AggState::Max(has.then_some(max)),
            ]);
            store.insert_states(start, &key, states);
        }
        r.end()?;
        Ok(store)
    }

    /// The windows table of version 0.1 (the default job's).
    pub fn default_windows_schema() -> TableSchema {
        use ColumnType::*;
        TableSchema::new(
            &[
                ("window_start_ms", BigInt),
                ("window_end_ms", BigInt),
                ("key", Varchar),
                ("count", BigInt),
                ("sum_value", Double),
                ("min_value", Double),
                ("max_value", Double),
            ],
            &["key", "window_start_ms"],
        )
    }

    pub fn decode_batch(data: &[u8], topic: &str) -> Result<(OutputSchemas, Batch), CodecError> {
        let mut r = Reader { b: data, i: 1 };
        let schemas = OutputSchemas::new(default_windows_schema());
        let mut batch = Batch::new(&schemas);
        for _ in 0..r.count()? {
            let start = r.i64()?;
            let end = r.i64()?;
            let key = r.string()?;
            let (count, values) = (r.i64()?, r.i64()?);
            let (sum, comp, min, max) = (r.f64()?, r.f64()?, r.f64()?, r.f64()?);
            let has = values > 0;
            let sum = if sum.is_finite() { sum + comp } else { sum };
            batch.windows.push(&[
                Cell::I64(start),
                Cell::I64(end),
                Cell::Str(&key),
                Cell::I64(count),
                if has { Cell::F64(sum) } else { Cell::Null },
                if has { Cell::F64(min) } else { Cell::Null },
                if has { Cell::F64(max) } else { Cell::Null },
            ]);
        }
        for _ in 0..r.count()? {
            let key = r.string()?;
            let (t, ingest) = (r.i64()?, r.i64()?);
            let payload = r.string()?;
            let (ws, we, wm) = (r.i64()?, r.i64()?, r.i64()?);
            let (partition, offset) = (r.i32()?, r.i64()?);
            batch.late.push(&[
                Cell::Str(&key),
                Cell::I64(t),
                Cell::I64(ingest),
                Cell::Str(&payload),
                Cell::I64(ws),
                Cell::I64(we),
                Cell::I64(wm),
                Cell::Str(topic),
                Cell::I32(partition),
                Cell::I64(offset),
            ]);
        }
        for _ in 0..r.count()? {
            let (partition, offset, ingest) = (r.i32()?, r.i64()?, r.i64()?);
            let raw = r.bytes()?.to_vec();
            let error = r.string()?;
            batch.dead.push(&[
                Cell::Str(topic),
                Cell::I32(partition),
                Cell::I64(offset),
                Cell::I64(ingest),
                Cell::Bytes(&raw),
                Cell::Str(&error),
            ]);
        }
        r.end()?;
        Ok((schemas, batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{Cell, OwnedCell};

    fn schemas() -> OutputSchemas {
        OutputSchemas::new(legacy::default_windows_schema())
    }

    fn sample() -> Batch {
        let mut b = Batch::new(&schemas());
        b.windows.push(&[
            Cell::I64(-1000),
            Cell::I64(0),
            Cell::Str("k€"),
            Cell::I64(2),
            Cell::F64(1.25),
            Cell::F64(1.25),
            Cell::F64(1.25),
        ]);
        b.dead.push(&[
            Cell::Str("t"),
            Cell::I32(1),
            Cell::I64(0),
            Cell::I64(7),
            Cell::Bytes(&[0xff, 0, 1]),
            Cell::Str("not JSON"),
        ]);
        b
    }

    #[test]
    fn batches_round_trip_with_their_schemas() {
        let b = sample();
        let mut buf = Vec::new();
        b.encode(&schemas(), &mut buf);
        let (s, back) = Batch::decode(&buf, "t").unwrap();
        assert_eq!(s, schemas());
        assert_eq!(back, b);
    }

    #[test]
    fn corrupt_data_is_an_error_not_a_panic() {
        let mut buf = Vec::new();
        sample().encode(&schemas(), &mut buf);
        for cut in 0..buf.len() {
            assert!(Batch::decode(&buf[..cut], "t").is_err());
        }
        let mut bad = buf.clone();
        bad[0] = 9;
        assert_eq!(
            Batch::decode(&bad, "t"),
            Err(CodecError("unknown format version"))
        );
        let mut huge = vec![FORMAT];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Batch::decode(&huge, "t").is_err());
    }

    #[test]
    fn version_one_batches_are_still_read() {
        // One window, one late event and one dead letter as version 0.1 stored them.
        let mut v1 = vec![1u8];
        let mut w = Writer(&mut v1);
        w.u64(1);
        w.i64(0);
        w.i64(1000);
        w.bytes(b"a");
        w.i64(2);
        w.i64(1);
        w.f64(5.0);
        w.f64(0.0);
        w.f64(5.0);
        w.f64(5.0);
        w.u64(1);
        w.bytes(b"a");
        w.i64(10);
        w.i64(11);
        w.bytes(b"{}");
        w.i64(0);
        w.i64(1000);
        w.i64(2000);
        w.i64(3);
        w.i64(42);
        w.u64(1);
        w.i64(0);
        w.i64(7);
        w.i64(12);
        w.bytes(b"x");
        w.bytes(b"not JSON");
        let (_, b) = Batch::decode(&v1, "t").unwrap();
        assert_eq!(
            b.windows.to_vec()[0],
            vec![
                OwnedCell::I64(0),
                OwnedCell::I64(1000),
                OwnedCell::Str("a".into()),
                OwnedCell::I64(2),
                OwnedCell::F64(5.0),
                OwnedCell::F64(5.0),
                OwnedCell::F64(5.0)
            ]
        );
        assert_eq!(b.late.to_vec()[0][9], OwnedCell::I64(42));
        assert_eq!(b.dead.to_vec()[0][5], OwnedCell::Str("not JSON".into()));
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
}
