//! A windowed statement (`FROM TUMBLE/HOP/SESSION(stream, ...)`): its window and the engine's
//! keys (the GROUP BY items that are stream columns), then planned as the engine's
//! ([`engine`](super::engine)) when the engine can compute its rows, or DuckDB's over staged
//! events ([`staged`](super::staged)); a window join ([`window_join`](super::window_join)) is
//! DuckDB's over both reads of each window's events.
#![forbid(unsafe_code)]

use serde_json::Value;
use streaming_etl_core::{EngineConfig, KeyColumn, Result, TypedColumn, WindowKind};

use super::ast;
use super::duck;
use super::on_engine::{calls_aggregate, engine_aggregates, stream_column_of, upsert_key};
use super::shape::{WindowFn, BOUNDS};
use super::statement::{SqlStatement, Statement};

/// Plans a windowed statement.
pub(super) fn plan(st: Statement<'_>, cfg: &mut EngineConfig) -> Result<SqlStatement> {
    let Some((wf, intervals)) = &st.sh.window else {
        return Err(st.fail("a windowed statement without a window"));
    };
    let wf = *wf;
    let mut ms = Vec::new();
    for (arg, node) in wf.interval_args().iter().zip(intervals) {
        let v = duck::millis(st.conn, &st.answer, node)
            .map_err(|m| st.fail(format!("{}'s {arg} {m}", wf.name())))?;
        if v <= 0 {
            return Err(st.fail(format!("{}'s {arg} must be > 0 (got {v} ms)", wf.name())));
        }
        ms.push(v);
    }
    cfg.window = match wf {
        WindowFn::Tumble => WindowKind::Tumbling,
        WindowFn::Session => WindowKind::Session,
        WindowFn::Hop if ms[0] == ms[1] => WindowKind::Tumbling,
        WindowFn::Hop => {
            if ms[0] > ms[1] || ms[1] % ms[0] != 0 {
                return Err(st.fail(format!(
                    "HOP's size ({} ms) must be a multiple of its hop ({} ms)",
                    ms[1], ms[0]
                )));
            }
            WindowKind::Hopping { hop_ms: ms[0] }
        }
    };
    cfg.time.window_ms = *ms.last().unwrap_or(&1);
    cfg.default_key = false;
    cfg.null_keys = true;
    let is_aggregate = st.is_aggregate;
    if st.sh.join.is_some() {
        let key = upsert_key(&st.sh, &st.columns, is_aggregate);
        return super::window_join::plan(st, cfg, key);
    }
    // The GROUP BY items that are stream columns are the engine's keys.
    let group_items: Vec<Value> = match &st.sh.group_by {
        Some(exprs) => exprs.clone(),
        None => st
            .sh
            .select
            .iter()
            .filter(|(_, e)| !calls_aggregate(e, is_aggregate))
            .map(|(_, e)| e.clone())
            .collect(),
    };
    let mut key_cols: Vec<TypedColumn> = Vec::new();
    let mut other_keys = false;
    for g in &group_items {
        match stream_column_of(g, &st.sh, &cfg.columns) {
            Some(c) if c.repr.keyable() => {
                if !key_cols.iter().any(|k| k.name == c.name) {
                    key_cols.push(c.clone());
                }
            }
            Some(_) => other_keys = true,
            None => {
                let bound = ast::column_names(g).is_some_and(|n| {
                    n.last()
                        .is_some_and(|c| BOUNDS.iter().any(|b| b.eq_ignore_ascii_case(c)))
                });
                other_keys |= !bound;
            }
        }
    }
    // A key's sessions are the engine's, per the GROUP BY's stream columns; other keys split a
    // session's rows. A session merged into another retracts its row by those keys alone.
    if wf == WindowFn::Session && other_keys && cfg.revisions() {
        return Err(st.fail("a SESSION statement with emit := 'update' or late_updates_ms groups by stream columns only (besides window_start): a session merged into another retracts its row by them; computed or joined keys need TUMBLE or HOP, or emit := 'close'"));
    }
    cfg.keys = key_cols
        .iter()
        .enumerate()
        .map(|(i, c)| KeyColumn {
            path: c.path.clone(),
            name: format!("__se_k{i}"),
        })
        .collect();
    let key = upsert_key(&st.sh, &st.columns, is_aggregate);
    let fast = engine_aggregates(
        &st.sh,
        &key_cols,
        &cfg.columns,
        &st.described,
        is_aggregate,
        other_keys,
    );
    match fast {
        Some((aggs, projection)) => Ok(super::engine::plan(
            st, cfg, &key_cols, key, aggs, projection,
        )),
        None => super::staged::plan(st, cfg, &key_cols, key),
    }
}
