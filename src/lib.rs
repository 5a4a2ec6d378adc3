//! streaming_etl: a DuckDB extension that runs event-time ETL inside the DuckDB process.
//! Events from a Kafka topic or NDJSON files are grouped into event-time windows per key under
//! per-partition watermarks; closed windows, late events and bad records land in tables of the
//! host database, with progress kept in a side SQLite checkpoint.
//!
//! This crate is the adapter layer: the entrypoint, the host database, the two SQL functions,
//! their parameters, the DuckDB sink and the Kafka source. The event-time core is
//! `streaming_etl_core`, the checkpoint and run loop `streaming_etl_runtime`.

mod args;
mod batch_function;
mod catalog;
mod checkpoint_function;
mod entry;
mod host;
#[cfg(feature = "capi-v1-2")]
mod lts_args;
mod os;
mod out_vector;
mod params;
mod partition_store;
mod result;
mod run_function;
mod sandbox;
mod sink;
mod source;

use std::fmt;

use duckdb::core::{LogicalTypeHandle, LogicalTypeId};
use duckdb::Connection;
use streaming_etl_core::EtlError;

pub use crate::entry::streaming_etl_init_c_api;

use crate::host::{Host, POOL_SIZE};
use crate::params::{Param, ParamType};

/// Registers the functions; called from the entrypoint (settings are registered there).
pub(crate) fn load(conn: Connection) -> Result<(), String> {
    let fail = |e: duckdb::Error| format!("streaming_etl: {e}");
    // The file this database lives in; in-memory databases have none.
    let db_path: Option<String> = conn
        .query_row(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()",
            [],
            |r| r.get::<_, Option<String>>(0),
        )
        .map_err(fail)?
        .filter(|p| !p.is_empty() && p != ":memory:")
        .map(|p| match std::fs::canonicalize(&p) {
            Ok(abs) => abs.to_string_lossy().into_owned(),
            Err(_) => p,
        });
    let conns = (0..POOL_SIZE)
        .map(|_| conn.try_clone())
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    let host = Host::start(conns, db_path);
    conn.register_table_function_with_extra_info::<run_function::RunFunction, _>(
        "streaming_etl_run",
        &host,
    )
    .map_err(fail)?;
    conn.register_table_function_with_extra_info::<checkpoint_function::CheckpointFunction, _>(
        "streaming_etl_checkpoint",
        &host,
    )
    .map_err(fail)?;
    conn.register_table_function::<batch_function::BatchFunction>(batch_function::NAME)
        .map_err(fail)?;
    Ok(())
}

/// The DuckDB types of a function's named parameters.
pub(crate) fn named_parameters(params: &[Param]) -> Vec<(String, LogicalTypeHandle)> {
    params
        .iter()
        .map(|p| (p.name.to_string(), logical_type(p.ty)))
        .collect()
}

/// The DuckDB type of a parameter.
pub(crate) fn logical_type(ty: ParamType) -> LogicalTypeHandle {
    let t = LogicalTypeHandle::from;
    match ty {
        ParamType::Varchar => t(LogicalTypeId::Varchar),
        ParamType::BigInt => t(LogicalTypeId::Bigint),
        ParamType::Boolean => t(LogicalTypeId::Boolean),
        ParamType::IntegerList => LogicalTypeHandle::list(&t(LogicalTypeId::Integer)),
        ParamType::VarcharList => LogicalTypeHandle::list(&t(LogicalTypeId::Varchar)),
        ParamType::VarcharMap => {
            LogicalTypeHandle::map(&t(LogicalTypeId::Varchar), &t(LogicalTypeId::Varchar))
        }
    }
}

/// An error as the SQL statement reports it.
#[derive(Debug)]
pub(crate) struct SqlError(String);

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

/// Runs a callback body with panics contained, so that a bug is an SQL error saying so.
pub(crate) fn contained<R>(f: impl FnOnce() -> Result<R, EtlError>) -> Result<R, SqlError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(SqlError(e.to_string())),
        Err(p) => Err(SqlError(format!(
            "streaming_etl internal error (a bug; please report it): {}",
            entry::panic_message(p)
        ))),
    }
}
