//! Where a job's output lives: the attached catalog each output table is in (the database's own
//! storage, a DuckLake, ...) and what that catalog can do. A DuckDB transaction writes one
//! attached database only, so a cycle's rows and its batch marker commit together only when the
//! three tables share one catalog; this is checked when the run is bound.

use duckdb::Connection;
use streaming_etl_core::{ByTable, EtlError, Result};

use crate::params::TableName;

/// DuckDB's name for a DuckLake in `duckdb_databases().type`.
const DUCKLAKE: &str = "ducklake";
/// DuckDB's name for its own storage (a database file or memory).
const DUCKDB: &str = "duckdb";

/// The catalog a job writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputCatalog {
    /// Its name as attached (`memory`, the file's stem, `lake`, ...).
    pub name: String,
    /// `duckdb_databases().type`: `duckdb`, `ducklake`, `postgres`, `sqlite`, ...
    pub kind: String,
}

impl OutputCatalog {
    /// DuckDB's own storage: primary keys, `INSERT OR REPLACE`, a marker table kept to one row
    /// per job. Elsewhere (DuckLake has no keys) upserts are a `MERGE` and the marker table is
    /// only appended to, since a delete in a lake is a file of its own and a point of conflict.
    pub fn has_keys(&self) -> bool {
        self.kind == DUCKDB
    }

    pub fn is_ducklake(&self) -> bool {
        self.kind == DUCKLAKE
    }
}

fn duck(e: duckdb::Error) -> EtlError {
    EtlError::Duck(e.to_string())
}

/// Every attached database (as an `OutputCatalog`: its name and type), and the default one.
fn attached(conn: &Connection) -> Result<(Vec<OutputCatalog>, String)> {
    let mut stmt = conn
        .prepare("SELECT database_name, type FROM duckdb_databases()")
        .map_err(duck)?;
    let all = stmt
        .query_map([], |r| {
            Ok(OutputCatalog {
                name: r.get(0)?,
                kind: r.get(1)?,
            })
        })
        .map_err(duck)?
        .collect::<duckdb::Result<Vec<_>>>()
        .map_err(duck)?;
    let current: String = conn
        .query_row("SELECT current_database()", [], |r| r.get(0))
        .map_err(duck)?;
    Ok((all, current))
}

fn has_schema(conn: &Connection, catalog: &str, schema: &str) -> Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM duckdb_schemas() WHERE lower(database_name) = lower(?) AND lower(schema_name) = lower(?)",
        duckdb::params![catalog, schema],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
    .map_err(duck)
}

/// The catalog a table name resolves to, as DuckDB's binder resolves it: `c.s.t` is in `c`;
/// `a.t` is schema `a` of the default catalog when that schema exists, else catalog `a`; `t` is
/// in the default catalog (the database's own, for the extension's connections).
fn catalog_of<'a>(
    conn: &Connection,
    all: &'a [OutputCatalog],
    current: &str,
    param: &'static str,
    name: &TableName,
) -> Result<&'a OutputCatalog> {
    let find = |c: &str| all.iter().find(|a| a.name.eq_ignore_ascii_case(c));
    let wanted = match name.parts.as_slice() {
        [catalog, _, _] => catalog.as_str(),
        [first, _] if !has_schema(conn, current, first)? && find(first).is_some() => first,
        _ => current,
    };
    find(wanted).ok_or_else(|| {
        EtlError::invalid(
            param,
            format!("no catalog named '{wanted}' is attached (ATTACH it first)"),
            format!("'{}'", name.parts.join(".")),
        )
    })
}

/// The one catalog of a job's tables; an error naming the table that is elsewhere.
pub fn resolve(conn: &Connection, tables: &ByTable<TableName>) -> Result<OutputCatalog> {
    let (all, current) = attached(conn)?;
    let windows = catalog_of(conn, &all, &current, "windows_table", &tables.windows)?;
    for (param, name) in [
        ("late_table", &tables.late),
        ("dead_letter_table", &tables.dead),
    ] {
        let other = catalog_of(conn, &all, &current, param, name)?;
        if !other.name.eq_ignore_ascii_case(&windows.name) {
            return Err(EtlError::invalid(
                param,
                format!(
                    "is in catalog '{}' but windows_table is in '{}': one transaction writes one catalog, so a cycle's output must be in one; name tables of one catalog",
                    other.name, windows.name
                ),
                format!("'{}'", name.parts.join(".")),
            ));
        }
    }
    Ok(windows.clone())
}

/// Checks that a job's statements' targets (`targets`: each as shown and as named) are all in
/// `catalog`, the catalog of its other tables: a cycle commits all of them in one transaction.
pub fn check_targets(
    conn: &Connection,
    catalog: &OutputCatalog,
    targets: &[(String, TableName)],
) -> Result<()> {
    let (all, current) = attached(conn)?;
    for (shown, name) in targets {
        let other = catalog_of(conn, &all, &current, "sql", name)?;
        if !other.name.eq_ignore_ascii_case(&catalog.name) {
            return Err(EtlError::Statement {
                target: shown.clone(),
                message: format!(
                    "{shown} is in catalog '{}' and the job's other tables in '{}': a cycle commits every statement's rows in one transaction, which writes one catalog; INSERT INTO tables of one catalog",
                    other.name, catalog.name
                ),
            });
        }
    }
    Ok(())
}
