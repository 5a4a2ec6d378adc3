//! A **window join**: the stream read twice, both reads in the same TUMBLE or HOP window, joined
//! on their `window_start` (`FROM TUMBLE(stream, ...) AS a JOIN TUMBLE(stream, ...) AS b ON ...
//! AND a.window_start = b.window_start`, INNER, LEFT, RIGHT, FULL, SEMI or ANTI). Every event is
//! staged under its window; as the watermark passes a window's end plus the lateness, the
//! statement itself runs over that window's events, read as both sides: DuckDB's batch join
//! over the events placed in the window. Its WHERE and ON read both sides, so they run then,
//! not as each event is read; a late event goes to the late table.
#![forbid(unsafe_code)]

use serde_json::Value;
use streaming_etl_core::{EngineConfig, EtlError, NullTest, NullTests, Result};

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
    let staged: Vec<String> = cfg
        .staged_schema()
        .columns
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let (row_sql, prefilter) = either_side(&st, &items, &staged)?;
    // (Only typed columns' NULL tests: the engine reads them before the row step.)
    cfg.prefilter = prefilter
        .into_iter()
        .map(|all| {
            all.into_iter()
                .filter(|t| {
                    cfg.columns
                        .iter()
                        .any(|c| c.name.eq_ignore_ascii_case(&t.column))
                })
                .map(|t| {
                    let column = cfg
                        .columns
                        .iter()
                        .find(|c| c.name.eq_ignore_ascii_case(&t.column))
                        .map_or(t.column.clone(), |c| c.name.clone());
                    NullTest { column, ..t }
                })
                .collect()
        })
        .collect();
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

/// The row step: the events that either side can read, by the conditions of one side alone that
/// the join's kind lets filter that side's events (an INNER join's ON and WHERE, the WHERE of the
/// side an outer join keeps, the ON of the side it may leave unmatched, and a key compared with
/// `=` in ON not NULL on a side the ON filters). An event neither side can read is not staged,
/// as a WHERE drops an event of another statement: it is neither in a window nor late. A FULL
/// join filters nothing (each side's events decide which of the other's are matched).
///
/// Also returns the NULL tests among those conditions, by side (none: every event), which the
/// engine applies before the row step.
fn either_side(
    st: &Statement<'_>,
    items: &[String],
    staged: &[String],
) -> Result<(String, NullTests)> {
    let every = || {
        Ok((
            format!("SELECT {} FROM __se_events AS e", items.join(", ")),
            Vec::new(),
        ))
    };
    let Some(from) = st.node.get("from_table") else {
        return every();
    };
    let alias = |side: &str| from.get(side).map(|t| ast::text(t, "alias").to_string());
    let (Some(left), Some(right)) = (alias("left"), alias("right")) else {
        return every();
    };
    if left.is_empty() || right.is_empty() || left.eq_ignore_ascii_case(&right) {
        return every();
    }
    // Which conjuncts filter which side: (ON, WHERE) for the left side, then the right.
    let (on_left, where_left, on_right, where_right) =
        match ast::text(from, "join_type").to_ascii_uppercase().as_str() {
            "INNER" => (true, true, true, true),
            "LEFT" | "SEMI" | "ANTI" => (false, true, true, false),
            "RIGHT" => (true, false, false, true),
            _ => return every(),
        };
    let mut on = Vec::new();
    conjuncts(from.get("condition"), &mut on);
    let mut filter = Vec::new();
    conjuncts(st.node.get("where_clause"), &mut filter);
    let side_of = |c: &Value| -> Option<bool> {
        // (Only conjuncts of plain column references to staged columns, of one side, without
        // subqueries.)
        if ast::any(c, &|m| {
            m.get("class").and_then(Value::as_str) == Some("SUBQUERY")
        }) {
            return None;
        }
        let mut refs = Vec::new();
        ast::column_refs(c, &[], &mut refs);
        let mut sides = refs.iter().map(|r| match r.as_slice() {
            [rel, col] if staged.iter().any(|s| s.eq_ignore_ascii_case(col)) => {
                if rel.eq_ignore_ascii_case(&left) {
                    Some(true)
                } else if rel.eq_ignore_ascii_case(&right) {
                    Some(false)
                } else {
                    None
                }
            }
            _ => None,
        });
        let first = sides.next()??;
        sides.all(|s| s == Some(first)).then_some(first)
    };
    let mut sides: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    let mut not_null: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut tests: [Vec<NullTest>; 2] = [Vec::new(), Vec::new()];
    for (list, for_left, for_right) in
        [(&on, on_left, on_right), (&filter, where_left, where_right)]
    {
        for c in list.iter() {
            let i = match side_of(c) {
                Some(true) if for_left => 0,
                Some(false) if for_right => 1,
                _ => continue,
            };
            sides[i].push(c.clone());
            if let Some(t) = null_test(c) {
                tests[i].push(t);
            }
        }
    }
    // A key compared with `=` in ON: an event whose key is NULL matches nothing.
    for c in on
        .iter()
        .filter(|c| ast::class(c) == "COMPARISON" && ast::kind(c) == "COMPARE_EQUAL")
    {
        for operand in [c.get("left"), c.get("right")].into_iter().flatten() {
            let Some(one) = Some(operand).filter(|o| ast::class(o) == "COLUMN_REF") else {
                continue;
            };
            let Some(left_side) = side_of(one) else {
                continue;
            };
            let (i, filtered) = if left_side {
                (0, on_left)
            } else {
                (1, on_right)
            };
            if filtered {
                if let Some(col) = ast::column_names(one).and_then(|n| n.last().cloned()) {
                    not_null[i].push(format!("e.{} IS NOT NULL", quote_ident(&col)));
                    tests[i].push(NullTest {
                        column: col,
                        not_null: true,
                    });
                }
            }
        }
    }
    if sides
        .iter()
        .zip(&not_null)
        .any(|(c, n)| c.is_empty() && n.is_empty())
    {
        return every();
    }
    // The conjuncts go in as placeholders (`"__se_c<n>"`) replaced by their nodes, each side's
    // references renamed to the event's.
    let mut placed: Vec<Value> = Vec::new();
    let mut terms = Vec::new();
    for (i, (cs, nn)) in sides.iter().zip(&not_null).enumerate() {
        let mut and: Vec<String> = nn.clone();
        for c in cs {
            let mut c = c.clone();
            let name = if i == 0 { &left } else { &right };
            ast::rename_refs(&mut c, &[], &|n: &[String]| match n {
                [rel, col] if rel.eq_ignore_ascii_case(name) => Some(vec!["e".into(), col.clone()]),
                _ => None,
            });
            and.push(format!("\"__se_c{}\"", placed.len()));
            placed.push(c);
        }
        terms.push(format!("({})", and.join(" AND ")));
    }
    let text = format!(
        "SELECT {} FROM __se_events AS e WHERE {}",
        items.join(", "),
        terms.join(" OR ")
    );
    let (answer, mut node) = duck::parse(st.conn, &text).map_err(EtlError::Duck)?;
    if let Some(w) = node.get_mut("where_clause") {
        splice(w, &placed);
    }
    let sql = duck::print(st.conn, &answer, &node).map_err(|m| st.fail(m))?;
    Ok((sql, tests.into_iter().collect()))
}

/// `x.c IS [NOT] NULL` as a test of column `c`.
fn null_test(c: &Value) -> Option<NullTest> {
    let not_null = match (ast::class(c), ast::kind(c)) {
        ("OPERATOR", "OPERATOR_IS_NOT_NULL") => true,
        ("OPERATOR", "OPERATOR_IS_NULL") => false,
        _ => return None,
    };
    let [only] = c.get("children").and_then(Value::as_array)?.as_slice() else {
        return None;
    };
    let column = ast::column_names(only)?.last()?.clone();
    Some(NullTest { column, not_null })
}

/// The conjuncts of an AND tree.
fn conjuncts(v: Option<&Value>, out: &mut Vec<Value>) {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return;
    };
    if ast::class(v) == "CONJUNCTION" && ast::kind(v) == "CONJUNCTION_AND" {
        for c in v
            .get("children")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            conjuncts(Some(c), out);
        }
    } else {
        out.push(v.clone());
    }
}

/// Replaces each placeholder reference `"__se_c<n>"` by the n-th node.
fn splice(v: &mut Value, placed: &[Value]) {
    if ast::class(v) == "COLUMN_REF" {
        let n = ast::column_names(v).filter(|n| n.len() == 1).and_then(|n| {
            n[0].strip_prefix("__se_c")
                .and_then(|k| k.parse::<usize>().ok())
        });
        if let Some(node) = n.and_then(|k| placed.get(k)) {
            *v = node.clone();
        }
        return;
    }
    match v {
        Value::Object(m) => m.values_mut().for_each(|c| splice(c, placed)),
        Value::Array(items) => items.iter_mut().for_each(|c| splice(c, placed)),
        _ => {}
    }
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
