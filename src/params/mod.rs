//! The settings and parameters of the SQL functions: declared once in [`table`], read through
//! [`given`], parsed into a run's plan by [`run`] (with its Kafka part in [`kafka`]), and the
//! table names and quoting they share in [`sql_name`].

mod given;
mod kafka;
mod run;
mod sql_name;
mod table;

pub use kafka::{KafkaParams, RegistryParams};
pub use run::{
    checkpoint_job, checkpoint_location, parse_run, Compaction, RunPlan, SourceSpec, Start,
    WriteMode,
};
pub use sql_name::{quote_ident, TableName};
pub use table::*;
