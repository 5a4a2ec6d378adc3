//! Writing a batch's rows into a table with one statement that reads them through
//! [`__streaming_etl_batch`](crate::functions::batch): a plain insert, an `INSERT OR REPLACE` by
//! primary key, or a `MERGE` on the key columns (catalogs without keys); windows with revisions
//! keep the latest row per key, and a retracted one deletes it.

use std::sync::Arc;

use duckdb::Connection;
use streaming_etl_core::{EtlError, Result, Role, Rows, TableSchema};

use super::staged::Staging;
use super::tables::{column_list, revision_columns, sink_error};
use crate::functions::batch::{self, Lent};
use crate::params::quote_ident;

/// How one write meets a table's existing rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Insert,
    /// Rows whose primary key exists replace them.
    Replace,
    /// Rows whose key columns match replace them (no index: a `MERGE`).
    Merge,
}

/// Rows of one batch for a table; `partition` adds that number as the table's last column
/// (`subscribe` runs: a windows row per partition).
pub(crate) struct Part<'a> {
    pub rows: &'a Rows,
    pub partition: Option<i32>,
}

/// Writes `rows` into `table` (its columns named, so a table with more columns works) with one
/// statement reading [`__streaming_etl_batch`](crate::functions::batch): DuckDB takes the rows a
/// vector at a time.
pub(crate) fn insert(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    rows: &Rows,
    verb: Verb,
) -> Result<()> {
    insert_parts(
        conn,
        table,
        schema,
        &[Part {
            rows,
            partition: None,
        }],
        verb,
    )
}

/// Writes several parts into `table` with one statement (their rows, one after the other).
pub(crate) fn insert_parts(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    parts: &[Part<'_>],
    verb: Verb,
) -> Result<()> {
    let parts: Vec<&Part<'_>> = parts.iter().filter(|p| !p.rows.is_empty()).collect();
    if parts.is_empty() {
        return Ok(());
    }
    let (_lent, query) = lend(&parts);
    write_rows(conn, table, schema, &query, verb).map(drop)
}

/// The events a part's cycle placed in windows, and its first live pane (see `Staged`).
pub(crate) struct StagedPart<'a> {
    pub rows: &'a Rows,
    pub partition: Option<i32>,
    pub live_from_pane_ms: Option<i64>,
}

/// Writes the windows rows of a job whose aggregates DuckDB computes in part (see
/// [`Staging`]): the cycle's new events that stay are staged, the rows are written with the
/// aggregates DuckDB computes over their windows' events, and the events no window needs any
/// more are deleted; all on `conn`, inside the cycle's transaction.
pub(crate) fn insert_staged(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    parts: &[Part<'_>],
    verb: Verb,
    staging: &Staging,
    staged: &[StagedPart<'_>],
) -> Result<()> {
    let all: Vec<&Part<'_>> = parts.iter().collect();
    let (_rows_lent, rows) = lend(&all);
    let staged_lent: Vec<Lent> = staged
        .iter()
        .map(|p| Lent::new(Arc::new(p.rows.clone())))
        .collect();
    let new = staged
        .iter()
        .zip(&staged_lent)
        .map(|(p, lent)| staging.new_events(&batch_ref(lent), p.partition))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let live: Vec<(Option<i32>, Option<i64>)> = staged
        .iter()
        .map(|p| (p.partition, p.live_from_pane_ms))
        .collect();
    let st = &staging.table;
    if !new.is_empty() {
        conn.execute_batch(&staging.keep_new(&new, &rows, &live))
            .map_err(|e| sink_error(st, e))?;
    }
    if parts.iter().any(|p| !p.rows.is_empty()) {
        let empty = format!("SELECT * FROM {st} WHERE false");
        let new = if new.is_empty() { empty } else { new };
        let query = staging.window_rows(&rows, &new, &live);
        if let Err(e) = write_rows(conn, table, schema, &query, verb) {
            return Err(aggregate_error(conn, e, staging, &rows, &new));
        }
    }
    conn.execute_batch(&staging.drop_done(&rows, &live))
        .map_err(|e| sink_error(st, e))
}

/// A failed write of rows with DuckDB's aggregates: DuckDB's error, naming the aggregate that
/// failed (each is computed alone, outside the cycle's transaction, which is rolled back: an
/// aggregate that overflows, or a cast inside one, fails on the events it reads).
fn aggregate_error(
    conn: &Connection,
    e: EtlError,
    staging: &Staging,
    rows: &str,
    new: &str,
) -> EtlError {
    let EtlError::Sink { table, message } = e else {
        return e;
    };
    let _ = conn.execute_batch("ROLLBACK");
    let failed = staging
        .each_aggregate(rows, new)
        .into_iter()
        .find_map(|(name, sql)| {
            conn.execute_batch(&sql).err().map(|e| {
                // (Not the statement of the extension's own that DuckDB quotes.)
                let text = e.to_string();
                let first = text.split("\n\nLINE ").next().unwrap_or(&text).to_string();
                format!("the aggregate {name} failed: {first}")
            })
        });
    let what = failed.unwrap_or_else(|| {
        format!(
            "computing the aggregates {}: {message}",
            staging.aggregates_shown()
        )
    });
    EtlError::Sink {
        table,
        message: format!("{what}; nothing of this cycle was written, and the next run resumes it"),
    }
}

/// The batch function reading lent rows (qualified: a macro of the same name in the user's
/// schema cannot stand in for it).
pub(super) fn batch_ref(lent: &Lent) -> String {
    format!("system.main.{}({})", batch::NAME, lent.id)
}

/// The parts' rows lent to the batch function, and the query reading them (columns `c0, ...`;
/// a part's partition as the last one).
pub(super) fn lend(parts: &[&Part<'_>]) -> (Vec<Lent>, String) {
    let lent: Vec<Lent> = parts
        .iter()
        .map(|p| Lent::new(Arc::new(p.rows.clone())))
        .collect();
    let selects: Vec<String> = parts
        .iter()
        .zip(&lent)
        .map(|(p, lent)| {
            let batch = batch_ref(lent);
            match p.partition {
                Some(k) => format!(
                    "SELECT *, CAST({k} AS INTEGER) AS c{} FROM {batch}",
                    p.rows.types().len()
                ),
                None => format!("SELECT * FROM {batch}"),
            }
        })
        .collect();
    (lent, selects.join(" UNION ALL "))
}

/// `query` (columns `c0, ...` of the rows) with the schema's given columns after them (the
/// job's name in a table jobs share).
fn with_given(schema: &TableSchema, query: &str) -> String {
    let given: Vec<String> = schema
        .columns
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match &c.role {
            Role::Given { sql_type, value } => Some(format!("CAST({value} AS {sql_type}) AS c{i}")),
            _ => None,
        })
        .collect();
    if given.is_empty() {
        return query.to_string();
    }
    format!("SELECT *, {} FROM ({query})", given.join(", "))
}

/// `query` (columns `c0, ...` in the schema's order) with typed keys cast to their type.
pub(super) fn cast_columns(schema: &TableSchema, query: &str) -> String {
    if !schema
        .columns
        .iter()
        .any(|c| matches!(c.role, Role::Cast(_)))
    {
        return query.to_string();
    }
    let cols: Vec<String> = schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| match &c.role {
            Role::Cast(t) => format!("CAST(c{i} AS {t}) AS c{i}"),
            _ => format!("c{i}"),
        })
        .collect();
    format!("SELECT {} FROM ({query})", cols.join(", "))
}

/// `c0, c1, ...` of the columns the table has (not the hidden ones).
fn select_list(schema: &TableSchema) -> String {
    schema
        .table_columns()
        .map(|(i, _)| format!("c{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes the rows `query` gives (columns `c0, ...` in the schema's order) into `table`; returns
/// how many rows it inserted or replaced (with revisions: the rows written, not those deleted).
pub(super) fn write_rows(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    query: &str,
    verb: Verb,
) -> Result<u64> {
    let query = cast_columns(schema, &with_given(schema, query));
    let keyed = verb != Verb::Insert && !schema.primary_key.is_empty();
    let select = select_list(schema);
    let revisions = revision_columns(schema).map(|(_, revision, retracted)| (revision, retracted));
    let run = |sql: &str| -> Result<u64> {
        conn.execute(sql, [])
            .map(|n| n as u64)
            .map_err(|e| sink_error(table, e))
    };
    match revisions.filter(|_| keyed) {
        // Windows with revisions into a keyed table: the latest row per key wins, and a
        // retracted one deletes the key's row.
        Some((revision, retracted)) => {
            let key: Vec<String> = key_positions(schema)
                .iter()
                .map(|i| format!("c{i}"))
                .collect();
            let latest = format!(
                "SELECT * FROM ({query}) QUALIFY row_number() OVER (PARTITION BY {} ORDER BY c{revision} DESC) = 1",
                key.join(", ")
            );
            // (DuckLake's MERGE takes one UPDATE or DELETE action: the deletes go first, apart.)
            run(&format!(
                "DELETE FROM {table} AS t USING ({latest}) AS s WHERE {} AND s.c{retracted}",
                key_match(schema)
            ))?;
            let live = format!("SELECT * FROM ({latest}) WHERE NOT c{retracted}");
            match verb {
                Verb::Merge => run(&merge_sql(table, schema, &live)),
                // (A keyed table with revisions is never written with a plain insert: see
                // `write_batch`.)
                Verb::Insert | Verb::Replace => run(&format!(
                    "INSERT OR REPLACE INTO {table} ({}) SELECT {select} FROM ({live})",
                    column_list(schema),
                )),
            }
        }
        None => match verb {
            Verb::Insert | Verb::Replace => run(&format!(
                "{} INTO {table} ({}) SELECT {select} FROM ({query})",
                if verb == Verb::Replace {
                    "INSERT OR REPLACE"
                } else {
                    "INSERT"
                },
                column_list(schema),
            )),
            Verb::Merge => run(&merge_sql(table, schema, &query)),
        },
    }
}

fn key_positions(schema: &TableSchema) -> Vec<usize> {
    schema
        .primary_key
        .iter()
        .filter_map(|k| schema.columns.iter().position(|c| &c.name == k))
        .collect()
}

/// `t.k = s.cI AND ...` over the key columns (NULL keys match NULL, as a key's equality does).
fn key_match(schema: &TableSchema) -> String {
    key_positions(schema)
        .iter()
        .map(|&i| {
            format!(
                "t.{} IS NOT DISTINCT FROM s.c{i}",
                quote_ident(&schema.columns[i].name)
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// `MERGE INTO` on the schema's key columns (NULL keys match NULL, as a key's equality does);
/// `query` reads the batch function, whose columns are `c0, c1, ...` in the schema's order.
fn merge_sql(table: &str, schema: &TableSchema, query: &str) -> String {
    let col = |i: usize| format!("s.c{i}");
    let mut on = Vec::new();
    let mut set = Vec::new();
    for (i, c) in schema.table_columns() {
        let name = quote_ident(&c.name);
        if schema.primary_key.iter().any(|k| k == &c.name) {
            on.push(format!("t.{name} IS NOT DISTINCT FROM {}", col(i)));
        } else {
            set.push(format!("{name} = {}", col(i)));
        }
    }
    let values: Vec<String> = schema.table_columns().map(|(i, _)| col(i)).collect();
    let matched = if set.is_empty() {
        String::new()
    } else {
        format!(" WHEN MATCHED THEN UPDATE SET {}", set.join(", "))
    };
    format!(
        "MERGE INTO {table} AS t USING ({query}) AS s ON ({}){matched} WHEN NOT MATCHED THEN INSERT ({}) VALUES ({})",
        on.join(" AND "),
        column_list(schema),
        values.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use streaming_etl_core::ColumnType;

    #[test]
    fn a_merge_matches_on_the_key_columns_with_nulls_equal() {
        let schema = TableSchema::new(
            &[
                ("window_start_ms", ColumnType::BigInt),
                ("key", ColumnType::Varchar),
                ("count", ColumnType::BigInt),
            ],
            &["key", "window_start_ms"],
        );
        assert_eq!(
            merge_sql("\"lake\".\"w\"", &schema, "SELECT * FROM b(1)"),
            "MERGE INTO \"lake\".\"w\" AS t USING (SELECT * FROM b(1)) AS s ON (t.\"window_start_ms\" IS NOT DISTINCT FROM s.c0 AND t.\"key\" IS NOT DISTINCT FROM s.c1) WHEN MATCHED THEN UPDATE SET \"count\" = s.c2 WHEN NOT MATCHED THEN INSERT (\"window_start_ms\", \"key\", \"count\") VALUES (s.c0, s.c1, s.c2)"
        );
    }
}
