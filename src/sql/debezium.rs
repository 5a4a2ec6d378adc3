//! The stream of a Debezium topic (`envelope := 'debezium'`) as a statement reads it: the
//! declared `columns` are the row's fields, each read from `after` (or from `before`, for a
//! delete), beside the envelope's `op`, `ts_ms`, `before`, `after` and `source`.
//!
//! The engine reads each declared field twice (its path under `after.` and under `before.`)
//! and the envelope's members, into typed columns of reserved names; the cycle's events
//! (`__se_events`) then give the statement the columns above, made from them.
#![forbid(unsafe_code)]

use streaming_etl_core::{EngineConfig, Envelope, EtlError, FieldPath, Result, TypedColumn};

use crate::params::quote_ident;

/// The envelope's own columns, as the stream has them.
pub const ENVELOPE_COLUMNS: [(&str, &str); 5] = [
    ("op", "VARCHAR"),
    ("ts_ms", "BIGINT"),
    ("before", ""),
    ("after", ""),
    ("source", "JSON"),
];

/// Whether an event is a delete (`op = 'd'`), as `__se_events` has it.
pub const DELETE_COLUMN: &str = "__se_delete";

const AFTER: &str = "__se_a_";
const BEFORE: &str = "__se_b_";
const OP: &str = "__se_op";
const TS_MS: &str = "__se_ts_ms";
const SOURCE: &str = "__se_source";

/// At most this many declared columns (each is read twice, within the decoder's 64 paths).
const MAX_ROW_COLUMNS: usize = 28;

/// Replaces the declared columns of a Debezium job by what the engine reads: each field under
/// `after.` and `before.`, `op`, `ts_ms` and `source` (the stream's `key` is kept as it is).
pub fn expand(cfg: &mut EngineConfig) -> Result<()> {
    if cfg.envelope != Envelope::Debezium {
        return Ok(());
    }
    let (row, kept): (Vec<TypedColumn>, Vec<TypedColumn>) =
        cfg.columns.drain(..).partition(|c| !c.message_key);
    if row.is_empty() {
        return Err(EtlError::invalid(
            "columns",
            "must declare the row's fields with envelope := 'debezium' (as the table has them, such as {'id': 'BIGINT', 'name': 'VARCHAR'}): they are read from the event's after (or before, for a delete)",
            "nothing",
        ));
    }
    if row.len() > MAX_ROW_COLUMNS {
        return Err(EtlError::invalid(
            "columns",
            format!("declares {} fields, and with envelope := 'debezium' a job reads at most {MAX_ROW_COLUMNS} (each is read from after and before)", row.len()),
            format!("{} columns", row.len()),
        ));
    }
    for c in &row {
        if let Some((n, _)) = ENVELOPE_COLUMNS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(&c.name))
        {
            return Err(EtlError::invalid(
                "columns",
                format!("column '{n}' is reserved with envelope := 'debezium' (the stream has op, ts_ms, before, after and source); give the field another name (AS ...)"),
                format!("'{} AS {}'", c.path.as_str(), c.name),
            ));
        }
    }
    let under = |prefix: &str, c: &TypedColumn, name: String| -> Result<TypedColumn> {
        let path = FieldPath::parse(&format!("{prefix}.{}", c.path.as_str()))
            .ok_or_else(|| EtlError::invalid("columns", "is not a field path", c.path.as_str()))?;
        Ok(TypedColumn {
            path,
            name,
            ..c.clone()
        })
    };
    let mut out = Vec::new();
    for c in &row {
        out.push(under("after", c, format!("{AFTER}{}", c.name))?);
        out.push(under("before", c, format!("{BEFORE}{}", c.name))?);
    }
    for (path, name, ty) in [
        ("op", OP, "VARCHAR"),
        ("ts_ms", TS_MS, "BIGINT"),
        ("source", SOURCE, "JSON"),
    ] {
        if let Some(p) = FieldPath::parse(path) {
            out.push(TypedColumn::new(p, name, ty));
        }
    }
    out.extend(kept);
    cfg.columns = out;
    Ok(())
}

/// The row's columns of an expanded job: name and type.
fn row_columns(cfg: &EngineConfig) -> Vec<(String, String)> {
    cfg.columns
        .iter()
        .filter_map(|c| {
            c.name
                .strip_prefix(AFTER)
                .map(|n| (n.to_string(), c.sql_type.clone()))
        })
        .collect()
}

/// The type of `before` and `after`: a STRUCT of the row's columns.
fn row_type(row: &[(String, String)]) -> String {
    let fields: Vec<String> = row
        .iter()
        .map(|(n, t)| format!("{} {t}", quote_ident(n)))
        .collect();
    format!("STRUCT({})", fields.join(", "))
}

/// The typed columns of the stream as a statement sees them (before the stream's own): the
/// row's, the envelope's, then the others (`key`).
pub fn visible_columns(cfg: &EngineConfig) -> Vec<(String, String)> {
    let row = row_columns(cfg);
    let mut out = row.clone();
    for (n, t) in ENVELOPE_COLUMNS {
        let t = if t.is_empty() {
            row_type(&row)
        } else {
            t.into()
        };
        out.push((n.to_string(), t));
    }
    out.extend(
        cfg.columns
            .iter()
            .filter(|c| !c.name.starts_with("__se_"))
            .map(|c| (c.name.clone(), c.sql_type.clone())),
    );
    out
}

/// The cycle's events of an expanded job: `events` (name, type, expression over the staged
/// rows, as the engine stages them) with the engine's reserved columns made into the row's,
/// the envelope's and the delete flag.
pub fn events(
    cfg: &EngineConfig,
    events: Vec<(String, String, String)>,
) -> Vec<(String, String, String)> {
    if cfg.envelope != Envelope::Debezium {
        return events;
    }
    let expr = |name: &str| {
        events
            .iter()
            .find(|(n, _, _)| n == name)
            .map_or_else(|| "NULL".to_string(), |(_, _, e)| format!("({e})"))
    };
    let op = expr(OP);
    let row = row_columns(cfg);
    let mut out = Vec::new();
    for (n, t) in &row {
        out.push((
            n.clone(),
            t.clone(),
            format!(
                "CASE WHEN {op} = 'd' THEN {} ELSE {} END",
                expr(&format!("{BEFORE}{n}")),
                expr(&format!("{AFTER}{n}"))
            ),
        ));
    }
    let image = |prefix: &str| {
        let fields: Vec<String> = row
            .iter()
            .map(|(n, _)| format!("{} := {}", quote_ident(n), expr(&format!("{prefix}{n}"))))
            .collect();
        format!("struct_pack({})", fields.join(", "))
    };
    let ty = row_type(&row);
    out.push(("op".into(), "VARCHAR".into(), op.clone()));
    out.push(("ts_ms".into(), "BIGINT".into(), expr(TS_MS)));
    // (`before` is the row before an update or a delete; a connector may send only its key
    // columns, or none for an update.)
    out.push((
        "before".into(),
        ty.clone(),
        format!("CASE WHEN {op} IN ('u', 'd') THEN {} END", image(BEFORE)),
    ));
    out.push((
        "after".into(),
        ty,
        format!("CASE WHEN {op} <> 'd' THEN {} END", image(AFTER)),
    ));
    out.push(("source".into(), "JSON".into(), expr(SOURCE)));
    out.push((
        DELETE_COLUMN.into(),
        "BOOLEAN".into(),
        format!("coalesce({op} = 'd', false)"),
    ));
    out.extend(events.into_iter().filter(|(n, _, _)| {
        !(n.starts_with(AFTER) || n.starts_with(BEFORE) || n == OP || n == TS_MS || n == SOURCE)
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> EngineConfig {
        let mut cfg = EngineConfig::with_defaults(
            streaming_etl_core::TimeSpec {
                window_ms: 1000,
                lateness_ms: 0,
                idle_timeout_ms: None,
            },
            FieldPath::parse("key").unwrap(),
            FieldPath::parse("ts_ms").unwrap(),
            &FieldPath::parse("v").unwrap(),
        );
        cfg.envelope = Envelope::Debezium;
        cfg.columns = vec![
            TypedColumn::new(FieldPath::parse("id").unwrap(), "id", "BIGINT"),
            TypedColumn::new(FieldPath::parse("name").unwrap(), "name", "VARCHAR"),
            TypedColumn::message_key(FieldPath::parse("key").unwrap()),
        ];
        cfg
    }

    #[test]
    fn the_row_is_read_under_after_and_before_beside_the_envelope() {
        let mut cfg = job();
        expand(&mut cfg).unwrap();
        let read: Vec<(&str, &str)> = cfg
            .columns
            .iter()
            .map(|c| (c.path.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(
            read,
            [
                ("after.id", "__se_a_id"),
                ("before.id", "__se_b_id"),
                ("after.name", "__se_a_name"),
                ("before.name", "__se_b_name"),
                ("op", "__se_op"),
                ("ts_ms", "__se_ts_ms"),
                ("source", "__se_source"),
                ("key", "key"),
            ]
        );
        let seen: Vec<String> = visible_columns(&cfg)
            .into_iter()
            .map(|(n, t)| format!("{n} {t}"))
            .collect();
        assert_eq!(
            seen,
            [
                "id BIGINT",
                "name VARCHAR",
                "op VARCHAR",
                "ts_ms BIGINT",
                "before STRUCT(\"id\" BIGINT, \"name\" VARCHAR)",
                "after STRUCT(\"id\" BIGINT, \"name\" VARCHAR)",
                "source JSON",
                "key VARCHAR"
            ]
        );
    }

    #[test]
    fn reserved_names_and_a_job_without_row_columns_are_refused() {
        let mut cfg = job();
        cfg.columns.push(TypedColumn::new(
            FieldPath::parse("x").unwrap(),
            "op",
            "VARCHAR",
        ));
        let e = expand(&mut cfg).unwrap_err().to_string();
        assert!(
            e.contains("column 'op' is reserved with envelope := 'debezium'"),
            "{e}"
        );
        let mut cfg = job();
        cfg.columns.truncate(0);
        assert!(expand(&mut cfg)
            .unwrap_err()
            .to_string()
            .contains("must declare the row's fields"));
    }
}
