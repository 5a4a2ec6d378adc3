//! The event-time engine of one job: decode → per-partition watermark → windows (tumbling,
//! hopping or session) per key, with late events and bad messages sent to side outputs.
//!
//! What must stay serial is small, and is this file: the merge takes parsed messages in
//! event-time order, one at a time, keeps each partition's offset and watermark, writes bad
//! messages as dead letters, and stamps each event with the global watermark as it stood before
//! the event arrived. Placing the events in their windows is split over window shards by key
//! (`shard`), which run on the run's threads (`pool`) in epochs of a few thousand events while
//! the merge goes on. Every output is the same whatever the number of shards.

use std::sync::Arc;

use crate::chunk::{Lent, Rejected};
use crate::codec::CodecError;
use crate::config::{EngineConfig, MAX_AGGREGATES};
use crate::error::{EtlError, Result};
use crate::layer::{self, Layer};
use crate::pool::{Actor, Pool};
use crate::record::{FieldPlan, Reject};
use crate::rows::Rows;
use crate::shard::{shard_of, LayerOf, Op, Shard, ShardWork, Windows};
use crate::state::Batch;
use crate::watermark::{PartitionClock, Watermarks};

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

/// Events a cycle of a job with DuckDB aggregates stages before it ends (each is a row of its
/// batch, written to DuckDB by its commit while the next cycle is read).
pub const MAX_STAGED_EVENTS: usize = 200_000;

/// Events merged before they are handed to the shards.
const EPOCH_EVENTS: usize = 4096;
/// Epochs a shard may have waiting before the merge helps it catch up (bounds memory).
const MAX_EPOCHS_AHEAD: usize = 4;

/// The merge's work not yet handed to the shards.
struct Epoch {
    number: u64,
    /// Per shard, in merge order.
    ops: Vec<Vec<Op>>,
    /// The chunks the events are in.
    chunks: Vec<Arc<Lent>>,
    events: usize,
}

/// The event-time core for one job.
pub struct Engine {
    cfg: Arc<EngineConfig>,
    plan: FieldPlan,
    marks: Watermarks,
    partitions: Vec<i32>,
    next_offsets: Vec<i64>,
    /// Dead letters since the output was last taken.
    dead: Rows,
    topic: Arc<str>,
    /// Consumed and dead exactly; the shards' counts as of the last time they were idle.
    counters: Counters,
    /// Wall clock used as ingest time; refreshed every few thousand messages.
    now_ms: i64,
    /// The wall clock the shards were last told.
    shards_now_ms: i64,
    pool: Arc<Pool>,
    /// Each statement's windows (a job of one: its own), `per_layer` shards each, in order.
    layers: Vec<Layer>,
    per_layer: usize,
    shards: Vec<Actor<Shard, ShardWork>>,
    epoch: Epoch,
    /// Per partition: the epoch and the place in its chunks of the partition's current chunk.
    slots: Vec<(u64, u32)>,
    /// As of the last time the shards were idle.
    open_windows: usize,
    pending_rows: usize,
    windows_waiting: bool,
    /// A worker thread failed (the run fails at the end of its cycle).
    failed: Option<String>,
    /// Events merged since the output was last taken, of a job that stages them (they bound a
    /// cycle's memory as side rows do); once per event however many statements stage it, so a
    /// set's cycles are as long as one statement's (each cycle costs DuckDB's fixed work).
    staged_since_take: usize,
    staging: bool,
}

impl Engine {
    /// An engine on the calling thread alone.
    pub fn new(
        cfg: &EngineConfig,
        restored: Restored,
        now_ms: i64,
        topic: &str,
    ) -> std::result::Result<Engine, CodecError> {
        Engine::with_pool(cfg, restored, now_ms, topic, Arc::new(Pool::new(1)))
    }

    /// An engine whose windows are split over as many shards as `pool` has threads.
    pub fn with_pool(
        cfg: &EngineConfig,
        restored: Restored,
        now_ms: i64,
        topic: &str,
        pool: Arc<Pool>,
    ) -> std::result::Result<Engine, CodecError> {
        if cfg.aggregates.len() > MAX_AGGREGATES {
            return Err(CodecError("too many aggregates"));
        }
        let n = pool.threads();
        let cfg = Arc::new(cfg.clone());
        let topic: Arc<str> = Arc::from(topic);
        let schemas = cfg.schemas();
        let mut layers = Layer::of(&cfg);
        let stored = layer::decode(restored.open_windows.as_deref(), &layers)?;
        let mut shards: Vec<Actor<Shard, ShardWork>> = Vec::with_capacity(n * layers.len());
        for (l, (floor_ms, data)) in layers.iter_mut().zip(stored) {
            l.floor_ms = floor_ms;
            let floor = l.watermark(restored.floor_ms);
            let of = LayerOf {
                index: l.index,
                inputs_from: l.inputs_from,
                columns: &cfg.columns,
            };
            for w in Windows::decode_all(&l.cfg, floor, data, n)? {
                let shard = Shard::new(
                    Arc::clone(&l.cfg),
                    Arc::clone(&topic),
                    &l.schemas,
                    w,
                    floor,
                    now_ms,
                    &of,
                );
                shards.push(Actor::new(shard, Shard::apply));
            }
        }
        let staging = layers.iter().any(|l| l.cfg.stages());
        let partitions = &restored.partitions;
        let mut engine = Engine {
            plan: FieldPlan::new(&cfg),
            marks: Watermarks::new(
                cfg.time.lateness_ms,
                cfg.time.idle_timeout_ms,
                restored.floor_ms,
                partitions.iter().map(|p| p.clock).collect(),
            ),
            partitions: partitions.iter().map(|p| p.partition).collect(),
            next_offsets: partitions.iter().map(|p| p.next_offset).collect(),
            dead: Rows::new(schemas.dead.types()),
            topic,
            counters: Counters::default(),
            now_ms,
            shards_now_ms: now_ms,
            epoch: Epoch {
                number: 1,
                ops: (0..shards.len()).map(|_| Vec::new()).collect(),
                chunks: Vec::new(),
                events: 0,
            },
            slots: Vec::new(),
            pool,
            layers,
            per_layer: n,
            shards,
            open_windows: 0,
            pending_rows: 0,
            windows_waiting: false,
            failed: None,
            staged_since_take: 0,
            staging,
            cfg,
        };
        engine.collect();
        Ok(engine)
    }

    pub(crate) fn cfg(&self) -> &EngineConfig {
        &self.cfg
    }

    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The run's totals (the shards' as of the end of the last cycle).
    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn watermark_ms(&self) -> i64 {
        self.marks.global_ms()
    }

    /// Open windows as of the end of the last cycle.
    pub fn open_windows(&self) -> usize {
        self.open_windows
    }

    /// Whether a worker thread failed (the cycle should end: the run fails).
    pub(crate) fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Hands the epoch to the shards. Helps them while one has too much waiting.
    fn dispatch(&mut self) {
        if self.epoch.ops.iter().all(Vec::is_empty) {
            return;
        }
        let chunks = Arc::new(std::mem::take(&mut self.epoch.chunks));
        for (ops, shard) in self.epoch.ops.iter_mut().zip(&self.shards) {
            if ops.is_empty() {
                continue;
            }
            let ops = std::mem::replace(ops, Vec::with_capacity(ops.capacity()));
            let work = ShardWork {
                ops,
                chunks: Arc::clone(&chunks),
            };
            shard.send(&self.pool, work, false);
        }
        self.epoch.number += 1;
        self.epoch.events = 0;
        let shards = &self.shards;
        let behind = self
            .pool
            .help_until(|| shards.iter().all(|s| s.backlog() <= MAX_EPOCHS_AHEAD));
        if let Err(e) = behind {
            self.failed.get_or_insert(e.to_string());
        }
    }

    /// Gives every shard `op` (made with the current watermark), then waits until every shard
    /// has applied all it was sent, helping meanwhile.
    fn sync(&mut self, op: fn(i64) -> Op) -> Result<()> {
        let wm = self.marks.global_ms();
        for (s, ops) in self.epoch.ops.iter_mut().enumerate() {
            let l = &self.layers[s / self.per_layer];
            ops.push(op(l.watermark(wm)));
        }
        self.dispatch();
        if let Some(e) = &self.failed {
            return Err(EtlError::Internal(e.clone()));
        }
        let shards = &self.shards;
        if let Err(e) = self.pool.help_until(|| shards.iter().all(Actor::idle)) {
            self.failed.get_or_insert(e.to_string());
            return Err(e);
        }
        self.collect();
        Ok(())
    }

    /// Waits until every event merged is placed (the counts are then exact).
    pub(crate) fn settle(&mut self) -> Result<()> {
        self.sync(Op::Close)
    }

    /// Reads the idle shards' counts.
    fn collect(&mut self) {
        let (mut emitted, mut late, mut open, mut rows, mut waiting) = (0, 0, 0, 0, false);
        for s in &self.shards {
            let st = s.state();
            emitted += st.out.windows_emitted;
            late += st.out.late_events;
            open += st.open_windows();
            rows += st.out.late.len();
            waiting |= !st.out.windows.is_empty();
        }
        self.counters.windows_emitted = emitted;
        self.counters.late_events = late;
        self.open_windows = open;
        self.pending_rows = rows;
        self.windows_waiting = waiting;
    }

    /// The open windows in their checkpoint form (one form whatever the number of shards),
    /// taken after [`Engine::take_output`]: the shards are then idle and closed through the
    /// same watermark, and what changed since is not part of the form.
    pub fn encode_open_windows(&self, out: &mut Vec<u8>) -> Result<()> {
        if !self.shards.iter().all(Actor::idle) || !self.epoch.ops.iter().all(Vec::is_empty) {
            return Err(EtlError::Internal(
                "open windows encoded while events are being placed".into(),
            ));
        }
        let states: Vec<_> = self.shards.iter().map(Actor::state).collect();
        let windows: Vec<&Windows> = states.iter().map(|s| &s.windows).collect();
        layer::encode(&self.layers, &windows, out);
        Ok(())
    }

    /// Hands over the output gathered since the last call (`into` must have this job's
    /// schemas; it comes back empty for the next call). With revisions, the running rows of
    /// what changed are written first.
    pub fn take_output(&mut self, into: &mut Batch) -> Result<()> {
        if self.cfg.revisions() {
            self.sync(Op::Emit)?;
        } else {
            self.sync(Op::Close)?;
        }
        into.clear();
        into.dead.take_from(&mut self.dead);
        let several = self.layers.iter().any(|l| l.index.is_some());
        if several && into.layers.len() != self.layers.len() {
            into.layers = self
                .layers
                .iter()
                .map(|l| Batch::empty(&l.schemas))
                .collect();
        }
        for (i, (l, shards)) in self
            .layers
            .iter()
            .zip(self.shards.chunks(self.per_layer))
            .enumerate()
        {
            let out = match into.layers.get_mut(i).filter(|_| several) {
                Some(out) => out,
                None => &mut *into,
            };
            l.take_output(shards, out);
        }
        self.pending_rows = 0;
        self.windows_waiting = false;
        self.staged_since_take = 0;
        Ok(())
    }

    /// Late and dead rows waiting in the output (bounds a cycle's memory; late rows as of the
    /// last time the shards were idle).
    pub fn pending_side_rows(&self) -> usize {
        self.pending_rows + self.dead.len()
    }

    /// Whether the cycle holds as much as a cycle should: `max_side_rows` late and dead rows,
    /// or [`MAX_STAGED_EVENTS`] staged events (their memory is the cycle's largest part).
    pub fn cycle_full(&self, max_side_rows: usize) -> bool {
        self.pending_side_rows() >= max_side_rows || self.staged_since_take >= MAX_STAGED_EVENTS
    }

    /// Whether windows closed since the output was last taken (waits for the shards).
    pub fn closed_windows_waiting(&mut self) -> Result<bool> {
        self.sync(Op::Close)?;
        Ok(self.windows_waiting)
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
        if now_ms != self.shards_now_ms {
            self.shards_now_ms = now_ms;
            for ops in &mut self.epoch.ops {
                ops.push(Op::Now(now_ms));
            }
        }
        self.marks.refresh_idle(now_ms);
    }

    /// Records that the partition at `idx` delivered now (it is not idle).
    pub fn delivered(&mut self, idx: usize) {
        self.marks.delivered(idx, self.now_ms);
    }

    /// Merges message `i` of the partition's current chunk (parsed): its offset, then a dead
    /// letter, or an event for its key's shard under the watermark as it stands; then the
    /// watermark.
    #[inline]
    pub(crate) fn merge(&mut self, idx: usize, lent: &Arc<Lent>, i: usize) {
        self.counters.events_consumed += 1;
        let chunk = &lent.chunk;
        self.next_offsets[idx] = chunk.next_offsets[i];
        // As one at a time: the time's reason first, then a time too far ahead, then the
        // key's or an input's.
        let read = match chunk.parsed(i) {
            Err(Rejected::Time(r)) => Err(r),
            Ok(_) | Err(Rejected::Rest(_)) if self.too_far_ahead(chunk.time[i]) => {
                Err(Reject::TooFarAhead)
            }
            Err(Rejected::Rest(r)) => Err(r),
            Ok(t) => Ok(t),
        };
        let t = match read {
            Ok(t) => t,
            Err(r) => {
                let partition = self.partitions[idx];
                self.dead(partition, chunk, i, r);
                return;
            }
        };
        let slot = self.slot(idx, lent);
        let n = self.per_layer;
        let wm = self.marks.global_ms();
        let event = |watermark| Op::Event {
            chunk: slot,
            at: i as u32,
            watermark,
        };
        let mut staged = false;
        if n == 1 && self.layers.len() == 1 {
            if self.layers[0].reads(chunk, i) {
                self.epoch.ops[0].push(event(wm));
                staged = true;
            }
        } else {
            for (at, l) in self.layers.iter().enumerate() {
                if !l.reads(chunk, i) {
                    continue;
                }
                staged = true;
                let shard = if n == 1 {
                    0
                } else {
                    shard_of(chunk.hash_in(l.index, i), n)
                };
                self.epoch.ops[at * n + shard].push(event(l.watermark(wm)));
            }
        }
        self.marks.observe(idx, t);
        self.epoch.events += 1;
        if self.staging && staged {
            self.staged_since_take += 1;
        }
        if self.epoch.events >= EPOCH_EVENTS {
            self.dispatch();
        }
    }

    /// The place of the partition's current chunk in the epoch's chunks.
    #[inline]
    fn slot(&mut self, idx: usize, lent: &Arc<Lent>) -> u32 {
        if self.slots.len() <= idx {
            self.slots.resize(idx + 1, (0, 0));
        }
        let (epoch, slot) = self.slots[idx];
        if epoch == self.epoch.number
            && self
                .epoch
                .chunks
                .get(slot as usize)
                .is_some_and(|c| Arc::ptr_eq(c, lent))
        {
            return slot;
        }
        self.epoch.chunks.push(Arc::clone(lent));
        let slot = (self.epoch.chunks.len() - 1) as u32;
        self.slots[idx] = (self.epoch.number, slot);
        slot
    }

    #[inline]
    fn too_far_ahead(&self, t: i64) -> bool {
        self.cfg
            .max_future_ms
            .is_some_and(|m| t > self.now_ms.saturating_add(m))
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
        self.marks.add(p.clock);
    }

    /// Takes partition `idx` out of the global watermark for good (a rolling file followed by
    /// a later one).
    pub fn release(&mut self, idx: usize) {
        self.marks.release(idx);
    }

    pub fn is_released(&self, idx: usize) -> bool {
        self.marks.clocks().get(idx).is_some_and(|c| c.released)
    }

    /// The opt-in rule for a stream that went completely quiet: once no partition has
    /// delivered for `quiet_ms` of wall clock, every open window is closed (as `flush` does).
    /// Returns whether it did.
    pub fn flush_if_quiet(&mut self, quiet_ms: i64) -> Result<bool> {
        if !self.marks.all_quiet(self.now_ms, quiet_ms) {
            return Ok(false);
        }
        self.sync(Op::Close)?;
        if self.open_windows == 0 {
            return Ok(false);
        }
        self.flush()?;
        Ok(true)
    }

    /// The largest event time a partition has delivered.
    pub fn max_event_time_ms(&self, idx: usize) -> Option<i64> {
        self.marks.max_event_time_ms(idx)
    }

    fn dead(&mut self, partition: i32, chunk: &crate::chunk::Chunk, i: usize, r: Reject) {
        let msg = chunk.message(i);
        let error = match r {
            Reject::Unconverted(at) => chunk.reason(at).to_string(),
            r => self.plan.describe(r),
        };
        self.push_dead(partition, msg.offset, msg.payload, &error);
    }

    fn push_dead(&mut self, partition: i32, offset: i64, raw: &[u8], error: &str) {
        self.counters.dead_letters += 1;
        self.dead
            .row()
            .str(&self.topic)
            .i32(partition)
            .i64(offset)
            .i64(self.now_ms)
            .bytes(raw)
            .str(error)
            .finish();
    }

    /// Closes every open window (bounded input is over). The watermark moves up to the last
    /// window end, so that later events for these windows are late, never a second version.
    pub fn flush(&mut self) -> Result<()> {
        for ops in &mut self.epoch.ops {
            ops.push(Op::Flush);
        }
        self.sync(Op::Close)?;
        for (l, shards) in self
            .layers
            .iter_mut()
            .zip(self.shards.chunks(self.per_layer))
        {
            let mut last = None::<i64>;
            for s in shards {
                if let Some(end) = s.state().flushed_to.take() {
                    last = Some(last.map_or(end, |l| l.max(end)));
                }
            }
            match (last, l.index) {
                (Some(end), None) => self.marks.raise_to(end),
                // A statement of several: its own watermark moves, as if it ran alone.
                (Some(end), Some(_)) => l.floor_ms = l.floor_ms.max(end),
                (None, _) => {}
            }
        }
        Ok(())
    }

    /// The partitions' watermarks (and so the order they are read in).
    pub(crate) fn marks(&self) -> &Watermarks {
        &self.marks
    }

    /// Processes one message of the partition at `idx` by itself (tests).
    #[cfg(test)]
    pub(crate) fn process(&mut self, idx: usize, msg: &crate::source::Message<'_>) {
        let mut chunk = crate::chunk::Chunk::default();
        chunk.push(msg);
        chunk.idx = idx;
        chunk.partition = self.partitions[idx];
        crate::parse::ChunkParser::new(&self.cfg)
            .parse(&mut chunk)
            .expect("a test chunk parses");
        let home = Arc::new(crate::chunk::Spare::default());
        let lent = Arc::new(Lent::new(chunk, home));
        self.delivered(idx);
        self.merge(idx, &lent, 0);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The shards' work holds chunks; let it finish before the pool (perhaps shared) goes on.
        let shards = &self.shards;
        let _ = self.pool.help_until(|| shards.iter().all(Actor::idle));
    }
}
