//! The checkpoint model: what a job must remember between cycles and runs (its settings, each
//! partition's next offset and event-time progress, the watermark floor, the open windows) and
//! the output of one cycle (a [`Batch`] of rows per output table), with the compact binary form
//! the output is stored in.

use crate::codec::{CodecError, Reader};
use crate::rows::{ColumnType, Rows, TableSchema};
use crate::tables::ByTable;

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

/// Version of a partition list's stored form.
const PARTITIONS_FORMAT: u8 = 1;

impl PartitionState {
    /// The stored form of a job's partitions (the checkpoint keeps it with the state it belongs
    /// to, so a state not yet confirmed can be dropped together with its positions).
    pub fn encode_list(parts: &[PartitionState], out: &mut Vec<u8>) {
        let mut w = crate::codec::Writer(out);
        w.u8(PARTITIONS_FORMAT);
        w.u64(parts.len() as u64);
        for p in parts {
            w.i64(i64::from(p.partition));
            w.bytes(p.name.as_bytes());
            w.bytes(p.identity.as_bytes());
            w.i64(p.next_offset);
            opt_i64(&mut w, p.max_event_time_ms);
            w.i64(p.last_delivery_ms);
            opt_i64(&mut w, p.end_offset);
            w.bytes(p.status.as_bytes());
        }
    }

    /// Reads what [`PartitionState::encode_list`] wrote.
    pub fn decode_list(data: &[u8]) -> Result<Vec<PartitionState>, CodecError> {
        let mut r = Reader { b: data, i: 0 };
        if r.u8()? != PARTITIONS_FORMAT {
            return Err(CodecError("unknown partition list format"));
        }
        let n = r.count()?;
        let mut parts = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            parts.push(PartitionState {
                partition: r.i32()?,
                name: r.string()?,
                identity: r.string()?,
                next_offset: r.i64()?,
                max_event_time_ms: read_opt_i64(&mut r)?,
                last_delivery_ms: r.i64()?,
                end_offset: read_opt_i64(&mut r)?,
                status: r.string()?,
            });
        }
        r.end()?;
        Ok(parts)
    }
}

fn opt_i64(w: &mut crate::codec::Writer<'_>, v: Option<i64>) {
    match v {
        Some(v) => {
            w.u8(1);
            w.i64(v);
        }
        None => w.u8(0),
    }
}

fn read_opt_i64(r: &mut Reader<'_>) -> Result<Option<i64>, CodecError> {
    match r.u8()? {
        0 => Ok(None),
        1 => r.i64().map(Some),
        _ => Err(CodecError("bad optional value")),
    }
}

/// The shapes of a job's three output tables.
pub type OutputSchemas = ByTable<TableSchema>;

impl ByTable<TableSchema> {
    /// A job's tables: its windows table and the fixed late-events and dead-letters tables.
    pub(crate) fn for_windows(windows: TableSchema) -> OutputSchemas {
        OutputSchemas {
            windows,
            late: TableSchema::late_events(),
            dead: TableSchema::dead_letters(),
        }
    }
}

/// The output of one checkpoint cycle, applied to DuckDB as one transaction: rows of the three
/// output tables (the batch reads as their [`ByTable`]) and, for a job whose aggregates DuckDB
/// computes, the events the cycle placed in windows.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub tables: ByTable<Rows>,
    pub staged: Staged,
    /// A job of several statements: each statement's windows, late events and staged events
    /// (the dead letters are the job's, above).
    pub layers: Vec<Batch>,
}

/// The events a cycle placed in windows (in `EngineConfig::staged_schema`'s shape), staged so
/// that DuckDB computes its aggregates over each window's events; and which staged events the
/// job still needs after the cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    pub rows: Rows,
    /// Tumbling and hopping windows: events of panes before this are needed no more (None: no
    /// pane is live). Sessions: the sessions written in the cycle's final rows say it.
    pub live_from_pane_ms: Option<i64>,
}

impl std::ops::Deref for Batch {
    type Target = ByTable<Rows>;
    fn deref(&self) -> &ByTable<Rows> {
        &self.tables
    }
}

impl std::ops::DerefMut for Batch {
    fn deref_mut(&mut self) -> &mut ByTable<Rows> {
        &mut self.tables
    }
}

impl Batch {
    /// No rows yet, in the shapes of `schemas` (and no staged events).
    pub fn empty(schemas: &OutputSchemas) -> Batch {
        Batch {
            tables: schemas.as_ref().map(|s| Rows::new(s.types())),
            staged: Staged {
                rows: Rows::new(Vec::new()),
                live_from_pane_ms: None,
            },
            layers: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(|r| r.is_empty())
            && self.staged.rows.is_empty()
            && self.layers.iter().all(Batch::is_empty)
    }

    pub fn clear(&mut self) {
        self.tables.as_mut().map(Rows::clear);
        self.staged.rows.clear();
        self.staged.live_from_pane_ms = None;
        self.layers.iter_mut().for_each(Batch::clear);
    }

    pub fn rows(&self) -> usize {
        self.tables.iter().map(|r| r.len()).sum::<usize>()
            + self.layers.iter().map(Batch::rows).sum::<usize>()
    }

    /// Reports a row written with the wrong shape (a bug).
    pub fn check(&self) -> Result<(), String> {
        self.tables.iter().try_for_each(Rows::check)?;
        self.staged.rows.check()?;
        self.layers.iter().try_for_each(Batch::check)
    }

    /// The stored form: the three tables' schemas and rows, so a batch can be applied again
    /// after a crash without the run's configuration.
    pub fn encode(&self, schemas: &OutputSchemas, out: &mut Vec<u8>) {
        out.push(FORMAT);
        for (schema, rows) in schemas.iter().zip(self.tables.iter()) {
            encode_schema(schema, out);
            rows.encode(out);
        }
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
            let rows = Rows::decode(data, &mut at)?;
            if rows.types() != schema.types().as_slice() {
                return Err(CodecError("rows do not match their table"));
            }
            Ok((schema, rows))
        };
        let (windows, late, dead) = (next()?, next()?, next()?);
        if at != data.len() {
            return Err(CodecError("trailing bytes"));
        }
        let both = ByTable {
            windows,
            late,
            dead,
        };
        let schemas = both.as_ref().map(|(s, _)| s.clone());
        let mut batch = Batch::empty(&schemas);
        batch.tables = both.map(|(_, r)| r);
        Ok((schemas, batch))
    }
}

/// Version of the binary forms, stored first so that a later version can read old checkpoints.
const FORMAT: u8 = 2;

fn encode_schema(s: &TableSchema, out: &mut Vec<u8>) {
    let mut w = crate::codec::Writer(out);
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
            "DOUBLE[]" => ColumnType::DoubleList,
            _ => return Err(CodecError("unknown column type")),
        };
        columns.push(crate::rows::Column::new(&name, ty));
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

/// The batches version 0.1 stored (format 1: fixed tables), still readable so a job
/// checkpointed by that version resumes after an upgrade (its open windows: `engine::legacy`).
pub(crate) mod legacy {
    use super::*;
    use crate::rows::Cell;

    /// The windows table of version 0.1 (the default job's).
    pub(crate) fn default_windows_schema() -> TableSchema {
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

    pub(crate) fn decode_batch(
        data: &[u8],
        topic: &str,
    ) -> Result<(OutputSchemas, Batch), CodecError> {
        let mut r = Reader { b: data, i: 1 };
        let schemas = OutputSchemas::for_windows(default_windows_schema());
        let mut batch = Batch::empty(&schemas);
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

    #[test]
    fn partition_lists_round_trip_and_damage_is_an_error() {
        let parts = vec![
            PartitionState {
                partition: 3,
                name: "/d/a.ndjson".into(),
                identity: "1:2/3/ab".into(),
                next_offset: 99,
                max_event_time_ms: Some(-5),
                last_delivery_ms: 7,
                end_offset: None,
                status: "released".into(),
            },
            PartitionState {
                partition: 0,
                name: String::new(),
                identity: String::new(),
                next_offset: 0,
                max_event_time_ms: None,
                last_delivery_ms: 0,
                end_offset: Some(12),
                status: String::new(),
            },
        ];
        let mut out = Vec::new();
        PartitionState::encode_list(&parts, &mut out);
        assert_eq!(PartitionState::decode_list(&out).unwrap(), parts);
        for cut in 0..out.len() {
            assert!(
                PartitionState::decode_list(&out[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    fn schemas() -> OutputSchemas {
        OutputSchemas::for_windows(legacy::default_windows_schema())
    }

    fn sample() -> Batch {
        let mut b = Batch::empty(&schemas());
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
        let mut w = crate::codec::Writer(&mut v1);
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
}
