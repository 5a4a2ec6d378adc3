//! A job written as SQL, planned at bind time: how each statement is split between the engine
//! and DuckDB, and the SQL DuckDB runs in each cycle.
//!
//! The engine reads the stream (decoding only the columns the statements use), keeps the
//! per-partition watermarks and places each event in its windows under them, keyed by the
//! statement's GROUP BY columns that are stream columns. Here a statement is parsed, typed and
//! checked ([`Statement`]); then each kind is planned in a file of its own:
//! - [`transform`](super::transform): no window (appended rows, or a table kept by key);
//! - [`window`](super::window): a windowed statement's window and keys, then
//!   [`engine`](super::engine) (the engine computes the rows) or [`staged`](super::staged)
//!   (DuckDB's batch query over each closing window's staged events), or
//!   [`window_join`](super::window_join) (the stream read twice, joined within each window).
//!
//! Several statements over one read are one engine with a layer per statement ([`together`]).

use std::collections::HashSet;

use duckdb::Connection;
use serde_json::Value;
use streaming_etl_core::{
    EngineConfig, Envelope, EtlError, FieldPath, Result, TypedColumn, MAX_AGGREGATES,
    TOMBSTONE_FIELD,
};

use super::duck::{self, Typing};
use super::shape::{shape, STREAM_COLUMNS};
use super::statement::{stmt_err, Body, SqlStatement, Statement};
use super::text::{statements, StatementText};
use crate::params::TableName;

/// A job written as SQL.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlJob {
    pub statements: Vec<SqlStatement>,
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

fn plan_statement<'a>(
    conn: &'a Connection,
    given: &'a Given<'_>,
    cfg: &mut EngineConfig,
    t: &'a StatementText,
    parsed: &std::result::Result<(String, Value), String>,
    is_aggregate: &'a dyn Fn(&str) -> bool,
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
    let st = Statement {
        conn,
        subscribe: given.subscribe,
        primary_key: given.primary_key,
        text: t,
        target_shown,
        target,
        answer,
        node,
        sh,
        normalized,
        typing,
        described,
        columns,
        used,
        is_aggregate,
    };
    match st.sh.window.is_some() {
        false => super::transform::plan(st, cfg),
        true => super::window::plan(st, cfg),
    }
}
