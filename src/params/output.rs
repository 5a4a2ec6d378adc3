//! Where and how a run writes: the output tables (`windows_table`, `late_table`,
//! `dead_letter_table`), `write_mode`, and DuckLake compaction (`compact_every`,
//! `compact_retain_ms`).

use streaming_etl_core::{ByTable, EtlError, Result};

use super::given::Given;
use super::sql_name::TableName;
use super::table::*;
use crate::host::args::{shown, Arg};

/// How the output tables are created and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Tables with primary keys; rows upserted (a replay overwrites itself).
    Upsert,
    /// Tables without keys (no index to maintain); rows appended, and each batch recorded in
    /// the marker table in the same transaction (a replay finds its marker and is skipped).
    Append,
}

/// `compact_every` and `compact_retain_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub every: i64,
    pub retain_ms: i64,
}

/// Snapshots a compaction keeps by default: readers' queries younger than this never lose the
/// files they read.
pub const DEFAULT_COMPACT_RETAIN_MS: i64 = 600_000;

/// `write_mode`.
pub(super) fn parse_write_mode(given: &Given<'_>) -> Result<WriteMode> {
    match given
        .text(ParamId::WriteMode)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("upsert") => Ok(WriteMode::Upsert),
        Some("append") => Ok(WriteMode::Append),
        Some(_) => Err(EtlError::invalid(
            given.name(ParamId::WriteMode),
            "must be 'upsert' or 'append'",
            shown(given.get(ParamId::WriteMode).unwrap_or(&Arg::Null)),
        )),
    }
}

/// The output tables: `windows_table`, and `late_table` and `dead_letter_table` beside it unless
/// named.
pub(super) fn parse_tables(given: &Given<'_>) -> Result<ByTable<TableName>> {
    let windows = given.table(ParamId::WindowsTable, TableName::bare("windows"))?;
    // Beside the windows table by default: one catalog, so one transaction writes all three.
    let late = given.table(ParamId::LateTable, windows.sibling("late_events"))?;
    let dead = given.table(ParamId::DeadLetterTable, windows.sibling("dead_letters"))?;
    if windows == late || windows == dead || late == dead {
        return Err(EtlError::invalid(
            given.name(ParamId::WindowsTable),
            "windows_table, late_table and dead_letter_table must be three different tables",
            format!("{}, {}, {}", windows.sql(), late.sql(), dead.sql()),
        ));
    }
    Ok(ByTable {
        windows,
        late,
        dead,
    })
}

/// `compact_every` and `compact_retain_ms`.
pub(super) fn parse_compaction(given: &Given<'_>) -> Result<Option<Compaction>> {
    let retain_ms = given.positive(ParamId::CompactRetainMs)?;
    Ok(match given.positive(ParamId::CompactEvery)? {
        Some(every) => Some(Compaction {
            every,
            retain_ms: retain_ms.unwrap_or(DEFAULT_COMPACT_RETAIN_MS),
        }),
        None if retain_ms.is_some() => {
            return Err(EtlError::invalid(
                given.name(ParamId::CompactRetainMs),
                "applies only with compact_every",
                retain_ms.unwrap_or_default(),
            ))
        }
        None => None,
    })
}
