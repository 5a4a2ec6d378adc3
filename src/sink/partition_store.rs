//! Partition state in the output catalog, for `subscribe` runs: one row per (job, partition)
//! in `streaming_etl_partitions` beside the windows table, holding the partition's offset,
//! watermark and open windows under its owner's generation. A cycle's rows and the new state
//! rows are one transaction, so a partition's next owner resumes exactly from the last commit.
//!
//! Fencing: DuckLake does not see two inserts into one table as a conflict, but it does fail a
//! commit that deletes a row another commit deleted first. So every claim and every commit
//! deletes the partition's current state row and inserts its successor: two members writing
//! one partition at once collide, and the one that retries finds the row's generation is no
//! longer its own. Claims also replace one anchor row, so two claims of a partition that has no
//! state row yet collide too.

use std::time::Duration;

use duckdb::types::Value;
use duckdb::Connection;
use streaming_etl_core::{ByTable, EtlError, JobSettings, OutputSchemas, Result, TableSchema};
use streaming_etl_runtime::clock::{Clock, SystemClock};
use streaming_etl_runtime::group::{settings_text, Claim, Moved, PartitionCommit, PartitionStore};
use streaming_etl_runtime::sink::Written;

use super::catalog::OutputCatalog;
use super::lake::{
    compact, ensure_tables, keep_in_files, restore_retry_wait, shorten_retry_wait, with_retry,
    with_retry_for,
};
use super::owners;
use super::partition_rows::PartitionOutput;
use super::sql_cycle::{add_output_column, SqlOutput};
use super::staged::{ensure_staged_table, Staging};
use super::tables::sink_error;
pub use super::tables::windows_with_partition;
use super::tables::with_job;
use super::write::Verb;
use crate::host::connections::SharedConn;
use crate::params::{Compaction, TableName, WriteMode};

mod claims;

/// How long claims and commits retry conflicts: the members of a job contend for the state
/// table all the time (claims on its anchor row, commits where one file holds rows of
/// partitions that now have different owners).
const CONTENDED_FOR: Duration = Duration::from_secs(60);

/// The state table's name, beside the windows table.
pub const STATE_TABLE: &str = "streaming_etl_partitions";

const STATE_COLUMNS: &str = "job VARCHAR, \"partition\" INTEGER, generation BIGINT, owner VARCHAR, seq BIGINT, next_offset BIGINT, max_event_time_ms BIGINT, last_delivery_ms BIGINT, watermark_ms BIGINT, open_windows BLOB, settings VARCHAR, committed_ms BIGINT";

fn now_ms() -> i64 {
    SystemClock.wall_ms()
}

fn duck(table: &str) -> impl Fn(duckdb::Error) -> EtlError + '_ {
    move |e| sink_error(table, e)
}

/// A state row's owner, as read back.
struct Owner {
    generation: i64,
    owner: String,
    seq: i64,
}

pub struct LakeStore {
    conn: SharedConn,
    job: String,
    settings: JobSettings,
    settings_text: String,
    mode: WriteMode,
    tables: ByTable<String>,
    state: String,
    catalog: OutputCatalog,
    compaction: Option<Compaction>,
    schemas: Option<OutputSchemas>,
    commits: i64,
    /// The aggregates DuckDB computes over the job's staged events, if it has any.
    staging: Option<Staging>,
    /// Whether DuckLake's retry wait was shortened on the connection (see `shorten_retry_wait`).
    short_retry_wait: bool,
    /// A job written as SQL: its statements' outputs (see `sql_cycle`).
    sql: Vec<SqlOutput>,
    /// The tables as parsed, and the job they are claimed for (see `owners`).
    names: ByTable<TableName>,
    owner: owners::Owner,
    claims: owners::Claims,
    /// Late events and dead letters carry the job in a column (known once prepared).
    jobbed: ByTable<bool>,
}

impl Drop for LakeStore {
    fn drop(&mut self) {
        if self.short_retry_wait {
            let guard = self.conn.lock();
            if let Ok(conn) = guard.conn() {
                restore_retry_wait(conn);
            }
        }
    }
}

impl LakeStore {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        conn: SharedConn,
        job: &str,
        settings: &JobSettings,
        mode: WriteMode,
        tables: &ByTable<TableName>,
        catalog: OutputCatalog,
        compaction: Option<Compaction>,
    ) -> LakeStore {
        LakeStore {
            conn,
            job: job.to_string(),
            settings_text: settings_text(settings),
            settings: settings.clone(),
            mode,
            tables: tables.as_ref().map(TableName::sql),
            state: tables.windows.sibling(STATE_TABLE).sql(),
            catalog,
            compaction,
            schemas: None,
            commits: 0,
            staging: None,
            short_retry_wait: false,
            sql: Vec::new(),
            names: tables.clone(),
            owner: owners::Owner::default(),
            claims: owners::Claims::default(),
            jobbed: ByTable::default(),
        }
    }

    /// The job the tables are claimed for.
    pub fn with_owner(mut self, owner: owners::Owner) -> LakeStore {
        self.owner = owner;
        self
    }

    /// A store for a job written as SQL: its statements' rows, late events and staged rows
    /// commit with each partition's state.
    pub fn with_sql(mut self, sql: Vec<SqlOutput>) -> LakeStore {
        self.sql = sql;
        self
    }

    /// The tables of staged events: the job's, or its statements'.
    fn stagings(&self) -> impl Iterator<Item = &Staging> {
        self.staging
            .iter()
            .chain(self.sql.iter().filter_map(SqlOutput::staging))
    }

    /// A store for a job whose aggregates DuckDB computes in part (see `staged`): each
    /// partition's staged events commit with its rows and state.
    pub fn with_staging(mut self, staging: Option<Staging>) -> LakeStore {
        self.staging = staging;
        self
    }

    /// Where and how a commit writes its partitions' rows.
    fn output(&self, schemas: &OutputSchemas) -> PartitionOutput<'_> {
        let job = |on: bool| on.then_some(self.job.as_str());
        PartitionOutput {
            tables: &self.tables,
            staging: self.staging.as_ref(),
            sql: &self.sql,
            verb: self.verb(),
            late: with_job(&schemas.late, job(self.jobbed.late)),
            dead: with_job(&schemas.dead, job(self.jobbed.dead)),
            late_job: job(self.jobbed.late),
            claims: self.claims.pending().then_some((&self.owner, &self.claims)),
        }
    }

    fn verb(&self) -> Verb {
        match self.mode {
            WriteMode::Upsert => Verb::Merge,
            WriteMode::Append => Verb::Insert,
        }
    }

    /// A commit in the common case: every partition's state row is this member's, under its
    /// generation, one commit behind. One UPDATE replaces them all and says how many it found,
    /// in place of reading the owners, deleting the rows and inserting their successors (a
    /// scan of the state table, and its catalog round trips, fewer per commit). DuckLake
    /// writes an update as a delete and an insert, so it fences like the delete it replaces
    /// (see the module's comment). Anything else (a partition moved, an earlier attempt whose
    /// outcome was unknown landed) is left to [`Self::try_commit_checked`].
    fn try_commit(
        &self,
        conn: &Connection,
        owner: &str,
        parts: &[PartitionCommit<'_>],
        schemas: &OutputSchemas,
    ) -> Result<(Vec<Moved>, Written)> {
        let st = &self.state;
        conn.execute_batch("BEGIN TRANSACTION").map_err(duck(st))?;
        let now = now_ms();
        let mut values = Vec::with_capacity(parts.len() * 9);
        for p in parts {
            let s = &p.state;
            values.extend([
                Value::Int(p.partition),
                Value::BigInt(p.generation),
                Value::BigInt(s.seq),
                Value::BigInt(s.next_offset),
                s.max_event_time_ms.map_or(Value::Null, Value::BigInt),
                Value::BigInt(s.last_delivery_ms),
                Value::BigInt(s.watermark_ms),
                s.open_windows.clone().map_or(Value::Null, Value::Blob),
                Value::BigInt(now),
            ]);
        }
        let row = "(?::INTEGER, ?::BIGINT, ?::BIGINT, ?::BIGINT, ?::BIGINT, ?::BIGINT, ?::BIGINT, ?::BLOB, ?::BIGINT)";
        let rows = vec![row; parts.len()].join(", ");
        values.push(Value::Text(self.job.clone()));
        values.push(Value::Text(owner.to_string()));
        let replaced = conn
            .execute(
                &format!(
                    "UPDATE {st} AS s SET seq = v.seq, next_offset = v.next_offset, max_event_time_ms = v.max_event_time_ms, last_delivery_ms = v.last_delivery_ms, watermark_ms = v.watermark_ms, open_windows = v.open_windows, committed_ms = v.committed_ms \
                     FROM (VALUES {rows}) AS v(\"partition\", generation, seq, next_offset, max_event_time_ms, last_delivery_ms, watermark_ms, open_windows, committed_ms) \
                     WHERE s.job = ? AND s.owner = ? AND s.\"partition\" = v.\"partition\" AND s.generation = v.generation AND s.seq < v.seq"
                ),
                duckdb::params_from_iter(values),
            )
            .map_err(duck(st))?;
        if replaced != parts.len() {
            conn.execute_batch("ROLLBACK").map_err(duck(st))?;
            return self.try_commit_checked(conn, owner, parts, schemas);
        }
        let written = self.output(schemas).write(conn, parts, schemas)?;
        self.finish(conn)?;
        Ok((Vec::new(), written))
    }

    /// A commit that reads the owners of its partitions first: the partitions that moved are
    /// returned and nothing is written, and a commit that already landed is not written again.
    fn try_commit_checked(
        &self,
        conn: &Connection,
        owner: &str,
        parts: &[PartitionCommit<'_>],
        schemas: &OutputSchemas,
    ) -> Result<(Vec<Moved>, Written)> {
        let st = &self.state;
        conn.execute_batch("BEGIN TRANSACTION").map_err(duck(st))?;
        let mut moved = Vec::new();
        let mut landed = 0;
        let ids: Vec<i32> = parts.iter().map(|p| p.partition).collect();
        let owners = self.owners(conn, &ids)?;
        for p in parts {
            match owners.get(&p.partition) {
                Some(o) if o.generation == p.generation && o.owner == owner => {
                    if o.seq >= p.state.seq {
                        landed += 1;
                    }
                }
                other => moved.push(Moved {
                    partition: p.partition,
                    our_generation: p.generation,
                    generation: other.map_or(0, |o| o.generation),
                    owner: other.map_or_else(|| "no owner".into(), |o| o.owner.clone()),
                }),
            }
        }
        if !moved.is_empty() || landed == parts.len() {
            // Nothing to write: partitions moved (the caller commits the others alone), or an
            // earlier attempt whose outcome was unknown did land.
            conn.execute_batch("ROLLBACK").map_err(duck(st))?;
            return Ok((moved, Written::default()));
        }
        if landed > 0 {
            return Err(EtlError::Internal(format!(
                "the state rows of job '{}' show part of one commit: {landed} of {} partitions",
                self.job,
                parts.len()
            )));
        }
        let written = self.output(schemas).write(conn, parts, schemas)?;
        let list: Vec<String> = parts.iter().map(|p| p.partition.to_string()).collect();
        conn.execute(
            &format!(
                "DELETE FROM {st} WHERE job = ? AND \"partition\" IN ({})",
                list.join(", ")
            ),
            duckdb::params![self.job],
        )
        .map_err(duck(st))?;
        // One statement for all the state rows: DuckLake writes a file per insert.
        let now = now_ms();
        let mut values = Vec::with_capacity(parts.len() * 12);
        for p in parts {
            let s = &p.state;
            let opt = |v: Option<i64>| v.map_or(Value::Null, Value::BigInt);
            values.extend([
                Value::Text(self.job.clone()),
                Value::Int(p.partition),
                Value::BigInt(p.generation),
                Value::Text(owner.to_string()),
                Value::BigInt(s.seq),
                Value::BigInt(s.next_offset),
                opt(s.max_event_time_ms),
                Value::BigInt(s.last_delivery_ms),
                Value::BigInt(s.watermark_ms),
                s.open_windows.clone().map_or(Value::Null, Value::Blob),
                Value::Text(self.settings_text.clone()),
                Value::BigInt(now),
            ]);
        }
        let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
        let rows = vec![row; parts.len()].join(", ");
        conn.execute(
            &format!("INSERT INTO {st} VALUES {rows}"),
            duckdb::params_from_iter(values),
        )
        .map_err(duck(st))?;
        self.finish(conn)?;
        Ok((Vec::new(), written))
    }

    /// Commits a commit's transaction (the fault hook just before it, for the kill tests).
    fn finish(&self, conn: &Connection) -> Result<()> {
        streaming_etl_runtime::fault::crash_point("sink-before-commit");
        conn.execute_batch("COMMIT")
            .map_err(duck(&self.tables.windows))?;
        Ok(())
    }
}

impl PartitionStore for LakeStore {
    fn prepare(&mut self, schemas: &OutputSchemas) -> Result<()> {
        let guard = self.conn.lock();
        let conn = guard.conn()?;
        if !self.short_retry_wait {
            self.short_retry_wait = shorten_retry_wait(conn);
        }
        let mut schemas = schemas.clone();
        schemas.windows = windows_with_partition(&schemas.windows);
        let mut tables_of = schemas.clone();
        if let Some(sql) = self.sql.first() {
            tables_of.windows = sql.target.clone();
            tables_of.late = SqlOutput::late_schema(&schemas.late);
        }
        let uses = owners::uses(&self.names, &self.sql, &self.owner);
        self.claims = owners::check(conn, &self.owner, uses)?;
        if !self.sql.is_empty() {
            add_output_column(conn, &self.tables.late)?;
        }
        // A late or dead table made before the job column existed is written as it is.
        let [late, dead] =
            [&self.tables.late, &self.tables.dead].map(|t| !owners::lacks_job_column(conn, t));
        tables_of.late = with_job(&tables_of.late, late.then_some(""));
        tables_of.dead = with_job(&tables_of.dead, dead.then_some(""));
        let job_tables = self.tables.clone().zip(tables_of);
        // A set's other statements' targets (the first's is the windows table's place).
        let others = self.sql.iter().skip(1);
        let tables: Vec<(String, TableSchema)> =
            [job_tables.windows, job_tables.late, job_tables.dead]
                .into_iter()
                .chain(others.map(|s| (s.stmt.target.sql(), s.target.clone())))
                .collect();
        ensure_tables(conn, &tables)?;
        self.jobbed = ByTable {
            windows: false,
            late: !owners::lacks_job_column(conn, &self.tables.late),
            dead: !owners::lacks_job_column(conn, &self.tables.dead),
        };
        for staging in self.stagings() {
            with_retry(&staging.table, || {
                ensure_staged_table(conn, staging).inspect_err(|_| {
                    let _ = conn.execute_batch("ROLLBACK");
                })
            })?;
        }
        let st = &self.state;
        // Created with its anchor row in one transaction: two jobs creating it at once
        // conflict, and the one that retries finds it made.
        with_retry(st, || {
            let created = conn.execute_batch(&format!(
                "BEGIN TRANSACTION; CREATE TABLE {st} ({STATE_COLUMNS}); INSERT INTO {st} (job, \"partition\", generation, owner, seq) VALUES ('', -1, 0, '', 0); COMMIT"
            ));
            match created {
                Ok(()) => Ok(()),
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    if e.to_string().contains("already exists") {
                        Ok(())
                    } else {
                        Err(sink_error(st, e))
                    }
                }
            }
        })?;
        // The tables every member deletes from stay in files (see `keep_in_files`); rows only
        // ever appended may be inlined, as the lake's attach says (measured in
        // docs/benchmarks.md#scale-out-subscribe).
        let mut deleted_from = vec![st.clone()];
        deleted_from.extend(self.stagings().map(|s| s.table.clone()));
        if self.mode == WriteMode::Upsert {
            deleted_from.push(self.tables.windows.clone());
            deleted_from.extend(self.sql.iter().skip(1).map(|s| s.stmt.target.sql()));
        }
        // Members starting at once update the same catalog rows: retried as commits are.
        with_retry_for(st, CONTENDED_FOR, || {
            keep_in_files(conn, &self.catalog.name, &deleted_from).inspect_err(|_| {
                let _ = conn.execute_batch("ROLLBACK");
            })
        })?;
        self.schemas = Some(schemas);
        Ok(())
    }

    fn claim(&mut self, partitions: &[i32], owner: &str) -> Result<Vec<Claim>> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let guard = self.conn.lock();
        let conn = guard.conn()?;
        with_retry_for(&self.state, CONTENDED_FOR, || {
            self.try_claim(conn, partitions, owner).inspect_err(|_| {
                let _ = conn.execute_batch("ROLLBACK");
            })
        })
    }

    fn commit(
        &mut self,
        owner: &str,
        parts: &[PartitionCommit<'_>],
    ) -> Result<(Vec<Moved>, Written)> {
        if parts.is_empty() {
            return Ok((Vec::new(), Written::default()));
        }
        let guard = self.conn.lock();
        let conn = guard.conn()?;
        let schemas = self
            .schemas
            .clone()
            .ok_or_else(|| EtlError::Internal("commit before prepare".into()))?;
        // Claims still to be recorded go with this commit, one commit at a time in the process.
        let _claiming = self.claims.pending().then(owners::claiming);
        let (moved, written) = with_retry_for(&self.tables.windows, CONTENDED_FOR, || {
            self.try_commit(conn, owner, parts, &schemas)
                .inspect_err(|_| {
                    let _ = conn.execute_batch("ROLLBACK");
                })
        })?;
        if moved.is_empty() {
            self.claims.recorded();
            self.commits += 1;
            if let Some(c) = &self.compaction {
                if self.commits % c.every == 0 {
                    // The state table is not merged: merged, one file would hold every member's
                    // rows and all their commits would conflict on it. A state row replaced
                    // leaves no live file behind (DuckLake ends a file whose rows are all
                    // deleted), so its files stay about one per member.
                    if let Err(e) =
                        compact(conn, &self.catalog.name, &self.tables, None, c.retain_ms)
                    {
                        eprintln!("streaming_etl: {e} (tried again in {} cycles)", c.every);
                    }
                }
            }
        }
        Ok((moved, written))
    }
}
