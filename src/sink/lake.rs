//! Writing into catalogs other writers commit to as well (a DuckLake, with its optimistic
//! concurrency): a commit that conflicts is tried again, within a bound, and `compact_every`
//! has the lake merge its small files now and then.

use std::time::Duration;

use duckdb::Connection;
use streaming_etl_core::{EtlError, Result, TableSchema};
use streaming_etl_runtime::sink::Tables;

use super::tables::{ensure_table, sink_error};
use crate::params::{quote_ident, TableName};

/// Commits that conflict with another writer's (a DuckLake's optimistic concurrency) are tried
/// this many times in all, waiting 20 ms, 40 ms, ... up to 1 s in between.
pub const COMMIT_ATTEMPTS: u32 = 8;

/// Whether a failed write lost a race with another writer's commit, so that trying again can
/// succeed: DuckLake's "Transaction conflict - ...", DuckDB's "Conflict on update", and any other
/// failed DuckLake commit (several processes creating tables in one lake at once can also make
/// DuckLake 1.4.4 fail a commit with "Failed to parse catalog entry"), and PostgreSQL's own
/// word for two transactions that updated one catalog row at once ("could not serialize
/// access", as members setting a table option at their start do). A failed commit wrote
/// nothing, and a retry first asks the marker whether the batch is there.
fn is_conflict(e: &EtlError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("conflict")
        || text.contains("failed to commit ducklake transaction")
        || text.contains("could not serialize access")
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

/// DuckLake's wait before it tries a commit again that lost the race for the next snapshot to
/// another writer's (then 1.5 times longer each time; 100 ms by default).
const RETRY_WAIT: &str = "ducklake_retry_wait_ms";
/// Its default, and the wait the members of a `subscribe` job use on their own connection.
const RETRY_WAIT_DEFAULT_MS: &str = "100";
const RETRY_WAIT_CONTENDED_MS: u32 = 5;

/// For writers that commit into one catalog all the time (the members of a `subscribe` job):
/// DuckLake's own retry of a commit that lost the race for the next snapshot waits 5 ms on this
/// connection rather than 100 ms, unless the user set another wait than the default. A commit
/// that lost holds no lock, and the race recurs every cycle: 8 members here commit about 1.35
/// times as often (docs/benchmarks.md#scale-out-subscribe). Returns whether the session's value
/// was set (for [`restore_retry_wait`]).
pub(crate) fn shorten_retry_wait(conn: &Connection) -> bool {
    let current: Option<String> = conn
        .query_row(
            &format!("SELECT current_setting('{RETRY_WAIT}')::VARCHAR"),
            [],
            |r| r.get(0),
        )
        .ok();
    current.as_deref() == Some(RETRY_WAIT_DEFAULT_MS)
        && conn
            .execute_batch(&format!(
                "SET SESSION {RETRY_WAIT} = {RETRY_WAIT_CONTENDED_MS}"
            ))
            .is_ok()
}

/// Gives the (pooled) connection its wait back once the job's writer is done.
pub(crate) fn restore_retry_wait(conn: &Connection) {
    let _ = conn.execute_batch(&format!("RESET SESSION {RETRY_WAIT}"));
}

fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A table of the lake as DuckLake's functions name it: its schema and its bare name.
fn lake_table(catalog: &str, table: &str) -> Option<(String, String)> {
    let name = TableName::parse(table)?;
    let bare = name.parts.last()?.clone();
    let schema = match name.parts.as_slice() {
        [_, s, _] => s.clone(),
        [s, _] if !s.eq_ignore_ascii_case(catalog) => s.clone(),
        _ => "main".to_string(),
    };
    Some((schema, bare))
}

/// DuckLake's own maintenance: writes the rows the catalog holds inline (`DATA_INLINING_ROW_LIMIT`)
/// as files, merges the small files of the job's tables (and of its marker table, which gains a
/// file per commit too), expires snapshots older than the retention and deletes the files no
/// snapshot needs any more.
pub(crate) fn compact(
    conn: &Connection,
    catalog: &str,
    tables: &Tables,
    marker: Option<&str>,
    retain_ms: i64,
) -> Result<()> {
    let mut sql = String::new();
    for table in tables.iter().map(String::as_str).chain(marker) {
        let Some((schema, bare)) = lake_table(catalog, table) else {
            continue;
        };
        sql += &format!(
            "CALL ducklake_flush_inlined_data({c}, schema_name => {s}, table_name => {t});\nCALL ducklake_merge_adjacent_files({c}, {t}, schema => {s});\n",
            c = lit(catalog),
            t = lit(&bare),
            s = lit(&schema)
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

/// Keeps the rows of `tables` out of the catalog's inlined data, whatever the lake's
/// `DATA_INLINING_ROW_LIMIT`: DuckLake 1.4 takes any two commits that delete inlined rows of one
/// table as a conflict, whichever rows they are, so the tables the members of a group all
/// delete from (their state rows, staged events, merged windows) would make every commit of one
/// member conflict with every other's. In files, commits conflict only where they delete rows
/// of the same file. A table option, stored in the catalog; set by every member at its start:
/// DuckLake reads its options into the attached catalog once, at ATTACH, and only a member's
/// own `set_option` updates that copy, so a member that attached before another set the option
/// would still inline (and, a BLOB inlined on PostgreSQL, fail its commit). `set_option` writes
/// the catalog's metadata table directly, no snapshot: two catalog statements a table, all of
/// `tables` in one transaction.
pub(crate) fn keep_in_files(conn: &Connection, catalog: &str, tables: &[String]) -> Result<()> {
    let calls: Vec<String> = tables
        .iter()
        .filter_map(|table| lake_table(catalog, table))
        .map(|(schema, bare)| {
            format!(
                "CALL {}.set_option('data_inlining_row_limit', 0, schema => {}, table_name => {});",
                quote_ident(catalog),
                lit(&schema),
                lit(&bare)
            )
        })
        .collect();
    if calls.is_empty() {
        return Ok(());
    }
    conn.execute_batch(&format!("BEGIN TRANSACTION; {} COMMIT", calls.join(" ")))
        .map_err(|e| {
            sink_error(
                &tables.join(", "),
                format!("keeping it out of inlined data: {e}"),
            )
        })
}

/// Creates the tables of `tables` that are missing, without keys (a lake has none), retrying a
/// conflict with another member creating them at once (the one that retries finds them).
pub fn ensure_tables(conn: &Connection, tables: &[(String, TableSchema)]) -> Result<()> {
    for (table, schema) in tables {
        with_retry(table, || {
            ensure_table(conn, table, &schema.without_key(), false)
                .inspect_err(|_| {
                    let _ = conn.execute_batch("ROLLBACK");
                })
                .map(drop)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

        // PostgreSQL's serialization failure is a lost race too.
        let mut tries = 0;
        assert!(with_retry("lake.t", || {
            tries += 1;
            if tries < 2 {
                Err(sink_error("lake.t", "Failed to insert config option in DuckLake: Failed to execute query \"UPDATE ...\": ERROR:  could not serialize access due to concurrent update"))
            } else {
                Ok(())
            }
        })
        .is_ok());
        assert_eq!(tries, 2);

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
}
