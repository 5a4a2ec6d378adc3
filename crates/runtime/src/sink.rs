//! Where a run's output goes: the trait the run writes through (the DuckDB tables in the
//! extension, memory in tests).

use streaming_etl_core::{Batch, ByTable, Counters, OutputSchemas, Result};

/// The three output tables of a job, as the sink names them (for DuckDB: quoted, possibly
/// qualified SQL names). Stored with a state in doubt, so its batch is looked for where it went.
pub type Tables = ByTable<String>;

/// One batch to apply.
pub struct Output<'a> {
    pub job: &'a str,
    /// The batch's sequence number in the job (increasing; a replay has the same number).
    pub seq: i64,
    /// When the job was created (`job` and this tell one job from an earlier one of the same
    /// name, whose batch numbers started at 1 too).
    pub job_created_ms: i64,
    pub tables: &'a Tables,
    pub schemas: &'a OutputSchemas,
    pub batch: &'a Batch,
    /// The batch may have been applied already (it was left in an older checkpoint's outbox by a
    /// run that died).
    pub replay: bool,
}

/// What a batch put in its tables, where the sink counts it rather than the engine: a job
/// written as SQL keeps the late events its statements' FROM and WHERE keep, and writes the
/// window rows its statements make (a staged statement's GROUP BY may make fewer or more rows
/// than the engine's windows). None: the engine's count stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub windows: Option<u64>,
    pub late: Option<u64>,
}

impl Written {
    /// `engine`'s counts of one cycle, with the sink's where it counted.
    pub fn over(self, mut engine: Counters) -> Counters {
        if let Some(w) = self.windows {
            engine.windows_emitted = w;
        }
        if let Some(l) = self.late {
            engine.late_events = l;
        }
        engine
    }

    /// The counts of two writes.
    pub fn plus(self, other: Written) -> Written {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        Written {
            windows: add(self.windows, other.windows),
            late: add(self.late, other.late),
        }
    }
}

pub trait OutputSink: Send {
    /// Makes sure the tables exist with what the schemas need (idempotent).
    fn prepare(&mut self, tables: &Tables, schemas: &OutputSchemas) -> Result<()>;

    /// Applies one batch atomically, with a marker of it (job, creation, number) in the same
    /// transaction. Applying a batch again must change nothing. Returns what it counted.
    fn apply(&mut self, output: &Output<'_>) -> Result<Written>;

    /// Whether batch `seq` of the job (or a later one) was applied to `tables`: its marker is
    /// there.
    fn landed(&mut self, tables: &Tables, job: &str, job_created_ms: i64, seq: i64)
        -> Result<bool>;
}
