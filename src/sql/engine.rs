//! An **engine** statement: a windowed statement that says what a parameter job says (built-in
//! aggregates over DOUBLE stream columns, keys that are stream columns, no join, no WHERE). The
//! engine computes its rows, and DuckDB only puts their columns in the statement's order and
//! types.
#![forbid(unsafe_code)]

use streaming_etl_core::{AggSpec, EngineConfig, TypedColumn};

use super::statement::{Body, SqlStatement, Statement};

/// Plans an engine statement: the engine decodes its keys and its aggregates' columns only.
pub(super) fn plan(
    mut st: Statement<'_>,
    cfg: &mut EngineConfig,
    key_cols: &[TypedColumn],
    key: Vec<String>,
    aggs: Vec<AggSpec>,
    projection: Vec<String>,
) -> SqlStatement {
    let mut used = key_cols.to_vec();
    for a in &aggs {
        if let Some(c) = a
            .path
            .as_ref()
            .and_then(|p| cfg.columns.iter().find(|c| c.path == *p))
        {
            if !used.iter().any(|u| u.name == c.name) {
                used.push(c.clone());
            }
        }
    }
    cfg.columns = used;
    cfg.aggregates = aggs;
    cfg.typed_inputs = true;
    cfg.stage_all = false;
    let columns = std::mem::take(&mut st.columns);
    st.planned(columns, key, Body::Engine { projection }, Vec::new())
}
