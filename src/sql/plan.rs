//! A job written as SQL, planned at bind time: how each statement is split between the engine
//! and DuckDB, and the SQL DuckDB runs in each cycle.
//!
//! The engine reads the stream (decoding only the columns the statements use), keeps the
//! per-partition watermarks and places each event in its windows under them, keyed by the
//! statement's GROUP BY columns that are stream columns. What it then does depends on the
//! statement:
//! - **engine** (a statement that says what a parameter job says: built-in aggregates over
//!   DOUBLE stream columns, keys that are stream columns, no join, no WHERE): the engine
//!   computes the rows, and DuckDB only puts their columns in the statement's order and types;
//! - **staged** (anything else windowed): every event the engine read is staged with what it
//!   did with it (placed, late, applied). In the cycle's transaction DuckDB runs the statement's
//!   FROM (its joins read the lookup tables as of that cycle) and WHERE over the cycle's events,
//!   keeping the columns the SELECT list, GROUP BY and HAVING read (`row_step`); late events
//!   that pass go to the late table; the placed ones are staged until their windows close, and
//!   a closing window's rows are the statement's own SELECT ... GROUP BY over its staged rows
//!   (`close`): DuckDB's batch query over the events placed in that window;
//! - **transform** (no window): the statement itself, over the cycle's events.

use std::collections::{BTreeMap, HashSet};

use duckdb::Connection;
use serde_json::Value;
use streaming_etl_core::{
    AggSpec, EngineConfig, EtlError, KeyColumn, Repr, Result, Role, TypedColumn, WindowKind,
};

use super::ast;
use super::duck::{self, Typing};
use super::shape::{shape, Ref, Shape, WindowFn, BOUNDS};
use super::text::{statements, StatementText};
use crate::params::{quote_ident, transform_spec, TableName};

/// The window of a transform-only job (its windows are never written): a day, so that the
/// engine keeps one open window.
const TRANSFORM_WINDOW_MS: i64 = 86_400_000;

/// The stream's own columns besides the typed ones.
pub const STREAM_COLUMNS: [(&str, &str); 4] = [
    ("event_time", "TIMESTAMP WITH TIME ZONE"),
    ("event_time_ms", "BIGINT"),
    ("partition", "INTEGER"),
    ("offset", "BIGINT"),
];

/// A job written as SQL.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlJob {
    pub statements: Vec<SqlStatement>,
}

/// One statement: its target and how its rows are made.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlStatement {
    /// The target as the statement names it (shown in errors and in `late_events.output`).
    pub target_shown: String,
    pub target: TableName,
    /// The target's columns as the statement makes them: name and DuckDB type.
    pub columns: Vec<(String, String)>,
    /// Its key in `upsert` mode: the GROUP BY columns among them, and window_start.
    pub key: Vec<String>,
    pub body: Body,
    /// The statement as DuckDB prints it (what the job's settings keep).
    pub normalized: String,
    /// A staged statement's columns for a window row that is retracted (a session merged
    /// into another): its keys and bounds from the engine's row (`r.c0, ...`), NULL elsewhere.
    pub retract: Vec<String>,
}

/// How a statement's rows are made.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Its SQL over the cycle's events (`__se_events`).
    Transform { sql: String },
    /// The engine's window rows, each target column an expression over their columns `c0, ...`.
    Engine { projection: Vec<String> },
    /// DuckDB's, over the staged rows.
    Staged {
        /// The cycle's events through the statement's FROM and WHERE (over `__se_events`).
        row_step: String,
        /// Its columns (the staged table's): name and type.
        rows: Vec<(String, String)>,
        /// The statement's SELECT ... GROUP BY over `__se_m` (a closing window's staged rows
        /// with `__se_w`, `window_start`, `window_end`); its last column is `__se_w`.
        close: String,
    },
}

impl SqlJob {
    /// What the job's settings keep of it: each statement's target and text as DuckDB prints it.
    pub fn setting(&self) -> String {
        let shown: Vec<String> = self
            .statements
            .iter()
            .map(|s| format!("INSERT INTO {} {}", s.target_shown, s.normalized))
            .collect();
        shown.join("; ").replace('\n', " ")
    }
}

fn stmt_err(target: &str, message: impl Into<String>) -> EtlError {
    EtlError::Statement {
        target: target.to_string(),
        message: message.into(),
    }
}

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
    out
}

/// The stream as a statement sees it: the typed columns, then its own.
fn stream_columns(cfg: &EngineConfig) -> Vec<(String, String)> {
    let mut cols: Vec<(String, String)> = cfg
        .columns
        .iter()
        .map(|c| (c.name.clone(), c.sql_type.clone()))
        .collect();
    cols.extend(
        STREAM_COLUMNS
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string())),
    );
    cols
}

/// What planning a job needs besides the connection.
pub struct Given<'a> {
    pub text: &'a str,
    /// `windows_table`: where a bare SELECT writes.
    pub windows_table: &'a TableName,
    pub subscribe: bool,
}

/// Plans a job's statements and configures its engine for them (`cfg`: the typed columns
/// bound by DuckDB, the time settings; its window, keys and aggregates are set here).
pub fn plan(conn: &Connection, given: &Given<'_>, cfg: &mut EngineConfig) -> Result<SqlJob> {
    let texts = statements(given.text).map_err(|e| {
        EtlError::invalid(
            "sql",
            format!("the statement text {}", e.0),
            shorten(given.text),
        )
    })?;
    if texts.len() > 1 {
        return Err(EtlError::invalid(
            "sql",
            "holds several statements; a job runs one statement (INSERT INTO <table> SELECT ...)",
            shorten(given.text),
        ));
    }
    for c in &cfg.columns {
        if let Some((n, _)) = STREAM_COLUMNS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(&c.name))
        {
            return Err(EtlError::invalid(
                "columns",
                format!("column '{n}' is reserved: the stream has it (event_time TIMESTAMPTZ, event_time_ms, partition, offset); give the field another name (AS ...)"),
                format!("'{} AS {}'", c.path.as_str(), c.name),
            ));
        }
    }
    let aggregates = duck::aggregate_names(conn).map_err(EtlError::Duck)?;
    let is_aggregate = |f: &str| aggregates.contains(&f.to_ascii_lowercase());
    let mut out = Vec::new();
    for t in &texts {
        out.push(plan_statement(conn, given, cfg, t, &is_aggregate)?);
    }
    Ok(SqlJob { statements: out })
}

/// Checks that each statement's target, where it exists, has the columns the statement makes
/// (`revisions`: and a window row's revision columns; `partitioned`: and `partition`), by name
/// and type, in order: a target of another shape is refused before anything is written.
pub fn check_targets(
    conn: &Connection,
    job: &SqlJob,
    revisions: bool,
    partitioned: bool,
) -> Result<()> {
    for s in &job.statements {
        let mut want = s.columns.clone();
        if revisions && !matches!(s.body, Body::Transform { .. }) {
            want.extend(
                [
                    ("final", "BOOLEAN"),
                    ("revision", "BIGINT"),
                    ("retracted", "BOOLEAN"),
                ]
                .map(|(n, t)| (n.to_string(), t.to_string())),
            );
        }
        if partitioned && !matches!(s.body, Body::Transform { .. }) {
            want.push(("partition".into(), "INTEGER".into()));
        }
        let Some(have) = duck::table_columns(conn, &s.target.sql()) else {
            continue;
        };
        let same = have.len() == want.len()
            && have
                .iter()
                .zip(&want)
                .all(|(h, w)| h.0.eq_ignore_ascii_case(&w.0) && h.1.eq_ignore_ascii_case(&w.1));
        if !same {
            let shown = |cols: &[(String, String)]| {
                cols.iter()
                    .map(|(n, t)| format!("{n} {t}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(stmt_err(
                &s.target_shown,
                format!(
                    "the existing table {} has the columns ({}), and the statement writes ({}); drop or rename it, or INSERT INTO another table",
                    s.target_shown,
                    shown(&have),
                    shown(&want)
                ),
            ));
        }
    }
    Ok(())
}

/// A long statement, shortened for an error message.
fn shorten(text: &str) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = one.chars().take(120).collect();
    if cut.len() < one.len() {
        format!("'{cut}...'")
    } else {
        format!("'{cut}'")
    }
}

fn plan_statement(
    conn: &Connection,
    given: &Given<'_>,
    cfg: &mut EngineConfig,
    t: &StatementText,
    is_aggregate: &dyn Fn(&str) -> bool,
) -> Result<SqlStatement> {
    let target_shown = t.target.clone().unwrap_or_else(|| {
        given
            .windows_table
            .parts
            .last()
            .cloned()
            .unwrap_or_else(|| "windows".into())
    });
    let shown = target_shown.clone();
    let fail = move |m: String| stmt_err(&shown, m);
    let target = match &t.target {
        Some(name) => TableName::parse(name)
            .ok_or_else(|| fail(format!("INSERT INTO {name}: not a table name")))?,
        None => given.windows_table.clone(),
    };
    let (answer, node) = duck::parse(conn, &t.query).map_err(&fail)?;
    let all_columns = stream_columns(cfg);
    let names: Vec<String> = all_columns.iter().map(|(n, _)| n.clone()).collect();
    let sh = shape(&node, &names, is_aggregate).map_err(|r| fail(r.0))?;
    let normalized = duck::print(conn, &answer, &node).map_err(&fail)?;
    // DuckDB's binder types the statement exactly as written.
    let typing = Typing::new(conn, &all_columns).map_err(EtlError::Duck)?;
    let described = duck::describe(conn, &t.query).map_err(&fail)?;
    let mut columns = described.clone();
    if let Some(list) = &t.columns {
        if list.len() != columns.len() {
            return Err(fail(format!(
                "INSERT INTO {target_shown} names {} columns, and its query makes {}",
                list.len(),
                columns.len()
            )));
        }
        for (c, name) in columns.iter_mut().zip(list) {
            c.0 = name.clone();
        }
    }
    let mut seen = HashSet::new();
    for (n, _) in &columns {
        if !seen.insert(n.to_ascii_lowercase()) {
            return Err(fail(format!(
                "column {n} appears twice in the query's result; name one with AS"
            )));
        }
        if n.to_ascii_lowercase().starts_with("__se_") {
            return Err(fail(format!(
                "column {n}: names starting with __se_ are reserved"
            )));
        }
    }
    let used: Vec<TypedColumn> = cfg
        .columns
        .iter()
        .filter(|c| {
            sh.stream_columns
                .iter()
                .any(|u| u.eq_ignore_ascii_case(&c.name))
        })
        .cloned()
        .collect();
    let Some((wf, intervals)) = &sh.window else {
        cfg.columns = used;
        cfg.window = WindowKind::Tumbling;
        cfg.time.window_ms = TRANSFORM_WINDOW_MS;
        cfg.keys = Vec::new();
        cfg.default_key = false;
        cfg.aggregates = vec![placeholder()];
        cfg.stage_all = true;
        let events = events_columns(cfg);
        typing
            .table(
                "__se_events",
                &events
                    .iter()
                    .map(|(n, t, _)| (n.clone(), t.clone()))
                    .collect::<Vec<_>>(),
            )
            .map_err(EtlError::Duck)?;
        let mut node = replace_stream(&node, &sh, conn)?;
        if given.subscribe
            && !columns
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("partition"))
        {
            // A member's rows carry the partition they were read from, as windowed rows do.
            let (_, t) = duck::parse(
                conn,
                &format!(
                    "SELECT {s}.\"partition\" AS \"partition\" FROM __se_events AS {s}",
                    s = quote_ident(&sh.stream)
                ),
            )
            .map_err(EtlError::Duck)?;
            let item = t
                .get("select_list")
                .and_then(Value::as_array)
                .and_then(|l| l.first())
                .cloned();
            if let (Some(list), Some(item)) = (
                node.get_mut("select_list").and_then(Value::as_array_mut),
                item,
            ) {
                list.push(item);
            }
            columns.push(("partition".into(), "INTEGER".into()));
        }
        let sql = duck::print(conn, &answer, &node).map_err(&fail)?;
        let typed = duck::describe(conn, &sql).map_err(&fail)?;
        for (c, t) in columns.iter_mut().zip(typed) {
            c.1 = t.1;
        }
        return Ok(SqlStatement {
            target_shown,
            target,
            columns,
            key: Vec::new(),
            body: Body::Transform { sql },
            normalized,
            retract: Vec::new(),
        });
    };
    let mut ms = Vec::new();
    for (arg, node) in wf.interval_args().iter().zip(intervals) {
        let v = duck::millis(conn, &answer, node)
            .map_err(|m| fail(format!("{}'s {arg} {m}", wf.name())))?;
        if v <= 0 {
            return Err(fail(format!(
                "{}'s {arg} must be > 0 (got {v} ms)",
                wf.name()
            )));
        }
        ms.push(v);
    }
    cfg.window = match wf {
        WindowFn::Tumble => WindowKind::Tumbling,
        WindowFn::Session => WindowKind::Session,
        WindowFn::Hop if ms[0] == ms[1] => WindowKind::Tumbling,
        WindowFn::Hop => {
            if ms[0] > ms[1] || ms[1] % ms[0] != 0 {
                return Err(fail(format!(
                    "HOP's size ({} ms) must be a multiple of its hop ({} ms)",
                    ms[1], ms[0]
                )));
            }
            WindowKind::Hopping { hop_ms: ms[0] }
        }
    };
    cfg.time.window_ms = *ms.last().unwrap_or(&1);
    cfg.default_key = false;
    cfg.null_keys = true;
    // The GROUP BY items that are stream columns are the engine's keys.
    let group_items: Vec<Value> = match &sh.group_by {
        Some(exprs) => exprs.clone(),
        None => sh
            .select
            .iter()
            .filter(|(_, e)| !calls_aggregate(e, is_aggregate))
            .map(|(_, e)| e.clone())
            .collect(),
    };
    let mut key_cols: Vec<TypedColumn> = Vec::new();
    let mut other_keys = false;
    for g in &group_items {
        match stream_column_of(g, &sh, &cfg.columns) {
            Some(c) if c.repr.keyable() => {
                if !key_cols.iter().any(|k| k.name == c.name) {
                    key_cols.push(c.clone());
                }
            }
            Some(_) => other_keys = true,
            None => {
                let bound = ast::column_names(g).is_some_and(|n| {
                    n.last()
                        .is_some_and(|c| BOUNDS.iter().any(|b| b.eq_ignore_ascii_case(c)))
                });
                other_keys |= !bound;
            }
        }
    }
    // A key's sessions are the engine's, per the GROUP BY's stream columns; other keys split a
    // session's rows. A session merged into another retracts its row by those keys alone.
    if *wf == WindowFn::Session && other_keys && cfg.revisions() {
        return Err(fail("a SESSION statement with emit := 'update' or late_updates_ms groups by stream columns only (besides window_start): a session merged into another retracts its row by them; computed or joined keys need TUMBLE or HOP, or emit := 'close'".into()));
    }
    cfg.keys = key_cols
        .iter()
        .enumerate()
        .map(|(i, c)| KeyColumn {
            path: c.path.clone(),
            name: format!("__se_k{i}"),
        })
        .collect();
    let key = upsert_key(&sh, &columns, is_aggregate);
    let fast = engine_aggregates(
        &sh,
        &key_cols,
        &cfg.columns,
        &described,
        is_aggregate,
        other_keys,
    );
    if let Some((aggs, projection)) = fast {
        let mut used = key_cols.clone();
        for a in &aggs {
            if let Some(c) = a
                .path
                .as_ref()
                .and_then(|p| cfg.columns.iter().find(|c| c.path == *p))
            {
                if !used.iter().any(|u| u.name == c.name) {
                    used.push(c.clone());
                }
            }
        }
        cfg.columns = used;
        cfg.aggregates = aggs;
        cfg.typed_inputs = true;
        cfg.stage_all = false;
        return Ok(SqlStatement {
            target_shown,
            target,
            columns,
            key,
            body: Body::Engine { projection },
            normalized,
            retract: Vec::new(),
        });
    }
    let mut used = used;
    for k in &key_cols {
        if !used.iter().any(|u| u.name == k.name) {
            used.push(k.clone());
        }
    }
    cfg.columns = used;
    cfg.aggregates = vec![placeholder()];
    cfg.stage_all = true;
    let events = events_columns(cfg);
    typing
        .table(
            "__se_events",
            &events
                .iter()
                .map(|(n, t, _)| (n.clone(), t.clone()))
                .collect::<Vec<_>>(),
        )
        .map_err(EtlError::Duck)?;
    let staged_names: Vec<String> = cfg
        .staged_schema()
        .columns
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let row_node = row_step(&node, &sh, &staged_names, conn)?;
    let row_sql = duck::print(conn, &answer, &row_node).map_err(&fail)?;
    let rows = duck::describe(conn, &row_sql).map_err(&fail)?;
    let close_node = close(&node, &sh, conn)?;
    let close_sql = duck::print(conn, &answer, &close_node).map_err(&fail)?;
    drop(typing);
    let retract = sh
        .select
        .iter()
        .zip(&described)
        .map(|((_, e), (_, ty))| {
            let bound = ast::column_names(e).and_then(|n| n.last().map(|c| c.to_ascii_lowercase()));
            match bound.as_deref() {
                Some("window_start") => "make_timestamptz(r.c0 * 1000)".to_string(),
                Some("window_end") => "make_timestamptz(r.c1 * 1000)".to_string(),
                _ => match stream_column_of(e, &sh, &key_cols)
                    .and_then(|c| key_cols.iter().position(|k| k.name == c.name))
                {
                    Some(k) => format!("CAST(r.c{} AS {ty})", 2 + k),
                    None => format!("CAST(NULL AS {ty})"),
                },
            }
        })
        .collect();
    Ok(SqlStatement {
        target_shown,
        target,
        columns,
        key,
        body: Body::Staged {
            row_step: row_sql,
            rows,
            close: close_sql,
        },
        normalized,
        retract,
    })
}

/// The engine's count of a window's events, which a job written as SQL does not write.
fn placeholder() -> AggSpec {
    AggSpec::parse("count(*) AS __se_n").unwrap_or_else(|_| AggSpec::duckdb("count(*)", "__se_n"))
}

fn calls_aggregate(v: &Value, is_aggregate: &dyn Fn(&str) -> bool) -> bool {
    ast::any(v, &|m| {
        m.get("class").and_then(Value::as_str) == Some("FUNCTION")
            && m.get("function_name")
                .and_then(Value::as_str)
                .is_some_and(|f| f == "count_star" || is_aggregate(f))
    })
}

/// The typed stream column an expression is exactly (a bare or stream-qualified reference).
fn stream_column_of<'c>(
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
fn upsert_key(
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
fn engine_aggregates(
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

/// The query node with the stream's table reference replaced by the cycle's events, under the
/// name the statement reads the stream by.
fn replace_stream(node: &Value, sh: &Shape, conn: &Connection) -> Result<Value> {
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
fn row_step(node: &Value, sh: &Shape, engine: &[String], conn: &Connection) -> Result<Value> {
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
fn close(node: &Value, sh: &Shape, conn: &Connection) -> Result<Value> {
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
        if let Some(l) = o.get_mut("select_list").and_then(Value::as_array_mut) {
            l.push(w.clone());
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
                l.push(w);
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
    Ok(out)
}
