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

use std::collections::HashSet;

use duckdb::Connection;
use serde_json::Value;
use streaming_etl_core::{
    EngineConfig, Envelope, EtlError, FieldPath, KeyColumn, Result, TypedColumn, WindowKind,
    MAX_AGGREGATES, TOMBSTONE_FIELD,
};

use super::ast;
use super::duck::{self, Typing};
use super::on_duckdb::{close, events_columns, replace_stream, row_step};
use super::on_engine::{
    calls_aggregate, engine_aggregates, placeholder, stream_column_of, upsert_key,
};
use super::shape::{shape, WindowFn, BOUNDS, STREAM_COLUMNS};
use super::text::{statements, StatementText};
use crate::params::{quote_ident, TableName};

/// The window of a transform-only job (its windows are never written): a day, so that the
/// engine keeps one open window.
const TRANSFORM_WINDOW_MS: i64 = 86_400_000;

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
    /// `INSERT OR REPLACE`: a row per key, each event's replacing its key's (a changelog).
    Keyed(super::keyed::Keyed),
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

impl Body {
    /// Whether its rows are a window's (engine or staged), with a window's revision columns.
    pub fn windowed(&self) -> bool {
        matches!(self, Body::Engine { .. } | Body::Staged { .. })
    }
}

impl SqlJob {
    /// What the job's settings keep of it: each statement's target and text as DuckDB prints it.
    pub fn setting(&self) -> String {
        let shown: Vec<String> = self
            .statements
            .iter()
            .map(|s| {
                let verb = match s.body {
                    Body::Keyed(_) => "INSERT OR REPLACE INTO",
                    _ => "INSERT INTO",
                };
                format!("{verb} {} {}", s.target_shown, s.normalized)
            })
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

/// The stream as a statement sees it: the typed columns, then its own.
fn stream_columns(cfg: &EngineConfig) -> Vec<(String, String)> {
    let mut cols: Vec<(String, String)> = match cfg.envelope {
        Envelope::Debezium => super::debezium::visible_columns(cfg),
        // (An upsert topic's tombstone flag is the keyed statement's, unseen.)
        Envelope::None | Envelope::Upsert => cfg
            .columns
            .iter()
            .filter(|c| c.name != TOMBSTONE_FIELD)
            .map(|c| (c.name.clone(), c.sql_type.clone()))
            .collect(),
    };
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
    /// `primary_key`: the key of an `INSERT OR REPLACE` target the job creates.
    pub primary_key: Option<&'a [String]>,
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
    super::debezium::expand(cfg)?;
    if cfg.envelope == Envelope::Upsert {
        if let Some(p) = FieldPath::parse(TOMBSTONE_FIELD) {
            cfg.columns
                .push(TypedColumn::new(p, TOMBSTONE_FIELD, "BOOLEAN"));
        }
    }
    // Parsed first: which of the functions they call are aggregates is asked once for all.
    let parsed: Vec<std::result::Result<(String, Value), String>> =
        texts.iter().map(|t| duck::parse(conn, &t.query)).collect();
    let mut called = HashSet::new();
    for (_, node) in parsed.iter().flatten() {
        duck::called_functions(node, &mut called);
    }
    let aggregates = duck::aggregates_among(conn, &called).map_err(EtlError::Duck)?;
    let is_aggregate = |f: &str| aggregates.contains(&f.to_ascii_lowercase());
    let mut out: Vec<SqlStatement> = Vec::new();
    let mut layers = Vec::new();
    for (t, parsed) in texts.iter().zip(&parsed) {
        let mut layer = cfg.clone();
        let s = plan_statement(conn, given, &mut layer, t, parsed, &is_aggregate)?;
        if let Some(first) = out.iter().find(|o| o.target.same_as(&s.target)) {
            let also = if first.target_shown == s.target_shown {
                String::new()
            } else {
                format!(" (the other names it {})", first.target_shown)
            };
            return Err(stmt_err(
                &s.target_shown,
                format!(
                    "two statements insert into {}{also}; each statement of a job writes a table of its own",
                    s.target_shown
                ),
            ));
        }
        out.push(s);
        layers.push(layer);
    }
    *cfg = together(cfg, layers, &out)?;
    Ok(SqlJob { statements: out })
}

/// The engine of a job of its statements' engines (`layers`): one statement's own; several
/// statements' read once, each event decoded into the typed columns any of them uses, with
/// each statement's windows, keys and aggregates as a layer of their own.
fn together(
    base: &EngineConfig,
    mut layers: Vec<EngineConfig>,
    statements: &[SqlStatement],
) -> Result<EngineConfig> {
    if layers.len() == 1 {
        return Ok(layers.remove(0));
    }
    let mut cfg = base.clone();
    cfg.columns = base
        .columns
        .iter()
        .filter(|c| {
            layers
                .iter()
                .any(|l| l.columns.iter().any(|u| u.path == c.path))
        })
        .cloned()
        .collect();
    cfg.keys = Vec::new();
    cfg.default_key = false;
    cfg.null_keys = true;
    cfg.stage_all = false;
    cfg.typed_inputs = layers.iter().any(|l| l.typed_inputs);
    cfg.aggregates = layers
        .iter()
        .flat_map(|l| l.aggregates.iter().cloned())
        .collect();
    if cfg.aggregates.len() > MAX_AGGREGATES {
        let last = statements.last().map_or("", |s| s.target_shown.as_str());
        return Err(stmt_err(
            last,
            format!(
                "the job's statements compute {} aggregates in the engine, and a job computes at most {MAX_AGGREGATES}; split the statements over two jobs",
                cfg.aggregates.len()
            ),
        ));
    }
    cfg.layers = layers;
    Ok(cfg)
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

/// A statement DuckDB computes: the engine stages every event it reads (its aggregates only a
/// placeholder), and the cycle's events are typed as `__se_events` for the statement's SQL.
fn stage_every_event(cfg: &mut EngineConfig, typing: &Typing<'_>) -> Result<()> {
    cfg.aggregates = vec![placeholder()];
    cfg.stage_all = true;
    let typed: Vec<(String, String)> = events_columns(cfg)
        .into_iter()
        .map(|(n, t, _)| (n, t))
        .collect();
    typing.table("__se_events", &typed).map_err(EtlError::Duck)
}

fn plan_statement(
    conn: &Connection,
    given: &Given<'_>,
    cfg: &mut EngineConfig,
    t: &StatementText,
    parsed: &std::result::Result<(String, Value), String>,
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
    let (answer, node) = parsed.clone().map_err(&fail)?;
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
    if t.replace && sh.window.is_some() {
        return Err(fail(format!(
            "INSERT OR REPLACE INTO {target_shown} keeps a row per key, each event's replacing its key's, so it takes no window; a windowed statement writes INSERT INTO, and write_mode := 'upsert' replaces a window's row by its key"
        )));
    }
    if cfg.envelope == Envelope::Debezium && sh.window.is_some() {
        return Err(fail(
            "with envelope := 'debezium', a statement reads each change without a window (INSERT OR REPLACE keeps the table, INSERT INTO appends the changes); window what it keeps with another job".into(),
        ));
    }
    let Some((wf, intervals)) = &sh.window else {
        match cfg.envelope {
            // (A Debezium row's columns are read from after or before as op says: all kept.)
            Envelope::Debezium => {}
            // (A keyed statement deletes the key of a tombstone.)
            Envelope::Upsert if t.replace => {
                // (A member checks each row's key against its message key.)
                let message_key = cfg
                    .columns
                    .iter()
                    .filter(|c| given.subscribe && c.message_key)
                    .filter(|c| !used.iter().any(|u| u.name == c.name))
                    .cloned()
                    .collect::<Vec<_>>();
                cfg.columns = used;
                cfg.columns.extend(message_key);
                if let Some(p) = FieldPath::parse(TOMBSTONE_FIELD) {
                    cfg.columns
                        .push(TypedColumn::new(p, TOMBSTONE_FIELD, "BOOLEAN"));
                }
            }
            _ => cfg.columns = used,
        }
        cfg.window = WindowKind::Tumbling;
        cfg.time.window_ms = TRANSFORM_WINDOW_MS;
        cfg.keys = Vec::new();
        cfg.default_key = false;
        stage_every_event(cfg, &typing)?;
        let mut node = replace_stream(&node, &sh, conn)?;
        if t.replace {
            let keyed = super::keyed::plan(
                conn,
                &super::keyed::Statement {
                    answer: &answer,
                    node: &node,
                    stream: &sh.stream,
                    columns: &columns,
                    target: &target,
                    target_shown: &target_shown,
                    primary_key: given.primary_key,
                    subscribe: given.subscribe,
                    envelope: cfg.envelope,
                    message_key: cfg
                        .columns
                        .iter()
                        .find(|c| c.message_key)
                        .map(|c| c.name.as_str()),
                },
            )?;
            return Ok(SqlStatement {
                target_shown,
                target,
                key: keyed.key.clone(),
                columns: keyed.columns.clone(),
                body: Body::Keyed(keyed),
                normalized,
                retract: Vec::new(),
            });
        }
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
    stage_every_event(cfg, &typing)?;
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
