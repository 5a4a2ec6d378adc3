//! streaming_etl: a DuckDB extension that runs event-time ETL inside the DuckDB process.
//! Events from a Kafka topic or NDJSON files are grouped into tumbling event-time windows per
//! key under per-partition watermarks; closed windows, late events and bad records land in
//! tables of the host database, with progress kept in a side SQLite checkpoint.

pub mod checkpoint;
pub mod checkpoint_function;
pub mod committer;
pub mod decode;
pub mod error;
pub mod ffi;
pub mod host;
pub mod job;
pub mod params;
pub mod pipeline;
pub mod run_function;
pub mod sink;
pub mod source;
pub mod state;
pub mod testing;
pub mod watermark;
pub mod window;

use crate::ffi::LoadingDatabase;
use crate::host::{Host, POOL_SIZE};
use crate::params::{DEFAULT_BROKERS, SETTING_BROKERS, SETTING_CHECKPOINT};

/// Registers the settings and functions; called from the C entrypoint with panics contained.
pub fn load(db: &LoadingDatabase) -> Result<(), String> {
    let setup = db.connect()?;
    setup.register_setting(
        SETTING_BROKERS,
        "Kafka bootstrap servers for streaming_etl_run (host:port[,host:port...])",
        DEFAULT_BROKERS,
    )?;
    setup.register_setting(
        SETTING_CHECKPOINT,
        "SQLite checkpoint file of streaming_etl jobs (default: <database file>.streaming_etl.sqlite; ':memory:' for one that lives as long as the database)",
        "",
    )?;
    // The file this database lives in; in-memory databases have none.
    let db_path = setup
        .query_string(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()",
        )
        .map_err(|e| format!("streaming_etl: {e}"))?
        .filter(|p| !p.is_empty() && p != ":memory:")
        .map(|p| match std::fs::canonicalize(&p) {
            Ok(abs) => abs.to_string_lossy().into_owned(),
            Err(_) => p,
        });
    let conns = (0..POOL_SIZE)
        .map(|_| db.connect())
        .collect::<Result<Vec<_>, _>>()?;
    let host = Host::start(conns, db_path);
    setup.register_table_function::<run_function::RunFunction>(host.clone())?;
    setup.register_table_function::<checkpoint_function::CheckpointFunction>(host)?;
    Ok(())
}
