//! The host: DuckDB and the process the extension runs in, as the rest of the crate sees them.
//! The entrypoint ([`entry`]), the extension's own connections ([`connections`]), a call's
//! arguments ([`args`]; on DuckDB 1.4, `lts_args`) and its parameters' types
//! ([`param_types`]), output vectors ([`out_vector`]), callback errors ([`sql_error`]), DuckDB's
//! sandbox settings ([`sandbox`]), operating-system calls ([`os`]), and DuckDB's binder and JSON
//! reader on typed columns ([`binder`] at bind time, [`resolver`] during a run). The unsafe code of the
//! crate is here (`entry`, `out_vector`, `os`), besides librdkafka's batch queue
//! (`source/kafka_batch.rs`).

pub mod args;
pub mod binder;
pub mod connections;
pub mod entry;
#[cfg(feature = "capi-v1-2")]
mod lts_args;
pub mod os;
pub mod out_vector;
pub mod param_types;
pub mod resolver;
pub mod sandbox;
pub mod sql_error;
