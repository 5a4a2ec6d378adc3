//! streaming_etl: a DuckDB extension that runs event-time ETL inside the DuckDB process.
//! Events from a Kafka topic or NDJSON files are grouped into event-time windows per key under
//! per-partition watermarks; closed windows, late events and bad records land in tables of the
//! host database, with progress kept in a side SQLite checkpoint.
//!
//! This crate is the adapter layer, in rooms: `host` (DuckDB's side: the entrypoint, the
//! extension's connections, arguments, output vectors, the sandbox, OS calls), `functions`
//! (the SQL functions), `jobs` (jobs in the background: registry, threads, schedules),
//! `params` (their settings and parameters), `sink` (writing the output tables) and `source`
//! (Kafka). This file registers the functions. The event-time core
//! is `streaming_etl_core`, the checkpoint and run loop `streaming_etl_runtime`.

mod functions;
mod host;
mod jobs;
mod params;
mod sink;
mod source;
mod sql;

use duckdb::Connection;

use crate::functions::batch::{self, BatchFunction};
use crate::functions::bound::{ParameterForm, SqlForm};
use crate::functions::checkpoint::CheckpointFunction;
use crate::functions::jobs::JobsFunction;
use crate::functions::resume::ResumeFunction;
use crate::functions::run::RunFunction;
use crate::functions::stop::StopFunction;
use crate::host::connections::{Host, POOL_SIZE};

// `streaming_etl_init_c_api`, the entrypoint DuckDB calls on `LOAD streaming_etl`: it registers
// the settings, then calls `load`.
host::entry::entrypoint!(load);

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
    conn.register_table_function_with_extra_info::<RunFunction<ParameterForm>, _>(
        "streaming_etl_run",
        &host,
    )
    .map_err(fail)?;
    // A job written as SQL. DuckDB's C API keeps one signature per table function name (a
    // second registration under `streaming_etl_run` is not an overload), so it is a sibling
    // with the same named parameters.
    conn.register_table_function_with_extra_info::<RunFunction<SqlForm>, _>(
        "streaming_etl_sql",
        &host,
    )
    .map_err(fail)?;
    conn.register_table_function_with_extra_info::<CheckpointFunction, _>(
        "streaming_etl_checkpoint",
        &host,
    )
    .map_err(fail)?;
    // Jobs in the background.
    conn.register_table_function_with_extra_info::<JobsFunction, _>("streaming_etl_jobs", &host)
        .map_err(fail)?;
    conn.register_table_function_with_extra_info::<StopFunction, _>("streaming_etl_stop", &host)
        .map_err(fail)?;
    conn.register_table_function_with_extra_info::<ResumeFunction, _>(
        "streaming_etl_resume",
        &host,
    )
    .map_err(fail)?;
    conn.register_table_function::<BatchFunction>(batch::NAME)
        .map_err(fail)?;
    Ok(())
}
