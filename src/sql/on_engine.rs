//! The engine's part of a windowed statement: its keys (the GROUP BY items that are stream
//! columns) and, for a statement that says what a parameter job says, its aggregates and the
//! projection of its rows into the statement's columns (the fast path: same rows, same speed).
#![forbid(unsafe_code)]

use serde_json::Value;
use streaming_etl_core::{AggSpec, Repr, TypedColumn};

use super::ast;
use super::shape::Shape;

/// The engine's count of a window's events, which a job written as SQL does not write.
pub(super) fn placeholder() -> AggSpec {
    AggSpec::parse("count(*) AS __se_n").unwrap_or_else(|_| AggSpec::duckdb("count(*)", "__se_n"))
}

pub(super) fn calls_aggregate(v: &Value, is_aggregate: &dyn Fn(&str) -> bool) -> bool {
    ast::any(v, &|m| {
        m.get("class").and_then(Value::as_str) == Some("FUNCTION")
            && m.get("function_name")
                .and_then(Value::as_str)
                .is_some_and(|f| f == "count_star" || is_aggregate(f))
    })
}

/// The typed stream column an expression is exactly (a bare or stream-qualified reference).
pub(super) fn stream_column_of<'c>(
    e: &Value,
    sh: &Shape,
    typed: &'c [TypedColumn],
) -> Option<&'c TypedColumn> {
    let n = ast::column_names(e)?;
    let col = match n.as_slice() {
        [rel, col] if rel.eq_ignore_ascii_case(&sh.stream) => col,
        [col] if sh.lookups.is_empty() => col,
        _ => return None,
    };
    typed.iter().find(|c| c.name.eq_ignore_ascii_case(col))
}

/// The upsert key: the target columns that are GROUP BY items (window_start among them, not
/// window_end, which follows from it).
pub(super) fn upsert_key(
    sh: &Shape,
    columns: &[(String, String)],
    is_aggregate: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut key = Vec::new();
    for (i, (_, e)) in sh.select.iter().enumerate() {
        let grouped = match &sh.group_by {
            None => !calls_aggregate(e, is_aggregate),
            Some(g) => g.iter().any(|g| same_expr(g, e)),
        };
        let is_end = ast::column_names(e).is_some_and(|n| {
            n.last()
                .is_some_and(|c| c.eq_ignore_ascii_case("window_end"))
        });
        if grouped && !is_end {
            if let Some((n, _)) = columns.get(i) {
                key.push(n.clone());
            }
        }
    }
    key
}

/// Whether two expression nodes are the same expression (positions aside).
fn same_expr(a: &Value, b: &Value) -> bool {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !k.starts_with("query_location") && k.as_str() != "alias")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            v => v.clone(),
        }
    }
    let lower = |v: Value| Value::String(v.to_string().to_ascii_lowercase());
    lower(strip(a)) == lower(strip(b))
}

/// The engine's aggregates and the projection of its rows, when the statement says what a
/// parameter job says: built-in aggregates (count, sum, min, max, avg) over DOUBLE stream
/// columns, keys that are stream columns, no join, WHERE or HAVING.
pub(super) fn engine_aggregates(
    sh: &Shape,
    keys: &[TypedColumn],
    typed: &[TypedColumn],
    described: &[(String, String)],
    is_aggregate: &dyn Fn(&str) -> bool,
    other_keys: bool,
) -> Option<(Vec<AggSpec>, Vec<String>)> {
    if other_keys || !sh.lookups.is_empty() || sh.has_where || !sh.joins.is_empty() {
        return None;
    }
    let mut aggs = Vec::new();
    let mut projection = Vec::new();
    for ((_, e), (_, ty)) in sh.select.iter().zip(described) {
        if let Some(n) = ast::column_names(e) {
            let last = n.last()?.to_ascii_lowercase();
            match last.as_str() {
                "window_start" if n.len() == 1 || n[0].eq_ignore_ascii_case(&sh.stream) => {
                    projection.push("make_timestamptz(c0 * 1000)".into());
                    continue;
                }
                "window_end" if n.len() == 1 || n[0].eq_ignore_ascii_case(&sh.stream) => {
                    projection.push("make_timestamptz(c1 * 1000)".into());
                    continue;
                }
                _ => {}
            }
            let c = stream_column_of(e, sh, typed)?;
            let k = keys.iter().position(|k| k.name == c.name)?;
            projection.push(format!("CAST(c{} AS {ty})", 2 + k));
            continue;
        }
        if ast::class(e) != "FUNCTION" || e.get("distinct").and_then(Value::as_bool) == Some(true) {
            return None;
        }
        if e.get("filter").is_some_and(|f| !f.is_null()) {
            return None;
        }
        let ordered = e
            .get("order_bys")
            .and_then(|o| o.get("orders"))
            .and_then(Value::as_array)
            .is_some_and(|o| !o.is_empty());
        if ordered {
            return None;
        }
        let f = ast::text(e, "function_name").to_ascii_lowercase();
        if !is_aggregate(&f) && f != "count_star" {
            return None;
        }
        let args = ast::arguments(e);
        // The engine's aggregates read a field: one two typed columns read (as two types) is
        // DuckDB's to aggregate, by the column's name.
        let shared = |c: &TypedColumn| typed.iter().filter(|t| t.path == c.path).count() > 1;
        if args
            .iter()
            .any(|(_, a)| stream_column_of(a, sh, typed).is_some_and(shared))
        {
            return None;
        }
        let name = format!("__se_a{}", aggs.len());
        let spec = match (f.as_str(), args.as_slice()) {
            ("count_star", []) => format!("count(*) AS {name}"),
            ("count", [(_, a)]) => format!(
                "count({}) AS {name}",
                stream_column_of(a, sh, typed)?.path.as_str()
            ),
            ("sum" | "min" | "max" | "avg", [(_, a)]) => {
                let c = stream_column_of(a, sh, typed)?;
                if c.repr != Repr::Double || c.sql_type != "DOUBLE" {
                    return None;
                }
                format!("{f}({}) AS {name}", c.path.as_str())
            }
            _ => return None,
        };
        let spec = AggSpec::parse(&spec).ok()?;
        projection.push(format!("CAST(c{} AS {ty})", 2 + keys.len() + aggs.len()));
        aggs.push(spec);
    }
    if aggs.is_empty() {
        aggs.push(placeholder());
    }
    Some((aggs, projection))
}
