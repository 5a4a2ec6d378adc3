//! DuckDB's side of reading a job's SQL, at bind time, on one of the extension's connections:
//! its parser (`json_serialize_sql`) and printer (`json_deserialize_sql`), its binder (each
//! statement typed with `DESCRIBE` exactly as written, the stream a temporary table and the
//! window functions temporary table macros), the values of the window functions' intervals,
//! the names of its aggregates, and the targets' existing shapes. The temporary objects are
//! dropped again before the connection goes back to the pool.

use std::collections::HashSet;
use std::sync::OnceLock;

use duckdb::types::Value as DuckValue;
use duckdb::Connection;
use serde_json::Value;

use super::ast;
use super::builtins;
use crate::params::quote_ident;

/// DuckDB's message of a failed statement of the extension's own (its first lines: not the
/// statement it quotes).
pub fn message(e: &duckdb::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("LINE "))
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines.join(" ")
}

/// A query's parse tree: the whole answer of `json_serialize_sql` and its query node.
pub fn parse(conn: &Connection, query: &str) -> Result<(String, Value), String> {
    let answer: String = conn
        .query_row(
            "SELECT json_serialize_sql(?::VARCHAR)::VARCHAR",
            [query],
            |r| r.get(0),
        )
        .map_err(|e| message(&e))?;
    let node = ast::query_node(&answer).map_err(|m| format!("Parser Error: {m}"))?;
    Ok((answer, node))
}

/// The SQL text of a parse tree (`answer`, with `node` as its query).
pub fn print(conn: &Connection, answer: &str, node: &Value) -> Result<String, String> {
    let json = ast::with_node(answer, node)?;
    conn.query_row("SELECT json_deserialize_sql(?::JSON)", [json], |r| {
        r.get::<_, String>(0)
    })
    .map_err(|e| message(&e))
}

/// The names of DuckDB's aggregate functions (lowercase), loaded extensions' included.
fn aggregate_names(conn: &Connection) -> Result<HashSet<String>, String> {
    let mut stmt = conn
        .prepare("SELECT DISTINCT lower(function_name) FROM duckdb_functions() WHERE function_type = 'aggregate'")
        .map_err(|e| message(&e))?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(|e| message(&e))?
        .collect::<duckdb::Result<HashSet<String>>>()
        .map_err(|e| message(&e))?;
    Ok(names)
}

fn builtin(
    names: &'static str,
    cell: &'static OnceLock<HashSet<&'static str>>,
) -> &'static HashSet<&'static str> {
    cell.get_or_init(|| names.split_whitespace().collect())
}

/// The aggregates among the functions a job's statements call (`called`, lowercase): DuckDB's
/// own are known (`builtins.rs`); only a name it does not know (a loaded extension's, a user's)
/// costs a scan of `duckdb_functions()` (tens of milliseconds).
pub fn aggregates_among(
    conn: &Connection,
    called: &HashSet<String>,
) -> Result<HashSet<String>, String> {
    static AGG: OnceLock<HashSet<&'static str>> = OnceLock::new();
    static OTHER: OnceLock<HashSet<&'static str>> = OnceLock::new();
    let (agg, other) = (
        builtin(builtins::AGGREGATES, &AGG),
        builtin(builtins::NOT_AGGREGATES, &OTHER),
    );
    let known = |n: &str| {
        agg.contains(n) || other.contains(n) || WINDOW_MACROS.iter().any(|(w, _)| *w == n)
    };
    if called.iter().all(|n| known(n)) {
        return Ok(called
            .iter()
            .filter(|n| agg.contains(n.as_str()))
            .cloned()
            .collect());
    }
    let all = aggregate_names(conn)?;
    Ok(called
        .iter()
        .filter(|n| all.contains(n.as_str()))
        .cloned()
        .collect())
}

/// The functions a parse tree calls, by name (lowercase).
pub fn called_functions(node: &Value, into: &mut HashSet<String>) {
    let found = std::cell::RefCell::new(std::mem::take(into));
    ast::any(node, &|m| {
        if m.get("class").and_then(Value::as_str) == Some("FUNCTION") {
            if let Some(f) = m.get("function_name").and_then(Value::as_str) {
                found.borrow_mut().insert(f.to_ascii_lowercase());
            }
        }
        false
    });
    *into = found.into_inner();
}

/// The value of an expression node of the query `answer` (an interval or a number of
/// milliseconds), in milliseconds.
pub fn millis(conn: &Connection, answer: &str, expr: &Value) -> Result<i64, String> {
    let (_, mut select) = parse(conn, "SELECT NULL")?;
    if let Some(list) = select.get_mut("select_list").and_then(Value::as_array_mut) {
        list.clear();
        list.push(expr.clone());
    }
    let sql = print(conn, answer, &select)?;
    let v: DuckValue = conn
        .query_row(&sql, [], |r| r.get(0))
        .map_err(|e| format!("could not be evaluated: {}", message(&e)))?;
    let ms = match v {
        DuckValue::Interval {
            months,
            days,
            nanos,
        } => {
            if months != 0 {
                return Err("is not of fixed length (it counts months); give it in days, hours, minutes, seconds or milliseconds".into());
            }
            if nanos % 1_000_000 != 0 {
                return Err("is not a whole number of milliseconds".into());
            }
            i64::from(days)
                .checked_mul(86_400_000)
                .and_then(|d| d.checked_add(nanos / 1_000_000))
        }
        DuckValue::TinyInt(x) => Some(i64::from(x)),
        DuckValue::SmallInt(x) => Some(i64::from(x)),
        DuckValue::Int(x) => Some(i64::from(x)),
        DuckValue::BigInt(x) => Some(x),
        DuckValue::HugeInt(x) => i64::try_from(x).ok(),
        DuckValue::UTinyInt(x) => Some(i64::from(x)),
        DuckValue::USmallInt(x) => Some(i64::from(x)),
        DuckValue::UInt(x) => Some(i64::from(x)),
        DuckValue::UBigInt(x) => i64::try_from(x).ok(),
        _ => {
            return Err(format!(
                "is not an INTERVAL or a number of milliseconds ({})",
                sql.trim_start_matches("SELECT ")
            ))
        }
    };
    ms.ok_or_else(|| "is out of range".to_string())
}

/// `DESCRIBE` of a query: its columns' names and types.
pub fn describe(conn: &Connection, query: &str) -> Result<Vec<(String, String)>, String> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT column_name, column_type FROM (DESCRIBE {query})"
        ))
        .map_err(|e| message(&e))?;
    let cols = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(|e| message(&e))?
        .collect::<duckdb::Result<Vec<_>>>()
        .map_err(|e| message(&e))?;
    Ok(cols)
}

/// The columns of an existing table (None: there is no such table).
pub fn table_columns(conn: &Connection, table: &str) -> Option<Vec<(String, String)>> {
    let probe = conn.prepare(&format!("SELECT * FROM {table} LIMIT 0"));
    match probe {
        Ok(_) => describe(conn, &format!("SELECT * FROM {table}")).ok(),
        Err(_) => {
            let _ = conn.execute_batch("ROLLBACK");
            None
        }
    }
}

/// The temporary objects a statement is typed against: the stream as a table of its columns
/// and the window functions as table macros over it (the window bounds as TIMESTAMPTZ).
pub struct Typing<'a> {
    conn: &'a Connection,
}

const WINDOW_MACROS: [(&str, &str); 3] = [
    ("tumble", "t, ts, size"),
    ("hop", "t, ts, hop, size"),
    ("session", "t, ts, gap"),
];

impl<'a> Typing<'a> {
    /// Creates `stream` (`columns`: name and type) and the window macros on `conn`.
    pub fn new(conn: &'a Connection, columns: &[(String, String)]) -> Result<Typing<'a>, String> {
        let typing = Typing { conn };
        let cols: Vec<String> = columns
            .iter()
            .map(|(n, t)| format!("{} {t}", quote_ident(n)))
            .collect();
        let mut sql = format!("CREATE OR REPLACE TEMP TABLE stream ({});", cols.join(", "));
        for (name, params) in WINDOW_MACROS {
            sql += &format!(
                "CREATE OR REPLACE TEMP MACRO {name}({params}) AS TABLE SELECT *, NULL::TIMESTAMPTZ AS window_start, NULL::TIMESTAMPTZ AS window_end FROM query_table(t);"
            );
        }
        conn.execute_batch(&sql).map_err(|e| message(&e))?;
        Ok(typing)
    }

    /// A temporary table of these columns, dropped with the others.
    pub fn table(&self, name: &str, columns: &[(String, String)]) -> Result<(), String> {
        let cols: Vec<String> = columns
            .iter()
            .map(|(n, t)| format!("{} {t}", quote_ident(n)))
            .collect();
        self.conn
            .execute_batch(&format!(
                "CREATE OR REPLACE TEMP TABLE {} ({})",
                quote_ident(name),
                cols.join(", ")
            ))
            .map_err(|e| message(&e))
    }
}

impl Drop for Typing<'_> {
    fn drop(&mut self) {
        let mut sql = String::from(
            "DROP TABLE IF EXISTS temp.main.stream; DROP TABLE IF EXISTS temp.main.__se_events;",
        );
        for (name, _) in WINDOW_MACROS {
            sql += &format!("DROP MACRO TABLE IF EXISTS temp.main.{name};");
        }
        if self.conn.execute_batch(&sql).is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
            let _ = self.conn.execute_batch(&sql);
        }
    }
}
