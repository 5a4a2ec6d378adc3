//! A **staged** statement: a windowed statement DuckDB computes (joins with lookup tables,
//! WHERE, any aggregate). Every event the engine read is staged with what it did with it
//! (placed, late, applied). In the cycle's transaction DuckDB runs the statement's FROM (its
//! joins read the lookup tables as of that cycle) and WHERE over the cycle's events, keeping the
//! columns the SELECT list, GROUP BY and HAVING read (`row_step`); late events that pass go to
//! the late table; the placed ones are staged until their windows close, and a closing window's
//! rows are the statement's own SELECT ... GROUP BY over its staged rows (`close`): DuckDB's
//! batch query over the events placed in that window.
#![forbid(unsafe_code)]

use streaming_etl_core::{EngineConfig, Result, TypedColumn};

use super::ast;
use super::duck;
use super::on_duckdb::{close, row_step};
use super::on_engine::stream_column_of;
use super::statement::{stage_every_event, Body, SqlStatement, Statement};

/// Plans a staged statement: its row step and its close, and what a retracted window row
/// writes.
pub(super) fn plan(
    mut st: Statement<'_>,
    cfg: &mut EngineConfig,
    key_cols: &[TypedColumn],
    key: Vec<String>,
) -> Result<SqlStatement> {
    let mut used = std::mem::take(&mut st.used);
    for k in key_cols {
        if !used.iter().any(|u| u.name == k.name) {
            used.push(k.clone());
        }
    }
    cfg.columns = used;
    stage_every_event(cfg, &st.typing)?;
    let staged_names: Vec<String> = cfg
        .staged_schema()
        .columns
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let row_node = row_step(&st.node, &st.sh, &staged_names, st.conn)?;
    let row_sql = duck::print(st.conn, &st.answer, &row_node).map_err(|m| st.fail(m))?;
    let rows = duck::describe(st.conn, &row_sql).map_err(|m| st.fail(m))?;
    let close_node = close(&st.node, &st.sh, st.conn)?;
    let close_sql = duck::print(st.conn, &st.answer, &close_node).map_err(|m| st.fail(m))?;
    let retract = retracted(&st, key_cols);
    let columns = std::mem::take(&mut st.columns);
    Ok(st.planned(
        columns,
        key,
        Body::Staged {
            row_step: row_sql,
            rows,
            close: close_sql,
        },
        retract,
    ))
}

/// What a retracted window row (a session merged into another) writes in each of the
/// statement's columns: its window bounds and its keys (`key_cols`, the engine's) from the
/// engine's row (`r.c0, ...`), NULL elsewhere.
pub(super) fn retracted(st: &Statement<'_>, key_cols: &[TypedColumn]) -> Vec<String> {
    st.sh
        .select
        .iter()
        .zip(&st.described)
        .map(|((_, e), (_, ty))| {
            let bound = ast::column_names(e).and_then(|n| n.last().map(|c| c.to_ascii_lowercase()));
            match bound.as_deref() {
                Some("window_start") => "make_timestamptz(r.c0 * 1000)".to_string(),
                Some("window_end") => "make_timestamptz(r.c1 * 1000)".to_string(),
                _ => match stream_column_of(e, &st.sh, key_cols)
                    .and_then(|c| key_cols.iter().position(|k| k.name == c.name))
                {
                    Some(k) => format!("CAST(r.c{} AS {ty})", 2 + k),
                    None => format!("CAST(NULL AS {ty})"),
                },
            }
        })
        .collect()
}
