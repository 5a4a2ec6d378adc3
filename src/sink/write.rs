//! Writing rows into a table with one statement that reads them through
//! [`__streaming_etl_batch`](crate::functions::batch): a plain insert, an `INSERT OR REPLACE` by
//! primary key, or a `MERGE` on the key columns (catalogs without keys); window rows that are
//! the latest revision of each key, matched to a table of DuckDB's own storage by a list lookup.
//! What is written comes from [`insert`](super::insert).

use std::sync::Arc;

use duckdb::Connection;

use streaming_etl_core::{Column, Result, Role, Rows, TableSchema};

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

/// What a keyed write of window rows knows before DuckDB reads them: how many are live and
/// retracted, and the range of their window starts (`window_start_ms`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    pub live: usize,
    pub retracted: usize,
    pub start_ms: Option<(i64, i64)>,
    /// The rows of each window start, ascending by start (all rows have one when their counts
    /// add up to `live + retracted`).
    pub starts: Vec<Start>,
    /// The rows written are these, one each (a SQL statement's GROUP BY may make more or fewer
    /// rows of a window of the stream).
    pub one_each: bool,
    /// The rows written are computed by DuckDB from these (aggregates over staged events, a
    /// statement's GROUP BY): a write that reads them more than once reads them from a copy.
    pub computed: bool,
}

impl Facts {
    /// Facts of rows a statement makes from these (more or fewer: see `one_each`).
    pub fn made_from(self) -> Facts {
        Facts {
            one_each: false,
            computed: true,
            ..self
        }
    }

    /// Facts of rows DuckDB computes from these, one each (aggregates over staged events).
    pub fn computed_from(self) -> Facts {
        Facts {
            computed: true,
            ..self
        }
    }

    pub(super) fn add(&mut self, other: Facts) {
        self.one_each = other.one_each;
        self.live += other.live;
        self.retracted += other.retracted;
        self.start_ms = match (self.start_ms, other.start_ms) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (x, None) | (None, x) => x,
        };
        for s in other.starts {
            self.count_start(s);
        }
    }

    /// Counts `s`'s rows under its window start.
    pub(super) fn count_start(&mut self, s: Start) {
        match self.starts.binary_search_by_key(&s.ms, |x| x.ms) {
            Ok(i) => {
                self.starts[i].live += s.live;
                self.starts[i].retracted += s.retracted;
            }
            Err(i) => self.starts.insert(i, s),
        }
    }

    /// Consecutive window starts grouped into bands of at most `max` rows (a start with more
    /// rows is a band of its own); None when some row has no window start.
    fn bands(&self, max: usize) -> Option<Vec<Facts>> {
        let counted: usize = self.starts.iter().map(|s| s.live + s.retracted).sum();
        if counted != self.live + self.retracted {
            return None;
        }
        let mut bands: Vec<Facts> = Vec::new();
        for s in &self.starts {
            let rows = s.live + s.retracted;
            match bands.last_mut() {
                Some(b) if b.live + b.retracted + rows <= max => {
                    b.live += s.live;
                    b.retracted += s.retracted;
                    b.start_ms = b.start_ms.map(|(lo, _)| (lo, s.ms));
                }
                _ => bands.push(Facts {
                    live: s.live,
                    retracted: s.retracted,
                    start_ms: Some((s.ms, s.ms)),
                    starts: Vec::new(),
                    ..self.clone_flags()
                }),
            }
        }
        Some(bands)
    }

    fn clone_flags(&self) -> Facts {
        Facts {
            one_each: self.one_each,
            computed: self.computed,
            ..Facts::default()
        }
    }
}

/// The rows of one window start among a keyed write's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    pub ms: i64,
    pub live: usize,
    pub retracted: usize,
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

/// The most rows a keyed write matches to its table's rows by a list lookup rather than a join.
/// The lookup is a nested loop over the table's rows in the batch's window range, which grows
/// with the square of the rows; a join costs more up to about this many, and each join leaves
/// its partitioned hash table's blocks in DuckDB's eviction queues (see docs/reliability.md).
const LIST_MATCH_MAX: usize = 2048;

/// Writes window rows that are the latest revision of each key (see [`lend_windows`]) into a
/// keyed `table`; `facts` (DuckDB's own storage) lets a batch be matched without a join:
/// - the retracted rows' keys are deleted, the live rows update the rows of their key, and the
///   live rows whose key is not in the table are inserted; each statement reads the table's
///   rows in the batch's window range only, and matches them against one list of the batch's
///   keys, so no hash table is built (and left behind in DuckDB's eviction queues) per cycle;
/// - a batch of more rows is written in bands of consecutive window starts (many keys make
///   many rows per window), each matched so; a window start with more rows than a lookup is
///   for, or rows without facts, are written as [`write_rows`] writes them.
///
/// Returns the rows written (live ones).
pub(super) fn write_window_rows(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    query: &str,
    verb: Verb,
    facts: Option<Facts>,
) -> Result<u64> {
    // (A plain insert appends: every revision, whatever the schema's key.)
    let keyed = verb != Verb::Insert && !schema.primary_key.is_empty();
    let Some(f) = facts else {
        return write_rows(conn, table, schema, query, verb);
    };
    let Some(start) = start_column(schema).filter(|_| keyed && f.start_ms.is_some()) else {
        return write_keyed(conn, table, schema, query, verb, Some(f));
    };
    if f.live + f.retracted <= LIST_MATCH_MAX {
        let range = band_range(schema, start, &f, "t.");
        return write_listed(conn, table, schema, query, &f, &range);
    }
    let Some(bands) = f.bands(LIST_MATCH_MAX) else {
        return write_keyed(conn, table, schema, query, verb, Some(f));
    };
    // (Each band reads the rows: computed ones are computed once.)
    let rows = if f.computed {
        conn.execute_batch(&format!(
            "CREATE OR REPLACE TEMP TABLE __se_banded AS {query}"
        ))
        .map_err(|e| sink_error(table, e))?;
        "SELECT * FROM __se_banded".to_string()
    } else {
        query.to_string()
    };
    let mut written = 0;
    for band in bands {
        let in_band = format!(
            "SELECT * FROM ({rows}) WHERE {}",
            band_range(schema, start, &band, "c")
        );
        let band = Facts {
            computed: false,
            ..band
        };
        written += if band.live + band.retracted <= LIST_MATCH_MAX {
            let range = band_range(schema, start, &band, "t.");
            write_listed(conn, table, schema, &in_band, &band, &range)?
        } else {
            write_keyed(conn, table, schema, &in_band, verb, Some(band))?
        };
    }
    Ok(written)
}

/// The key column holding the window start: `window_start_ms` (BIGINT), or a SQL statement's
/// `window_start` (TIMESTAMPTZ).
fn start_column(schema: &TableSchema) -> Option<usize> {
    schema.columns.iter().position(|c| {
        schema.primary_key.contains(&c.name)
            && (c.name == "window_start_ms" || c.name == "window_start")
    })
}

/// The filter on the window start column (`start`) that covers the rows of `f`: on the table's
/// column (`side` = `"t."`) or on the batch's (`"c"`: its `c<i>`).
fn band_range(schema: &TableSchema, start: usize, f: &Facts, side: &str) -> String {
    let Some((lo, hi)) = f.start_ms else {
        return "true".into();
    };
    let col = &schema.columns[start].name;
    let name = match side {
        "c" => format!("c{start}"),
        _ => format!("{side}{}", quote_ident(col)),
    };
    match col.as_str() {
        "window_start_ms" => format!("{name} BETWEEN {lo} AND {hi}"),
        _ => format!(
            "{name} BETWEEN to_timestamp({lo}::DOUBLE / 1000) AND to_timestamp({hi}::DOUBLE / 1000)"
        ),
    }
}

/// The list-lookup form of [`write_window_rows`].
fn write_listed(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    query: &str,
    f: &Facts,
    range: &str,
) -> Result<u64> {
    let mut query = cast_columns(schema, &with_given(schema, query));
    if f.computed {
        // (Read by up to three statements: computed once.)
        conn.execute_batch(&format!(
            "CREATE OR REPLACE TEMP TABLE __se_written AS {query}"
        ))
        .map_err(|e| sink_error(table, e))?;
        query = "SELECT * FROM __se_written".to_string();
    }
    let run = |sql: &str| -> Result<u64> {
        conn.execute(sql, [])
            .map(|n| n as u64)
            .map_err(|e| sink_error(table, e))
    };
    let key = key_positions(schema);
    let struct_of = |side: &dyn Fn(usize) -> String| {
        let fields: Vec<String> = key
            .iter()
            .enumerate()
            .map(|(j, &i)| format!("k{j} := {}", side(i)))
            .collect();
        format!("struct_pack({})", fields.join(", "))
    };
    let in_table = struct_of(&|i| format!("t.{}", quote_ident(&schema.columns[i].name)));
    let in_batch = struct_of(&|i| format!("c{i}"));
    let retracted = revision_columns(schema).map(|(_, _, r)| r);
    if f.retracted > 0 {
        if let Some(r) = retracted {
            run(&format!(
                "DELETE FROM {table} AS t USING (SELECT list({in_batch}) AS keys FROM ({query}) WHERE c{r}) AS b \
                 WHERE {range} AND list_position(b.keys, {in_table}) IS NOT NULL"
            ))?;
        }
    }
    if f.live == 0 {
        return Ok(0);
    }
    let live = match retracted {
        Some(r) => format!("SELECT * FROM ({query}) WHERE NOT c{r}"),
        None => format!("SELECT * FROM ({query})"),
    };
    let values: Vec<(usize, &Column)> = schema
        .table_columns()
        .filter(|(_, c)| !schema.primary_key.contains(&c.name))
        .collect();
    let mut written = 0;
    if !values.is_empty() {
        let fields: Vec<String> = values
            .iter()
            .map(|(i, _)| format!("v{i} := c{i}"))
            .collect();
        let sets: Vec<String> = values
            .iter()
            .map(|(i, c)| {
                format!(
                    "{} = b.vals[list_position(b.keys, {in_table})].v{i}",
                    quote_ident(&c.name)
                )
            })
            .collect();
        written = run(&format!(
            "UPDATE {table} AS t SET {} FROM (SELECT list({in_batch}) AS keys, list(struct_pack({})) AS vals FROM ({live})) AS b \
             WHERE {range} AND list_position(b.keys, {in_table}) IS NOT NULL",
            sets.join(", "),
            fields.join(", ")
        ))?;
    }
    if f.one_each && written as usize >= f.live {
        return Ok(written);
    }
    let select = select_list(schema);
    let cols = column_list(schema);
    let inserted = if written == 0 {
        run(&format!(
            "INSERT INTO {table} ({cols}) SELECT {select} FROM ({live})"
        ))?
    } else {
        run(&format!(
            "INSERT INTO {table} ({cols}) SELECT {select} FROM ({live}) \
             WHERE list_position((SELECT coalesce(list({in_table}), []) FROM {table} AS t WHERE {range}), {in_batch}) IS NULL"
        ))?
    };
    Ok(written + inserted)
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
    write_keyed(conn, table, schema, query, verb, None)
}

/// [`write_rows`]; `known`: the rows are the latest revision of each key (else several
/// revisions of a key may be there, and the latest is taken by a window sort), and these are
/// their facts.
fn write_keyed(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    query: &str,
    verb: Verb,
    known: Option<Facts>,
) -> Result<u64> {
    // (Rows of no key match no row: a MERGE needs one.)
    let verb = if schema.primary_key.is_empty() {
        Verb::Insert
    } else {
        verb
    };
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
            let latest = match &known {
                Some(_) => query.clone(),
                None => {
                    let key: Vec<String> = key_positions(schema)
                        .iter()
                        .map(|i| format!("c{i}"))
                        .collect();
                    format!(
                        "SELECT * FROM ({query}) QUALIFY row_number() OVER (PARTITION BY {} ORDER BY c{revision} DESC) = 1",
                        key.join(", ")
                    )
                }
            };
            // (DuckLake's MERGE takes one UPDATE or DELETE action: the deletes go first, apart.)
            if known.as_ref().is_none_or(|f| f.retracted > 0) {
                run(&format!(
                    "DELETE FROM {table} AS t USING ({latest}) AS s WHERE {} AND s.c{retracted}",
                    key_match(schema)
                ))?;
            }
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

pub(super) fn key_positions(schema: &TableSchema) -> Vec<usize> {
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

    fn rows_at(ms: i64, live: usize, retracted: usize) -> Facts {
        let mut f = Facts {
            live,
            retracted,
            start_ms: Some((ms, ms)),
            one_each: true,
            ..Facts::default()
        };
        f.count_start(Start {
            ms,
            live,
            retracted,
        });
        f
    }

    #[test]
    fn many_rows_are_banded_by_consecutive_window_starts() {
        let mut f = rows_at(3000, 1500, 0);
        f.add(rows_at(1000, 900, 100));
        f.add(rows_at(2000, 500, 0));
        f.add(rows_at(1000, 10, 0));
        f.add(rows_at(4000, 5000, 0));
        f.add(rows_at(5000, 1, 1));
        assert_eq!(f.live + f.retracted, 8012);
        let bands = f.bands(2048).unwrap();
        let shown: Vec<_> = bands
            .iter()
            .map(|b| (b.start_ms, b.live, b.retracted, b.one_each))
            .collect();
        assert_eq!(
            shown,
            [
                (Some((1000, 2000)), 1410, 100, true),
                (Some((3000, 3000)), 1500, 0, true),
                // (More rows than a lookup is for: this start is a band of its own.)
                (Some((4000, 4000)), 5000, 0, true),
                (Some((5000, 5000)), 1, 1, true),
            ]
        );
    }

    #[test]
    fn rows_without_a_window_start_are_not_banded() {
        let mut f = rows_at(1000, 10, 0);
        f.live += 1;
        assert_eq!(f.bands(2048), None);
    }
}
