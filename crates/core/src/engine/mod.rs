//! The event-time engine of one job: decode → per-partition watermark → windows (tumbling,
//! hopping or session) per key, with late events and bad messages sent to side outputs. Pure
//! state, fed one message at a time by the pipeline's read loop.

mod legacy;

use crate::aggregate::Input;
use crate::chunk::Chunk;
use crate::codec::{CodecError, Reader, Writer};
use crate::config::{Emit, EngineConfig, WindowKind, MAX_AGGREGATES};
use crate::emit::Shape;
use crate::format::{record_json, RecordDecoder};
use crate::record::{late_key, with_inputs, FieldPlan, Reject};
use crate::session::SessionStore;
use crate::source::Message;
use crate::state::Batch;
use crate::watermark::{PartitionClock, Watermarks};
use crate::window::PaneStore;

/// Running totals of a run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub events_consumed: u64,
    pub windows_emitted: u64,
    pub late_events: u64,
    pub dead_letters: u64,
}

/// Where a job left off: the watermark floor, each partition's progress, the open windows (in
/// their checkpoint form; None for a new job).
#[derive(Debug, Default)]
pub struct Restored {
    pub floor_ms: i64,
    pub partitions: Vec<PartitionProgress>,
    pub open_windows: Option<Vec<u8>>,
}

/// A partition's position as the engine starts or checkpoints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionProgress {
    pub partition: i32,
    pub next_offset: i64,
    pub clock: PartitionClock,
}

enum Windows {
    Panes(PaneStore),
    Sessions(SessionStore),
}

/// Version of the open-windows form (1 was version 0.1's tumbling-only form).
const STATE_FORMAT: u8 = 2;

impl Windows {
    fn new(cfg: &EngineConfig, floor_ms: i64) -> Windows {
        let size = cfg.time.window_ms;
        let shape = Shape::new(cfg.keys.len(), &cfg.aggregates, cfg.revisions());
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

    fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u8(STATE_FORMAT);
        match self {
            Windows::Panes(p) => {
                w.u8(0);
                p.encode(&mut w);
            }
            Windows::Sessions(s) => {
                w.u8(1);
                s.encode(&mut w);
            }
        }
    }

    fn decode(cfg: &EngineConfig, floor_ms: i64, data: &[u8]) -> Result<Windows, CodecError> {
        let mut r = Reader { b: data, i: 0 };
        let aggs = &cfg.aggregates[..];
        let windows = match (r.u8()?, r.u8()?, Windows::new(cfg, floor_ms)) {
            (STATE_FORMAT, 0, Windows::Panes(store)) => {
                Windows::Panes(PaneStore::decode(store, aggs, &mut r)?)
            }
            (STATE_FORMAT, 1, Windows::Sessions(store)) => {
                Windows::Sessions(SessionStore::decode(store, aggs, &mut r)?)
            }
            (1, _, Windows::Panes(_)) if cfg.window == WindowKind::Tumbling && cfg.default_key => {
                return legacy::decode_windows(cfg, floor_ms, data).map(Windows::Panes)
            }
            _ => return Err(CodecError("open windows of another kind of job")),
        };
        r.end()?;
        Ok(windows)
    }
}

/// The event-time core for one job: pure state, fed one message at a time.
pub struct Engine {
    cfg: EngineConfig,
    /// The `topic` column of late events and dead letters.
    topic: String,
    plan: FieldPlan,
    /// Taken out while an event is read (its fields borrow it); always put back.
    /// (Boxed: taking it out and back per event moves a pointer, not the whole decoder.)
    decoder: Option<Box<RecordDecoder>>,
    windows: Windows,
    marks: Watermarks,
    partitions: Vec<i32>,
    next_offsets: Vec<i64>,
    /// Output since the last checkpoint.
    out: Batch,
    counters: Counters,
    /// Wall clock used as ingest time; refreshed every few thousand messages.
    now_ms: i64,
    /// The current event's encoded key, and a late event's key column (reused buffers).
    key: Vec<u8>,
    late_key: String,
}

impl Engine {
    pub fn new(
        cfg: &EngineConfig,
        restored: Restored,
        now_ms: i64,
        topic: &str,
    ) -> Result<Engine, CodecError> {
        if cfg.aggregates.len() > MAX_AGGREGATES {
            return Err(CodecError("too many aggregates"));
        }
        let plan = FieldPlan::new(cfg);
        let windows = match &restored.open_windows {
            Some(data) => Windows::decode(cfg, restored.floor_ms, data)?,
            None => Windows::new(cfg, restored.floor_ms),
        };
        let partitions = &restored.partitions;
        Ok(Engine {
            decoder: Some(Box::new(plan.decoder())),
            plan,
            topic: topic.to_string(),
            windows,
            marks: Watermarks::new(
                cfg.time.lateness_ms,
                cfg.time.idle_timeout_ms,
                restored.floor_ms,
                partitions.iter().map(|p| p.clock).collect(),
            ),
            partitions: partitions.iter().map(|p| p.partition).collect(),
            next_offsets: partitions.iter().map(|p| p.next_offset).collect(),
            out: Batch::empty(&cfg.schemas()),
            counters: Counters::default(),
            now_ms,
            key: Vec::new(),
            late_key: String::new(),
            cfg: cfg.clone(),
        })
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn watermark_ms(&self) -> i64 {
        self.marks.global_ms()
    }

    pub fn open_windows(&self) -> usize {
        match &self.windows {
            Windows::Panes(p) => p.open_windows(),
            Windows::Sessions(s) => s.open_windows(),
        }
    }

    /// The open windows in their checkpoint form, taken after [`Engine::take_output`] (which
    /// writes the cycle's running rows: what changed since is not part of the form).
    pub fn encode_open_windows(&self, out: &mut Vec<u8>) {
        self.windows.encode(out);
    }

    #[cfg(test)]
    pub fn output(&self) -> &Batch {
        &self.out
    }

    /// Hands over the output gathered since the last call (`into` must have this job's
    /// schemas; it comes back empty for the next call).
    pub fn take_output(&mut self, into: &mut Batch) {
        if self.cfg.revisions() {
            let wm = self.marks.global_ms();
            let out = &mut self.out.windows;
            match &mut self.windows {
                Windows::Panes(p) => p.emit_updates(wm, out),
                Windows::Sessions(s) => s.emit_updates(out),
            };
        }
        into.clear();
        std::mem::swap(into, &mut self.out);
    }

    /// Late and dead rows waiting in the output (bounds a cycle's memory).
    pub fn pending_side_rows(&self) -> usize {
        self.out.late.len() + self.out.dead.len()
    }

    /// Windows closed since the output was last taken.
    pub fn closed_windows_waiting(&self) -> bool {
        !self.out.windows.is_empty()
    }

    /// Every partition's position and event-time progress, for a checkpoint.
    pub fn progress(&self) -> Vec<PartitionProgress> {
        self.partitions
            .iter()
            .zip(&self.next_offsets)
            .zip(self.marks.clocks())
            .map(|((&partition, &next_offset), &clock)| PartitionProgress {
                partition,
                next_offset,
                clock,
            })
            .collect()
    }

    pub fn set_now(&mut self, now_ms: i64) {
        self.now_ms = now_ms;
        if self.marks.refresh_idle(now_ms) {
            self.close_windows();
        }
    }

    /// Records that the partition at `idx` delivered now (it is not idle).
    pub fn delivered(&mut self, idx: usize) {
        if self.marks.delivered(idx, self.now_ms) {
            self.close_windows();
        }
    }

    /// Processes one message of the partition at `idx`.
    #[inline]
    pub fn process(&mut self, idx: usize, msg: &Message<'_>) {
        self.counters.events_consumed += 1;
        self.next_offsets[idx] = msg.next_offset;
        let partition = self.partitions[idx];
        let n = self.cfg.aggregates.len();
        // Taken out for the event (no allocation): the fields borrow the decoder while the
        // event goes into the windows.
        let mut key = std::mem::take(&mut self.key);
        let mut decoder = self
            .decoder
            .take()
            .unwrap_or_else(|| Box::new(self.plan.decoder()));
        match decoder.decode(msg.payload, msg.schema) {
            Ok(fields) => with_inputs(n, |inputs| {
                let read = self.plan.time(&fields, msg.timestamp).and_then(|t| {
                    if self.too_far_ahead(t) {
                        return Err(Reject::TooFarAhead);
                    }
                    self.plan.key(&fields, msg.key, &mut key)?;
                    self.plan.inputs(&fields, inputs)?;
                    Ok(t)
                });
                match read {
                    Ok(t) => self.place(idx, msg, t, &key, inputs),
                    Err(r) => self.dead(partition, msg, r),
                }
            }),
            Err(e) => self.dead(partition, msg, Reject::Syntax(e)),
        }
        self.key = key;
        self.decoder = Some(decoder);
    }

    /// Processes message `i` of a chunk parsed ahead (see `prefetch`): the same outcome as
    /// [`Engine::process`] on that message.
    #[inline]
    pub(crate) fn process_parsed(&mut self, idx: usize, chunk: &Chunk, i: usize) {
        self.counters.events_consumed += 1;
        let msg = chunk.message(i);
        self.next_offsets[idx] = msg.next_offset;
        let partition = self.partitions[idx];
        let read = match chunk.parsed(i) {
            (Err(r), _) => Err(r),
            (Ok(t), _) if self.too_far_ahead(t) => Err(Reject::TooFarAhead),
            (Ok(_), Err(r)) => Err(r),
            (Ok(t), Ok(())) => Ok(t),
        };
        match read {
            Ok(t) => with_inputs(self.cfg.aggregates.len(), |inputs| {
                chunk.inputs(i, inputs);
                self.place(idx, &msg, t, chunk.key(i), inputs);
            }),
            Err(r) => self.dead(partition, &msg, r),
        }
    }

    #[inline]
    fn too_far_ahead(&self, t: i64) -> bool {
        self.cfg
            .max_future_ms
            .is_some_and(|m| t > self.now_ms.saturating_add(m))
    }

    /// An event that read well: into its window(s), or late; then the watermark.
    #[inline]
    fn place(&mut self, idx: usize, msg: &Message<'_>, t: i64, key: &[u8], inputs: &[Input<'_>]) {
        let partition = self.partitions[idx];
        let watermark = self.marks.global_ms();
        let aggs = &self.cfg.aggregates;
        let mut applied = false;
        let late = match &mut self.windows {
            Windows::Panes(p) => match p.late_window(t, watermark) {
                Ok(()) => {
                    p.add(t, key, inputs, aggs);
                    Ok(())
                }
                Err(w) => {
                    applied = p.add_late(t, key, inputs, aggs, watermark);
                    Err(w)
                }
            },
            Windows::Sessions(s) => s.add(t, key, inputs, aggs, watermark),
        };
        if let Err((start, end)) = late {
            self.counters.late_events += 1;
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
                .i32(partition)
                .i64(msg.offset);
            if self.cfg.late_updates_ms.is_some() {
                row.cell(crate::rows::Cell::Bool(applied));
            }
            row.finish();
        }
        if self.marks.observe(idx, t) {
            self.close_windows();
        }
    }

    /// Records data the source cannot deliver (see `source::Gap`), so that it is visible as
    /// a dead letter instead of silently skipped.
    pub fn record_gap(&mut self, partition: i32, from: i64, message: &str) {
        self.push_dead(partition, from, &[], message);
    }

    /// A partition that appeared during the run (a new file, a partition added to a topic).
    pub fn add_partition(&mut self, p: PartitionProgress) {
        self.partitions.push(p.partition);
        self.next_offsets.push(p.next_offset);
        if self.marks.add(p.clock) {
            self.close_windows();
        }
    }

    /// Takes partition `idx` out of the global watermark for good (a rolling file followed by
    /// a later one).
    pub fn release(&mut self, idx: usize) {
        if self.marks.release(idx) {
            self.close_windows();
        }
    }

    pub fn is_released(&self, idx: usize) -> bool {
        self.marks.clocks().get(idx).is_some_and(|c| c.released)
    }

    /// The opt-in rule for a stream that went completely quiet: once no partition has
    /// delivered for `quiet_ms` of wall clock, every open window is closed (as `flush` does).
    /// Returns whether it did.
    pub fn flush_if_quiet(&mut self, quiet_ms: i64) -> bool {
        if self.open_windows() > 0 && self.marks.all_quiet(self.now_ms, quiet_ms) {
            self.flush();
            return true;
        }
        false
    }

    /// The largest event time a partition has delivered.
    pub fn max_event_time_ms(&self, idx: usize) -> Option<i64> {
        self.marks.max_event_time_ms(idx)
    }

    fn dead(&mut self, partition: i32, msg: &Message<'_>, r: Reject) {
        let error = self.plan.describe(r);
        self.push_dead(partition, msg.offset, msg.payload, &error);
    }

    fn push_dead(&mut self, partition: i32, offset: i64, raw: &[u8], error: &str) {
        self.counters.dead_letters += 1;
        self.out
            .dead
            .row()
            .str(&self.topic)
            .i32(partition)
            .i64(offset)
            .i64(self.now_ms)
            .bytes(raw)
            .str(error)
            .finish();
    }

    fn close_windows(&mut self) {
        let wm = self.marks.global_ms();
        let out = &mut self.out.windows;
        let n = match &mut self.windows {
            Windows::Panes(p) => p.close_through(wm, out),
            Windows::Sessions(s) => s.close_through(wm, out),
        };
        self.counters.windows_emitted += n as u64;
    }

    /// Closes every open window (bounded input is over). The watermark moves up to the last
    /// window end, so that later events for these windows are late, never a second version.
    pub fn flush(&mut self) {
        let before = self.out.windows.len();
        let out = &mut self.out.windows;
        let last = match &mut self.windows {
            Windows::Panes(p) => p.close_all(out),
            Windows::Sessions(s) => s.close_all(out),
        };
        if let Some(end) = last {
            self.marks.raise_to(end);
        }
        self.counters.windows_emitted += (self.out.windows.len() - before) as u64;
    }

    #[inline]
    pub(crate) fn order_key(&self, idx: usize) -> (i64, usize) {
        (self.marks.max_event_time_ms(idx).unwrap_or(i64::MIN), idx)
    }
}
