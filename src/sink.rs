//! The DuckDB sink: creates a job's tables from their declared schemas and writes a cycle's
//! output through the extension's own connection, in one transaction, idempotently, with the
//! batch's marker in the same transaction (the checkpoint asks it whether a batch landed).
//!
//! Each table's rows go in with one `INSERT ... SELECT` from `__streaming_etl_batch` (DuckDB reads
//! them a vector at a time; no SQL text and no call per value). `upsert` mode: rows are upserted
//! by each table's primary key (windows by key and window start, late events and dead letters
//! by topic, partition and offset), so applying a batch again after a crash changes nothing. A
//! batch applied for the first time is inserted plainly (its rows cannot exist yet); a batch
//! applied again (the outbox after a crash), or one whose insert hits rows that exist (a job
//! restarted from scratch over its old tables), is inserted with `INSERT OR REPLACE`.
//!
//! Every batch's number is written to a marker table in the same transaction: a state the
//! checkpoint holds in doubt is kept if its batch's marker is there. `append` mode (and any
//! table the user created without a key): no index to maintain; a replay of a batch that was
//! applied (an older checkpoint's outbox) finds its marker and is skipped.
//!
//! Catalogs without keys (DuckLake): `upsert` is a `MERGE` on the key columns, the marker table
//! is appended to (never deleted from), a commit that conflicts with another writer is retried a
//! bounded number of times, and `compact_every` merges the lake's small files now and then.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use duckdb::Connection;
use streaming_etl_core::{ByTable, ColumnType, EtlError, OutputSchemas, Result, Rows, TableSchema};
use streaming_etl_runtime::sink::{Output, OutputSink, Tables};

use crate::batch_function::{self, Lent};
use crate::catalog::OutputCatalog;
use crate::host::PooledConn;
use crate::params::{quote_ident, Compaction, TableName, WriteMode};

/// The table that records, per job, the last batch applied.
pub const MARKER_TABLE: &str = "streaming_etl_batches";

/// Commits that conflict with another writer's (a DuckLake's optimistic concurrency) are tried
/// this many times in all, waiting 20 ms, 40 ms, ... up to 1 s in between.
pub const COMMIT_ATTEMPTS: u32 = 8;

/// How a table takes a batch's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Keys {
    /// No key: appended (a marker table records the batch).
    #[default]
    None,
    /// A primary key (DuckDB's storage): `INSERT OR REPLACE` where rows may exist.
    Primary,
    /// Key columns without an index (a catalog without keys): `MERGE` on them.
    Merge,
}

pub struct DuckSink {
    conn: PooledConn,
    mode: WriteMode,
    /// The job's tables as parsed at bind time.
    job_tables: ByTable<TableName>,
    /// The catalog they are in (resolved at bind time).
    catalog: OutputCatalog,
    compaction: Option<Compaction>,
    /// Per set of tables: how each takes rows, and the marker table.
    prepared: HashMap<Tables, (ByTable<Keys>, String)>,
}

impl DuckSink {
    pub fn new(
        conn: PooledConn,
        mode: WriteMode,
        tables: &ByTable<TableName>,
        catalog: OutputCatalog,
        compaction: Option<Compaction>,
    ) -> DuckSink {
        DuckSink {
            conn,
            mode,
            job_tables: tables.clone(),
            catalog,
            compaction,
            prepared: HashMap::new(),
        }
    }

    /// The marker table beside the windows table (same catalog and schema: one transaction
    /// writes both).
    fn marker_table(&self, tables: &Tables) -> String {
        let windows = if *tables == self.job_tables.as_ref().map(TableName::sql) {
            self.job_tables.windows.clone()
        } else {
            // Tables of a batch an earlier run left in the outbox: their names as it stored
            // them, which were parsed and quoted when that run started.
            TableName::parse(&tables.windows).unwrap_or(TableName { parts: Vec::new() })
        };
        windows.sibling(MARKER_TABLE).sql()
    }
}

pub(crate) fn sink_error(table: &str, message: impl std::fmt::Display) -> EtlError {
    EtlError::Sink {
        table: table.to_string(),
        message: message.to_string(),
    }
}

/// `CREATE TABLE` column list (and primary key) of a schema.
pub fn ddl_columns(schema: &TableSchema) -> String {
    let mut cols: Vec<String> = schema
        .columns
        .iter()
        .map(|c| format!("{} {}", quote_ident(&c.name), c.ty.sql()))
        .collect();
    if !schema.primary_key.is_empty() {
        let key: Vec<String> = schema.primary_key.iter().map(|k| quote_ident(k)).collect();
        cols.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    cols.join(", ")
}

fn column_list(schema: &TableSchema) -> String {
    schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes sure `table` exists and has every column of `schema`; returns whether it has a primary
/// key (a table the user created without one is appended to, whatever the mode). `keys`: whether
/// the catalog has primary keys (the table is created without one where it has not).
pub(crate) fn ensure_table(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    keys: bool,
) -> Result<bool> {
    let declared = if keys {
        ddl_columns(schema)
    } else {
        ddl_columns(&schema.without_key())
    };
    conn.execute_batch(&format!("CREATE TABLE IF NOT EXISTS {table} ({declared})"))
        .map_err(|e| sink_error(table, e))?;
    let mut stmt = conn
        .prepare(&format!("SELECT column_name, key FROM (DESCRIBE {table})"))
        .map_err(|e| sink_error(table, e))?;
    let have: Vec<(String, Option<String>)> = stmt
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })
        .map_err(|e| sink_error(table, e))?
        .collect::<duckdb::Result<_>>()
        .map_err(|e| sink_error(table, e))?;
    let missing: Vec<&str> = schema
        .columns
        .iter()
        .filter(|c| !have.iter().any(|(h, _)| h.eq_ignore_ascii_case(&c.name)))
        .map(|c| c.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(sink_error(
            table,
            format!(
                "the existing table lacks the column(s) {} that this job writes; drop or alter it, or name another table",
                missing.join(", ")
            ),
        ));
    }
    Ok(have.iter().any(|(_, k)| k.as_deref() == Some("PRI")))
}

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
/// statement reading [`batch_function`](crate::batch_function): DuckDB takes the rows a vector
/// at a time.
fn insert(
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
    let lent: Vec<Lent> = parts
        .iter()
        .map(|p| Lent::new(Arc::new(p.rows.clone())))
        .collect();
    let selects: Vec<String> = parts
        .iter()
        .zip(&lent)
        .map(|(p, lent)| {
            // Qualified: a macro of the same name in the user's schema cannot stand in for it.
            let batch = format!("system.main.{}({})", batch_function::NAME, lent.id);
            match p.partition {
                Some(k) => format!(
                    "SELECT *, CAST({k} AS INTEGER) AS c{} FROM {batch}",
                    p.rows.types().len()
                ),
                None => format!("SELECT * FROM {batch}"),
            }
        })
        .collect();
    let query = selects.join(" UNION ALL ");
    let keyed = verb != Verb::Insert && !schema.primary_key.is_empty();
    let sql = match revision_columns(schema).filter(|_| keyed) {
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
            let delete = format!(
                "DELETE FROM {table} AS t USING ({latest}) AS s WHERE {} AND s.c{retracted}",
                key_match(schema)
            );
            let live = format!("SELECT * FROM ({latest}) WHERE NOT c{retracted}");
            match verb {
                Verb::Merge => format!("{delete}; {}", merge_sql(table, schema, &live)),
                // (A keyed table with revisions is never written with a plain insert: see
                // `write_batch`.)
                Verb::Insert | Verb::Replace => format!(
                    "{delete}; INSERT OR REPLACE INTO {table} ({}) {live}",
                    column_list(schema),
                ),
            }
        }
        None => match verb {
            Verb::Insert | Verb::Replace => format!(
                "{} INTO {table} ({}) {query}",
                if verb == Verb::Replace {
                    "INSERT OR REPLACE"
                } else {
                    "INSERT"
                },
                column_list(schema),
            ),
            Verb::Merge => merge_sql(table, schema, &query),
        },
    };
    conn.execute_batch(&sql).map_err(|e| sink_error(table, e))
}

/// The positions of `revision` and `retracted` in a windows table whose rows
/// have revisions (`emit := 'update'`, `late_updates_ms`): the three BOOLEAN/BIGINT/BOOLEAN
/// columns after the aggregates (no aggregate is BOOLEAN, so they cannot be mistaken).
fn revision_columns(schema: &TableSchema) -> Option<(usize, usize)> {
    let cols = &schema.columns;
    let at = cols.iter().position(|c| c.name == "final")?;
    let names = cols.get(at..at + 3)?;
    let fits = names.iter().map(|c| (c.name.as_str(), c.ty)).eq([
        ("final", ColumnType::Boolean),
        ("revision", ColumnType::BigInt),
        ("retracted", ColumnType::Boolean),
    ]);
    fits.then_some((at + 1, at + 2))
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
    for (i, c) in schema.columns.iter().enumerate() {
        let name = quote_ident(&c.name);
        if schema.primary_key.iter().any(|k| k == &c.name) {
            on.push(format!("t.{name} IS NOT DISTINCT FROM {}", col(i)));
        } else {
            set.push(format!("{name} = {}", col(i)));
        }
    }
    let values: Vec<String> = (0..schema.columns.len()).map(col).collect();
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

/// How a batch meets its tables.
struct WritePlan<'a> {
    /// How each table takes rows.
    keys: ByTable<Keys>,
    /// A table with a primary key takes the batch by appending (its rows cannot exist yet)
    /// rather than by upserting.
    append_keyed: bool,
    /// The marker table that records the batch.
    marker: &'a str,
    /// Whether the marker table keeps one row per job (DuckDB's storage) or is appended to.
    prune_marker: bool,
}

impl WritePlan<'_> {
    fn verb(&self, keys: Keys) -> Verb {
        match keys {
            Keys::None => Verb::Insert,
            Keys::Primary if self.append_keyed => Verb::Insert,
            Keys::Primary => Verb::Replace,
            Keys::Merge => Verb::Merge,
        }
    }
}

/// Writes the batch's three tables, and its marker, in one transaction.
fn write_batch(conn: &Connection, out: &Output<'_>, plan: &WritePlan<'_>) -> Result<()> {
    conn.execute_batch("BEGIN TRANSACTION")
        .map_err(|e| EtlError::Duck(e.to_string()))?;
    let result = (|| {
        let parts = out.tables.as_ref().zip(out.schemas.as_ref());
        for (((table, schema), rows), keys) in parts.zip(out.batch.as_ref()).zip(plan.keys) {
            let verb = match plan.verb(keys) {
                // A window's row may be in the table already, from an earlier cycle.
                Verb::Insert if keys == Keys::Primary && revision_columns(schema).is_some() => {
                    Verb::Replace
                }
                verb => verb,
            };
            insert(conn, table, schema, rows, verb)?;
        }
        let marker = plan.marker;
        // Batches are applied in order, each one only once the ones before it are confirmed:
        // the job's latest marker is the only one a replay or a state in doubt can need.
        if plan.prune_marker {
            conn.execute(
                &format!("DELETE FROM {marker} WHERE job = ?"),
                duckdb::params![out.job],
            )
            .map_err(|e| sink_error(marker, e))?;
        }
        conn.execute(
            &format!("INSERT INTO {marker} VALUES (?, ?, ?, epoch_ms(now()))"),
            duckdb::params![out.job, out.job_created_ms, out.seq],
        )
        .map_err(|e| sink_error(marker, e))?;
        streaming_etl_runtime::fault::crash_point("sink-before-commit");
        conn.execute_batch("COMMIT")
            .map_err(|e| sink_error(&out.tables.windows, e))
    })();
    if result.is_err() {
        // A failed statement leaves the transaction aborted; the connection must be reset
        // before it can be used again.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// Whether the marker table records this batch as applied.
fn applied(conn: &Connection, marker: &str, out: &Output<'_>) -> Result<bool> {
    conn.query_row(
        &format!("SELECT count(*) FROM {marker} WHERE job = ? AND job_created_ms = ? AND seq = ?"),
        duckdb::params![out.job, out.job_created_ms, out.seq],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
    .map_err(|e| sink_error(marker, e))
}

/// Whether a failed write lost a race with another writer's commit, so that trying again can
/// succeed: DuckLake's "Transaction conflict - ...", DuckDB's "Conflict on update", and any other
/// failed DuckLake commit (several processes creating tables in one lake at once can also make
/// DuckLake 1.4.4 fail a commit with "Failed to parse catalog entry"). A failed commit wrote
/// nothing, and a retry first asks the marker whether the batch is there.
fn is_conflict(e: &EtlError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("conflict") || text.contains("failed to commit ducklake transaction")
}

/// How long a write that conflicts is tried again.
enum Bound {
    /// This many tries in all, waiting 20 ms, 40 ms, ... up to 1 s in between.
    Attempts(u32),
    /// Until this long has passed, each wait shortened by a random part so that writers that
    /// collided do not collide again in step.
    For(Duration),
}

/// Tries `write` while it fails on a conflict, within `bound`.
fn retry_conflicts<T>(
    table: &str,
    bound: Bound,
    mut write: impl FnMut() -> Result<T>,
) -> Result<T> {
    use std::hash::{BuildHasher, Hasher};
    let started = std::time::Instant::now();
    let mut wait = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        let e = match write() {
            Err(e) if is_conflict(&e) => e,
            other => return other,
        };
        let message = match bound {
            Bound::Attempts(n) if attempt >= n => format!("the commit failed {n} times in a row (conflicting with other writers, or refused by the catalog)"),
            Bound::For(d) if started.elapsed() >= d => format!("the commit conflicted with other writers for {} s without landing", d.as_secs()),
            Bound::Attempts(_) => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(1));
                attempt += 1;
                continue;
            }
            Bound::For(_) => {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(wait.as_nanos() as u64);
                let jitter = (h.finish() % 1000) as u32;
                std::thread::sleep(wait / 2 + wait / 2 * jitter / 1000);
                wait = (wait * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        return Err(sink_error(
            table,
            format!("{message}; nothing of this cycle was written, and the next run resumes it (last error: {e})"),
        ));
    }
}

/// Tries `write` up to [`COMMIT_ATTEMPTS`] times while it fails on a conflict.
pub(crate) fn with_retry<T>(table: &str, write: impl FnMut() -> Result<T>) -> Result<T> {
    retry_conflicts(table, Bound::Attempts(COMMIT_ATTEMPTS), write)
}

/// Tries `write` while it fails on a conflict for up to `bound`, with jittered waits. For
/// writers that contend all the time (the members of a `subscribe` job): each conflict means
/// another writer's commit landed, so the group as a whole moves on.
pub(crate) fn with_retry_for<T>(
    table: &str,
    bound: Duration,
    write: impl FnMut() -> Result<T>,
) -> Result<T> {
    retry_conflicts(table, Bound::For(bound), write)
}

/// DuckLake's own maintenance: merges the small files of the job's tables (and of its marker
/// table, which gains a file per commit too), expires snapshots older than the retention and
/// deletes the files no snapshot needs any more.
pub(crate) fn compact(
    conn: &Connection,
    catalog: &str,
    tables: &Tables,
    marker: Option<&str>,
    retain_ms: i64,
) -> Result<()> {
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let mut sql = String::new();
    for table in tables.iter().map(String::as_str).chain(marker) {
        let name = TableName::parse(table).unwrap_or(TableName { parts: Vec::new() });
        let Some(bare) = name.parts.last() else {
            continue;
        };
        let schema = match name.parts.as_slice() {
            [_, s, _] => s.clone(),
            [s, _] if !s.eq_ignore_ascii_case(catalog) => s.clone(),
            _ => "main".to_string(),
        };
        sql += &format!(
            "CALL ducklake_merge_adjacent_files({}, {}, schema => {});\n",
            lit(catalog),
            lit(bare),
            lit(&schema)
        );
    }
    let before = format!("now() - INTERVAL {} MILLISECOND", retain_ms.max(0));
    sql += &format!(
        "CALL ducklake_expire_snapshots({}, older_than => {before});\nCALL ducklake_cleanup_old_files({}, older_than => {before});",
        lit(catalog),
        lit(catalog)
    );
    conn.execute_batch(&sql).map_err(|e| {
        sink_error(
            &tables.windows,
            format!("compacting DuckLake '{catalog}': {e}"),
        )
    })
}

impl OutputSink for DuckSink {
    fn prepare(&mut self, tables: &Tables, schemas: &OutputSchemas) -> Result<()> {
        let conn = self.conn.conn()?;
        let catalog_keys = self.catalog.has_keys();
        let mut keys = ByTable::<Keys>::default();
        for ((table, schema), k) in tables.as_ref().zip(schemas.as_ref()).zip(keys.as_mut()) {
            let declared = match self.mode {
                WriteMode::Upsert => schema.clone(),
                WriteMode::Append => schema.without_key(),
            };
            // Two jobs creating a lake's table at once conflict; the one that retries finds it.
            let mut primary = false;
            with_retry(table, || {
                primary = ensure_table(conn, table, &declared, catalog_keys).inspect_err(|_| {
                    let _ = conn.execute_batch("ROLLBACK");
                })?;
                Ok(())
            })?;
            *k = match (primary, self.mode) {
                (true, _) => Keys::Primary,
                (false, WriteMode::Upsert) if !catalog_keys => Keys::Merge,
                _ => Keys::None,
            };
        }
        let m = self.marker_table(tables);
        with_retry(&m, || {
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {m} (job VARCHAR, job_created_ms BIGINT, seq BIGINT, applied_ms BIGINT)"
            ))
            .map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                sink_error(&m, e)
            })
        })?;
        self.prepared.insert(tables.clone(), (keys, m));
        Ok(())
    }

    fn apply(&mut self, out: &Output<'_>) -> Result<()> {
        if out.batch.is_empty() {
            return Ok(());
        }
        let conn = self.conn.conn()?;
        let (keys, marker) = self
            .prepared
            .get(out.tables)
            .cloned()
            .ok_or_else(|| EtlError::Internal("a batch for tables not prepared".into()))?;
        let marker = marker.as_str();
        let mut plan = WritePlan {
            keys,
            append_keyed: !out.replay,
            marker,
            prune_marker: self.catalog.has_keys(),
        };
        with_retry(&out.tables.windows, || {
            // A replay, or a retry after a conflict that may have landed after all: the marker
            // says whether the batch is there.
            if (out.replay || !plan.append_keyed) && applied(conn, marker, out)? {
                return Ok(());
            }
            if plan.append_keyed && write_batch(conn, out, &plan).is_ok() {
                return Ok(());
            }
            plan.append_keyed = false;
            write_batch(conn, out, &plan)
        })?;
        if let Some(c) = &self.compaction {
            if self.catalog.is_ducklake() && out.seq % c.every == 0 {
                // The cycle is committed: a compaction that fails (another writer compacting the
                // same lake) is only tried again later.
                if let Err(e) = compact(
                    conn,
                    &self.catalog.name,
                    out.tables,
                    Some(marker),
                    c.retain_ms,
                ) {
                    eprintln!("streaming_etl: {e} (tried again in {} cycles)", c.every);
                }
            }
        }
        Ok(())
    }

    fn landed(
        &mut self,
        tables: &Tables,
        job: &str,
        job_created_ms: i64,
        seq: i64,
    ) -> Result<bool> {
        let conn = self.conn.conn()?;
        let marker = self.marker_table(tables);
        // A marker table that is not there (the tables were dropped or renamed) has no marker.
        let exists = conn
            .prepare(&format!("SELECT 1 FROM {marker} LIMIT 0"))
            .is_ok();
        if !exists {
            return Ok(false);
        }
        conn.query_row(
            &format!(
                "SELECT coalesce(max(seq), -1) FROM {marker} WHERE job = ? AND job_created_ms = ?"
            ),
            duckdb::params![job, job_created_ms],
            |r| r.get::<_, i64>(0),
        )
        .map(|latest| latest >= seq)
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            sink_error(&marker, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streaming_etl_core::ColumnType;

    fn conflict() -> EtlError {
        sink_error(
            "lake.windows",
            "Failed to commit DuckLake transaction. Transaction conflict - attempting to insert into table with index \"1\" - but another transaction has altered it",
        )
    }

    #[test]
    fn conflicts_are_retried_a_bounded_number_of_times() {
        let mut tries = 0;
        assert!(with_retry("lake.windows", || {
            tries += 1;
            if tries < 3 {
                Err(conflict())
            } else {
                Ok(())
            }
        })
        .is_ok());
        assert_eq!(tries, 3);

        let mut tries = 0;
        let err = with_retry("lake.windows", || {
            tries += 1;
            Err::<(), _>(conflict())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(tries, COMMIT_ATTEMPTS);
        assert!(
            err.starts_with("writing to table lake.windows: the commit failed 8 times in a row (conflicting with other writers, or refused by the catalog)"),
            "{err}"
        );

        // Any other failure is not retried.
        let mut tries = 0;
        let err = with_retry("t", || {
            tries += 1;
            Err::<(), _>(sink_error("t", "No space left on device"))
        });
        assert_eq!(tries, 1);
        assert_eq!(
            err.unwrap_err().to_string(),
            "writing to table t: No space left on device"
        );
    }

    #[test]
    fn contended_commits_are_retried_until_the_bound_then_fail_naming_it() {
        let mut tries = 0;
        let got = with_retry_for("lake.s", Duration::from_secs(5), || {
            tries += 1;
            if tries < 12 {
                Err(conflict())
            } else {
                Ok(tries)
            }
        });
        // More than COMMIT_ATTEMPTS tries: the bound is a time, not a count.
        assert_eq!(got.unwrap(), 12);
        let err = with_retry_for("lake.s", Duration::from_millis(300), || {
            Err::<(), _>(conflict())
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("writing to table lake.s: the commit conflicted with other writers for 0 s without landing"),
            "{err}"
        );
    }

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
