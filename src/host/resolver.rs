//! Conversions only DuckDB can decide, during a run: the values of typed columns the core does
//! not convert itself (a string into a number or a date, a list, a struct, ...) are converted by
//! DuckDB's JSON reader (`json_transform_strict`, as `read_json` does), a chunk's values of one
//! column in one statement, on the run's connection (between the sink's transactions).

use std::sync::Arc;

use streaming_etl_core::{Cell, ColumnType, Resolver, Rows};

use crate::host::connections::SharedConn;

use crate::functions::batch::{self, Lent};
use crate::params::transform_spec;

pub struct DuckResolver {
    conn: SharedConn,
}

impl DuckResolver {
    pub fn new(conn: SharedConn) -> Arc<DuckResolver> {
        Arc::new(DuckResolver { conn })
    }
}

/// DuckDB's message, without the statement it quotes.
fn message(e: &duckdb::Error) -> String {
    e.to_string()
        .lines()
        .take_while(|l| !l.starts_with("LINE "))
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

impl Resolver for DuckResolver {
    fn resolve(
        &self,
        sql_type: &str,
        json: &[&str],
    ) -> std::result::Result<Vec<std::result::Result<String, String>>, String> {
        let guard = self.conn.lock();
        let conn = guard.conn().map_err(|e| e.to_string())?;
        let mut rows = Rows::new(vec![ColumnType::BigInt, ColumnType::Varchar]);
        for (i, j) in json.iter().enumerate() {
            rows.push(&[Cell::I64(i as i64), Cell::Str(j)]);
        }
        let lent = Lent::new(Arc::new(rows));
        let spec = transform_spec(sql_type);
        let sql = format!(
            "SELECT TRY(json_transform_strict(c1, {spec}))::VARCHAR FROM system.main.{}({}) ORDER BY c0",
            batch::NAME,
            lent.id
        );
        let mut stmt = conn.prepare(&sql).map_err(|e| message(&e))?;
        let converted: Vec<Option<String>> = stmt
            .query_map([], |r| r.get::<_, Option<String>>(0))
            .map_err(|e| message(&e))?
            .collect::<duckdb::Result<_>>()
            .map_err(|e| message(&e))?;
        if converted.len() != json.len() {
            return Err(format!(
                "{} values converted of {}",
                converted.len(),
                json.len()
            ));
        }
        let one = format!("SELECT json_transform_strict(?, {spec})::VARCHAR");
        Ok(converted
            .into_iter()
            .zip(json)
            .map(|(v, j)| match v {
                Some(text) => Ok(text),
                // A value that does not convert: DuckDB's own message says why.
                None => match conn.query_row(&one, [j], |r| r.get::<_, Option<String>>(0)) {
                    Ok(Some(text)) => Ok(text),
                    Ok(None) => Err("converts to NULL".into()),
                    Err(e) => Err(message(&e)),
                },
            })
            .collect())
    }
}
