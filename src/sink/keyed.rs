//! The sink of a keyed statement (`INSERT OR REPLACE INTO t SELECT ... FROM stream`, planned in
//! `sql::keyed`): in the cycle's transaction, the statement's rows over the cycle's events are
//! reduced to the last change of each key: a key whose last change is a delete is deleted from
//! the target, a key still there is updated, and the others are inserted. Matching by the key's
//! values needs no index (a DuckLake has none) and gives the same table whatever the target held,
//! so a cycle run again after a crash writes what it wrote the first time.
#![forbid(unsafe_code)]

use duckdb::Connection;
use streaming_etl_core::Result;

use super::tables::sink_error;
use crate::params::quote_ident;
use crate::sql::{Keyed, MESSAGE_KEY_COLUMN};

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
            "SELECT __se_p, __se_o, __se_d FROM __se_changes WHERE {} ORDER BY __se_p, __se_o LIMIT 1",
            null_key.join(" OR ")
        ),
        [],
        |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?, r.get::<_, bool>(2)?)),
    );
    match found {
        Ok((p, o, delete)) => {
            let hint = if delete {
                format!(
                    "; it is a delete, whose row may have its key's fields only (a Debezium delete's before image, an upsert tombstone's message key): key the table by those, or read the key from the message key (such as CAST(key AS BIGINT) AS {})",
                    keyed.key.first().map_or("id", String::as_str)
                )
            } else {
                format!(
                    " (drop such rows with WHERE {} IS NOT NULL)",
                    keyed.key.join(" IS NOT NULL AND ")
                )
            };
            return Err(sink_error(
                target,
                format!(
                    "the row of the event at partition {p}, offset {o} has a NULL key ({}); its key names no row{hint}",
                    keyed.key.join(", "),
                ),
            ));
        }
        Err(duckdb::Error::QueryReturnedNoRows) => {}
        Err(e) => return Err(fail("the statement over the cycle's events", e)),
    }
    if keyed.message_keyed {
        check_message_keys(conn, target, keyed, &key)?;
    }
    // The last change of each key: the latest offset of its partition (a key lives in one
    // partition of a keyed topic), then, for a key seen in several, the latest event time.
    let k = key.join(", ");
    let matched: Vec<String> = key
        .iter()
        .map(|c| format!("__se_target.{c} = __se_last.{c}"))
        .collect();
    // A key still there is updated in place, not deleted and inserted again: DuckDB 1.4 could
    // refuse the commit of a key deleted and inserted again while an older transaction (the
    // statement running the job) still saw its old row ("write-write conflict on key"), on every
    // retry of the cycle.
    let set: Vec<String> = cols
        .iter()
        .filter(|c| !key.contains(c))
        .map(|c| format!("{c} = __se_last.{c}"))
        .collect();
    let update = if set.is_empty() {
        String::new()
    } else {
        format!(
            "UPDATE {target} AS __se_target SET {} FROM __se_last WHERE {} AND NOT __se_last.__se_d;",
            set.join(", "),
            matched.join(" AND ")
        )
    };
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE __se_last AS SELECT * FROM (
             SELECT * FROM __se_changes
             QUALIFY row_number() OVER (PARTITION BY {k}, __se_p ORDER BY __se_o DESC) = 1)
         QUALIFY row_number() OVER (PARTITION BY {k} ORDER BY __se_t DESC, __se_p DESC) = 1;
         DELETE FROM {target} AS __se_target USING __se_last WHERE {matched} AND __se_last.__se_d;
         {update}
         INSERT INTO {target} ({cols}) SELECT {cols} FROM __se_last WHERE NOT __se_d
           AND NOT EXISTS (SELECT 1 FROM {target} AS __se_target WHERE {matched});
         DROP TABLE __se_changes; DROP TABLE __se_last;",
        matched = matched.join(" AND "),
        cols = cols.join(", ")
    ))
    .map_err(|e| fail("replacing the rows of the changed keys", e))?;
    Ok(())
}

/// A `subscribe` member's rows: each row's key must be its message's key (its values, whatever
/// their names: a JSON object's members, bare or in the JSON converter's wrapper, an Avro or
/// Protobuf key's as JSON, or the key itself), so that a key lives in one partition and one
/// member writes its row. A change keyed otherwise fails the cycle, naming it.
fn check_message_keys(
    conn: &Connection,
    target: &str,
    keyed: &Keyed,
    key: &[String],
) -> Result<()> {
    let k = MESSAGE_KEY_COLUMN;
    let row: Vec<String> = key
        .iter()
        .map(|c| format!("CAST({c} AS VARCHAR)"))
        .collect();
    let row = format!("list_value({})", row.join(", "));
    let object = format!(
        "CASE WHEN json_type({k}, '$.schema') IS NOT NULL AND json_type({k}, '$.payload') = 'OBJECT' \
         THEN json_extract({k}, '$.payload') ELSE {k}::JSON END"
    );
    let message = format!(
        "CASE WHEN NOT coalesce(json_valid({k}), false) THEN list_value({k}) \
         WHEN json_type({k}) = 'OBJECT' THEN json_extract_string({object}, '$.*') \
         ELSE list_value(json_extract_string({k}, '$')) END"
    );
    let found = conn.query_row(
        &format!(
            "SELECT __se_p, __se_o, CAST({row} AS VARCHAR), {k} FROM __se_changes \
             WHERE NOT coalesce(list_sort({row}) = list_sort({message}), false) ORDER BY __se_p, __se_o LIMIT 1"
        ),
        [],
        |r| {
            Ok((
                r.get::<_, i32>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        },
    );
    match found {
        Ok((p, o, row_key, message_key)) => Err(sink_error(
            target,
            format!(
                "with subscribe := true, each row's key ({}) must be its message's key, so that a key lives in one partition and one member writes its row; the event at partition {p}, offset {o} has the key {row_key} and the message key {}",
                keyed.key.join(", "),
                message_key.map_or("NULL".to_string(), |m| format!("'{m}'"))
            ),
        )),
        Err(duckdb::Error::QueryReturnedNoRows) => Ok(()),
        Err(e) => Err(sink_error(target, format!("checking the rows' message keys: {e}"))),
    }
}
