//! DuckDB's binder on a job's typed columns and aggregate expressions, at bind time, before
//! anything is read: each column's type as DuckDB names it (and one DuckDB's JSON reader can
//! produce), each aggregate DuckDB computes checked and typed by DuckDB itself. A bad one fails
//! the statement with DuckDB's message, after the parameter and the expression.

use duckdb::Connection;
use streaming_etl_core::{EngineConfig, EtlError, Repr, Result};

use crate::params::{quote_ident, transform_spec, EVENT_TIME};

/// The first lines of DuckDB's message (not the statement of the extension's own it quotes).
fn message(e: &duckdb::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("LINE "))
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines.join(" ")
}

fn one_text(conn: &Connection, sql: &str) -> std::result::Result<String, duckdb::Error> {
    conn.query_row(sql, [], |r| r.get::<_, String>(0))
}

/// Normalizes the job's typed column types, checks its typed keys and binds its DuckDB
/// aggregates (their result types). `engine`'s settings text for `columns` changes with the
/// normalized types: the caller recomputes the job's settings.
pub fn bind_typed(conn: &Connection, engine: &mut EngineConfig) -> Result<()> {
    if engine.columns.is_empty() {
        return Ok(());
    }
    for c in &mut engine.columns {
        let given = c.sql_type.clone();
        let bad = |why: String| {
            EtlError::invalid(
                "columns",
                why,
                format!("'{} AS {}': '{given}'", c.path.as_str(), c.name),
            )
        };
        let normal = one_text(conn, &format!("SELECT typeof(NULL::{given})"))
            .map_err(|e| bad(message(&e)))?;
        // DuckDB's JSON reader names a user's type (an ENUM) by its name, not its definition.
        let sql_type = [normal.as_str(), given.as_str()]
            .into_iter()
            .find(|t| {
                one_text(
                    conn,
                    &format!(
                        "SELECT typeof(json_transform_strict('null', {}))",
                        transform_spec(t)
                    ),
                )
                .is_ok()
            })
            .ok_or_else(|| {
                bad(format!(
                    "DuckDB's JSON reader cannot produce a {normal} from a JSON value"
                ))
            })?
            .to_string();
        c.repr = Repr::of(&normal);
        c.sql_type = sql_type;
    }
    for k in &engine.keys {
        if let Some(c) = engine.typed_key(k).filter(|c| !c.repr.keyable()) {
            return Err(EtlError::invalid(
                "group_by",
                format!(
                    "key column '{}' has type {}; a key must be of a scalar type (not JSON, a list, a struct, a map or a union)",
                    k.name, c.sql_type
                ),
                format!("'{} AS {}'", k.path.as_str(), k.name),
            ));
        }
    }
    let relation = relation(engine);
    let keys: Vec<String> = engine.keys.iter().map(|k| quote_ident(&k.name)).collect();
    let group = std::iter::once("__se_w".to_string())
        .chain(keys)
        .collect::<Vec<_>>()
        .join(", ");
    for a in &mut engine.aggregates {
        let name = a.name.clone();
        let Some(d) = a.duck.as_mut() else {
            continue;
        };
        let sql = format!(
            "SELECT column_type FROM (DESCRIBE SELECT ({}) AS __se_a FROM ({relation}) GROUP BY {group})",
            d.expr
        );
        d.sql_type = one_text(conn, &sql).map_err(|e| EtlError::InvalidExpression {
            name: "aggregates",
            expr: format!("{} AS {name}", d.expr),
            message: message(&e),
        })?;
    }
    Ok(())
}

/// A relation with the columns the aggregates DuckDB computes see: the row's number, the key
/// columns, `event_time_ms` and the typed columns, each of its type.
fn relation(engine: &EngineConfig) -> String {
    let mut cols = vec!["NULL::BIGINT AS __se_w".to_string()];
    for k in &engine.keys {
        let ty = engine
            .typed_key(k)
            .map_or("VARCHAR".to_string(), |c| c.sql_type.clone());
        cols.push(format!("NULL::{ty} AS {}", quote_ident(&k.name)));
    }
    cols.push(format!("NULL::BIGINT AS {EVENT_TIME}"));
    for c in engine.staged_values() {
        cols.push(format!("NULL::{} AS {}", c.sql_type, quote_ident(&c.name)));
    }
    format!("SELECT {}", cols.join(", "))
}
