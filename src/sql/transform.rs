//! A statement without a window: a **transform** (`INSERT INTO t SELECT ... FROM stream`, each
//! event's rows appended: the statement itself over the cycle's events), or a keyed statement
//! (`INSERT OR REPLACE INTO t`, a table kept by key: [`keyed`](super::keyed)).
#![forbid(unsafe_code)]

use serde_json::Value;
use streaming_etl_core::{EngineConfig, Envelope, EtlError, Result, WindowKind, TOMBSTONE_FIELD};

use super::duck;
use super::on_duckdb::replace_stream;
use super::statement::{stage_every_event, Body, SqlStatement, Statement};
use crate::params::quote_ident;

/// The window of a transform-only job (its windows are never written): a day, so that the
/// engine keeps one open window.
const TRANSFORM_WINDOW_MS: i64 = 86_400_000;

/// Plans a statement without a window; the engine stages every event it reads.
pub(super) fn plan(mut st: Statement<'_>, cfg: &mut EngineConfig) -> Result<SqlStatement> {
    let used = std::mem::take(&mut st.used);
    match cfg.envelope {
        // (A Debezium row's columns are read from after or before as op says: all kept.)
        Envelope::Debezium => {}
        // (A keyed statement also reads the tombstone flag, to delete a tombstone's key, and a
        // member the message key it checks each row's key against.)
        Envelope::Upsert if st.text.replace => {
            let kept = cfg
                .columns
                .iter()
                .filter(|c| c.name == TOMBSTONE_FIELD || st.subscribe && c.message_key)
                .filter(|c| !used.iter().any(|u| u.name == c.name))
                .cloned()
                .collect::<Vec<_>>();
            cfg.columns = used;
            cfg.columns.extend(kept);
        }
        _ => cfg.columns = used,
    }
    cfg.window = WindowKind::Tumbling;
    cfg.time.window_ms = TRANSFORM_WINDOW_MS;
    cfg.keys = Vec::new();
    cfg.default_key = false;
    stage_every_event(cfg, &st.typing)?;
    let mut node = replace_stream(&st.node, &st.sh, st.conn)?;
    if st.text.replace {
        let keyed = super::keyed::plan(
            st.conn,
            &super::keyed::Statement {
                answer: &st.answer,
                node: &node,
                stream: &st.sh.stream,
                columns: &st.columns,
                target: &st.target,
                target_shown: &st.target_shown,
                primary_key: st.primary_key,
                subscribe: st.subscribe,
                envelope: cfg.envelope,
                message_key: cfg
                    .columns
                    .iter()
                    .find(|c| c.message_key)
                    .map(|c| c.name.as_str()),
            },
        )?;
        let (key, columns) = (keyed.key.clone(), keyed.columns.clone());
        return Ok(st.planned(columns, key, Body::Keyed(keyed), Vec::new()));
    }
    let mut columns = std::mem::take(&mut st.columns);
    if st.subscribe
        && !columns
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("partition"))
    {
        // A member's rows carry the partition they were read from, as windowed rows do.
        let (_, t) = duck::parse(
            st.conn,
            &format!(
                "SELECT {s}.\"partition\" AS \"partition\" FROM __se_events AS {s}",
                s = quote_ident(&st.sh.stream)
            ),
        )
        .map_err(EtlError::Duck)?;
        let item = t
            .get("select_list")
            .and_then(Value::as_array)
            .and_then(|l| l.first())
            .cloned();
        if let (Some(list), Some(item)) = (
            node.get_mut("select_list").and_then(Value::as_array_mut),
            item,
        ) {
            list.push(item);
        }
        columns.push(("partition".into(), "INTEGER".into()));
    }
    let sql = duck::print(st.conn, &st.answer, &node).map_err(|m| st.fail(m))?;
    let typed = duck::describe(st.conn, &sql).map_err(|m| st.fail(m))?;
    for (c, t) in columns.iter_mut().zip(typed) {
        c.1 = t.1;
    }
    Ok(st.planned(columns, Vec::new(), Body::Transform { sql }, Vec::new()))
}
