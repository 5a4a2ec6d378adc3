//! The columns a parameter job's DuckDB aggregates read (`aggregates := ['median(value)', ...]`
//! over `columns`), by DuckDB's parser: a job that declares more columns than they read stages
//! only those (the others are still converted: a value that does not convert is a dead letter).
#![forbid(unsafe_code)]

use duckdb::Connection;

use super::{ast, duck};

/// The names among `columns` that any of `exprs` refers to; None when one cannot be told (an
/// expression that does not parse, or reads `*` or `COLUMNS(...)`): then every column is read.
pub fn columns_read(conn: &Connection, exprs: &[&str], columns: &[String]) -> Option<Vec<String>> {
    let mut read = Vec::new();
    for e in exprs {
        let (_, node) = duck::parse(conn, &format!("SELECT ({e}) FROM __se_events")).ok()?;
        let list = node.get("select_list")?;
        let star = |m: &serde_json::Map<String, serde_json::Value>| {
            m.get("class").and_then(serde_json::Value::as_str) == Some("STAR")
        };
        if ast::any(list, &star) {
            return None;
        }
        let mut refs = Vec::new();
        ast::column_refs(list, &[], &mut refs);
        // (`s.a` is column s's field a, or a column a of s: either way, both names are kept.)
        for name in refs.iter().flatten() {
            if let Some(c) = columns.iter().find(|c| c.eq_ignore_ascii_case(name)) {
                if !read.contains(c) {
                    read.push(c.clone());
                }
            }
        }
    }
    Some(read)
}
