//! Which jobs write a table: the registry `streaming_etl_tables`, beside each output table (same
//! catalog and schema), a row per table and job. It keeps one job from overwriting or dropping
//! another's keyed rows: a table that holds a job's windows (or a SQL statement's windowed rows)
//! is that job's alone, and a second job that names it is refused before anything is created or
//! read. Late events and dead letters carry their job in a column of their key, so jobs share
//! those tables; a transform's target is appended to, and is shared too. A late or dead table
//! made before the job column existed holds one job's rows, as a windows table does.
//!
//! A job's claims are checked when its sink is prepared (at bind time, before anything is made)
//! and recorded in the transaction of its first commit, checked again there: a job that never
//! commits holds nothing. Within a process, claims are recorded one commit at a time; processes
//! that share a DuckLake and commit their first cycles into one table at the same instant may
//! both record theirs (the registry has no key), and the next start of either is refused.

use std::sync::Mutex;

use duckdb::Connection;
use streaming_etl_core::{ByTable, EtlError, Result};

use super::lake::with_retry;
use super::sql_cycle::SqlOutput;
use super::tables::sink_error;
use crate::params::TableName;

/// The registry's name, beside each table it speaks for.
pub const OWNERS_TABLE: &str = "streaming_etl_tables";

pub use super::tables::JOB_COLUMN;

const OWNERS_COLUMNS: &str = "table_name VARCHAR, job VARCHAR, holds VARCHAR, exclusive BOOLEAN, shape VARCHAR, checkpoint VARCHAR, since_ms BIGINT";

/// Claims are made one at a time in this process.
static CLAIMING: Mutex<()> = Mutex::new(());

/// What a table holds for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    Windows,
    Late,
    Dead,
    /// A transform's rows (appended).
    Rows,
    /// A keyed statement's rows (`INSERT OR REPLACE`): one job's.
    Keyed,
}

impl Holds {
    fn name(self) -> &'static str {
        match self {
            Holds::Windows => "windows",
            Holds::Late => "late events",
            Holds::Dead => "dead letters",
            Holds::Rows => "rows",
            Holds::Keyed => "rows by key",
        }
    }

    fn parse(s: &str) -> Holds {
        match s {
            "windows" => Holds::Windows,
            "late events" => Holds::Late,
            "dead letters" => Holds::Dead,
            "rows by key" => Holds::Keyed,
            _ => Holds::Rows,
        }
    }
}

/// How the call names a table: the parameter, or a statement of a job written as SQL (its
/// target as written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedBy {
    Param(&'static str),
    Statement(String),
}

/// One table a job writes.
#[derive(Debug, Clone)]
pub struct TableUse {
    pub table: TableName,
    pub holds: Holds,
    pub named_by: NamedBy,
    /// Its windows in a few words (see [`describe`]; empty for other tables).
    pub shape: String,
}

/// The tables a job writes, as its call names them: its windows table (a job written as SQL:
/// each statement's target), its late table and its dead letter table.
pub fn uses(tables: &ByTable<TableName>, sql: &[SqlOutput], owner: &Owner) -> Vec<TableUse> {
    let mut uses = Vec::new();
    if sql.is_empty() {
        uses.push(TableUse {
            table: tables.windows.clone(),
            holds: Holds::Windows,
            named_by: NamedBy::Param("windows_table"),
            shape: owner.shape.clone(),
        });
    }
    for s in sql {
        uses.push(TableUse {
            table: s.stmt.target.clone(),
            holds: if s.is_keyed() {
                Holds::Keyed
            } else if s.is_transform() {
                Holds::Rows
            } else {
                Holds::Windows
            },
            named_by: NamedBy::Statement(s.stmt.target_shown.clone()),
            shape: s.shape.clone(),
        });
    }
    for (table, holds, param) in [
        (&tables.late, Holds::Late, "late_table"),
        (&tables.dead, Holds::Dead, "dead_letter_table"),
    ] {
        uses.push(TableUse {
            table: table.clone(),
            holds,
            named_by: NamedBy::Param(param),
            shape: String::new(),
        });
    }
    uses
}

/// The job that claims: its name, what its windows are (a job of parameters: shown to another
/// job refused its table) and where its checkpoint is.
#[derive(Debug, Clone, Default)]
pub struct Owner {
    pub job: String,
    pub shape: String,
    pub checkpoint: String,
}

fn duck(table: &str) -> impl Fn(duckdb::Error) -> EtlError + '_ {
    move |e| sink_error(table, e)
}

/// The table's columns (lower case), or None when it does not exist.
fn columns_of(conn: &Connection, table: &str) -> Option<Vec<String>> {
    let mut stmt = match conn.prepare(&format!("SELECT column_name FROM (DESCRIBE {table})")) {
        Ok(s) => s,
        Err(_) => {
            let _ = conn.execute_batch("ROLLBACK");
            return None;
        }
    };
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .ok()?
        .collect::<duckdb::Result<Vec<String>>>()
        .ok()?;
    Some(names.into_iter().map(|n| n.to_lowercase()).collect())
}

/// Whether a late or dead table exists without the job column (made before it existed): it
/// then holds one job's rows.
pub fn lacks_job_column(conn: &Connection, table: &str) -> bool {
    columns_of(conn, table).is_some_and(|c| !c.iter().any(|n| n == JOB_COLUMN))
}

/// A claim recorded in the registry.
#[derive(Debug, Clone)]
struct Recorded {
    job: String,
    holds: Holds,
    exclusive: bool,
    shape: String,
}

fn recorded(conn: &Connection, registry: &str, name: &str) -> Result<Vec<Recorded>> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT job, holds, exclusive, shape FROM {registry} WHERE lower(table_name) = lower(?) ORDER BY rowid"
        ))
        .map_err(duck(registry))?;
    let rows = stmt
        .query_map(duckdb::params![name], |r| {
            Ok(Recorded {
                job: r.get(0)?,
                holds: Holds::parse(&r.get::<_, String>(1)?),
                exclusive: r.get(2)?,
                shape: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            })
        })
        .map_err(duck(registry))?
        .collect::<duckdb::Result<Vec<_>>>()
        .map_err(duck(registry));
    rows
}

/// The refusal of `t` to `owner`, as `other` holds it.
fn refusal(t: &TableUse, other: &Recorded, owner: &Owner) -> EtlError {
    let shown = t.table.parts.join(".");
    let what = if other.shape.is_empty() {
        String::new()
    } else {
        format!(" ({})", other.shape)
    };
    let holds = match other.holds {
        Holds::Late | Holds::Dead if other.exclusive => format!(
            "holds the {} of job '{}' in a table without a job column (made by an earlier version)",
            other.holds.name(),
            other.job
        ),
        Holds::Rows => format!("holds the rows of job '{}'", other.job),
        h => format!("holds the {} of job '{}'{what}", h.name(), other.job),
    };
    let take = match &t.named_by {
        NamedBy::Param(p) => format!("give job '{}' its own {p}", owner.job),
        NamedBy::Statement(_) => {
            format!("give job '{}' a table of its own to INSERT INTO", owner.job)
        }
    };
    let reason = format!("\"{shown}\" {holds}; {take}");
    match &t.named_by {
        NamedBy::Param(p) => EtlError::invalid(p, reason, format!("'{shown}'")),
        NamedBy::Statement(target) => EtlError::Statement {
            target: target.clone(),
            message: reason,
        },
    }
}

/// Whether `t` would hold its job's rows alone: windows always (their key does not name the
/// job, and their staged events are kept beside them under the table's name); late events and
/// dead letters in a table without the job column.
fn is_exclusive(conn: &Connection, t: &TableUse) -> bool {
    match t.holds {
        Holds::Windows | Holds::Keyed => true,
        Holds::Late | Holds::Dead => lacks_job_column(conn, &t.table.sql()),
        Holds::Rows => false,
    }
}

/// A job's claims on its tables: checked when its sink is prepared, recorded with its first
/// commit (a job that never commits, say one whose source did not open, holds nothing).
#[derive(Debug, Clone, Default)]
pub struct Claims {
    uses: Vec<TableUse>,
    /// Per table: whether it holds the job's rows alone.
    exclusive: Vec<bool>,
    /// Some claim is not recorded yet (as it is now).
    pending: bool,
}

impl Claims {
    /// Whether the next commit must record the claims.
    pub fn pending(&self) -> bool {
        self.pending
    }

    /// The claims are recorded (their commit went through).
    pub fn recorded(&mut self) {
        self.pending = false;
    }
}

/// Holds claims still to be recorded to one commit at a time in this process, from the check
/// inside the commit's transaction to its end (a DuckDB file has one writing process).
pub fn claiming() -> std::sync::MutexGuard<'static, ()> {
    CLAIMING.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first claim of another job that keeps `owner` from `t` (`mine`: whether `t` would hold
/// `owner`'s rows alone).
fn conflict(
    conn: &Connection,
    owner: &Owner,
    t: &TableUse,
    mine: bool,
) -> Result<Option<Recorded>> {
    let registry = t.table.sibling(OWNERS_TABLE).sql();
    if columns_of(conn, &registry).is_none() {
        return Ok(None);
    }
    let name = t.table.parts.last().cloned().unwrap_or_default();
    Ok(recorded(conn, &registry, &name)?
        .into_iter()
        .find(|r| r.job != owner.job && (mine || r.exclusive)))
}

/// Checks `owner`'s tables before anything is made or read: refused, naming the other job and
/// the parameter to set, where one holds another job's rows alone or would hold this job's rows
/// alone beside another's. Claims on tables that no longer exist (dropped, with whatever they
/// held) are forgotten first. Makes the registries that are missing.
pub fn check(conn: &Connection, owner: &Owner, uses: Vec<TableUse>) -> Result<Claims> {
    if owner.job.is_empty() {
        return Ok(Claims::default());
    }
    let _one_at_a_time = claiming();
    forget_dropped(conn, &uses)?;
    let mut exclusive = Vec::with_capacity(uses.len());
    let mut pending = false;
    for t in &uses {
        let mine = is_exclusive(conn, t);
        exclusive.push(mine);
        if let Some(other) = conflict(conn, owner, t, mine)? {
            return Err(refusal(t, &other, owner));
        }
        let registry = t.table.sibling(OWNERS_TABLE).sql();
        let name = t.table.parts.last().cloned().unwrap_or_default();
        let same = columns_of(conn, &registry).is_some()
            && recorded(conn, &registry, &name)?.iter().any(|r| {
                r.job == owner.job
                    && r.exclusive == mine
                    && r.holds == t.holds
                    && r.shape == t.shape
            });
        pending |= !same;
    }
    let mut registries: Vec<String> = uses
        .iter()
        .map(|t| t.table.sibling(OWNERS_TABLE).sql())
        .collect();
    registries.sort();
    registries.dedup();
    for registry in &registries {
        // Members of a job creating a lake's registry at once conflict; the one that retries
        // finds it made.
        with_retry(registry, || {
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {registry} ({OWNERS_COLUMNS})"
            ))
            .map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                sink_error(registry, e)
            })
        })?;
    }
    Ok(Claims {
        uses,
        exclusive,
        pending,
    })
}

/// Records `owner`'s claims inside the transaction of its commit (the caller holds
/// [`claiming`] from before the transaction began): refused as [`check`] refuses, should another
/// job's claim have committed since.
pub fn record(conn: &Connection, owner: &Owner, claims: &Claims) -> Result<()> {
    for (t, &mine) in claims.uses.iter().zip(&claims.exclusive) {
        if let Some(other) = conflict(conn, owner, t, mine)? {
            return Err(refusal(t, &other, owner));
        }
        let registry = t.table.sibling(OWNERS_TABLE).sql();
        let name = t.table.parts.last().cloned().unwrap_or_default();
        conn.execute(
            &format!("DELETE FROM {registry} WHERE lower(table_name) = lower(?) AND job = ?"),
            duckdb::params![name, owner.job],
        )
        .map_err(duck(&registry))?;
        conn.execute(
            &format!("INSERT INTO {registry} VALUES (?, ?, ?, ?, ?, ?, epoch_ms(now()))"),
            duckdb::params![
                name,
                owner.job,
                t.holds.name(),
                mine,
                t.shape,
                owner.checkpoint
            ],
        )
        .map_err(duck(&registry))?;
    }
    Ok(())
}

/// Drops the registry's claims on tables that no longer exist (each was dropped, with whatever
/// it held), before they are made again.
fn forget_dropped(conn: &Connection, tables: &[TableUse]) -> Result<()> {
    for t in tables {
        if columns_of(conn, &t.table.sql()).is_some() {
            continue;
        }
        let registry = t.table.sibling(OWNERS_TABLE).sql();
        if columns_of(conn, &registry).is_none() {
            continue;
        }
        let name = t.table.parts.last().cloned().unwrap_or_default();
        conn.execute(
            &format!("DELETE FROM {registry} WHERE lower(table_name) = lower(?)"),
            duckdb::params![name],
        )
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            sink_error(&registry, e)
        })?;
    }
    Ok(())
}

/// The checkpoint files the jobs writing into this database's catalogs recorded (every
/// registry of every attached catalog), for `streaming_etl_checkpoint()` to show them all.
pub fn recorded_checkpoints(conn: &Connection) -> Result<Vec<String>> {
    let registries: Vec<String> = {
        let mut stmt = conn
            .prepare(
                "SELECT database_name, schema_name FROM duckdb_tables() WHERE table_name = ? ORDER BY ALL",
            )
            .map_err(duck(OWNERS_TABLE))?;
        let rows = stmt
            .query_map(duckdb::params![OWNERS_TABLE], |r| {
                Ok(TableName {
                    parts: vec![r.get(0)?, r.get(1)?, OWNERS_TABLE.to_string()],
                }
                .sql())
            })
            .map_err(duck(OWNERS_TABLE))?
            .collect::<duckdb::Result<Vec<_>>>()
            .map_err(duck(OWNERS_TABLE))?;
        rows
    };
    let mut out: Vec<String> = Vec::new();
    for registry in registries {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT DISTINCT checkpoint FROM {registry} WHERE checkpoint NOT IN ('', ':memory:') ORDER BY 1"
            ))
            .map_err(duck(&registry))?;
        let paths = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(duck(&registry))?
            .collect::<duckdb::Result<Vec<_>>>()
            .map_err(duck(&registry))?;
        for p in paths {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(named_by: NamedBy) -> TableUse {
        TableUse {
            table: TableName::parse("main.windows").unwrap(),
            holds: Holds::Windows,
            named_by,
            shape: "5000 ms windows".into(),
        }
    }

    fn held_by(job: &str, holds: Holds, exclusive: bool) -> Recorded {
        Recorded {
            job: job.into(),
            holds,
            exclusive,
            shape: if holds == Holds::Windows {
                "1000 ms windows".into()
            } else {
                String::new()
            },
        }
    }

    fn owner(job: &str) -> Owner {
        Owner {
            job: job.into(),
            ..Owner::default()
        }
    }

    #[test]
    fn a_refusal_names_the_other_job_its_windows_and_the_parameter_to_set() {
        let e = refusal(
            &windows(NamedBy::Param("windows_table")),
            &held_by("a", Holds::Windows, true),
            &owner("b"),
        );
        assert_eq!(
            e.to_string(),
            "invalid parameter 'windows_table': \"main.windows\" holds the windows of job 'a' (1000 ms windows); give job 'b' its own windows_table (got 'main.windows')"
        );
        let e = refusal(
            &windows(NamedBy::Statement("per_key".into())),
            &held_by("s1", Holds::Windows, true),
            &owner("s2"),
        );
        assert_eq!(
            e.to_string(),
            "invalid parameter 'sql': the statement into per_key: \"main.windows\" holds the windows of job 's1' (1000 ms windows); give job 's2' a table of its own to INSERT INTO"
        );
        let mut late = windows(NamedBy::Param("late_table"));
        late.holds = Holds::Late;
        let e = refusal(&late, &held_by("o1", Holds::Late, true), &owner("o2"));
        assert!(e.to_string().contains(
            "holds the late events of job 'o1' in a table without a job column (made by an earlier version); give job 'o2' its own late_table"
        ));
    }

    #[test]
    fn claims_are_parsed_back_as_written() {
        for h in [
            Holds::Windows,
            Holds::Late,
            Holds::Dead,
            Holds::Rows,
            Holds::Keyed,
        ] {
            assert_eq!(Holds::parse(h.name()), h);
        }
    }
}
