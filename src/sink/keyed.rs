//! The sink of a keyed statement (`INSERT OR REPLACE INTO t SELECT ... FROM stream`, planned in
//! `sql::keyed`): in the cycle's transaction, the statement's rows over the cycle's events are
//! reduced to the last change of each key, every key changed is deleted from the target, and
//! the keys whose last change is not a delete are inserted again. Deleting then inserting
//! needs no index (a DuckLake has none) and gives the same table whatever the target held, so
//! a cycle run again after a crash writes what it wrote the first time.
#![forbid(unsafe_code)]

use duckdb::Connection;
use streaming_etl_core::Result;

use super::tables::sink_error;
use crate::params::quote_ident;
use crate::sql::Keyed;

/// Writes a cycle's changes (`__se_events` holds its events) into `target`, whose columns the
/// statement's are (`columns`, quoted).
pub fn write(conn: &Connection, target: &str, keyed: &Keyed) -> Result<()> {
    let fail = |what: &str, e: duckdb::Error| sink_error(target, format!("{what}: {e}"));
    let key: Vec<String> = keyed.key.iter().map(|k| quote_ident(k)).collect();
    let cols: Vec<String> = keyed.columns.iter().map(|(n, _)| quote_ident(n)).collect();
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE __se_changes AS SELECT * FROM ({}) WHERE __se_c",
        keyed.changes
    ))
    .map_err(|e| fail("the statement over the cycle's events", e))?;
    if keyed.truncates {
        // A truncate empties the table; of the cycle's changes, those after the last truncate
        // remain (in its partition, by offset; in the others, by event time).
        let last = conn.query_row(
            "SELECT \"partition\", \"offset\", event_time_ms FROM __se_events WHERE op = 't'
             ORDER BY event_time_ms DESC, \"partition\" DESC, \"offset\" DESC LIMIT 1",
            [],
            |r| {
                Ok((
                    r.get::<_, i32>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        );
        match last {
            Ok((p, o, t)) => conn
                .execute_batch(&format!(
                    "DELETE FROM {target};
                     DELETE FROM __se_changes WHERE NOT (__se_p = {p} AND __se_o > {o} OR __se_p <> {p} AND __se_t > {t});"
                ))
                .map_err(|e| fail("a truncate", e))?,
            Err(duckdb::Error::QueryReturnedNoRows) => {}
            Err(e) => return Err(fail("the cycle's truncates", e)),
        }
    }
    // A key of NULL names no row: refused, naming the event (a WHERE that drops such rows
    // says what the job is to do with them).
    let null_key: Vec<String> = key.iter().map(|k| format!("{k} IS NULL")).collect();
    let found = conn.query_row(
        &format!(
            "SELECT __se_p, __se_o FROM __se_changes WHERE {} ORDER BY __se_p, __se_o LIMIT 1",
            null_key.join(" OR ")
        ),
        [],
        |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?)),
    );
    match found {
        Ok((p, o)) => {
            return Err(sink_error(
                target,
                format!(
                    "the row of the event at partition {p}, offset {o} has a NULL key ({}); its key names no row (drop such rows with WHERE {} IS NOT NULL)",
                    keyed.key.join(", "),
                    keyed.key.join(" IS NOT NULL AND ")
                ),
            ))
        }
        Err(duckdb::Error::QueryReturnedNoRows) => {}
        Err(e) => return Err(fail("the statement over the cycle's events", e)),
    }
    // The last change of each key: the latest offset of its partition (a key lives in one
    // partition of a keyed topic), then, for a key seen in several, the latest event time.
    let k = key.join(", ");
    let matched: Vec<String> = key
        .iter()
        .map(|c| format!("__se_target.{c} = __se_last.{c}"))
        .collect();
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE __se_last AS SELECT * FROM (
             SELECT * FROM __se_changes
             QUALIFY row_number() OVER (PARTITION BY {k}, __se_p ORDER BY __se_o DESC) = 1)
         QUALIFY row_number() OVER (PARTITION BY {k} ORDER BY __se_t DESC, __se_p DESC) = 1;
         DELETE FROM {target} AS __se_target USING __se_last WHERE {matched};
         INSERT INTO {target} ({cols}) SELECT {cols} FROM __se_last WHERE NOT __se_d;
         DROP TABLE __se_changes; DROP TABLE __se_last;",
        matched = matched.join(" AND "),
        cols = cols.join(", ")
    ))
    .map_err(|e| fail("replacing the rows of the changed keys", e))?;
    Ok(())
}
