//! The DuckDB sink: creates a job's tables from their declared schemas and writes a cycle's
//! output through the extension's own connection, in one transaction, idempotently: rows are
//! upserted by each table's primary key (windows by key and window start, late events and dead
//! letters by topic, partition and offset), so applying a batch again after a crash changes
//! nothing. A batch applied for the first time is appended straight into the tables with the
//! `duckdb` Appender (its rows cannot exist yet); a batch applied again (the outbox after a
//! crash), or one whose append hits rows that exist (a job restarted from scratch over its old
//! tables), goes through a staging table and one `INSERT OR REPLACE ... SELECT` per table.
//! Batched either way: no SQL text per row.

use duckdb::types::{ToSqlOutput, ValueRef};
use duckdb::{appender_params_from_iter, Connection, ToSql};
use streaming_etl_core::error::{EtlError, Result};
use streaming_etl_core::rows::{Cell, Rows, TableSchema};
use streaming_etl_core::state::OutputSchemas;
use streaming_etl_runtime::sink::{Output, OutputSink, Tables};

use crate::host::PooledConn;
use crate::params::{quote_ident, TableName};

const STAGE: &str = "streaming_etl_stage";

pub struct DuckSink {
    conn: PooledConn,
}

impl DuckSink {
    pub fn new(conn: PooledConn) -> DuckSink {
        DuckSink { conn }
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

/// A cell as an Appender value.
struct SqlCell<'a>(Cell<'a>);

impl ToSql for SqlCell<'_> {
    fn to_sql(&self) -> duckdb::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Cell::Null => ValueRef::Null,
            Cell::Bool(b) => ValueRef::Boolean(b),
            Cell::I32(v) => ValueRef::Int(v),
            Cell::I64(v) => ValueRef::BigInt(v),
            Cell::F64(v) => ValueRef::Double(v),
            Cell::Str(s) => ValueRef::Text(s.as_bytes()),
            Cell::Bytes(b) => ValueRef::Blob(b),
        }))
    }
}

/// Makes sure `table` exists and has every column of `schema`.
fn ensure_table(conn: &Connection, table: &str, schema: &TableSchema) -> Result<()> {
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table} ({})",
        ddl_columns(schema)
    ))
    .map_err(|e| sink_error(table, e))?;
    let mut stmt = conn
        .prepare(&format!("SELECT column_name FROM (DESCRIBE {table})"))
        .map_err(|e| sink_error(table, e))?;
    let have: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(|e| sink_error(table, e))?
        .collect::<duckdb::Result<_>>()
        .map_err(|e| sink_error(table, e))?;
    let missing: Vec<&str> = schema
        .columns
        .iter()
        .filter(|c| !have.iter().any(|h| h.eq_ignore_ascii_case(&c.name)))
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
    Ok(())
}

/// Appends `rows` to `table` (its columns named, so a table with more columns works).
fn append(conn: &Connection, table: &str, schema: &TableSchema, rows: &Rows) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let err = |e: duckdb::Error| sink_error(table, e);
    let name = TableName::parse(table)
        .ok_or_else(|| EtlError::Internal(format!("unreadable table name {table}")))?;
    let cols: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
    let mut app = match name.parts.as_slice() {
        [t] => conn.appender_with_columns(t, &cols),
        [s, t] => conn.appender_with_columns_to_db(t, s, &cols),
        [c, s, t] => conn.appender_with_columns_to_catalog_and_db(t, c, s, &cols),
        _ => return Err(EtlError::Internal(format!("bad table name {table}"))),
    }
    .map_err(err)?;
    rows.each(|cells| app.append_row(appender_params_from_iter(cells.iter().map(|c| SqlCell(*c)))))
        .map_err(|e| EtlError::Internal(e.to_string()))?
        .map_err(err)?;
    app.flush().map_err(err)
}

/// Upserts `rows` into `table`: appended to a staging table, then one INSERT OR REPLACE.
fn upsert(conn: &Connection, table: &str, schema: &TableSchema, rows: &Rows) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let err = |e: duckdb::Error| sink_error(table, e);
    let stage = format!("temp.main.{STAGE}");
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE {STAGE} ({})",
        ddl_columns(&schema.without_key())
    ))
    .map_err(err)?;
    {
        let mut app = conn
            .appender_to_catalog_and_db(STAGE, "temp", "main")
            .map_err(err)?;
        rows.each(|cells| {
            app.append_row(appender_params_from_iter(cells.iter().map(|c| SqlCell(*c))))
        })
        .map_err(|e| EtlError::Internal(e.to_string()))?
        .map_err(err)?;
        app.flush().map_err(err)?;
    }
    let cols = column_list(schema);
    let verb = if schema.primary_key.is_empty() {
        "INSERT"
    } else {
        "INSERT OR REPLACE"
    };
    conn.execute_batch(&format!(
        "{verb} INTO {table} ({cols}) SELECT {cols} FROM {stage}; DROP TABLE {stage}"
    ))
    .map_err(err)
}

type Writer = fn(&Connection, &str, &TableSchema, &Rows) -> Result<()>;

/// Writes the batch's three tables in one transaction.
fn write_batch(conn: &Connection, out: &Output<'_>, write: Writer) -> Result<()> {
    conn.execute_batch("BEGIN TRANSACTION")
        .map_err(|e| EtlError::Duck(e.to_string()))?;
    let result = (|| {
        write(
            conn,
            &out.tables.windows,
            &out.schemas.windows,
            &out.batch.windows,
        )?;
        write(conn, &out.tables.late, &out.schemas.late, &out.batch.late)?;
        write(conn, &out.tables.dead, &out.schemas.dead, &out.batch.dead)?;
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

impl OutputSink for DuckSink {
    fn prepare(&mut self, tables: &Tables, schemas: &OutputSchemas) -> Result<()> {
        let conn = self.conn.conn()?;
        for (table, schema) in [
            (&tables.windows, &schemas.windows),
            (&tables.late, &schemas.late),
            (&tables.dead, &schemas.dead),
        ] {
            ensure_table(conn, table, schema)?;
        }
        Ok(())
    }

    fn apply(&mut self, out: &Output<'_>) -> Result<()> {
        if out.batch.is_empty() {
            return Ok(());
        }
        let conn = self.conn.conn()?;
        if !out.replay && write_batch(conn, out, append).is_ok() {
            return Ok(());
        }
        write_batch(conn, out, upsert)
    }
}
