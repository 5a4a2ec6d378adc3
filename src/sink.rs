//! The sink: writes a cycle's output into the host database through the extension's own
//! connection, in one transaction, idempotently: windows are upserted by (key, window_start_ms)
//! and late events and dead letters are keyed by (topic, partition, offset), so re-applying a
//! batch after a crash changes nothing. Rows go through query appenders (batched, no SQL text
//! per row).

use crate::error::{EtlError, Result};
use crate::ffi::{ColType, DuckConn};
use crate::params::{TableName, Tables};
use crate::state::Batch;

/// Creates the three tables when they are missing.
pub fn ensure_tables(conn: &DuckConn, tables: &Tables) -> Result<()> {
    let ddl = [
        (
            &tables.windows,
            "window_start_ms BIGINT, window_end_ms BIGINT, key VARCHAR, count BIGINT, \
             sum_value DOUBLE, min_value DOUBLE, max_value DOUBLE, PRIMARY KEY (key, window_start_ms)",
        ),
        (
            &tables.late,
            "key VARCHAR, event_time_ms BIGINT, ingest_time_ms BIGINT, payload_json VARCHAR, \
             window_start_ms BIGINT, window_end_ms BIGINT, watermark_ms BIGINT, topic VARCHAR, \
             partition INTEGER, \"offset\" BIGINT, PRIMARY KEY (topic, partition, \"offset\")",
        ),
        (
            &tables.dead,
            "topic VARCHAR, partition INTEGER, \"offset\" BIGINT, ingest_time_ms BIGINT, raw BLOB, \
             error VARCHAR, PRIMARY KEY (topic, partition, \"offset\")",
        ),
    ];
    for (name, columns) in ddl {
        conn.execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} ({columns})",
            name.sql()
        ))
        .map_err(|e| sink_error(name, e))?;
    }
    Ok(())
}

fn sink_error(table: &TableName, message: String) -> EtlError {
    EtlError::Sink {
        table: table.sql(),
        message,
    }
}

const WINDOW_COLUMNS: &[(&str, ColType)] = &[
    ("window_start_ms", ColType::BigInt),
    ("window_end_ms", ColType::BigInt),
    ("key", ColType::Varchar),
    ("count", ColType::BigInt),
    ("sum_value", ColType::Double),
    ("min_value", ColType::Double),
    ("max_value", ColType::Double),
];

const LATE_COLUMNS: &[(&str, ColType)] = &[
    ("key", ColType::Varchar),
    ("event_time_ms", ColType::BigInt),
    ("ingest_time_ms", ColType::BigInt),
    ("payload_json", ColType::Varchar),
    ("window_start_ms", ColType::BigInt),
    ("window_end_ms", ColType::BigInt),
    ("watermark_ms", ColType::BigInt),
    ("topic", ColType::Varchar),
    ("partition", ColType::Integer),
    ("offset", ColType::BigInt),
];

const DEAD_COLUMNS: &[(&str, ColType)] = &[
    ("topic", ColType::Varchar),
    ("partition", ColType::Integer),
    ("offset", ColType::BigInt),
    ("ingest_time_ms", ColType::BigInt),
    ("raw", ColType::Blob),
    ("error", ColType::Varchar),
];

fn insert_sql(verb: &str, table: &TableName, columns: &[(&str, ColType)]) -> String {
    let cols = columns
        .iter()
        .map(|(c, _)| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{verb} INTO {} ({cols}) SELECT {cols} FROM appended_data",
        table.sql()
    )
}

/// Applies one batch in one transaction. `topic` fills the topic column.
pub fn apply(conn: &DuckConn, tables: &Tables, topic: &str, batch: &Batch) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    conn.execute("BEGIN TRANSACTION").map_err(EtlError::Duck)?;
    let result = write(conn, tables, topic, batch).and_then(|()| {
        crate::testing::crash_point("sink-before-commit");
        conn.execute("COMMIT")
            .map_err(|e| sink_error(&tables.windows, e))
    });
    if result.is_err() {
        // A failed statement leaves the transaction aborted; the connection must be reset
        // before it can be used again.
        let _ = conn.execute("ROLLBACK");
    }
    result
}

fn write(conn: &DuckConn, tables: &Tables, topic: &str, batch: &Batch) -> Result<()> {
    if !batch.windows.is_empty() {
        let t = &tables.windows;
        let err = |e| sink_error(t, e);
        let mut a = conn
            .appender(
                &insert_sql("INSERT OR REPLACE", t, WINDOW_COLUMNS),
                WINDOW_COLUMNS,
            )
            .map_err(err)?;
        for w in &batch.windows {
            a.i64(w.start_ms).map_err(err)?;
            a.i64(w.end_ms).map_err(err)?;
            a.str(&w.key).map_err(err)?;
            a.i64(w.agg.count).map_err(err)?;
            a.opt_f64(w.agg.sum_value()).map_err(err)?;
            a.opt_f64(w.agg.min_value()).map_err(err)?;
            a.opt_f64(w.agg.max_value()).map_err(err)?;
            a.end_row().map_err(err)?;
        }
        a.flush().map_err(err)?;
    }
    if !batch.late.is_empty() {
        let t = &tables.late;
        let err = |e| sink_error(t, e);
        let mut a = conn
            .appender(
                &insert_sql("INSERT OR IGNORE", t, LATE_COLUMNS),
                LATE_COLUMNS,
            )
            .map_err(err)?;
        for r in &batch.late {
            a.str(&r.key).map_err(err)?;
            a.i64(r.event_time_ms).map_err(err)?;
            a.i64(r.ingest_time_ms).map_err(err)?;
            a.str(&r.payload).map_err(err)?;
            a.i64(r.window_start_ms).map_err(err)?;
            a.i64(r.window_end_ms).map_err(err)?;
            a.i64(r.watermark_ms).map_err(err)?;
            a.str(topic).map_err(err)?;
            a.i32(r.partition).map_err(err)?;
            a.i64(r.offset).map_err(err)?;
            a.end_row().map_err(err)?;
        }
        a.flush().map_err(err)?;
    }
    if !batch.dead.is_empty() {
        let t = &tables.dead;
        let err = |e| sink_error(t, e);
        let mut a = conn
            .appender(
                &insert_sql("INSERT OR IGNORE", t, DEAD_COLUMNS),
                DEAD_COLUMNS,
            )
            .map_err(err)?;
        for r in &batch.dead {
            a.str(topic).map_err(err)?;
            a.i32(r.partition).map_err(err)?;
            a.i64(r.offset).map_err(err)?;
            a.i64(r.ingest_time_ms).map_err(err)?;
            a.blob(&r.raw).map_err(err)?;
            a.str(&r.error).map_err(err)?;
            a.end_row().map_err(err)?;
        }
        a.flush().map_err(err)?;
    }
    Ok(())
}
