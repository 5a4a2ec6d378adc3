//! The DuckDB sink of a run ([`DuckSink`]): creates a job's tables from their declared schemas
//! and writes a cycle's output through the extension's own connection, in one transaction,
//! idempotently, with the batch's marker in the same transaction (the checkpoint asks it whether
//! a batch landed). The statements are in `insert.rs`, the tables' creation in `tables.rs`.
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
//! bounded number of times, and `compact_every` merges the lake's small files now and then (both
//! in `lake.rs`).

use std::collections::HashMap;

use duckdb::Connection;
use streaming_etl_core::{ByTable, EtlError, OutputSchemas, Result, TableSchema};
use streaming_etl_runtime::sink::{Output, OutputSink, Tables, Written};

use super::catalog::OutputCatalog;
use super::insert::{insert, insert_staged, insert_windows, StagedPart, StagedWrite};
use super::lake::{compact, with_retry};
use super::owners::{self, Claims, Owner};
use super::sql_cycle::{add_output_column, Cycle, SqlOutput};
use super::staged::{ensure_staged_table, Staging};
use super::tables::{ensure_table, revision_columns, sink_error, with_job};
use super::write::{Part, Verb};
use crate::host::connections::SharedConn;
use crate::params::{Compaction, TableName, WriteMode};

/// The table that records, per job, the last batch applied.
pub const MARKER_TABLE: &str = "streaming_etl_batches";

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
    conn: SharedConn,
    mode: WriteMode,
    /// The job's tables as parsed at bind time.
    job_tables: ByTable<TableName>,
    /// The catalog they are in (resolved at bind time).
    catalog: OutputCatalog,
    compaction: Option<Compaction>,
    /// Per set of tables: how each takes rows, the marker table, and which tables carry the
    /// job in a column (late events and dead letters that jobs share).
    prepared: HashMap<Tables, Prepared>,
    /// The job its tables are claimed for, and its claims (see `owners`).
    owner: Owner,
    claims: Claims,
    /// The aggregates DuckDB computes over the job's staged events, if it has any.
    staging: Option<Staging>,
    /// A job written as SQL: its statements' outputs.
    sql: Vec<SqlOutput>,
}

impl DuckSink {
    pub fn new(
        conn: SharedConn,
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
            owner: Owner::default(),
            claims: Claims::default(),
            staging: None,
            sql: Vec::new(),
        }
    }

    /// The job the tables are claimed for, and written under.
    pub fn with_owner(mut self, owner: Owner) -> DuckSink {
        self.owner = owner;
        self
    }

    /// A sink for a job written as SQL (see `sql_cycle`).
    pub fn with_sql(mut self, sql: Vec<SqlOutput>) -> DuckSink {
        self.sql = sql;
        self
    }

    /// The SQL statements' outputs for the job's own tables (none: a job of parameters, or a
    /// batch an earlier version left).
    fn sql_for(&self, tables: &Tables) -> &[SqlOutput] {
        if *tables == self.job_tables.as_ref().map(TableName::sql) {
            &self.sql
        } else {
            &[]
        }
    }

    /// A sink for a job whose aggregates DuckDB computes in part (see `staged`).
    pub fn with_staging(mut self, staging: Option<Staging>) -> DuckSink {
        self.staging = staging;
        self
    }

    /// The staging of the job's own tables (a batch an earlier version left has none).
    fn staging_for(&self, tables: &Tables) -> Option<&Staging> {
        self.staging
            .as_ref()
            .filter(|_| *tables == self.job_tables.as_ref().map(TableName::sql))
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

impl DuckSink {
    /// Makes the tables (and the staged events' tables) as missing; returns how each takes rows.
    /// A late or dead table is made with the job's column, which lets jobs share it; one made
    /// before that column existed is written as it is.
    fn create_tables(
        &self,
        conn: &Connection,
        tables: &Tables,
        schemas: &OutputSchemas,
    ) -> Result<ByTable<Keys>> {
        let catalog_keys = self.catalog.has_keys();
        let mut keys = ByTable::<Keys>::default();
        let sql = self.sql_for(tables);
        let sql_schemas = sql.first().map(|s| ByTable {
            windows: s.created(),
            late: SqlOutput::late_schema(&schemas.late),
            dead: schemas.dead.clone(),
        });
        if !sql.is_empty() {
            add_output_column(conn, &tables.late)?;
        }
        let schemas = sql_schemas.as_ref().unwrap_or(schemas);
        for (i, ((table, schema), k)) in tables
            .as_ref()
            .zip(schemas.as_ref())
            .zip(keys.as_mut())
            .into_iter()
            .enumerate()
        {
            let shared = i > 0 && !owners::lacks_job_column(conn, table);
            let schema = with_job(schema, shared.then_some(""));
            let keyed = i == 0 && sql.first().is_some_and(SqlOutput::is_keyed);
            let declared = match self.mode {
                WriteMode::Append if !keyed => schema.without_key(),
                _ => schema,
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
        for s in sql.iter().skip(1) {
            // The other statements' targets, as the first's (the windows table's place).
            let table = s.stmt.target.sql();
            with_retry(&table, || {
                ensure_table(conn, &table, &s.created(), catalog_keys)
                    .inspect_err(|_| {
                        let _ = conn.execute_batch("ROLLBACK");
                    })
                    .map(drop)
            })?;
        }
        if let (false, WriteMode::Upsert) = (sql.is_empty(), self.mode) {
            // A statement's target has no primary key (its GROUP BY keys may be NULL): rows
            // are matched on them with NULLs equal.
            keys.windows = Keys::Merge;
        }
        let stagings = self
            .staging_for(tables)
            .into_iter()
            .chain(sql.iter().filter_map(SqlOutput::staging));
        for staging in stagings {
            with_retry(&staging.table, || {
                ensure_staged_table(conn, staging).inspect_err(|_| {
                    let _ = conn.execute_batch("ROLLBACK");
                })
            })?;
        }
        Ok(keys)
    }
}

/// How a set of tables was prepared.
#[derive(Debug, Clone)]
struct Prepared {
    keys: ByTable<Keys>,
    marker: String,
    /// Late events and dead letters carry the job in a column (and their key).
    jobbed: ByTable<bool>,
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
    staging: Option<&'a Staging>,
    sql: &'a [SqlOutput],
    /// The late and dead tables' shapes as written (with the job's column where they have it).
    schemas: ByTable<TableSchema>,
    /// The job, where the late table carries it.
    late_job: Option<&'a str>,
    /// The job's claims on its tables, when this commit records them.
    claims: Option<(&'a Owner, &'a Claims)>,
    /// The tables are in DuckDB's own storage (a small batch of window rows is matched to a
    /// keyed table's rows without a join: see `write::write_window_rows`).
    native: bool,
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
fn write_batch(conn: &Connection, out: &Output<'_>, plan: &WritePlan<'_>) -> Result<Written> {
    conn.execute_batch("BEGIN TRANSACTION")
        .map_err(|e| EtlError::Duck(e.to_string()))?;
    let result = (|| {
        let mut written = Written::default();
        if let Some((owner, claims)) = plan.claims {
            owners::record(conn, owner, claims)?;
        }
        if out.seq == 1 {
            let stagings = plan
                .staging
                .into_iter()
                .chain(plan.sql.iter().filter_map(SqlOutput::staging));
            for staging in stagings {
                // A new job: events staged under its name by an earlier job are none of its own.
                conn.execute_batch(&staging.clear(None))
                    .map_err(|e| sink_error(&staging.table, e))?;
            }
        }
        for sql in plan.sql {
            let batch = sql.part(out.batch);
            let windows = [Part {
                rows: &batch.windows,
                partition: None,
            }];
            let late = [Part {
                rows: &batch.late,
                partition: None,
            }];
            let staged = [StagedPart {
                rows: &batch.staged.rows,
                partition: None,
                live_from_pane_ms: batch.staged.live_from_pane_ms,
            }];
            let cycle = Cycle {
                windows: &windows,
                late: &late,
                staged: &staged,
                late_table: &out.tables.late,
                late_schema: &out.schemas.late,
                job: plan.late_job,
                native: plan.native,
            };
            written = written.plus(sql.write(
                conn,
                &cycle,
                plan.verb(plan.keys.windows),
                plan.verb(plan.keys.late),
            )?);
        }
        if !plan.sql.is_empty() {
            insert(
                conn,
                &out.tables.dead,
                &plan.schemas.dead,
                &out.batch.dead,
                plan.verb(plan.keys.dead),
            )?;
        }
        let parts = out.tables.as_ref().zip(plan.schemas.as_ref());
        for (i, (((table, schema), rows), keys)) in parts
            .zip(out.batch.as_ref())
            .zip(plan.keys)
            .into_iter()
            .enumerate()
            .filter(|_| plan.sql.is_empty())
        {
            let verb = match plan.verb(keys) {
                // A window's row may be in the table already, from an earlier cycle.
                Verb::Insert if keys == Keys::Primary && revision_columns(schema).is_some() => {
                    Verb::Replace
                }
                verb => verb,
            };
            match plan.staging.filter(|_| i == 0) {
                Some(staging) => {
                    let staged = &out.batch.staged;
                    let part = Part {
                        rows,
                        partition: None,
                    };
                    let events = StagedPart {
                        rows: &staged.rows,
                        partition: None,
                        live_from_pane_ms: staged.live_from_pane_ms,
                    };
                    let write = StagedWrite {
                        staging,
                        events: &[events],
                        native: plan.native,
                    };
                    insert_staged(conn, table, schema, &[part], verb, write)?;
                }
                None if i == 0 => {
                    let part = Part {
                        rows,
                        partition: None,
                    };
                    insert_windows(conn, table, schema, &[part], verb, plan.native)?;
                }
                None => insert(conn, table, schema, rows, verb)?,
            }
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
            .map_err(|e| sink_error(&out.tables.windows, e))?;
        Ok(written)
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

impl OutputSink for DuckSink {
    fn prepare(&mut self, tables: &Tables, schemas: &OutputSchemas) -> Result<()> {
        let guard = self.conn.lock();
        let conn = guard.conn()?;
        let own = *tables == self.job_tables.as_ref().map(TableName::sql);
        if own {
            // The job's own tables: another job's are refused before anything is made.
            let uses = owners::uses(&self.job_tables, &self.sql, &self.owner);
            self.claims = owners::check(conn, &self.owner, uses)?;
        }
        let keys = self.create_tables(conn, tables, schemas)?;
        let jobbed = ByTable {
            windows: false,
            late: !owners::lacks_job_column(conn, &tables.late),
            dead: !owners::lacks_job_column(conn, &tables.dead),
        };
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
        self.prepared.insert(
            tables.clone(),
            Prepared {
                keys,
                marker: m,
                jobbed,
            },
        );
        Ok(())
    }

    fn apply(&mut self, out: &Output<'_>) -> Result<Written> {
        if out.batch.is_empty() {
            return Ok(Written::default());
        }
        let guard = self.conn.lock();
        let conn = guard.conn()?;
        let prepared = self
            .prepared
            .get(out.tables)
            .cloned()
            .ok_or_else(|| EtlError::Internal("a batch for tables not prepared".into()))?;
        let own = *out.tables == self.job_tables.as_ref().map(TableName::sql);
        let claiming = own && self.claims.pending();
        // Claims are recorded one commit at a time in the process, from their check to the end
        // of the commit's transaction.
        let _claiming = claiming.then(owners::claiming);
        let marker = prepared.marker.as_str();
        let job = |on: bool| on.then_some(out.job);
        let mut plan = WritePlan {
            keys: prepared.keys,
            append_keyed: !out.replay,
            marker,
            prune_marker: self.catalog.has_keys(),
            staging: self.staging_for(out.tables),
            sql: self.sql_for(out.tables),
            schemas: ByTable {
                windows: out.schemas.windows.clone(),
                late: with_job(&out.schemas.late, job(prepared.jobbed.late)),
                dead: with_job(&out.schemas.dead, job(prepared.jobbed.dead)),
            },
            late_job: job(prepared.jobbed.late),
            claims: claiming.then_some((&self.owner, &self.claims)),
            native: self.catalog.has_keys(),
        };
        let (written, recorded) = with_retry(&out.tables.windows, || {
            // A replay, or a retry after a conflict that may have landed after all: the marker
            // says whether the batch is there.
            if (out.replay || !plan.append_keyed) && applied(conn, marker, out)? {
                return Ok((Written::default(), false));
            }
            if plan.append_keyed {
                if let Ok(w) = write_batch(conn, out, &plan) {
                    return Ok((w, true));
                }
            }
            plan.append_keyed = false;
            write_batch(conn, out, &plan).map(|w| (w, true))
        })?;
        if claiming && recorded {
            self.claims.recorded();
        }
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
        Ok(written)
    }

    fn landed(
        &mut self,
        tables: &Tables,
        job: &str,
        job_created_ms: i64,
        seq: i64,
    ) -> Result<bool> {
        let guard = self.conn.lock();
        let conn = guard.conn()?;
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
