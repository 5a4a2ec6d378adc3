//! The settings and parameters of the SQL functions: declared once in [`table`], read through
//! [`given`], parsed into a run's plan by [`run`] from its groups ([`source`], [`windows`],
//! [`time`], [`output`], [`checkpoint`], typed columns in [`columns`], and Kafka's in [`kafka`]),
//! and the table names and quoting they share in [`sql_name`].

mod background;
mod checkpoint;
mod columns;
mod given;
mod kafka;
mod output;
mod run;
mod source;
mod sql_name;
mod table;
mod time;
mod windows;

pub use checkpoint::{checkpoint_job, checkpoint_location, checkpoint_named, jobs_record};
pub use columns::EVENT_TIME;
pub use kafka::{KafkaParams, RegistryParams};
pub use output::{Compaction, WriteMode};
pub use run::{parse_run, RunPlan};
pub use source::{SourceSpec, Start};
pub use sql_name::{quote_ident, quote_literal, transform_spec, TableName};
pub use table::*;
