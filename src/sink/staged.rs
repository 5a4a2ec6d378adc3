//! The aggregates DuckDB computes (any DuckDB aggregate expression over a job's typed columns):
//! the events of open windows are staged in a table beside the windows table, written in each
//! cycle's transaction; a window's row is written with DuckDB's aggregates over its events, in
//! that same transaction; and the events no window will read again are deleted with it. So the
//! staged events are part of exactly once: they land, and go, with the state that needs them.
//!
//! The SQL of a cycle, for the batch's window rows `r` (each numbered `__se_w`) and events `e`
//! (the staged table's, and the cycle's new ones):
//! - tumbling: `e` joins `r` on the key and the pane (`__se_pane = window_start_ms`);
//! - hopping: `r` expanded into its panes (`unnest(range(start, end, hop))`), joined likewise;
//! - sessions: `e ASOF JOIN r` on the key and `event_time_ms >= window_start_ms`, kept where
//!   `event_time_ms <= window_end_ms - gap` (a key's sessions never overlap);
//! - with hopping windows or late corrections, an event counts in a row when it was placed
//!   before the window closed (`__se_stamp < window_end_ms`), or the row is a correction.
//!
//! Then `SELECT __se_w, <aggregates> ... GROUP BY __se_w, <keys>`, joined back to the rows.
//! Which staged events stay: tumbling and hopping, those of panes from the first live one on
//! (the engine says which); sessions, those of sessions not closed by the cycle's rows.

use duckdb::Connection;
use streaming_etl_core::{EngineConfig, Repr, Result, Role, TableSchema, WindowKind};

use super::tables::{revision_columns, sink_error};
use crate::params::{quote_ident, transform_spec, TableName};

/// Columns of the staged events (and of the cycle's rows) only the extension uses.
const PANE: &str = "__se_pane";
const STAMP: &str = "__se_stamp";
const ROW: &str = "__se_w";

/// How a job's DuckDB aggregates are computed (None for a job without any).
#[derive(Debug, Clone, PartialEq)]
pub struct Staging {
    /// The staged events' table (quoted, qualified like the windows table).
    pub table: String,
    /// The batch rows' shape (`EngineConfig::staged_schema`).
    rows: TableSchema,
    /// The windows rows' shape as written (with `partition` last when partitioned).
    windows: TableSchema,
    window: WindowKind,
    window_ms: i64,
    /// The key columns' names.
    keys: Vec<String>,
    /// Per column of the windows rows: the aggregate expression DuckDB computes there.
    aggregates: Vec<(usize, String)>,
    /// The windows rows' `retracted` and hidden correction columns.
    retracted: Option<usize>,
    correction: Option<usize>,
    /// A `subscribe` job: events and rows carry their partition.
    partitioned: bool,
    /// A statement of a job written as SQL: the staged table holds its row step's columns
    /// (the engine's, its partition among them, then the statement's).
    statement_rows: Option<Vec<(String, String)>>,
    /// Keys may be NULL (a job written as SQL): they match with NULLs equal.
    null_keys: bool,
}

/// The table of a job's staged events, beside its windows table:
/// `streaming_etl_staged_<windows table>`.
pub fn staged_table(windows: &TableName) -> TableName {
    let bare = windows.parts.last().map_or("windows", String::as_str);
    windows.sibling(&format!("streaming_etl_staged_{bare}"))
}

impl Staging {
    /// The staging of a job whose aggregates DuckDB computes in part; `table` is the staged
    /// events' table, `windows` the windows rows' shape as written (a `subscribe` job's with
    /// its `partition` column last).
    pub fn of(
        cfg: &EngineConfig,
        table: String,
        windows: &TableSchema,
        partitioned: bool,
    ) -> Option<Staging> {
        if !cfg.stages() {
            return None;
        }
        let position = |name: &str| windows.columns.iter().position(|c| c.name == name);
        let aggregates = cfg
            .aggregates
            .iter()
            .filter_map(|a| Some((position(&a.name)?, a.duck.as_ref()?.expr.clone())))
            .collect();
        Some(Staging {
            table,
            rows: cfg.staged_schema(),
            windows: windows.clone(),
            window: cfg.window,
            window_ms: cfg.time.window_ms,
            keys: cfg.keys.iter().map(|k| k.name.clone()).collect(),
            aggregates,
            retracted: revision_columns(windows).map(|(_, _, r)| r),
            correction: position(streaming_etl_core::CORRECTION_COLUMN),
            partitioned,
            statement_rows: None,
            null_keys: cfg.null_keys,
        })
    }

    /// The staging of a statement of a job written as SQL, whose staged rows have `rows`' columns.
    pub fn for_statement(
        cfg: &EngineConfig,
        table: String,
        windows: &TableSchema,
        partitioned: bool,
        rows: &[(String, String)],
    ) -> Option<Staging> {
        let mut s = Staging::of(cfg, table, windows, partitioned)?;
        s.statement_rows = Some(rows.to_vec());
        Some(s)
    }

    /// The staged events' columns as `(name, DuckDB type)`, in order.
    fn columns(&self) -> Vec<(String, String)> {
        if let Some(rows) = &self.statement_rows {
            return rows.clone();
        }
        let mut out: Vec<(String, String)> = Vec::new();
        if self.partitioned {
            out.push(("partition".into(), "INTEGER".into()));
        }
        for c in &self.rows.columns {
            let ty = c.sql_type().unwrap_or(c.ty.sql()).to_string();
            out.push((c.name.clone(), ty));
        }
        out
    }

    /// `CREATE TABLE IF NOT EXISTS` of the staged events' table.
    pub fn ddl(&self) -> String {
        let cols: Vec<String> = self
            .columns()
            .iter()
            .map(|(n, t)| format!("{} {t}", quote_ident(n)))
            .collect();
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            self.table,
            cols.join(", ")
        )
    }

    /// The names of the staged events' columns, as the table has them.
    pub fn column_names(&self) -> Vec<String> {
        self.columns().into_iter().map(|(n, _)| n).collect()
    }

    /// The batch's new events (`batch`: a relation with columns `c0, c1, ...` in the rows'
    /// shape) as the staged table's columns, each converted to its type.
    pub fn new_events(&self, batch: &str, partition: Option<i32>) -> String {
        let mut cols: Vec<String> = Vec::new();
        if self.partitioned {
            cols.push(format!(
                "CAST({} AS INTEGER) AS \"partition\"",
                partition.unwrap_or(-1)
            ));
        }
        for (i, c) in self.rows.columns.iter().enumerate() {
            let v = format!("c{i}");
            let expr = match (&c.role, Repr::of(c.sql_type().unwrap_or(""))) {
                (Role::Cast(t), Repr::Json { .. }) => {
                    format!("json_transform_strict({v}, {})", transform_spec(t))
                }
                (Role::Cast(t), _) => format!("CAST({v} AS {t})"),
                _ => v,
            };
            cols.push(format!("{expr} AS {}", quote_ident(&c.name)));
        }
        format!("SELECT {} FROM {batch}", cols.join(", "))
    }

    /// Whether a staged event (columns of the staged table, as `e`) is still needed after the
    /// cycle. Tumbling and hopping: its pane is live (`live`: the first live pane per
    /// partition, None when none is). Sessions: no closed session of the cycle holds it
    /// (`closed`: those sessions' rows, as `s`, in the windows rows' columns `c0, ...`).
    pub(super) fn kept(&self, live: &[(Option<i32>, Option<i64>)], closed: &str) -> String {
        match self.window {
            WindowKind::Session => format!(
                "NOT EXISTS (SELECT 1 FROM {closed} s WHERE {}e.event_time_ms >= s.c0 AND e.event_time_ms <= s.c1 - {})",
                self.key_match("e", "s"),
                self.window_ms
            ),
            _ => {
                let per: Vec<String> = live
                    .iter()
                    .map(|(p, from)| {
                        let cond = match from {
                            Some(from) => format!("e.{PANE} >= {from}"),
                            None => "false".into(),
                        };
                        match p {
                            Some(p) if self.partitioned => {
                                format!("(e.\"partition\" = {p} AND {cond})")
                            }
                            _ => format!("({cond})"),
                        }
                    })
                    .collect();
                if per.is_empty() {
                    "true".into()
                } else {
                    per.join(" OR ")
                }
            }
        }
    }

    /// `e.k = r.k0 AND ...` over the key columns (and the partition), each with `and` after
    /// it: the rows' keys are their columns `k0, ...` and `kp` (see [`Staging::keyed_rows`]).
    pub(super) fn key_match(&self, events: &str, rows: &str) -> String {
        let mut out = String::new();
        let eq = if self.null_keys {
            "IS NOT DISTINCT FROM"
        } else {
            "="
        };
        for (i, k) in self.keys.iter().enumerate() {
            out += &format!("{events}.{} {eq} {rows}.k{i} AND ", quote_ident(k));
        }
        if self.partitioned {
            out += &format!("{events}.\"partition\" = {rows}.kp AND ");
        }
        out
    }

    /// The windows rows `rows` (columns `c0, ...`) with their keys as the staged events have
    /// them, `k0, ...` (typed keys cast), and their partition as `kp`.
    pub(super) fn keyed_rows(&self, rows: &str, numbered: bool) -> String {
        let mut keys: Vec<String> = Vec::new();
        for (i, name) in self.keys.iter().enumerate() {
            let at = self
                .windows
                .columns
                .iter()
                .position(|c| &c.name == name)
                .unwrap_or(2 + i);
            keys.push(match self.windows.columns.get(at).map(|c| &c.role) {
                Some(Role::Cast(t)) => format!(", CAST(c{at} AS {t}) AS k{i}"),
                _ => format!(", c{at} AS k{i}"),
            });
        }
        if self.partitioned {
            keys.push(format!(", c{} AS kp", self.windows.columns.len() - 1));
        }
        let number = if numbered {
            format!("row_number() OVER () AS {ROW}, ")
        } else {
            String::new()
        };
        format!("SELECT {number}*{} FROM ({rows})", keys.concat())
    }

    /// The windows rows of the cycle (`rows`: their query, columns `c0, ...` in the windows
    /// rows' shape) with the aggregates DuckDB computes over each window's events in their
    /// columns; `new`: the cycle's new events (as [`Staging::new_events`] gives them), `live`
    /// as for [`Staging::kept`]. The result has the columns `c0, ...` of the rows.
    pub fn window_rows(
        &self,
        rows: &str,
        new: &str,
        live: &[(Option<i32>, Option<i64>)],
    ) -> String {
        self.rows_query(rows, new, Some(live))
    }

    /// For each aggregate DuckDB computes, a query computing it alone for the cycle's windows
    /// (over the staged events and all of the cycle's new ones, as they stand before the
    /// cycle's transaction), with the aggregate as it is named: a failed cycle runs them to
    /// say which aggregate failed.
    pub fn each_aggregate(&self, rows: &str, new: &str) -> Vec<(String, String)> {
        (0..self.aggregates.len())
            .map(|i| {
                let mut one = self.clone();
                one.aggregates = vec![self.aggregates[i].clone()];
                let name = one.aggregates_shown();
                (
                    name,
                    format!("SELECT count(*) FROM ({})", one.rows_query(rows, new, None)),
                )
            })
            .collect()
    }

    /// The common table expressions of a cycle's window rows: `__se_rows` (the rows, numbered
    /// `__se_w`, keys as the events have them), `__se_live` (those not retracted), `__se_events`
    /// (the staged events and the cycle's new ones) and `__se_m` (each live row with its
    /// window's events; `bounds`: with `window_start` and `window_end` as TIMESTAMPTZ). With
    /// `live` None, over every new event (see [`Staging::each_aggregate`]).
    pub(super) fn ctes(
        &self,
        rows: &str,
        new: &str,
        live: Option<&[(Option<i32>, Option<i64>)]>,
        bounds: bool,
    ) -> String {
        let live_rows = match self.retracted {
            Some(r) => format!("SELECT * FROM __se_rows WHERE NOT c{r}"),
            None => "SELECT * FROM __se_rows".into(),
        };
        let closed = match revision_columns(&self.windows) {
            Some((fin, _, ret)) => format!("(SELECT * FROM __se_rows WHERE c{fin} AND NOT c{ret})"),
            None => "__se_rows".into(),
        };
        let cols = self
            .column_names()
            .iter()
            .map(|n| quote_ident(n))
            .collect::<Vec<_>>()
            .join(", ");
        let events = match live {
            Some(live) => format!(
                "SELECT {cols} FROM {} UNION ALL SELECT {cols} FROM ({new}) e WHERE NOT ({})",
                self.table,
                self.kept(live, &closed)
            ),
            None => format!(
                "SELECT {cols} FROM {} UNION ALL SELECT {cols} FROM ({new}) e",
                self.table
            ),
        };
        let placed = match (self.correction, self.stamped()) {
            (Some(c), _) => format!(" AND (e.{STAMP} < r.c1 OR r.c{c})"),
            (None, true) => format!(" AND e.{STAMP} < r.c1"),
            _ => String::new(),
        };
        let keys = self.key_match("e", "r");
        let row = if bounds {
            format!("r.{ROW}, make_timestamptz(r.c0 * 1000) AS window_start, make_timestamptz(r.c1 * 1000) AS window_end")
        } else {
            format!("r.{ROW}")
        };
        let matched = match self.window {
            WindowKind::Tumbling => format!(
                "SELECT {row}, e.* FROM __se_live r JOIN __se_events e ON {keys}e.{PANE} = r.c0{placed}"
            ),
            WindowKind::Hopping { hop_ms } => format!(
                "SELECT {row}, e.* FROM (SELECT *, unnest(range(c0, c1, {hop_ms})) AS __se_p FROM __se_live) r JOIN __se_events e ON {keys}e.{PANE} = r.__se_p{placed}"
            ),
            // (DuckDB 1.4's ASOF join drops NULL keys that IS NOT DISTINCT FROM matches; a key's
            // sessions never overlap, so a range join finds the same one.)
            WindowKind::Session if self.null_keys => format!(
                "SELECT {row}, e.* FROM __se_events e JOIN __se_live r ON {keys}e.event_time_ms >= r.c0 AND e.event_time_ms <= r.c1 - {}",
                self.window_ms
            ),
            WindowKind::Session => format!(
                "SELECT {row}, e.* FROM __se_events e ASOF JOIN __se_live r ON {keys}e.event_time_ms >= r.c0 WHERE e.event_time_ms <= r.c1 - {}",
                self.window_ms
            ),
        };
        format!(
            "WITH __se_rows AS ({}), __se_live AS ({live_rows}), __se_events AS ({events}), __se_m AS ({matched}) ",
            self.keyed_rows(rows, true)
        )
    }

    /// [`Staging::window_rows`]; with `live` None, over every new event (see
    /// [`Staging::each_aggregate`]).
    fn rows_query(
        &self,
        rows: &str,
        new: &str,
        live: Option<&[(Option<i32>, Option<i64>)]>,
    ) -> String {
        let nrows = self.windows.columns.len();
        let group: Vec<String> = std::iter::once(ROW.to_string())
            .chain(self.keys.iter().map(|k| quote_ident(k)))
            .collect();
        let computed: Vec<String> = self
            .aggregates
            .iter()
            .map(|(at, expr)| format!("({expr}) AS __se_a{at}"))
            .collect();
        let out: Vec<String> = (0..nrows)
            .map(|i| match self.aggregates.iter().find(|(at, _)| *at == i) {
                Some(_) => format!("a.__se_a{i} AS c{i}"),
                None => format!("r.c{i} AS c{i}"),
            })
            .collect();
        format!(
            "{}, __se_a AS (SELECT {}, {} FROM __se_m GROUP BY {}) \
             SELECT {} FROM __se_rows r LEFT JOIN __se_a a ON a.{ROW} = r.{ROW}",
            self.ctes(rows, new, live, false),
            group.join(", "),
            computed.join(", "),
            group.join(", "),
            out.join(", ")
        )
    }

    /// The aggregates DuckDB computes, as the job names them (for error messages).
    pub fn aggregates_shown(&self) -> String {
        let shown: Vec<String> = self
            .aggregates
            .iter()
            .map(|(at, expr)| {
                let name = self
                    .windows
                    .columns
                    .get(*at)
                    .map_or("", |c| c.name.as_str());
                format!("'{expr} AS {name}'")
            })
            .collect();
        shown.join(", ")
    }

    /// Whether staged events carry the watermark they were placed under.
    pub(super) fn stamped(&self) -> bool {
        self.rows.columns.iter().any(|c| c.name == STAMP)
    }

    /// The statements that stage the cycle's new events that stay (`new`), before its window
    /// rows are written; and those that delete the staged events no window needs any more,
    /// after (`rows`: the cycle's window rows, as for [`Staging::window_rows`]).
    pub fn keep_new(&self, new: &str, rows: &str, live: &[(Option<i32>, Option<i64>)]) -> String {
        let closed = self.closed_rows(rows);
        format!(
            "INSERT INTO {} SELECT * FROM ({new}) e WHERE {}",
            self.table,
            self.kept(live, &closed)
        )
    }

    pub fn drop_done(&self, rows: &str, live: &[(Option<i32>, Option<i64>)]) -> String {
        let closed = self.closed_rows(rows);
        match self.window {
            WindowKind::Session => format!(
                "DELETE FROM {} AS e USING {closed} AS s WHERE {}e.event_time_ms >= s.c0 AND e.event_time_ms <= s.c1 - {}",
                self.table,
                self.key_match("e", "s"),
                self.window_ms
            ),
            _ => format!(
                "DELETE FROM {} AS e WHERE {}NOT ({})",
                self.table,
                self.partitions_of(live),
                self.kept(live, &closed)
            ),
        }
    }

    /// `e."partition" IN (...) AND ` for a partitioned job (only its partitions' events go).
    fn partitions_of(&self, live: &[(Option<i32>, Option<i64>)]) -> String {
        if !self.partitioned {
            return String::new();
        }
        let list: Vec<String> = live
            .iter()
            .filter_map(|(p, _)| p.map(|p| p.to_string()))
            .collect();
        format!("e.\"partition\" IN ({}) AND ", list.join(", "))
    }

    /// The rows closing windows (sessions: their events go with them), with their keys as
    /// `k0, ...` (and `kp`), as a relation.
    pub(super) fn closed_rows(&self, rows: &str) -> String {
        let filter = match revision_columns(&self.windows) {
            Some((fin, _, ret)) => format!(" WHERE c{fin} AND NOT c{ret}"),
            None => String::new(),
        };
        format!("(SELECT * FROM ({}){filter})", self.keyed_rows(rows, false))
    }

    /// Deletes every staged event (a job's first batch: events an earlier job of the same
    /// name left, which this one never placed); `partition`: only this partition's.
    pub fn clear(&self, partition: Option<i32>) -> String {
        match partition.filter(|_| self.partitioned) {
            Some(p) => format!("DELETE FROM {} WHERE \"partition\" = {p}", self.table),
            None => format!("DELETE FROM {}", self.table),
        }
    }
}

/// Makes sure the table of a job's staged events exists with the columns the job stages, in
/// their order. One that holds another shape is replaced while empty (an earlier job of this
/// windows table left it); one that holds these columns and others (an earlier version staged
/// every declared column) loses the others; else the run fails naming it.
pub(crate) fn ensure_staged_table(conn: &Connection, staging: &Staging) -> Result<()> {
    let table = &staging.table;
    conn.execute_batch(&staging.ddl())
        .map_err(|e| sink_error(table, e))?;
    let mut stmt = conn
        .prepare(&format!("SELECT column_name FROM (DESCRIBE {table})"))
        .map_err(|e| sink_error(table, e))?;
    let have: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(|e| sink_error(table, e))?
        .collect::<duckdb::Result<_>>()
        .map_err(|e| sink_error(table, e))?;
    let want = staging.column_names();
    let same = have.len() == want.len()
        && have
            .iter()
            .zip(&want)
            .all(|(h, w)| h.eq_ignore_ascii_case(w));
    if same {
        return Ok(());
    }
    let rows: i64 = conn
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .map_err(|e| sink_error(table, e))?;
    // Staged by a version that staged every declared column: the job now stages only those its
    // aggregates read, so the others are dropped (their order is kept).
    let mut wanted = want.iter().peekable();
    let extra: Vec<&String> = have
        .iter()
        .filter(|h| {
            let found = wanted.peek().is_some_and(|w| h.eq_ignore_ascii_case(w));
            if found {
                wanted.next();
            }
            !found
        })
        .collect();
    if rows > 0 && wanted.peek().is_none() && !extra.is_empty() {
        let drops: Vec<String> = extra
            .iter()
            .map(|c| format!("ALTER TABLE {table} DROP COLUMN {};", quote_ident(c)))
            .collect();
        return conn
            .execute_batch(&drops.concat())
            .map_err(|e| sink_error(table, e));
    }
    if rows > 0 {
        return Err(sink_error(
            table,
            format!(
                "it holds {rows} staged events of another job's open windows (columns {}), not this job's ({}); drop it, or name another windows_table",
                have.join(", "),
                want.join(", ")
            ),
        ));
    }
    conn.execute_batch(&format!("DROP TABLE {table}; {}", staging.ddl()))
        .map_err(|e| sink_error(table, e))
}
