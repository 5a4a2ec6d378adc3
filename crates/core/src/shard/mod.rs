//! A window shard: the open windows of the keys whose hash falls to it, and the rows they write.
//! The event-time merge decides, one event at a time, the global watermark at that event; the
//! shards then place their events under those watermarks in parallel, each on whichever thread
//! of the run is free. A key's events all go to one shard in merge order, and windows of
//! different keys never meet, so what a shard writes is what the one engine of a single thread
//! writes for those keys: the same windows, the same late events, whatever the number of shards.
//!
//! The open windows of all shards are stored in the form of one store, so a job checkpointed
//! with some number of threads resumes with any other.

mod legacy;

use std::sync::Arc;

use crate::aggregate::Input;
use crate::chunk::{Chunk, Lent};
use crate::codec::{CodecError, Reader, Writer};
use crate::columns::OwnedTyped;
use crate::config::{Emit, EngineConfig, Fate, WindowKind};
use crate::emit::Shape;
use crate::format::record_json;
use crate::record::{key_parts, late_key, with_inputs};
use crate::rows::{Cell, Rows};
use crate::session::SessionStore;
use crate::state::OutputSchemas;
use crate::window::{hash_key, window_start_ms, PaneStore};

/// The shard of a key's hash among `shards`. The hash is mixed again first: the panes' hash
/// tables read its bits too, and keys of one shard must not share them.
#[inline]
pub(crate) fn shard_of(hash: u64, shards: usize) -> usize {
    let mixed = (hash ^ (hash >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((u128::from(mixed ^ (mixed >> 29)) * shards as u128) >> 64) as usize
}

/// One shard's piece of work, in merge order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// Message `at` of chunk `chunk` (of the work's chunks), with the global watermark as it
    /// stood before the event arrived.
    Event { chunk: u32, at: u32, watermark: i64 },
    /// The wall clock, as the ingest time of late events from here on.
    Now(i64),
    /// Close every window the watermark has passed.
    Close(i64),
    /// A cycle ends: close what the watermark passed, then (jobs with revisions) write the
    /// running rows of what changed.
    Emit(i64),
    /// Close every window (bounded input is over).
    Flush,
}

/// Work sent to a shard: operations, and the chunks their events are in.
pub(crate) struct ShardWork {
    pub ops: Vec<Op>,
    pub chunks: Arc<Vec<Arc<Lent>>>,
}

pub(crate) enum Windows {
    Panes(PaneStore),
    Sessions(SessionStore),
}

/// Version of the open-windows form (1 was version 0.1's tumbling-only form).
const STATE_FORMAT: u8 = 2;

impl Windows {
    pub(crate) fn new(cfg: &EngineConfig, floor_ms: i64) -> Windows {
        let size = cfg.time.window_ms;
        let mut shape = Shape::new(cfg.keys.len(), &cfg.aggregates, cfg.revisions());
        shape.corrections = cfg.marks_corrections();
        let running = cfg.emit == Emit::Update;
        let panes = |hop_ms| {
            PaneStore::new(size, hop_ms, shape.clone(), floor_ms)
                .tracking(running, cfg.late_updates_ms)
        };
        match cfg.window {
            WindowKind::Tumbling => Windows::Panes(panes(size)),
            WindowKind::Hopping { hop_ms } => Windows::Panes(panes(hop_ms)),
            WindowKind::Session => {
                Windows::Sessions(SessionStore::new(size, shape.clone()).tracking(running))
            }
        }
    }

    fn open_windows(&self) -> usize {
        match self {
            Windows::Panes(p) => p.open_windows(),
            Windows::Sessions(s) => s.open_windows(),
        }
    }

    /// The first pane a window row may still read (tumbling and hopping; None when none is).
    pub(crate) fn first_live_pane(&self) -> Option<i64> {
        match self {
            Windows::Panes(p) => p.first_live_pane(),
            Windows::Sessions(_) => None,
        }
    }

    /// The open windows of `shards` as one store's checkpoint form.
    pub(crate) fn encode_all(shards: &[&Windows], out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u8(STATE_FORMAT);
        let panes: Vec<&PaneStore> = shards
            .iter()
            .filter_map(|s| match s {
                Windows::Panes(p) => Some(p),
                Windows::Sessions(_) => None,
            })
            .collect();
        if panes.len() == shards.len() {
            w.u8(0);
            PaneStore::encode_all(&panes, &mut w);
            return;
        }
        let sessions: Vec<&SessionStore> = shards
            .iter()
            .filter_map(|s| match s {
                Windows::Sessions(s) => Some(s),
                Windows::Panes(_) => None,
            })
            .collect();
        w.u8(1);
        SessionStore::encode_all(&sessions, &mut w);
    }

    /// `shards` new stores holding the open windows `data` stored, each key in its shard.
    pub(crate) fn decode_all(
        cfg: &EngineConfig,
        floor_ms: i64,
        data: Option<&[u8]>,
        shards: usize,
    ) -> Result<Vec<Windows>, CodecError> {
        let fresh = || Windows::new(cfg, floor_ms);
        let Some(data) = data else {
            return Ok((0..shards).map(|_| fresh()).collect());
        };
        let route = |key: &[u8]| shard_of(hash_key(key), shards);
        let mut r = Reader { b: data, i: 0 };
        let aggs = &cfg.aggregates[..];
        let kind = (r.u8()?, r.u8()?);
        let windows = match (kind, fresh()) {
            ((STATE_FORMAT, 0), Windows::Panes(_)) => {
                let mut stores = panes_of(cfg, floor_ms, shards);
                PaneStore::decode_into(&mut stores, &route, aggs, &mut r)?;
                stores.into_iter().map(Windows::Panes).collect()
            }
            ((STATE_FORMAT, 1), Windows::Sessions(_)) => {
                let mut stores: Vec<SessionStore> = (0..shards)
                    .filter_map(|_| match fresh() {
                        Windows::Sessions(s) => Some(s),
                        Windows::Panes(_) => None,
                    })
                    .collect();
                SessionStore::decode_into(&mut stores, &route, aggs, &mut r)?;
                stores.into_iter().map(Windows::Sessions).collect()
            }
            ((1, _), Windows::Panes(_))
                if cfg.window == WindowKind::Tumbling && cfg.default_key =>
            {
                let mut stores = panes_of(cfg, floor_ms, shards);
                legacy::decode_windows_into(&mut stores, &route, data)?;
                return Ok(stores.into_iter().map(Windows::Panes).collect());
            }
            _ => return Err(CodecError("open windows of another kind of job")),
        };
        r.end()?;
        Ok(windows)
    }
}

fn panes_of(cfg: &EngineConfig, floor_ms: i64, shards: usize) -> Vec<PaneStore> {
    (0..shards)
        .filter_map(|_| match Windows::new(cfg, floor_ms) {
            Windows::Panes(p) => Some(p),
            Windows::Sessions(_) => None,
        })
        .collect()
}

/// What a shard has written and counted since the engine last took it.
pub(crate) struct ShardOutput {
    pub windows: Rows,
    pub late: Rows,
    /// The events placed in windows, for a job whose aggregates DuckDB computes (see
    /// `EngineConfig::staged_schema`).
    pub staged: Rows,
    pub windows_emitted: u64,
    pub late_events: u64,
}

/// Which statement of a job of several a shard's windows are (its keys and inputs are its own
/// part of each chunk), and the typed columns the chunks carry.
pub(crate) struct LayerOf<'a> {
    pub index: Option<usize>,
    pub inputs_from: usize,
    pub columns: &'a [crate::columns::TypedColumn],
}

/// A window shard (see the module's documentation).
pub(crate) struct Shard {
    cfg: Arc<EngineConfig>,
    topic: Arc<str>,
    /// A statement of a job of several: its place (None: the job's own keys and inputs).
    layer: Option<usize>,
    inputs_from: usize,
    pub(crate) windows: Windows,
    /// The watermark this shard's windows are closed through.
    closed_ms: i64,
    now_ms: i64,
    pub(crate) out: ShardOutput,
    /// The latest end a flush wrote.
    pub(crate) flushed_to: Option<i64>,
    late_key: String,
    /// A job whose aggregates DuckDB computes: which typed columns its staged events carry.
    staged_values: Option<Box<[usize]>>,
}

impl Shard {
    pub(crate) fn new(
        cfg: Arc<EngineConfig>,
        topic: Arc<str>,
        schemas: &OutputSchemas,
        windows: Windows,
        floor_ms: i64,
        now_ms: i64,
        layer: &LayerOf<'_>,
    ) -> Shard {
        Shard {
            topic,
            layer: layer.index,
            inputs_from: layer.inputs_from,
            windows,
            closed_ms: floor_ms,
            now_ms,
            out: ShardOutput {
                windows: Rows::new(schemas.windows.types()),
                late: Rows::new(schemas.late.types()),
                staged: Rows::new(cfg.staged_schema().types()),
                windows_emitted: 0,
                late_events: 0,
            },
            flushed_to: None,
            late_key: String::new(),
            staged_values: cfg.stages().then(|| {
                // Places among the typed columns the chunks carry.
                let values: Vec<usize> = cfg
                    .staged_values()
                    .filter_map(|c| layer.columns.iter().position(|u| u.name == c.name))
                    .collect();
                values.into()
            }),
            cfg,
        }
    }

    pub(crate) fn open_windows(&self) -> usize {
        self.windows.open_windows()
    }

    /// Applies a piece of work (the shard's actor function).
    pub(crate) fn apply(&mut self, work: ShardWork) {
        for op in work.ops {
            match op {
                Op::Event {
                    chunk,
                    at,
                    watermark,
                } => {
                    if let Some(c) = work.chunks.get(chunk as usize) {
                        self.place(c, at as usize, watermark);
                    }
                }
                Op::Now(ms) => self.now_ms = ms,
                Op::Close(wm) => self.close_through(wm),
                Op::Emit(wm) => {
                    self.close_through(wm);
                    if self.cfg.revisions() {
                        let out = &mut self.out.windows;
                        match &mut self.windows {
                            Windows::Panes(p) => p.emit_updates(wm, out),
                            Windows::Sessions(s) => s.emit_updates(out),
                        };
                    }
                }
                Op::Flush => {
                    if let Windows::Panes(p) = &mut self.windows {
                        // Late corrections of closed windows go first: the flush moves the
                        // watermark past every window they were kept for.
                        p.emit_corrections(&mut self.out.windows);
                    }
                    let before = self.out.windows.len();
                    let out = &mut self.out.windows;
                    let last = match &mut self.windows {
                        Windows::Panes(p) => p.close_all(out),
                        Windows::Sessions(s) => s.close_all(out),
                    };
                    if let Some(end) = last {
                        self.closed_ms = self.closed_ms.max(end);
                        self.flushed_to = Some(self.flushed_to.map_or(end, |f| f.max(end)));
                    }
                    self.out.windows_emitted += (self.out.windows.len() - before) as u64;
                }
            }
        }
    }

    /// Closes the windows the watermark passed (the one engine closed them the moment the
    /// watermark moved; a shard does it before its next event or at the cycle's end, which
    /// writes the same rows: nothing of its keys happened in between).
    #[inline]
    fn close_through(&mut self, watermark_ms: i64) {
        if watermark_ms <= self.closed_ms {
            return;
        }
        self.closed_ms = watermark_ms;
        let out = &mut self.out.windows;
        let n = match &mut self.windows {
            Windows::Panes(p) => p.close_through(watermark_ms, out),
            Windows::Sessions(s) => s.close_through(watermark_ms, out),
        };
        self.out.windows_emitted += n as u64;
    }

    /// An event that read well: into its window(s), or late.
    #[inline]
    fn place(&mut self, lent: &Lent, i: usize, watermark: i64) {
        self.close_through(watermark);
        let chunk = &lent.chunk;
        let t = chunk.time[i];
        let key = chunk.key_in(self.layer, i);
        let aggs = &self.cfg.aggregates;
        let windows = &mut self.windows;
        let (layer, from) = (self.layer, self.inputs_from);
        let (late, applied) = with_inputs(aggs.len(), |inputs: &mut [Input<'_>]| {
            chunk.inputs_from(i, from, inputs);
            match windows {
                Windows::Panes(p) => match p.late_window(t, watermark) {
                    Ok(()) => {
                        p.add_hashed(t, key, chunk.hash_in(layer, i), inputs, aggs);
                        (Ok(()), false)
                    }
                    Err(w) => (Err(w), p.add_late(t, key, inputs, aggs, watermark)),
                },
                Windows::Sessions(s) => (s.add(t, key, inputs, aggs, watermark), false),
            }
        });
        let Err((start, end)) = late else {
            self.stage(chunk, i, t, watermark, Fate::Placed);
            return;
        };
        if applied {
            self.stage(chunk, i, t, watermark, Fate::Applied);
        } else if self.cfg.stage_all {
            self.stage(chunk, i, t, watermark, Fate::Late);
        }
        self.out.late_events += 1;
        let msg = chunk.message(i);
        let has_key = late_key(key, self.cfg.keys.len(), &mut self.late_key);
        // Decoding checked a JSON message is UTF-8; a binary record is rendered as JSON.
        let rendered;
        let payload = if self.cfg.format.is_binary() {
            rendered = record_json(&self.cfg.schemas, msg.payload, msg.schema);
            rendered.as_str()
        } else {
            std::str::from_utf8(msg.payload).unwrap_or_default()
        };
        let mut row = self.out.late.row();
        row.opt_str(has_key.then_some(self.late_key.as_str()))
            .i64(t)
            .i64(self.now_ms)
            .str(payload)
            .i64(start)
            .i64(end)
            .i64(watermark)
            .str(&self.topic)
            .i32(chunk.partition)
            .i64(msg.offset);
        if self.cfg.late_updates_ms.is_some() {
            row.cell(Cell::Bool(applied));
        }
        row.finish();
    }
}

impl Shard {
    /// Stages an event placed in windows (a job whose aggregates DuckDB computes): its key
    /// columns, pane, time, the watermark it was placed under, its typed values.
    #[inline]
    fn stage(&mut self, chunk: &Chunk, i: usize, t: i64, watermark: i64, fate: Fate) {
        let Some(values) = &self.staged_values else {
            return;
        };
        let cfg = &self.cfg;
        let mut row = self.out.staged.row();
        for part in key_parts(chunk.key_in(self.layer, i), cfg.keys.len()) {
            row.opt_str(part);
        }
        match cfg.window {
            WindowKind::Tumbling => {
                row.i64(window_start_ms(t, cfg.time.window_ms));
            }
            WindowKind::Hopping { hop_ms } => {
                row.i64(window_start_ms(t, hop_ms));
            }
            WindowKind::Session => {}
        }
        row.i64(t);
        if cfg.stamps_events() {
            row.i64(watermark);
        }
        if cfg.stage_all {
            row.i32(chunk.partition)
                .i64(chunk.offsets[i])
                .i32(fate as i32);
        }
        let typed = chunk.typed(i);
        for &j in values.iter() {
            match typed.get(j).copied().unwrap_or(OwnedTyped::Null) {
                OwnedTyped::Null | OwnedTyped::Pending => row.cell(Cell::Null),
                OwnedTyped::Bool(b) => row.cell(Cell::Bool(b)),
                OwnedTyped::Int(v) => row.i64(v),
                OwnedTyped::Double(v) => row.cell(Cell::F64(v)),
                OwnedTyped::Text(a, b) => row.str(chunk.text(a, b)),
            };
        }
        row.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_every_shard_and_one_shard_takes_all() {
        for shards in [1, 2, 3, 8, 64] {
            let mut seen = vec![0; shards];
            for k in 0..5000 {
                seen[shard_of(hash_key(format!("k{k}").as_bytes()), shards)] += 1;
            }
            assert!(
                seen.iter().all(|&n| n > 5000 / shards / 2),
                "{shards}: {seen:?}"
            );
        }
    }
}
