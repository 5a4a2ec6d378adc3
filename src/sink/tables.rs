//! A job's output tables: created from their declared schemas, an existing one checked for the
//! columns the job writes, and the errors that name the table a write failed on.

use duckdb::Connection;
use streaming_etl_core::{Column, ColumnType, EtlError, Result, TableSchema};

use crate::params::{quote_ident, quote_literal};

/// The column of a late or dead table that names the job a row is of (tables jobs share).
pub const JOB_COLUMN: &str = "job";

/// A late or dead table's shape as written: with the job's column when the table has it.
pub(crate) fn with_job(schema: &TableSchema, job: Option<&str>) -> TableSchema {
    match job {
        Some(j) => schema.with_given(JOB_COLUMN, "VARCHAR", &quote_literal(j), true),
        None => schema.clone(),
    }
}

pub(crate) fn sink_error(table: &str, message: impl std::fmt::Display) -> EtlError {
    EtlError::Sink {
        table: table.to_string(),
        message: message.to_string(),
    }
}

/// `CREATE TABLE` column list (and primary key) of a schema.
pub fn ddl_columns(schema: &TableSchema) -> String {
    let mut cols: Vec<String> = schema
        .table_columns()
        .filter_map(|(_, c)| Some(format!("{} {}", quote_ident(&c.name), c.sql_type()?)))
        .collect();
    if !schema.primary_key.is_empty() {
        let key: Vec<String> = schema.primary_key.iter().map(|k| quote_ident(k)).collect();
        cols.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    cols.join(", ")
}

/// The positions of `final`, `revision` and `retracted` in a windows table whose rows have
/// revisions (`emit := 'update'`, `late_updates_ms`): the three BOOLEAN/BIGINT/BOOLEAN columns
/// after the aggregates.
pub(crate) fn revision_columns(schema: &TableSchema) -> Option<(usize, usize, usize)> {
    let cols = &schema.columns;
    let at = cols.iter().position(|c| c.name == "final")?;
    let names = cols.get(at..at + 3)?;
    let fits = names.iter().map(|c| (c.name.as_str(), c.ty)).eq([
        ("final", ColumnType::Boolean),
        ("revision", ColumnType::BigInt),
        ("retracted", ColumnType::Boolean),
    ]);
    fits.then_some((at, at + 1, at + 2))
}

pub(crate) fn column_list(schema: &TableSchema) -> String {
    schema
        .table_columns()
        .map(|(_, c)| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes sure `table` exists and has every column of `schema`; returns whether it has a primary
/// key (a table the user created without one is appended to, whatever the mode). `keys`: whether
/// the catalog has primary keys (the table is created without one where it has not).
pub(crate) fn ensure_table(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    keys: bool,
) -> Result<bool> {
    let declared = if keys {
        ddl_columns(schema)
    } else {
        ddl_columns(&schema.without_key())
    };
    conn.execute_batch(&format!("CREATE TABLE IF NOT EXISTS {table} ({declared})"))
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
        .table_columns()
        .map(|(_, c)| c)
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

/// The windows table of a `subscribe` run: a `partition` column, part of the key.
pub fn windows_with_partition(schema: &TableSchema) -> TableSchema {
    let mut with = schema.clone();
    with.columns
        .push(Column::new("partition", ColumnType::Integer));
    with.primary_key.push("partition".into());
    with
}
