//! Where a run's output goes: the trait the run writes through (the DuckDB tables in the
//! extension, memory in tests).

use streaming_etl_core::{Batch, ByTable, OutputSchemas, Result};

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

pub trait OutputSink: Send {
    /// Makes sure the tables exist with what the schemas need (idempotent).
    fn prepare(&mut self, tables: &Tables, schemas: &OutputSchemas) -> Result<()>;

    /// Applies one batch atomically, with a marker of it (job, creation, number) in the same
    /// transaction. Applying a batch again must change nothing.
    fn apply(&mut self, output: &Output<'_>) -> Result<()>;

    /// Whether batch `seq` of the job (or a later one) was applied to `tables`: its marker is
    /// there.
    fn landed(&mut self, tables: &Tables, job: &str, job_created_ms: i64, seq: i64)
        -> Result<bool>;
}
