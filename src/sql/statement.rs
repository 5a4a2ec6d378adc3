//! One statement of a job written as SQL, as it is planned and as it is run: [`Statement`]
//! (parsed, typed and checked by [`plan`](super::plan), then planned by its kind) and
//! [`SqlStatement`] (its target and how its rows are made, [`Body`]).
#![forbid(unsafe_code)]

use duckdb::Connection;
use serde_json::Value;
use streaming_etl_core::{EngineConfig, EtlError, Result, TypedColumn};

use super::duck::Typing;
use super::on_duckdb::events_columns;
use super::on_engine::placeholder;
use super::shape::Shape;
use super::text::StatementText;
use crate::params::TableName;

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

pub(super) fn stmt_err(target: &str, message: impl Into<String>) -> EtlError {
    EtlError::Statement {
        target: target.to_string(),
        message: message.into(),
    }
}

/// A statement DuckDB computes: the engine stages every event it reads (its aggregates only a
/// placeholder), and the cycle's events are typed as `__se_events` for the statement's SQL.
pub(super) fn stage_every_event(cfg: &mut EngineConfig, typing: &Typing<'_>) -> Result<()> {
    cfg.aggregates = vec![placeholder()];
    cfg.stage_all = true;
    let typed: Vec<(String, String)> = events_columns(cfg)
        .into_iter()
        .map(|(n, t, _)| (n, t))
        .collect();
    typing.table("__se_events", &typed).map_err(EtlError::Duck)
}

/// One statement being planned, whatever its kind: its target, DuckDB's parse and typing of it
/// (the stream typed as a table while it lives), and the stream columns it reads.
pub(super) struct Statement<'a> {
    pub conn: &'a Connection,
    pub subscribe: bool,
    /// `primary_key`: the key of an `INSERT OR REPLACE` target the job creates.
    pub primary_key: Option<&'a [String]>,
    pub text: &'a StatementText,
    pub target_shown: String,
    pub target: TableName,
    /// DuckDB's parse of the statement, and its query node.
    pub answer: String,
    pub node: Value,
    pub sh: Shape,
    pub normalized: String,
    pub typing: Typing<'a>,
    /// The query's columns as DuckDB's binder types them, and as the target gets them (renamed
    /// by an `INSERT INTO t (a, b)` list).
    pub described: Vec<(String, String)>,
    pub columns: Vec<(String, String)>,
    /// The typed columns of the stream it reads.
    pub used: Vec<TypedColumn>,
    pub is_aggregate: &'a dyn Fn(&str) -> bool,
}

impl Statement<'_> {
    pub fn fail(&self, message: impl Into<String>) -> EtlError {
        stmt_err(&self.target_shown, message)
    }

    /// The planned statement: its target's columns and key, and how its rows are made.
    pub fn planned(
        self,
        columns: Vec<(String, String)>,
        key: Vec<String>,
        body: Body,
        retract: Vec<String>,
    ) -> SqlStatement {
        SqlStatement {
            target_shown: self.target_shown,
            target: self.target,
            columns,
            key,
            body,
            normalized: self.normalized,
            retract,
        }
    }
}
