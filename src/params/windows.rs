//! Windows and what they compute: the window kind (`window_kind`, `hop_ms`), when rows are
//! written (`emit`, `late_updates_ms`), the key columns (`group_by`, `key_field`) and the
//! aggregates (`aggregates`, `value_field`), with the column names they give the windows table
//! checked.

use streaming_etl_core::{
    split_alias, AggSpec, Emit, EngineConfig, EtlError, FieldPath, KeyColumn, Result, TypedColumn,
    WindowKind, MAX_AGGREGATES,
};

use super::columns::{parse_aggregate, typed_key};
use super::given::Given;
use super::table::*;
use crate::host::args::{shown, Arg};

/// `emit` and `late_updates_ms`: when window rows are written.
pub(super) fn parse_emit(given: &Given<'_>, window: WindowKind) -> Result<(Emit, Option<i64>)> {
    let emit = match given
        .text(ParamId::Emit)?
        .map(|f| f.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("close") => Emit::Close,
        Some("update") => Emit::Update,
        Some(_) => {
            return Err(EtlError::invalid(
                given.name(ParamId::Emit),
                "must be 'close' or 'update'",
                shown(given.get(ParamId::Emit).unwrap_or(&Arg::Null)),
            ))
        }
    };
    let late = given.positive(ParamId::LateUpdatesMs)?;
    if let (Some(n), WindowKind::Session) = (late, window) {
        return Err(EtlError::invalid(
            given.name(ParamId::LateUpdatesMs),
            "applies to tumbling and hopping windows, not to sessions",
            n,
        ));
    }
    Ok((emit, late))
}

/// The window kind from `window_kind` and `hop_ms`.
pub(super) fn parse_window(given: &Given<'_>, window_ms: i64) -> Result<WindowKind> {
    let hop = given.positive(ParamId::HopMs)?;
    let kind = given.text(ParamId::WindowKind)?;
    let kind_name = given.name(ParamId::WindowKind);
    let hop_name = given.name(ParamId::HopMs);
    let checked_hop = |h: i64| -> Result<WindowKind> {
        if h > window_ms {
            return Err(EtlError::invalid(
                hop_name,
                format!("must be <= window_ms ({window_ms})"),
                h,
            ));
        }
        if window_ms % h != 0 {
            return Err(EtlError::invalid(
                hop_name,
                format!("must divide window_ms ({window_ms}) into equal steps"),
                h,
            ));
        }
        Ok(if h == window_ms {
            WindowKind::Tumbling
        } else {
            WindowKind::Hopping { hop_ms: h }
        })
    };
    match (kind.as_deref().map(str::to_ascii_lowercase).as_deref(), hop) {
        (None | Some("tumbling"), None) => Ok(WindowKind::Tumbling),
        (Some("tumbling"), Some(h)) if h != window_ms => Err(EtlError::invalid(
            hop_name,
            "applies to hopping windows (window_kind 'tumbling' hops by window_ms)",
            h,
        )),
        (None | Some("hopping") | Some("tumbling"), Some(h)) => checked_hop(h),
        (Some("hopping"), None) => Err(EtlError::invalid(
            kind_name,
            "'hopping' needs hop_ms (how often a window starts)",
            "'hopping'",
        )),
        (Some("session"), None) => Ok(WindowKind::Session),
        (Some("session"), Some(h)) => Err(EtlError::invalid(
            hop_name,
            "does not apply to session windows (window_ms is the gap)",
            h,
        )),
        _ => Err(EtlError::invalid(
            kind_name,
            "must be 'tumbling', 'hopping' or 'session'",
            format!("'{}'", kind.unwrap_or_default()),
        )),
    }
}

/// `path [AS name]` of `group_by`; a typed column (by its path or name) is read as that column.
fn parse_key_column(item: &str, columns: &[TypedColumn]) -> std::result::Result<KeyColumn, String> {
    let (expr, alias) = split_alias(item)?;
    let path = FieldPath::parse(expr)
        .filter(|_| !expr.is_empty() && !expr.contains(char::is_whitespace))
        .ok_or_else(|| {
            format!("'{expr}' is not a field name or dotted path such as payload.value")
        })?;
    if let Some(c) = typed_key(columns, &path) {
        let name = match alias {
            Some(a) => a,
            None if c.path == path => path.last_segment().to_string(),
            None => c.name.clone(),
        };
        return Ok(KeyColumn {
            path: c.path.clone(),
            name,
        });
    }
    let name = alias.unwrap_or_else(|| path.last_segment().to_string());
    Ok(KeyColumn { path, name })
}

/// The key columns and aggregates: `group_by` / `aggregates`, or the defaults from
/// `key_field` / `value_field`.
pub(super) fn parse_keys_and_aggregates(
    given: &Given<'_>,
    key_field: &FieldPath,
    value_field: &FieldPath,
    columns: &[TypedColumn],
) -> Result<(Vec<KeyColumn>, bool, Vec<AggSpec>)> {
    let (keys, default_key) = match given.text_list(ParamId::GroupBy)? {
        None => (
            vec![KeyColumn {
                path: key_field.clone(),
                name: "key".into(),
            }],
            true,
        ),
        Some(_) if given.get(ParamId::KeyField).is_some() => {
            return Err(EtlError::invalid(
                given.name(ParamId::KeyField),
                "cannot be combined with group_by (name the key fields in group_by)",
                shown(given.get(ParamId::KeyField).unwrap_or(&Arg::Null)),
            ))
        }
        Some(items) => {
            let cols = items
                .iter()
                .map(|i| {
                    parse_key_column(i, columns).map_err(|why| {
                        EtlError::invalid(given.name(ParamId::GroupBy), why, format!("'{i}'"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            (cols, false)
        }
    };
    let aggs = match given.text_list(ParamId::Aggregates)? {
        None => AggSpec::defaults(value_field),
        Some(_) if given.get(ParamId::ValueField).is_some() => {
            return Err(EtlError::invalid(
                given.name(ParamId::ValueField),
                "cannot be combined with aggregates (name the fields in the aggregates)",
                shown(given.get(ParamId::ValueField).unwrap_or(&Arg::Null)),
            ))
        }
        Some(items) if items.is_empty() => {
            return Err(EtlError::invalid(
                given.name(ParamId::Aggregates),
                "must list at least one aggregate, e.g. ['count(*)']",
                "[]",
            ))
        }
        Some(items) if items.len() > MAX_AGGREGATES => {
            return Err(EtlError::invalid(
                given.name(ParamId::Aggregates),
                format!("may list at most {MAX_AGGREGATES} aggregates"),
                items.len(),
            ))
        }
        Some(items) => items
            .iter()
            .map(|i| {
                let parsed = if columns.is_empty() {
                    AggSpec::parse(i)
                } else {
                    parse_aggregate(i, columns)
                };
                parsed.map_err(|why| {
                    EtlError::invalid(given.name(ParamId::Aggregates), why, format!("'{i}'"))
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    // Column names: DuckDB compares identifiers without case.
    let mut seen: Vec<String> = vec!["window_start_ms".into(), "window_end_ms".into()];
    for (param, name, expr) in named_columns(&keys, &aggs) {
        let lower = name.to_ascii_lowercase();
        if seen[..2].contains(&lower) {
            return Err(EtlError::invalid(
                given.name(param),
                format!("column '{name}' is reserved for the window bounds; give the expression another name (AS ...)"),
                format!("'{expr}'"),
            ));
        }
        if seen.contains(&lower) {
            return Err(EtlError::invalid(
                given.name(param),
                format!("column '{name}' would appear twice in the windows table; give one expression another name (AS ...)"),
                format!("'{expr}'"),
            ));
        }
        seen.push(lower);
    }
    // A key that is not a typed column must not take a typed column's name in the staged
    // events, where both are columns.
    for k in &keys {
        let clash = columns
            .iter()
            .find(|c| c.path != k.path && c.name.eq_ignore_ascii_case(&k.name));
        if let Some(c) = clash {
            return Err(EtlError::invalid(
                given.name(ParamId::GroupBy),
                format!(
                    "column '{}' is also the name of the typed column of '{}'; give the key another name (AS ...)",
                    k.name,
                    c.path.as_str()
                ),
                format!("'{} AS {}'", k.path.as_str(), k.name),
            ));
        }
    }
    Ok((keys, default_key, aggs))
}

/// The columns the key and aggregate expressions name: (parameter, column, expression).
fn named_columns<'a>(
    keys: &'a [KeyColumn],
    aggs: &'a [AggSpec],
) -> impl Iterator<Item = (ParamId, &'a str, String)> {
    let key = |k: &'a KeyColumn| {
        let expr = format!("{} AS {}", k.path.as_str(), k.name);
        (ParamId::GroupBy, k.name.as_str(), expr)
    };
    let agg = |a: &'a AggSpec| (ParamId::Aggregates, a.name.as_str(), a.shown());
    keys.iter().map(key).chain(aggs.iter().map(agg))
}

/// With revisions, `final`, `revision` and `retracted` are the windows table's own columns.
pub(super) fn check_revision_columns(given: &Given<'_>, engine: &EngineConfig) -> Result<()> {
    for (param, name, expr) in named_columns(&engine.keys, &engine.aggregates) {
        if ["final", "revision", "retracted"].contains(&name.to_ascii_lowercase().as_str()) {
            return Err(EtlError::invalid(
                given.name(param),
                format!("column '{name}' is reserved for a window row's revision (emit := 'update', late_updates_ms); give the expression another name (AS ...)"),
                format!("'{expr}'"),
            ));
        }
    }
    Ok(())
}
