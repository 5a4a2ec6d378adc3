//! A job's targets as they exist: a statement's existing target must have the columns it
//! makes, by name and type, in order (checked at bind, before anything is written).
#![forbid(unsafe_code)]

use duckdb::Connection;
use streaming_etl_core::{EtlError, Result};

use super::duck;
use super::plan::SqlJob;

/// Checks that each statement's target, where it exists, has the columns the statement makes
/// (`revisions`: and a window row's revision columns; `partitioned`: and `partition`), by name
/// and type, in order: a target of another shape is refused before anything is written.
pub fn check_targets(
    conn: &Connection,
    job: &SqlJob,
    revisions: bool,
    partitioned: bool,
) -> Result<()> {
    for s in &job.statements {
        let mut want = s.columns.clone();
        if revisions && s.body.windowed() {
            want.extend(
                [
                    ("final", "BOOLEAN"),
                    ("revision", "BIGINT"),
                    ("retracted", "BOOLEAN"),
                ]
                .map(|(n, t)| (n.to_string(), t.to_string())),
            );
        }
        if partitioned && s.body.windowed() {
            want.push(("partition".into(), "INTEGER".into()));
        }
        let Some(have) = duck::table_columns(conn, &s.target.sql()) else {
            continue;
        };
        let same = have.len() == want.len()
            && have
                .iter()
                .zip(&want)
                .all(|(h, w)| h.0.eq_ignore_ascii_case(&w.0) && h.1.eq_ignore_ascii_case(&w.1));
        if !same {
            let shown = |cols: &[(String, String)]| {
                cols.iter()
                    .map(|(n, t)| format!("{n} {t}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(EtlError::Statement {
                target: s.target_shown.clone(),
                message:
                format!(
                    "the existing table {} has the columns ({}), and the statement writes ({}); drop or rename it, or INSERT INTO another table",
                    s.target_shown,
                    shown(&have),
                    shown(&want)
                ),
            });
        }
    }
    Ok(())
}
