//! DuckDB's part of a statement, the SQL it runs each cycle, made at bind time by editing the
//! statement's parse tree: the cycle's events as the statement reads them (`__se_events`), the
//! row step (the statement's FROM and WHERE over them, keeping what its SELECT list, GROUP BY
//! and HAVING read) and the close query (its SELECT ... GROUP BY over a closing window's rows).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use duckdb::Connection;
use serde_json::Value;
use streaming_etl_core::{EngineConfig, EtlError, Repr, Result, Role};

use super::ast;
use super::duck;
use super::shape::{Ref, Shape, BOUNDS, STREAM_COLUMNS};
use crate::params::{quote_ident, transform_spec};

/// The columns of the cycle's events (`__se_events`) for a job's engine: name, type, and the
/// expression over the engine's staged rows (`c0, ...`) that gives it.
pub fn events_columns(cfg: &EngineConfig) -> Vec<(String, String, String)> {
    let schema = cfg.staged_schema();
    let mut out = Vec::new();
    for (i, c) in schema.columns.iter().enumerate() {
        let v = format!("c{i}");
        let (ty, expr) = match &c.role {
            Role::Cast(t) if matches!(Repr::of(t), Repr::Json { .. }) => (
                t.clone(),
                format!("json_transform_strict({v}, {})", transform_spec(t)),
            ),
            Role::Cast(t) => (t.clone(), format!("CAST({v} AS {t})")),
            _ => (c.ty.sql().to_string(), v),
        };
        if let Some(k) = cfg.keys.iter().find(|k| k.name == c.name) {
            // A key is also the stream column it is.
            if let Some(col) = cfg.typed_key(k) {
                out.push((col.name.clone(), ty.clone(), expr.clone()));
            }
        }
        out.push((c.name.clone(), ty, expr));
    }
    out.push((
        "event_time".into(),
        STREAM_COLUMNS[0].1.into(),
        format!(
            "make_timestamptz(c{} * 1000)",
            schema
                .columns
                .iter()
                .position(|c| c.name == "event_time_ms")
                .unwrap_or(0)
        ),
    ));
    super::debezium::events(cfg, out)
}

/// The query node with the stream's table reference replaced by the cycle's events, under the
/// name the statement reads the stream by.
pub(super) fn replace_stream(node: &Value, sh: &Shape, conn: &Connection) -> Result<Value> {
    let (_, template) = duck::parse(
        conn,
        &format!("SELECT * FROM __se_events AS {}", quote_ident(&sh.stream)),
    )
    .map_err(EtlError::Duck)?;
    let events = template.get("from_table").cloned().unwrap_or(Value::Null);
    let mut out = node.clone();
    if let Some(from) = out.get_mut("from_table") {
        replace_in_from(from, &events);
    }
    Ok(out)
}

fn replace_in_from(from: &mut Value, events: &Value) -> bool {
    match ast::kind(from) {
        "JOIN" => {
            for side in ["left", "right"] {
                if let Some(s) = from.get_mut(side) {
                    if replace_in_from(s, events) {
                        return true;
                    }
                }
            }
            false
        }
        "BASE_TABLE" if ast::text(from, "table_name").eq_ignore_ascii_case("stream") => {
            *from = events.clone();
            true
        }
        "TABLE_FUNCTION" => {
            *from = events.clone();
            true
        }
        _ => false,
    }
}

/// The name a reference is staged under: `__se_v<n>`, its place among the statement's
/// references (a plain name: a lake's Parquet files take no dots in a column's name).
fn staged(sh: &Shape, r: &Ref) -> String {
    let n = sh.refs.iter().position(|x| x == r).unwrap_or(0);
    format!("__se_v{n}")
}

/// The row step: the statement's FROM and WHERE over the cycle's events, selecting the engine's
/// columns of each event (`engine`) and the columns the statement's SELECT list, GROUP BY and
/// HAVING read.
pub(super) fn row_step(
    node: &Value,
    sh: &Shape,
    engine: &[String],
    conn: &Connection,
) -> Result<Value> {
    let s = quote_ident(&sh.stream);
    let mut items: Vec<String> = engine
        .iter()
        .map(|n| format!("{s}.{}", quote_ident(n)))
        .collect();
    for r in &sh.refs {
        let expr = match &r.relation {
            Some(rel) => format!("{}.{}", quote_ident(rel), quote_ident(&r.column)),
            None => quote_ident(&r.column),
        };
        items.push(format!("{expr} AS {}", quote_ident(&staged(sh, r))));
    }
    let (_, template) = duck::parse(
        conn,
        &format!("SELECT {} FROM __se_events AS {s}", items.join(", ")),
    )
    .map_err(EtlError::Duck)?;
    let mut out = replace_stream(node, sh, conn)?;
    if let (Some(o), Some(t)) = (out.as_object_mut(), template.as_object()) {
        for field in [
            "select_list",
            "group_expressions",
            "group_sets",
            "aggregate_handling",
            "having",
            "modifiers",
            "qualify",
        ] {
            if let Some(v) = t.get(field) {
                o.insert(field.into(), v.clone());
            }
        }
    }
    Ok(out)
}

/// The close query: the statement's SELECT list, GROUP BY and HAVING over a closing window's
/// staged rows (`__se_m`), its references renamed to the staged columns, grouped by the window
/// row (`__se_w`) too, which it selects last.
pub(super) fn close(node: &Value, sh: &Shape, conn: &Connection) -> Result<Value> {
    let (_, template) = duck::parse(conn, "SELECT __se_w FROM __se_m").map_err(EtlError::Duck)?;
    let staged_names: BTreeMap<String, String> = sh
        .refs
        .iter()
        .map(|r| {
            let key = match &r.relation {
                Some(rel) => format!(
                    "{}.{}",
                    rel.to_ascii_lowercase(),
                    r.column.to_ascii_lowercase()
                ),
                None => r.column.to_ascii_lowercase(),
            };
            (key, staged(sh, r))
        })
        .collect();
    let relations: Vec<String> = std::iter::once(sh.stream.clone())
        .chain(sh.lookups.iter().cloned())
        .collect();
    let stream = sh.stream.clone();
    let rename = move |names: &[String]| -> Option<Vec<String>> {
        let bound = |c: &str| {
            BOUNDS
                .iter()
                .find(|b| b.eq_ignore_ascii_case(c))
                .map(|b| b.to_string())
        };
        match names {
            [rel, col, rest @ ..] if rel.eq_ignore_ascii_case(&stream) && bound(col).is_some() => {
                Some(
                    std::iter::once(bound(col)?)
                        .chain(rest.iter().cloned())
                        .collect(),
                )
            }
            [rel, col, rest @ ..] if relations.iter().any(|r| r.eq_ignore_ascii_case(rel)) => {
                let s = staged_names.get(&format!(
                    "{}.{}",
                    rel.to_ascii_lowercase(),
                    col.to_ascii_lowercase()
                ))?;
                Some(
                    std::iter::once(s.clone())
                        .chain(rest.iter().cloned())
                        .collect(),
                )
            }
            [col, rest @ ..] => {
                let s = staged_names.get(&col.to_ascii_lowercase())?;
                Some(
                    std::iter::once(s.clone())
                        .chain(rest.iter().cloned())
                        .collect(),
                )
            }
            [] => None,
        }
    };
    let mut out = node.clone();
    let w = template
        .get("select_list")
        .and_then(Value::as_array)
        .and_then(|l| l.first())
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(o) = out.as_object_mut() {
        for field in ["select_list", "group_expressions", "having"] {
            if let Some(v) = o.get_mut(field) {
                ast::rename_refs(v, &[], &rename);
            }
        }
        if let Some(from) = template.get("from_table") {
            o.insert("from_table".into(), from.clone());
        }
        o.insert("where_clause".into(), Value::Null);
    }
    select_last(&mut out, w);
    Ok(out)
}

/// Appends `item` to a query node's SELECT list, and to its GROUP BY when it has an explicit
/// one (the window row a close query selects last and groups by).
pub(super) fn select_last(node: &mut Value, item: Value) {
    let Some(o) = node.as_object_mut() else {
        return;
    };
    if let Some(l) = o.get_mut("select_list").and_then(Value::as_array_mut) {
        l.push(item.clone());
    }
    let explicit = o
        .get("group_expressions")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty());
    if explicit {
        let g = o
            .get("group_expressions")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if let Some(l) = o.get_mut("group_expressions").and_then(Value::as_array_mut) {
            l.push(item);
        }
        if let Some(sets) = o.get_mut("group_sets").and_then(Value::as_array_mut) {
            for set in sets.iter_mut() {
                if let Some(s) = set.as_array_mut() {
                    s.push(Value::from(g as u64));
                }
            }
        }
    }
}
