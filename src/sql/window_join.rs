//! A **window join**: the stream read twice, both reads in the same TUMBLE or HOP window, joined
//! on their `window_start` (`FROM TUMBLE(stream, ...) AS a JOIN TUMBLE(stream, ...) AS b ON ...
//! AND a.window_start = b.window_start`, INNER, LEFT, RIGHT, FULL, SEMI or ANTI). Every event is
//! staged under its window; as the watermark passes a window's end plus the lateness, the
//! statement itself runs over that window's events, read as both sides: DuckDB's batch join
//! over the events placed in the window. Its WHERE and ON read both sides, so they run then,
//! not as each event is read; a late event goes to the late table.
#![forbid(unsafe_code)]

use serde_json::Value;
use streaming_etl_core::{EngineConfig, EtlError, Result};

use super::ast;
use super::duck;
use super::on_duckdb::select_last;
use super::staged::retracted;
use super::statement::{stage_every_event, Body, SqlStatement, Statement};
use crate::params::quote_ident;

/// Plans a window join: the engine keeps no keys (the join's are DuckDB's, at close).
pub(super) fn plan(
    mut st: Statement<'_>,
    cfg: &mut EngineConfig,
    key: Vec<String>,
) -> Result<SqlStatement> {
    let Some(other) = st.sh.join.clone() else {
        return Err(st.fail("a window join without its second side"));
    };
    if !st.sh.grouped && cfg.revisions() {
        // (A running row of an outer join's unmatched event would stay once it is matched.)
        return Err(st.fail("a window join that selects its joined rows writes each window's rows once, as it closes: emit := 'update' and late_updates_ms need GROUP BY window_start, ... (each window's rows replaced by their key)"));
    }
    cfg.keys = Vec::new();
    cfg.columns = std::mem::take(&mut st.used);
    stage_every_event(cfg, &st.typing)?;
    // The row step stages every event with its columns (and its event_time, which either side
    // may read).
    let mut items: Vec<String> = cfg
        .staged_schema()
        .columns
        .iter()
        .map(|c| format!("e.{}", quote_ident(&c.name)))
        .collect();
    if !items
        .iter()
        .any(|i| i == "e.\"event_time\"" || i == "e.event_time")
    {
        items.push("e.event_time".into());
    }
    let row_sql = format!("SELECT {} FROM __se_events AS e", items.join(", "));
    let rows = duck::describe(st.conn, &row_sql).map_err(|m| st.fail(m))?;
    let close_node = close(&st, &other)?;
    let close_sql = duck::print(st.conn, &st.answer, &close_node).map_err(|m| st.fail(m))?;
    let retract = retracted(&st, &[]);
    let columns = std::mem::take(&mut st.columns);
    // (Joined rows are appended: each is written once, and two may be alike.)
    let key = if st.sh.grouped { key } else { Vec::new() };
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

/// The close query: the statement with both reads of the stream replaced by a closing window's
/// staged events (`__se_m`, under the names the statement gives them), grouped by the window
/// row (`__se_w`, of whichever side a row has) too, which it selects last.
fn close(st: &Statement<'_>, other: &str) -> Result<Value> {
    let first = st.sh.stream.as_str();
    let (a, b) = (quote_ident(first), quote_ident(other));
    // (A SEMI or ANTI join's rows are its left side's; an outer join's, either side's.)
    let kind = st
        .node
        .get("from_table")
        .map(|f| ast::text(f, "join_type").to_ascii_uppercase())
        .unwrap_or_default();
    let window_row = match kind.as_str() {
        "RIGHT" => format!("{b}.__se_w"),
        "OUTER" | "FULL" => format!("coalesce({a}.__se_w, {b}.__se_w)"),
        _ => format!("{a}.__se_w"),
    };
    let (_, template) = duck::parse(
        st.conn,
        &format!("SELECT {window_row} FROM __se_m AS {a}, __se_m AS {b}"),
    )
    .map_err(EtlError::Duck)?;
    let w = template
        .get("select_list")
        .and_then(Value::as_array)
        .and_then(|l| l.first())
        .cloned()
        .unwrap_or(Value::Null);
    let mut relations = Vec::new();
    let mut joins = Vec::new();
    if let Some(from) = template.get("from_table") {
        ast::table_refs(from, &mut relations, &mut joins);
    }
    // Both sides of a joined pair are one window row's events: with `subscribe` a partition's
    // windows are its own, and two partitions' windows of one start are not joined.
    let (_, same_window) = duck::parse(
        st.conn,
        &format!(
            "SELECT 1 FROM __se_m AS {a} JOIN __se_m AS {b} ON (true) AND {a}.__se_w = {b}.__se_w"
        ),
    )
    .map_err(EtlError::Duck)?;
    let mut same_window = same_window
        .get("from_table")
        .and_then(|f| f.get("condition"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut out = st.node.clone();
    if let Some(from) = out.get_mut("from_table") {
        let on = from.get("condition").cloned().unwrap_or(Value::Null);
        if let Some(first) = same_window
            .get_mut("children")
            .and_then(Value::as_array_mut)
            .and_then(|c| c.first_mut())
        {
            *first = on;
        }
        if let Some(o) = from.as_object_mut() {
            o.insert("condition".into(), same_window);
        }
        for (side, read) in ["left", "right"].iter().zip(&relations) {
            if let Some(t) = from.get_mut(*side) {
                let name = ast::text(t, "alias").to_string();
                // (Each side keeps its own name: the template's reads are in the same order.)
                let mut m = read.node.clone();
                if let Some(o) = m.as_object_mut() {
                    o.insert("alias".into(), Value::from(name));
                }
                *t = m;
            }
        }
    }
    select_last(&mut out, w);
    Ok(out)
}
