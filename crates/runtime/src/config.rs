//! What a run is asked to do, already parsed and checked (the extension builds it from SQL
//! arguments at bind time; tests build it directly).

use streaming_etl_core::{EngineConfig, JobSettings};

use crate::sink::Tables;

/// Where a job's checkpoint lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointLocation {
    File(String),
    /// In memory, for as long as the database is open (not crash-safe).
    Memory,
}

impl CheckpointLocation {
    pub fn shown(&self) -> &str {
        match self {
            CheckpointLocation::File(p) => p,
            CheckpointLocation::Memory => ":memory:",
        }
    }
}

/// Everything one run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// The name the job's state is kept under.
    pub job: String,
    /// The source as the user named it (the `topic` argument: a Kafka topic or a `file:`
    /// pattern); also the `topic` column of late events and dead letters.
    pub source: String,
    /// The settings the checkpoint must agree with.
    pub settings: JobSettings,
    pub engine: EngineConfig,
    pub tables: Tables,
    pub checkpoint: CheckpointLocation,
    pub max_messages: Option<u64>,
    pub max_runtime_ms: Option<i64>,
    /// Length of a checkpoint cycle (one result row per cycle).
    pub checkpoint_interval_ms: i64,
    /// Once caught up, close every open window.
    pub flush: bool,
    /// Keep reading what arrives instead of stopping when caught up.
    pub follow: bool,
    /// Rolling files: a caught-up file stops holding the watermark back once a file that sorts
    /// after it has delivered data.
    pub rolling: bool,
    /// Once every partition has been silent this long (wall clock), close every open window.
    pub quiet_flush_ms: Option<i64>,
    /// Threads the run may use in all, its caller's included (DuckDB's `threads` when the run
    /// starts); at least one.
    pub threads: usize,
}
