//! The rows a `subscribe` commit writes for its partitions, in the commit's transaction beside
//! their state rows: window rows (with their partition), late events, dead letters, and staged
//! events of DuckDB's aggregates, or a SQL statement's part (`sql_cycle`).

use duckdb::Connection;
use streaming_etl_core::{Batch, ByTable, OutputSchemas, Result, Rows, TableSchema};
use streaming_etl_runtime::group::PartitionCommit;

use super::insert::{insert_parts, insert_staged, insert_windows, StagedPart, StagedWrite};
use super::owners::{self, Claims, Owner};
use super::sql_cycle::SqlOutput;
use super::staged::Staging;
use super::tables::sink_error;
use super::write::{Part, Verb};
use streaming_etl_runtime::sink::Written;

/// What a commit writes its partitions' rows into, and how.
pub(super) struct PartitionOutput<'a> {
    pub tables: &'a ByTable<String>,
    pub staging: Option<&'a Staging>,
    /// A job written as SQL: its statements' outputs.
    pub sql: &'a [SqlOutput],
    pub verb: Verb,
    /// The late and dead tables' shapes as written (with the job's column where they have it).
    pub late: TableSchema,
    pub dead: TableSchema,
    /// The job, where the late table carries it.
    pub late_job: Option<&'a str>,
    /// The job's claims on its tables, when this commit records them (see `owners`).
    pub claims: Option<(&'a Owner, &'a Claims)>,
}

impl PartitionOutput<'_> {
    /// The cycle's rows of `parts` (windows, late events, dead letters, and staged events if
    /// the job has any), inside the commit's transaction.
    pub(super) fn write(
        &self,
        conn: &Connection,
        parts: &[PartitionCommit<'_>],
        schemas: &OutputSchemas,
    ) -> Result<Written> {
        if let Some((owner, claims)) = self.claims {
            owners::record(conn, owner, claims)?;
        }
        let verb = self.verb;
        let pick: [fn(&Batch) -> &Rows; 3] = [|b| &b.windows, |b| &b.late, |b| &b.dead];
        let targets = [
            (&self.tables.windows, &schemas.windows),
            (&self.tables.late, &self.late),
            (&self.tables.dead, &self.dead),
        ];
        let stagings = self
            .staging
            .into_iter()
            .chain(self.sql.iter().filter_map(SqlOutput::staging));
        for staging in stagings {
            // A partition's first commit: events an earlier job of this name staged for it are
            // none of this one's.
            for p in parts.iter().filter(|p| p.state.seq == 1) {
                conn.execute_batch(&staging.clear(Some(p.partition)))
                    .map_err(|e| sink_error(&staging.table, e))?;
            }
        }
        if !self.sql.is_empty() {
            let batches: Vec<(i32, &Batch)> =
                parts.iter().map(|p| (p.partition, p.batch)).collect();
            let mut written = Written::default();
            for sql in self.sql {
                written = written.plus(sql.write_partitions(
                    conn,
                    &batches,
                    &self.tables.late,
                    schemas,
                    verb,
                    self.late_job,
                )?);
            }
            let dead: Vec<Part<'_>> = parts
                .iter()
                .map(|p| Part {
                    rows: &p.batch.dead,
                    partition: None,
                })
                .collect();
            insert_parts(conn, &self.tables.dead, &self.dead, &dead, verb)?;
            return Ok(written);
        }
        for (i, ((table, schema), rows_of)) in targets.into_iter().zip(pick).enumerate() {
            let rows: Vec<Part<'_>> = parts
                .iter()
                .map(|p| Part {
                    rows: rows_of(p.batch),
                    // Late events and dead letters have a partition column of their own.
                    partition: (i == 0).then_some(p.partition),
                })
                .collect();
            match self.staging.filter(|_| i == 0) {
                Some(staging) => {
                    let events: Vec<StagedPart<'_>> = parts
                        .iter()
                        .map(|p| StagedPart {
                            rows: &p.batch.staged.rows,
                            partition: Some(p.partition),
                            live_from_pane_ms: p.batch.staged.live_from_pane_ms,
                        })
                        .collect();
                    let write = StagedWrite {
                        staging,
                        events: &events,
                        native: false,
                    };
                    insert_staged(conn, table, schema, &rows, verb, write)?;
                }
                // (A lake has no keys: its rows are merged, the latest revision of each.)
                None if i == 0 => {
                    insert_windows(conn, table, schema, &rows, verb, false)?;
                }
                None => insert_parts(conn, table, schema, &rows, verb)?,
            }
        }
        Ok(Written::default())
    }
}
