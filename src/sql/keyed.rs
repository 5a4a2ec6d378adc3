//! `INSERT OR REPLACE INTO t SELECT ... FROM stream`: a table kept by key from a changelog.
//! Each event's row replaces the row of its key, and a delete (a Debezium `op = 'd'`, or a
//! tombstone of a keyed topic read with `envelope := 'upsert'`) removes it. Planned here at bind time: the target's key (its PRIMARY KEY, or `primary_key` for a
//! table the job creates), and the statement's SQL over the cycle's events with what the sink
//! needs to keep the last change of each key (`sink::keyed`).
#![forbid(unsafe_code)]

use duckdb::Connection;
use serde_json::Value;
use streaming_etl_core::{Envelope, EtlError, Result, TOMBSTONE_FIELD};

use super::debezium::DELETE_COLUMN;
use super::duck;
use crate::params::{quote_ident, quote_literal, TableName};

/// The columns the statement's rows carry besides its own: the event's partition, offset, time,
/// whether it deletes its key and whether it changes a row at all (a Debezium truncate or
/// message does not).
pub const CHANGE_COLUMNS: [&str; 5] = ["__se_p", "__se_o", "__se_t", "__se_d", "__se_c"];

/// A keyed statement's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyed {
    /// Its SQL over the cycle's events (`__se_events`): its columns, then [`CHANGE_COLUMNS`].
    pub changes: String,
    /// The target's key columns, as the statement names them.
    pub key: Vec<String>,
    /// The statement's columns: name and DuckDB type.
    pub columns: Vec<(String, String)>,
    /// Debezium's truncates (`op = 't'`) empty the table (`__se_events` has `op`).
    pub truncates: bool,
    /// Each row's key must be its message's key (a `subscribe` member's; the changes have it
    /// as [`MESSAGE_KEY_COLUMN`]).
    pub message_keyed: bool,
}

/// The message key of a change, beside [`CHANGE_COLUMNS`] when the key is checked.
pub const MESSAGE_KEY_COLUMN: &str = "__se_k";

/// What planning a keyed statement needs.
pub struct Statement<'a> {
    /// DuckDB's parse of the statement and its query node (the stream replaced by the
    /// cycle's events).
    pub answer: &'a str,
    pub node: &'a Value,
    /// The name the statement reads the stream by.
    pub stream: &'a str,
    /// Its columns (name and type), as DuckDB's binder typed them.
    pub columns: &'a [(String, String)],
    pub target: &'a TableName,
    pub target_shown: &'a str,
    pub primary_key: Option<&'a [String]>,
    pub subscribe: bool,
    pub envelope: Envelope,
    /// The stream's column of the message key (`key`, unless a declared column has the name).
    pub message_key: Option<&'a str>,
}

fn refuse(s: &Statement<'_>, message: String) -> EtlError {
    EtlError::Statement {
        target: s.target_shown.to_string(),
        message,
    }
}

/// Plans a keyed statement: its key, checked against the table where it exists, and the SQL
/// of its changes.
pub fn plan(conn: &Connection, s: &Statement<'_>) -> Result<Keyed> {
    let t = s.target_shown;
    if s.subscribe && s.envelope == Envelope::None {
        // (Members would write a key's row from two partitions in no order.)
        return Err(refuse(
            s,
            format!("with subscribe := true, INSERT OR REPLACE INTO {t} reads a changelog keyed by its rows' key (envelope := 'debezium' or 'upsert'): a key then lives in one partition, and one member writes its row"),
        ));
    }
    if s.subscribe && s.message_key.is_none() {
        return Err(refuse(
            s,
            format!("with subscribe := true, INSERT OR REPLACE INTO {t} checks each row's key against its message key, which the stream has as key: a declared column named key hides it (give it another name with AS)"),
        ));
    }
    let key = match (existing_key(conn, s.target), s.primary_key) {
        (Existing::Missing, Some(k)) => k.to_vec(),
        (Existing::Missing, None) => {
            return Err(refuse(
                s,
                format!("INSERT OR REPLACE INTO {t} keeps a row per key, and {t} does not exist: name its key with primary_key := ['...'], or create it with a PRIMARY KEY"),
            ))
        }
        (Existing::Key(k), None) => k,
        (Existing::Key(k), Some(given)) => {
            let same = k.len() == given.len()
                && k.iter().zip(given).all(|(a, b)| a.eq_ignore_ascii_case(b));
            if !same {
                return Err(EtlError::invalid(
                    "primary_key",
                    format!(
                        "the existing table {t} has the PRIMARY KEY ({}); name that, or leave primary_key out",
                        k.join(", ")
                    ),
                    format!("[{}]", given.iter().map(|g| quote_literal(g)).collect::<Vec<_>>().join(", ")),
                ));
            }
            k
        }
        (Existing::NoKey, Some(k)) => k.to_vec(),
        (Existing::NoKey, None) => {
            return Err(refuse(
                s,
                format!("INSERT OR REPLACE INTO {t} keeps a row per key, and the existing table {t} has no PRIMARY KEY: create it with one, or name its key with primary_key := ['...']"),
            ))
        }
    };
    let mut named = Vec::new();
    for k in &key {
        let Some((n, _)) = s.columns.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)) else {
            let have: Vec<&str> = s.columns.iter().map(|(n, _)| n.as_str()).collect();
            return Err(refuse(
                s,
                format!(
                    "the key column {k} of {t} is not among the statement's columns ({}); select it",
                    have.join(", ")
                ),
            ));
        };
        named.push(n.clone());
    }
    let stream = quote_ident(s.stream);
    let (deletes, changes) = match s.envelope {
        Envelope::Debezium => (
            format!("{stream}.{DELETE_COLUMN}"),
            format!("coalesce({stream}.op IN ('c', 'r', 'u', 'd'), false)"),
        ),
        Envelope::Upsert => (
            format!("coalesce({stream}.{TOMBSTONE_FIELD}, false)"),
            "true".to_string(),
        ),
        Envelope::None => ("false".to_string(), "true".to_string()),
    };
    // With subscribe, each row's key is checked against its message key (`__se_k`).
    let message_key = match s.message_key.filter(|_| s.subscribe) {
        Some(k) => format!(", {stream}.{} AS {MESSAGE_KEY_COLUMN}", quote_ident(k)),
        None => String::new(),
    };
    let extra = format!(
        "SELECT {stream}.\"partition\" AS __se_p, {stream}.\"offset\" AS __se_o, {stream}.event_time_ms AS __se_t, {deletes} AS __se_d, {changes} AS __se_c{message_key} FROM __se_events AS {stream}"
    );
    let (_, template) = duck::parse(conn, &extra).map_err(EtlError::Duck)?;
    let mut node = s.node.clone();
    let items = template
        .get("select_list")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    match node.get_mut("select_list").and_then(Value::as_array_mut) {
        Some(list) if items.len() >= CHANGE_COLUMNS.len() => list.extend(items),
        _ => {
            return Err(refuse(
                s,
                format!("INSERT OR REPLACE INTO {t} takes one SELECT ... FROM stream (not a UNION or VALUES)"),
            ))
        }
    }
    let changes = duck::print(conn, s.answer, &node).map_err(|m| refuse(s, m))?;
    let typed = duck::describe(conn, &changes).map_err(|m| refuse(s, m))?;
    let columns: Vec<(String, String)> = s
        .columns
        .iter()
        .zip(&typed)
        .map(|((n, _), (_, ty))| (n.clone(), ty.clone()))
        .collect();
    Ok(Keyed {
        changes,
        key: named,
        columns,
        truncates: s.envelope == Envelope::Debezium,
        message_keyed: s.subscribe,
    })
}

/// What the target is where it exists.
enum Existing {
    Missing,
    NoKey,
    Key(Vec<String>),
}

/// The target's PRIMARY KEY, as DuckDB's catalog has it.
fn existing_key(conn: &Connection, table: &TableName) -> Existing {
    if duck::table_columns(conn, &table.sql()).is_none() {
        return Existing::Missing;
    }
    let lit = |i: usize| table.parts.get(i).map(|p| quote_literal(p));
    let n = table.parts.len();
    let place = match n {
        3 => format!(
            "database_name = {} AND schema_name = {}",
            lit(0).unwrap_or_default(),
            lit(1).unwrap_or_default()
        ),
        2 => format!(
            "(database_name = current_database() AND schema_name = {s} OR database_name = {s} AND schema_name = 'main')",
            s = lit(0).unwrap_or_default()
        ),
        _ => "database_name = current_database() AND schema_name = current_schema()".to_string(),
    };
    let sql = format!(
        "SELECT array_to_string(constraint_column_names, chr(31)) FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' AND table_name = {} AND {place}",
        lit(n.saturating_sub(1)).unwrap_or_default()
    );
    let found: std::result::Result<String, duckdb::Error> = conn.query_row(&sql, [], |r| r.get(0));
    match found {
        Ok(k) if !k.is_empty() => Existing::Key(k.split('\u{1f}').map(str::to_string).collect()),
        Ok(_) | Err(duckdb::Error::QueryReturnedNoRows) => Existing::NoKey,
        Err(_) => {
            // (A failed query leaves no transaction open.)
            let _ = conn.execute_batch("ROLLBACK");
            Existing::NoKey
        }
    }
}
