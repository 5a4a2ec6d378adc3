//! The DuckDB sink: creates a job's tables from their declared schemas and writes a cycle's
//! output through the extension's own connection, in one transaction, idempotently.
//!
//! Each table's rows go in with one `INSERT ... SELECT` from `__streaming_etl_batch` (DuckDB reads
//! them a vector at a time; no SQL text and no call per value). `upsert` mode: rows are upserted
//! by each table's primary key (windows by key and window start, late events and dead letters
//! by topic, partition and offset), so applying a batch again after a crash changes nothing. A
//! batch applied for the first time is inserted plainly (its rows cannot exist yet); a batch
//! applied again (the outbox after a crash), or one whose insert hits rows that exist (a job
//! restarted from scratch over its old tables), is inserted with `INSERT OR REPLACE`.
//!
//! `append` mode (and any table the user created without a key): no index to maintain; the
//! batch's number is written to a marker table in the same transaction, so a replay of a batch
//! that was applied finds its marker and is skipped.

use std::collections::HashMap;
use std::sync::Arc;

use duckdb::Connection;
use streaming_etl_core::{ByTable, EtlError, OutputSchemas, Result, Rows, TableSchema};
use streaming_etl_runtime::sink::{Output, OutputSink, Tables};

use crate::batch_function::{self, Lent};
use crate::host::PooledConn;
use crate::params::{quote_ident, TableName, WriteMode};

/// The table that records, per job, the last batch applied to tables without a primary key.
pub const MARKER_TABLE: &str = "streaming_etl_batches";

pub struct DuckSink {
    conn: PooledConn,
    mode: WriteMode,
    /// The job's tables as parsed at bind time.
    job_tables: ByTable<TableName>,
    /// Per set of tables: which have a primary key, and the marker table when one has not.
    prepared: HashMap<Tables, (ByTable<bool>, Option<String>)>,
}

impl DuckSink {
    pub fn new(conn: PooledConn, mode: WriteMode, tables: &ByTable<TableName>) -> DuckSink {
        DuckSink {
            conn,
            mode,
            job_tables: tables.clone(),
            prepared: HashMap::new(),
        }
    }

    /// The marker table beside the windows table (same catalog and schema: one transaction
    /// writes both).
    fn marker_table(&self, tables: &Tables) -> String {
        let windows = if *tables == self.job_tables.as_ref().map(TableName::sql) {
            self.job_tables.windows.clone()
        } else {
            // Tables of a batch an earlier run left in the outbox: their names as it stored
            // them, which were parsed and quoted when that run started.
            TableName::parse(&tables.windows).unwrap_or(TableName { parts: Vec::new() })
        };
        windows.sibling(MARKER_TABLE).sql()
    }
}

fn sink_error(table: &str, message: impl std::fmt::Display) -> EtlError {
    EtlError::Sink {
        table: table.to_string(),
        message: message.to_string(),
    }
}

/// `CREATE TABLE` column list (and primary key) of a schema.
pub fn ddl_columns(schema: &TableSchema) -> String {
    let mut cols: Vec<String> = schema
        .columns
        .iter()
        .map(|c| format!("{} {}", quote_ident(&c.name), c.ty.sql()))
        .collect();
    if !schema.primary_key.is_empty() {
        let key: Vec<String> = schema.primary_key.iter().map(|k| quote_ident(k)).collect();
        cols.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    cols.join(", ")
}

fn column_list(schema: &TableSchema) -> String {
    schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes sure `table` exists and has every column of `schema`; returns whether it has a primary
/// key (a table the user created without one is appended to, whatever the mode).
fn ensure_table(conn: &Connection, table: &str, schema: &TableSchema) -> Result<bool> {
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table} ({})",
        ddl_columns(schema)
    ))
    .map_err(|e| sink_error(table, e))?;
    let mut stmt = conn
        .prepare(&format!("SELECT column_name, key FROM (DESCRIBE {table})"))
        .map_err(|e| sink_error(table, e))?;
    let have: Vec<(String, Option<String>)> = stmt
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })
        .map_err(|e| sink_error(table, e))?
        .collect::<duckdb::Result<_>>()
        .map_err(|e| sink_error(table, e))?;
    let missing: Vec<&str> = schema
        .columns
        .iter()
        .filter(|c| !have.iter().any(|(h, _)| h.eq_ignore_ascii_case(&c.name)))
        .map(|c| c.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(sink_error(
            table,
            format!(
                "the existing table lacks the column(s) {} that this job writes; drop or alter it, or name another table",
                missing.join(", ")
            ),
        ));
    }
    Ok(have.iter().any(|(_, k)| k.as_deref() == Some("PRI")))
}

/// Writes `rows` into `table` (its columns named, so a table with more columns works) with one
/// `INSERT ... SELECT` from [`batch_function`](crate::batch_function): DuckDB takes the rows a
/// vector at a time. `replace`: rows whose primary key exists replace them.
fn insert(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    rows: &Rows,
    replace: bool,
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let lent = Lent::new(Arc::new(rows.clone()));
    let verb = if replace && !schema.primary_key.is_empty() {
        "INSERT OR REPLACE"
    } else {
        "INSERT"
    };
    conn.execute_batch(&format!(
        // Qualified: a macro of the same name in the user's schema cannot stand in for it.
        "{verb} INTO {table} ({}) SELECT * FROM system.main.{}({})",
        column_list(schema),
        batch_function::NAME,
        lent.id
    ))
    .map_err(|e| sink_error(table, e))
}

/// How a batch meets its tables.
struct WritePlan<'a> {
    /// Whether each table has a primary key.
    keyed: ByTable<bool>,
    /// A keyed table takes the batch by appending (its rows cannot exist yet) rather than by
    /// upserting.
    append_keyed: bool,
    /// The marker table that records the batch, when a table without a key takes part.
    marker: Option<&'a str>,
}

/// Writes the batch's three tables, and its marker, in one transaction.
fn write_batch(conn: &Connection, out: &Output<'_>, plan: &WritePlan<'_>) -> Result<()> {
    conn.execute_batch("BEGIN TRANSACTION")
        .map_err(|e| EtlError::Duck(e.to_string()))?;
    let result = (|| {
        let parts = out.tables.as_ref().zip(out.schemas.as_ref());
        for (((table, schema), rows), keyed) in parts.zip(out.batch.as_ref()).zip(plan.keyed) {
            insert(conn, table, schema, rows, keyed && !plan.append_keyed)?;
        }
        if let Some(marker) = plan.marker {
            // Batches are applied in order, each one only once the ones before it are
            // confirmed: the job's latest marker is the only one a replay can need.
            conn.execute(
                &format!("DELETE FROM {marker} WHERE job = ?"),
                duckdb::params![out.job],
            )
            .and_then(|_| {
                conn.execute(
                    &format!("INSERT INTO {marker} VALUES (?, ?, ?, epoch_ms(now()))"),
                    duckdb::params![out.job, out.job_created_ms, out.seq],
                )
            })
            .map_err(|e| sink_error(marker, e))?;
        }
        streaming_etl_runtime::fault::crash_point("sink-before-commit");
        conn.execute_batch("COMMIT")
            .map_err(|e| sink_error(&out.tables.windows, e))
    })();
    if result.is_err() {
        // A failed statement leaves the transaction aborted; the connection must be reset
        // before it can be used again.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// Whether the marker table records this batch as applied.
fn applied(conn: &Connection, marker: &str, out: &Output<'_>) -> Result<bool> {
    conn.query_row(
        &format!("SELECT count(*) FROM {marker} WHERE job = ? AND job_created_ms = ? AND seq = ?"),
        duckdb::params![out.job, out.job_created_ms, out.seq],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
    .map_err(|e| sink_error(marker, e))
}

impl OutputSink for DuckSink {
    fn prepare(&mut self, tables: &Tables, schemas: &OutputSchemas) -> Result<()> {
        let conn = self.conn.conn()?;
        let mut keyed = ByTable::<bool>::default();
        for ((table, schema), has_key) in tables.as_ref().zip(schemas.as_ref()).zip(keyed.as_mut())
        {
            let declared = match self.mode {
                WriteMode::Upsert => schema.clone(),
                WriteMode::Append => schema.without_key(),
            };
            *has_key = ensure_table(conn, table, &declared)?;
        }
        let marker = (!keyed.iter().all(|&k| k)).then(|| self.marker_table(tables));
        if let Some(m) = &marker {
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {m} (job VARCHAR, job_created_ms BIGINT, seq BIGINT, applied_ms BIGINT)"
            ))
            .map_err(|e| sink_error(m, e))?;
        }
        self.prepared.insert(tables.clone(), (keyed, marker));
        Ok(())
    }

    fn apply(&mut self, out: &Output<'_>) -> Result<()> {
        if out.batch.is_empty() {
            return Ok(());
        }
        let conn = self.conn.conn()?;
        let (keyed, marker) = self
            .prepared
            .get(out.tables)
            .cloned()
            .ok_or_else(|| EtlError::Internal("a batch for tables not prepared".into()))?;
        let marker = marker.as_deref();
        if out.replay {
            if let Some(m) = marker {
                if applied(conn, m, out)? {
                    return Ok(());
                }
            }
        }
        let mut plan = WritePlan {
            keyed,
            append_keyed: !out.replay,
            marker,
        };
        if plan.append_keyed && write_batch(conn, out, &plan).is_ok() {
            return Ok(());
        }
        plan.append_keyed = false;
        write_batch(conn, out, &plan)
    }
}
