//! A statement of a job written as SQL, in each cycle's transaction: DuckDB's part of the plan
//! (`sql::plan`). The cycle's events (what the engine staged: every event it read, placed or
//! late) become the temporary table `__se_events`, typed as the statement reads them; then
//! - a transform inserts its statement's rows over them;
//! - an engine-computed statement writes the engine's window rows, its columns in the
//!   statement's order and types;
//! - a staged statement runs its row step (its FROM and WHERE, the lookup tables as they are
//!   now) into `__se_rows`; its late events that pass go to the late table; the placed rows of
//!   windows that stay open are staged; each closing window's rows are the statement's own
//!   SELECT ... GROUP BY over the window's rows; and the staged rows no window needs go.
//!
//! All of it commits with the batch's marker (and, with `subscribe`, the partitions' state), so
//! a statement's rows are part of exactly once.

use duckdb::Connection;
use streaming_etl_core::{
    Batch, Column, ColumnType, EngineConfig, OutputSchemas, Result, Role, Rows, TableSchema,
    FATE_COLUMN,
};

use super::insert::{lend_windows, StagedPart};
use super::staged::{staged_table, Staging};
use super::tables::{revision_columns, sink_error};
use super::write::{cast_columns, lend, write_rows, write_window_rows, Facts, Part, Verb};
use crate::functions::batch::Lent;
use crate::params::{quote_ident, quote_literal};
use crate::sql::{events_columns, Body, SqlJob, SqlStatement};
use streaming_etl_runtime::sink::Written;

/// The late table's column that names the statement an event was late for.
pub const OUTPUT_COLUMN: &str = "output";

/// The fate of late events (not applied) in the staged rows: `Fate::Late`.
const LATE: i32 = 1;

/// One statement's output, as the sink writes it.
#[derive(Debug, Clone)]
pub struct SqlOutput {
    pub stmt: SqlStatement,
    /// The target as written: the statement's columns, then the revision columns, then
    /// `partition` (a `subscribe` job).
    pub target: TableSchema,
    /// The engine's window rows (as the batch has them).
    engine: TableSchema,
    /// The cycle's events: name, type and expression over the staged rows.
    events: Vec<(String, String, String)>,
    staging: Option<Staging>,
    partitioned: bool,
    /// Its part of a batch of a job of several statements (None: the batch is its own).
    layer: Option<usize>,
    /// Its windows in a few words (empty for a transform), shown to a job refused its target.
    pub shape: String,
}

impl SqlOutput {
    /// The outputs of a job's statements (none: a job of parameters), each with its own part of
    /// the engine (`engine`; with `partitioned`, the rows of a `subscribe` run).
    pub fn for_job(job: Option<&SqlJob>, engine: &EngineConfig, partitioned: bool) -> Vec<Self> {
        let Some(job) = job else {
            return Vec::new();
        };
        job.statements
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (cfg, layer) = match engine.layers.get(i) {
                    Some(l) => (l, Some(i)),
                    None => (engine, None),
                };
                let mut windows = cfg.schemas().windows;
                if partitioned {
                    windows = super::tables::windows_with_partition(&windows);
                }
                let mut out = SqlOutput::new(s, cfg, &windows, partitioned);
                out.layer = layer;
                out
            })
            .collect()
    }

    /// The statement's part of a cycle's batch.
    pub fn part<'b>(&self, batch: &'b Batch) -> &'b Batch {
        self.layer
            .and_then(|i| batch.layers.get(i))
            .unwrap_or(batch)
    }

    /// `engine`: the engine's window rows as the batch has them (with `partition` last when
    /// `partitioned`).
    pub fn new(
        stmt: &SqlStatement,
        cfg: &EngineConfig,
        engine: &TableSchema,
        partitioned: bool,
    ) -> SqlOutput {
        let mut columns: Vec<Column> = stmt
            .columns
            .iter()
            .map(|(n, t)| {
                let mut c = Column::new(n, ColumnType::Varchar);
                c.role = Role::Computed(t.clone());
                c
            })
            .collect();
        let mut key = stmt.key.clone();
        if stmt.body.windowed() {
            if let Some((fin, _, _)) = revision_columns(engine) {
                columns.extend(engine.columns[fin..fin + 3].iter().cloned());
            }
        }
        // (A transform's rows have their partition among its columns.)
        if partitioned && stmt.body.windowed() {
            columns.push(Column::new("partition", ColumnType::Integer));
            if !key.is_empty() {
                key.push("partition".into());
            }
        }
        let staging = match &stmt.body {
            Body::Staged { rows, .. } => Staging::for_statement(
                cfg,
                staged_table(&stmt.target).sql(),
                engine,
                partitioned,
                rows,
            ),
            _ => None,
        };
        SqlOutput {
            stmt: stmt.clone(),
            target: TableSchema {
                columns,
                primary_key: key,
            },
            engine: engine.clone(),
            events: events_columns(cfg),
            staging,
            partitioned,
            layer: None,
            shape: match &stmt.body {
                Body::Transform { .. } | Body::Keyed(_) => String::new(),
                _ => cfg.windows_shown(),
            },
        }
    }

    pub fn staging(&self) -> Option<&Staging> {
        self.staging.as_ref()
    }

    /// Whether the statement is a transform (its rows appended, no window).
    pub fn is_transform(&self) -> bool {
        matches!(self.stmt.body, Body::Transform { .. })
    }

    /// Whether the statement keeps a row per key (`INSERT OR REPLACE`): its target is created
    /// with its key.
    pub fn is_keyed(&self) -> bool {
        matches!(self.stmt.body, Body::Keyed(_))
    }

    /// The target as created: a keyed statement's with its key, the others' without (their
    /// GROUP BY keys may be NULL: rows are matched with NULLs equal).
    pub fn created(&self) -> TableSchema {
        if self.is_keyed() {
            self.target.clone()
        } else {
            self.target.without_key()
        }
    }

    /// Whether a window's rows may be written more than once (`emit := 'update'`,
    /// `late_updates_ms`).
    pub fn revisions(&self) -> bool {
        revision_columns(&self.engine).is_some()
    }

    /// The late table of a job written as SQL: the late events' columns, and `output`.
    pub fn late_schema(late: &TableSchema) -> TableSchema {
        let mut s = late.clone();
        let mut c = Column::new(OUTPUT_COLUMN, ColumnType::Varchar);
        c.role = Role::Computed("VARCHAR".into());
        s.columns.push(c);
        if !s.primary_key.is_empty() {
            s.primary_key.push(OUTPUT_COLUMN.into());
        }
        s
    }

    /// Writes the statement's part of a cycle on `conn`, inside the cycle's transaction:
    /// `windows` the engine's window rows, `late` its late events, `staged` its staged events
    /// (each per partition with `subscribe`).
    pub fn write(
        &self,
        conn: &Connection,
        cycle: &Cycle<'_>,
        target_verb: Verb,
        late_verb: Verb,
    ) -> Result<Written> {
        let target = self.stmt.target.sql();
        let events = self.events_table(conn, cycle.staged)?;
        let mut written = Written {
            windows: Some(0),
            late: Some(0),
        };
        match &self.stmt.body {
            Body::Transform { sql } => {
                if events {
                    let cols: Vec<String> = self
                        .target
                        .table_columns()
                        .map(|(_, c)| quote_ident(&c.name))
                        .collect();
                    conn.execute_batch(&format!(
                        "INSERT INTO {target} ({}) {sql}",
                        cols.join(", ")
                    ))
                    .map_err(|e| sink_error(&target, e))?;
                }
                return Ok(written);
            }
            Body::Keyed(keyed) => {
                if events {
                    super::keyed::write(conn, &target, keyed)?;
                }
                return Ok(written);
            }
            Body::Engine { projection } => {
                let all: Vec<&Part<'_>> = cycle
                    .windows
                    .iter()
                    .filter(|p| !p.rows.is_empty())
                    .collect();
                if !all.is_empty() {
                    let (_lent, rows, facts) = lend_windows(&all, &self.engine, target_verb)?;
                    let query = format!(
                        "SELECT {} FROM ({})",
                        self.outputs(projection.iter().cloned()).join(", "),
                        cast_columns(&self.engine, &rows)
                    );
                    // (The engine's rows, one each in the statement's columns.)
                    let facts = facts.filter(|_| cycle.native);
                    written.windows = Some(self.write_final(conn, &query, target_verb, facts)?);
                }
                written.late = Some(self.write_late(conn, cycle, None, late_verb)?);
            }
            Body::Staged {
                row_step, close, ..
            } => {
                let Some(staging) = &self.staging else {
                    return Ok(written);
                };
                if events {
                    conn.execute_batch(&format!(
                        "CREATE OR REPLACE TEMP TABLE __se_step AS {row_step}"
                    ))
                    .map_err(|e| {
                        sink_error(
                            &target,
                            format!("the statement's FROM and WHERE over the cycle's events: {e}"),
                        )
                    })?;
                }
                let rows_table = events.then_some("__se_step");
                written.late = Some(self.write_late(conn, cycle, rows_table, late_verb)?);
                written.windows = Some(self.write_windows(
                    conn,
                    staging,
                    cycle,
                    rows_table,
                    close,
                    target_verb,
                )?);
            }
        }
        Ok(written)
    }

    /// Writes the rows `query` gives into the target; returns how many are final (a closed
    /// window's row, not a running one).
    fn write_final(
        &self,
        conn: &Connection,
        query: &str,
        verb: Verb,
        facts: Option<Facts>,
    ) -> Result<u64> {
        let target = self.stmt.target.sql();
        let Some((fin, _, _)) = revision_columns(&self.target) else {
            return write_window_rows(conn, &target, &self.target, query, verb, facts);
        };
        conn.execute_batch(&format!("CREATE OR REPLACE TEMP TABLE __se_out AS {query}"))
            .map_err(|e| sink_error(&target, e))?;
        let finals: i64 = conn
            .query_row(
                &format!("SELECT count(*) FILTER (WHERE c{fin}) FROM __se_out"),
                [],
                |r| r.get(0),
            )
            .map_err(|e| sink_error(&target, e))?;
        write_window_rows(
            conn,
            &target,
            &self.target,
            "SELECT * FROM __se_out",
            verb,
            facts,
        )?;
        Ok(finals.max(0) as u64)
    }

    /// The statement's part of a `subscribe` commit: each partition's batch (`batches`), written
    /// with its late events (into `late_table`) in the commit's transaction. A partition's
    /// windows close once and its rows commit with its state, so a statement without revisions
    /// appends them (DuckLake 1.4's MERGE of such rows failed in DuckDB's Parquet reader while
    /// members wrote at once: see docs/sql.md).
    pub fn write_partitions(
        &self,
        conn: &Connection,
        batches: &[(i32, &Batch)],
        late_table: &str,
        schemas: &OutputSchemas,
        verb: Verb,
        job: Option<&str>,
    ) -> Result<Written> {
        let batches: Vec<(i32, &Batch)> = batches.iter().map(|(p, b)| (*p, self.part(b))).collect();
        let batches = &batches[..];
        let rows_of = |pick: fn(&Batch) -> &Rows, with_partition: bool| -> Vec<Part<'_>> {
            batches
                .iter()
                .map(|(p, b)| Part {
                    rows: pick(b),
                    partition: with_partition.then_some(*p),
                })
                .collect()
        };
        let windows = rows_of(|b| &b.windows, true);
        let late = rows_of(|b| &b.late, false);
        let staged: Vec<StagedPart<'_>> = batches
            .iter()
            .map(|(p, b)| StagedPart {
                rows: &b.staged.rows,
                partition: Some(*p),
                live_from_pane_ms: b.staged.live_from_pane_ms,
            })
            .collect();
        let cycle = Cycle {
            windows: &windows,
            late: &late,
            staged: &staged,
            late_table,
            late_schema: &schemas.late,
            job,
            native: false,
        };
        let target_verb = if self.revisions() { verb } else { Verb::Insert };
        self.write(conn, &cycle, target_verb, verb)
    }

    /// `__se_events`, the cycle's events typed as the statement reads them; false when the
    /// cycle staged none.
    fn events_table(&self, conn: &Connection, staged: &[StagedPart<'_>]) -> Result<bool> {
        if matches!(self.stmt.body, Body::Engine { .. }) {
            return Ok(false);
        }
        let parts: Vec<&StagedPart<'_>> = staged.iter().filter(|p| !p.rows.is_empty()).collect();
        if parts.is_empty() {
            return Ok(false);
        }
        let lent: Vec<Lent> = parts
            .iter()
            .map(|p| Lent::new(std::sync::Arc::new(p.rows.clone())))
            .collect();
        let exprs: Vec<String> = self
            .events
            .iter()
            .map(|(n, _, e)| format!("{e} AS {}", quote_ident(n)))
            .collect();
        let selects: Vec<String> = lent
            .iter()
            .map(|l| {
                format!(
                    "SELECT {} FROM {}",
                    exprs.join(", "),
                    super::write::batch_ref(l)
                )
            })
            .collect();
        conn.execute_batch(&format!(
            "CREATE OR REPLACE TEMP TABLE __se_events AS {}",
            selects.join(" UNION ALL ")
        ))
        .map_err(|e| sink_error(&self.stmt.target.sql(), format!("the cycle's events: {e}")))?;
        Ok(true)
    }

    /// The target's columns `c0, ...` from the statement's (`stmt`) and the engine row's
    /// revision columns and partition (the engine's rows as `c0, ...`, or as `r.c0, ...`).
    fn outputs(&self, stmt: impl Iterator<Item = String>) -> Vec<String> {
        self.outputs_from(stmt, "")
    }

    fn outputs_from(&self, stmt: impl Iterator<Item = String>, row: &str) -> Vec<String> {
        let mut out: Vec<String> = stmt.collect();
        if let Some((fin, rev, ret)) = revision_columns(&self.engine) {
            if self.target.columns.iter().any(|c| c.name == "final") {
                out.extend([fin, rev, ret].map(|i| format!("{row}c{i}")));
            }
        }
        if self.partitioned {
            out.push(format!("{row}c{}", self.engine.columns.len() - 1));
        }
        out.iter()
            .enumerate()
            .map(|(i, e)| format!("{e} AS c{i}"))
            .collect()
    }

    /// The late events of the statement (those its FROM and WHERE keep, when `rows` holds its
    /// row step), each with the statement's target.
    fn write_late(
        &self,
        conn: &Connection,
        cycle: &Cycle<'_>,
        rows: Option<&str>,
        verb: Verb,
    ) -> Result<u64> {
        let all: Vec<&Part<'_>> = cycle.late.iter().filter(|p| !p.rows.is_empty()).collect();
        if all.is_empty() {
            return Ok(0);
        }
        let schema = super::tables::with_job(&SqlOutput::late_schema(cycle.late_schema), cycle.job);
        let (_lent, query) = lend(&all);
        let at = |name: &str| {
            cycle
                .late_schema
                .columns
                .iter()
                .position(|c| c.name == name)
                .unwrap_or(0)
        };
        let n = cycle.late_schema.columns.len();
        let cols: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let kept = match (rows, &self.stmt.body) {
            (Some(r), _) => format!(
                " WHERE EXISTS (SELECT 1 FROM {r} __se_r WHERE __se_r.\"partition\" = l.c{} AND __se_r.\"offset\" = l.c{})",
                at("partition"),
                at("offset")
            ),
            (None, Body::Staged { .. }) => " WHERE false".to_string(),
            (None, _) => String::new(),
        };
        let q = format!(
            "SELECT {}, {} AS c{n} FROM ({query}) l{kept}",
            cols.join(", "),
            quote_literal(&self.stmt.target_shown)
        );
        write_rows(conn, cycle.late_table, &schema, &q, verb)
    }

    /// A staged statement's window rows, and its staged rows kept and dropped.
    fn write_windows(
        &self,
        conn: &Connection,
        staging: &Staging,
        cycle: &Cycle<'_>,
        rows_table: Option<&str>,
        close: &str,
        verb: Verb,
    ) -> Result<u64> {
        let parts: Vec<&Part<'_>> = cycle.windows.iter().collect();
        let (_rows_lent, rows, facts) = lend_windows(&parts, &self.engine, verb)?;
        let facts = facts.filter(|_| cycle.native).map(Facts::made_from);
        let live: Vec<(Option<i32>, Option<i64>)> = cycle
            .staged
            .iter()
            .map(|p| (p.partition, p.live_from_pane_ms))
            .collect();
        let st = &staging.table;
        let new = match rows_table {
            Some(r) => format!("SELECT * FROM {r} WHERE {FATE_COLUMN} <> {LATE}"),
            None => format!("SELECT * FROM {st} WHERE false"),
        };
        if rows_table.is_some() {
            conn.execute_batch(&staging.keep_new(&new, &rows, &live))
                .map_err(|e| sink_error(st, format!("staging the rows of open windows: {e}")))?;
        }
        let mut finals = 0;
        if cycle.windows.iter().any(|p| !p.rows.is_empty()) {
            let n = self.stmt.columns.len();
            let named: Vec<String> = (0..n).map(|i| format!("__se_o{i}")).collect();
            let outs = self.outputs_from(named.iter().map(|c| format!("s.{c}")), "r.");
            let mut query = format!(
                "{}SELECT {} FROM ({close}) AS s({}, __se_w) JOIN __se_rows r ON r.__se_w = s.__se_w",
                staging.ctes(&rows, &new, Some(&live), true),
                outs.join(", "),
                named.join(", ")
            );
            if let (Some((_, _, ret)), Body::Staged { .. }) =
                (revision_columns(&self.engine), &self.stmt.body)
            {
                // A session merged into another: its row goes (retracted), its keys and bounds
                // as they were.
                let bounds = self.retracted_columns();
                let outs = self.outputs_from(bounds.into_iter(), "r.");
                query = format!(
                    "SELECT * FROM ({query}) UNION ALL SELECT {} FROM ({}) r WHERE r.c{ret}",
                    outs.join(", "),
                    staging.keyed_rows(&rows, false)
                );
            }
            finals = self.write_final(conn, &query, verb, facts)?;
        }
        conn.execute_batch(&staging.drop_done(&rows, &live))
            .map_err(|e| sink_error(st, format!("dropping the rows of closed windows: {e}")))?;
        Ok(finals)
    }

    /// A retracted row's statement columns: its keys and window bounds, NULL elsewhere.
    fn retracted_columns(&self) -> Vec<String> {
        self.stmt.retract.clone()
    }
}

/// Adds `output` to an existing late table (one a parameter job made), where the statement's
/// name goes.
pub fn add_output_column(conn: &Connection, late: &str) -> Result<()> {
    let exists = conn
        .prepare(&format!("SELECT 1 FROM {late} LIMIT 0"))
        .is_ok();
    if !exists {
        let _ = conn.execute_batch("ROLLBACK");
        return Ok(());
    }
    conn.execute_batch(&format!(
        "ALTER TABLE {late} ADD COLUMN IF NOT EXISTS {} VARCHAR",
        quote_ident(OUTPUT_COLUMN)
    ))
    .map_err(|e| {
        let _ = conn.execute_batch("ROLLBACK");
        sink_error(late, e)
    })
}

/// What one cycle holds for a statement.
pub struct Cycle<'a> {
    pub windows: &'a [Part<'a>],
    pub late: &'a [Part<'a>],
    pub staged: &'a [StagedPart<'a>],
    /// The late table, and its rows' shape as the batch has them.
    pub late_table: &'a str,
    pub late_schema: &'a TableSchema,
    /// The job, where the late table carries it in a column.
    pub job: Option<&'a str>,
    /// The target is in DuckDB's own storage (see `write::write_window_rows`).
    pub native: bool,
}
