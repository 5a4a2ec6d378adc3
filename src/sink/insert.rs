//! A batch's rows as they go into a table: a plain insert, the latest revision of each window
//! (a retracted one deletes it), and the windows whose aggregates DuckDB computes over their
//! staged events; written by [`write`](super::write).

use std::collections::HashMap;
use std::sync::Arc;

use duckdb::Connection;

use streaming_etl_core::{Cell, ColumnType, EtlError, Result, Rows, TableSchema};

use super::staged::Staging;
use super::tables::{revision_columns, sink_error};
use super::write::{
    batch_ref, key_positions, lend, write_rows, write_window_rows, Facts, Part, Start, Verb,
};
use crate::functions::batch::Lent;

/// Writes `rows` into `table` (its columns named, so a table with more columns works) with one
/// statement reading [`__streaming_etl_batch`](crate::functions::batch): DuckDB takes the rows a
/// vector at a time.
pub(crate) fn insert(
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
    let (_lent, query) = lend(&parts);
    write_rows(conn, table, schema, &query, verb).map(drop)
}

/// Writes window rows into `table` (`schema`: the engine's window rows): the latest revision of
/// each window only, and, in DuckDB's own storage (`native`), a small batch matched to the
/// table's rows without a join (see [`write_window_rows`]).
pub(crate) fn insert_windows(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    parts: &[Part<'_>],
    verb: Verb,
    native: bool,
) -> Result<u64> {
    let parts: Vec<&Part<'_>> = parts.iter().filter(|p| !p.rows.is_empty()).collect();
    if parts.is_empty() {
        return Ok(0);
    }
    let (_lent, query, facts) = lend_windows(&parts, schema, verb)?;
    write_window_rows(conn, table, schema, &query, verb, facts.filter(|_| native))
}

/// The events a part's cycle placed in windows, and its first live pane (see `Staged`).
pub(crate) struct StagedPart<'a> {
    pub rows: &'a Rows,
    pub partition: Option<i32>,
    pub live_from_pane_ms: Option<i64>,
}

/// The staged events of a cycle, and how they are staged.
pub(crate) struct StagedWrite<'a> {
    pub staging: &'a Staging,
    pub events: &'a [StagedPart<'a>],
    /// The tables are in DuckDB's own storage (see [`write_window_rows`]).
    pub native: bool,
}

/// Writes the windows rows of a job whose aggregates DuckDB computes in part (see
/// [`Staging`]): the cycle's new events that stay are staged, the rows are written with the
/// aggregates DuckDB computes over their windows' events, and the events no window needs any
/// more are deleted; all on `conn`, inside the cycle's transaction.
pub(crate) fn insert_staged(
    conn: &Connection,
    table: &str,
    schema: &TableSchema,
    parts: &[Part<'_>],
    verb: Verb,
    write: StagedWrite<'_>,
) -> Result<()> {
    let StagedWrite {
        staging,
        events: staged,
        native,
    } = write;
    let all: Vec<&Part<'_>> = parts.iter().collect();
    let (_rows_lent, rows, facts) = lend_windows(&all, schema, verb)?;
    let staged_lent: Vec<Lent> = staged
        .iter()
        .map(|p| Lent::new(Arc::new(p.rows.clone())))
        .collect();
    let new = staged
        .iter()
        .zip(&staged_lent)
        .map(|(p, lent)| staging.new_events(&batch_ref(lent), p.partition))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let live: Vec<(Option<i32>, Option<i64>)> = staged
        .iter()
        .map(|p| (p.partition, p.live_from_pane_ms))
        .collect();
    let st = &staging.table;
    if !new.is_empty() {
        conn.execute_batch(&staging.keep_new(&new, &rows, &live))
            .map_err(|e| sink_error(st, e))?;
    }
    if parts.iter().any(|p| !p.rows.is_empty()) {
        let empty = format!("SELECT * FROM {st} WHERE false");
        let new = if new.is_empty() { empty } else { new };
        let query = staging.window_rows(&rows, &new, &live);
        let facts = facts.filter(|_| native).map(Facts::computed_from);
        if let Err(e) = write_window_rows(conn, table, schema, &query, verb, facts) {
            return Err(aggregate_error(conn, e, staging, &rows, &new));
        }
    }
    conn.execute_batch(&staging.drop_done(&rows, &live))
        .map_err(|e| sink_error(st, e))
}

/// A failed write of rows with DuckDB's aggregates: DuckDB's error, naming the aggregate that
/// failed (each is computed alone, outside the cycle's transaction, which is rolled back: an
/// aggregate that overflows, or a cast inside one, fails on the events it reads).
fn aggregate_error(
    conn: &Connection,
    e: EtlError,
    staging: &Staging,
    rows: &str,
    new: &str,
) -> EtlError {
    let EtlError::Sink { table, message } = e else {
        return e;
    };
    let _ = conn.execute_batch("ROLLBACK");
    let failed = staging
        .each_aggregate(rows, new)
        .into_iter()
        .find_map(|(name, sql)| {
            conn.execute_batch(&sql).err().map(|e| {
                // (Not the statement of the extension's own that DuckDB quotes.)
                let text = e.to_string();
                let first = text.split("\n\nLINE ").next().unwrap_or(&text).to_string();
                format!("the aggregate {name} failed: {first}")
            })
        });
    let what = failed.unwrap_or_else(|| {
        format!(
            "computing the aggregates {}: {message}",
            staging.aggregates_shown()
        )
    });
    EtlError::Sink {
        table,
        message: format!("{what}; nothing of this cycle was written, and the next run resumes it"),
    }
}

/// The parts' window rows lent to the batch function as [`lend`] lends them, with the facts of
/// them; written into a keyed table (`verb` not a plain insert), each part's rows the latest
/// revision of each window (a cycle may hold a window's running rows, its final row and
/// corrections: the last is what the table keeps; appended, all of them are).
pub(super) fn lend_windows(
    parts: &[&Part<'_>],
    schema: &TableSchema,
    verb: Verb,
) -> Result<(Vec<Lent>, String, Option<Facts>)> {
    let mut facts = Facts::default();
    let mut known = true;
    let latest: Vec<Option<Rows>> = parts
        .iter()
        .map(|p| {
            let (rows, f) = latest_revisions(p.rows, schema, verb != Verb::Insert)?;
            match f {
                Some(f) => facts.add(f),
                None => known = false,
            }
            Ok(rows)
        })
        .collect::<Result<_>>()?;
    let owned: Vec<Part<'_>> = parts
        .iter()
        .zip(&latest)
        .map(|(p, l)| Part {
            rows: l.as_ref().unwrap_or(p.rows),
            partition: p.partition,
        })
        .collect();
    let refs: Vec<&Part<'_>> = owned.iter().collect();
    let (lent, query) = lend(&refs);
    Ok((lent, query, known.then_some(facts)))
}

/// With `latest`, the latest revision of each window among `rows` (None when each is there once,
/// the rows have no revisions, or not `latest`), and the facts of what is written; no facts when
/// the rows have no `window_start_ms`.
fn latest_revisions(
    rows: &Rows,
    schema: &TableSchema,
    latest: bool,
) -> Result<(Option<Rows>, Option<Facts>)> {
    let width = rows.types().len();
    let start = schema
        .columns
        .iter()
        .position(|c| c.name == "window_start_ms")
        .filter(|&i| i < width && rows.types()[i] == ColumnType::BigInt);
    let key: Vec<usize> = key_positions(schema)
        .into_iter()
        .filter(|&i| i < width)
        .collect();
    let revisions = revision_columns(schema).filter(|&(_, r, t)| r < width && t < width);
    let dedup = revisions.filter(|_| latest);
    let bad = |e: streaming_etl_core::CodecError| EtlError::Internal(format!("window rows: {e}"));
    // Per key, the row of its latest revision (the later row on a tie).
    let mut newest: HashMap<String, (usize, i64)> = HashMap::new();
    let mut facts = Facts {
        one_each: true,
        ..Facts::default()
    };
    let mut retracted = Vec::with_capacity(rows.len());
    let mut starts = Vec::with_capacity(rows.len());
    let mut i = 0;
    rows.each(|cells| {
        let mut row_start = None;
        if let Some(s) = start {
            if let Cell::I64(ms) = cells[s] {
                row_start = Some(ms);
                facts.start_ms = Some(
                    facts
                        .start_ms
                        .map_or((ms, ms), |(a, b)| (a.min(ms), b.max(ms))),
                );
            }
        }
        starts.push(row_start);
        let gone = revisions.is_some_and(|(_, _, t)| cells[t] == Cell::Bool(true));
        retracted.push(gone);
        if let Some((_, r, _)) = dedup {
            let rev = match cells[r] {
                Cell::I64(v) => v,
                _ => 0,
            };
            let k: String = key
                .iter()
                .map(|&c| format!("{:?}", cells[c]))
                .collect::<Vec<_>>()
                .join("\u{0}");
            let e = newest.entry(k).or_insert((i, rev));
            if rev >= e.1 {
                *e = (i, rev);
            }
        }
        i += 1;
        Ok::<(), ()>(())
    })
    .map_err(bad)?
    .map_err(|()| EtlError::Internal("window rows".into()))?;
    let keep: Option<Vec<bool>> = (dedup.is_some() && newest.len() < rows.len()).then(|| {
        let mut keep = vec![false; rows.len()];
        for &(row, _) in newest.values() {
            keep[row] = true;
        }
        keep
    });
    for (j, (gone, row_start)) in retracted.iter().zip(&starts).enumerate() {
        if keep.as_ref().is_none_or(|k| k[j]) {
            if *gone {
                facts.retracted += 1;
            } else {
                facts.live += 1;
            }
            if let Some(ms) = *row_start {
                facts.count_start(Start {
                    ms,
                    live: usize::from(!gone),
                    retracted: usize::from(*gone),
                });
            }
        }
    }
    let facts = start.map(|_| facts);
    let Some(keep) = keep else {
        return Ok((None, facts));
    };
    let mut out = Rows::new(rows.types().to_vec());
    let mut j = 0;
    rows.each(|cells| {
        if keep[j] {
            out.push(cells);
        }
        j += 1;
        Ok::<(), ()>(())
    })
    .map_err(bad)?
    .map_err(|()| EtlError::Internal("window rows".into()))?;
    Ok((Some(out), facts))
}
