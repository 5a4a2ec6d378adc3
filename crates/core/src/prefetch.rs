//! Reading ahead of the event-time merge. A partition's next messages are taken off the source
//! in chunks, and each chunk is parsed as a job of the run's pool while the merge applies
//! earlier ones, so parsing uses every thread the run has. With one thread, a chunk is read and
//! parsed just before the merge needs it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::chunk::{Chunk, Lent, Spare};
use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::error::{EtlError, Result};
use crate::parse::ChunkParser;
use crate::source::{Pull, Source};
use crate::watermark::OrderKey;

/// Bytes per chunk (a file's lines are read as one block of this size), and messages.
const CHUNK_BYTES: usize = 64 << 10;
const CHUNK_MESSAGES: usize = 1024;
/// Chunks a partition may have read ahead (being parsed, or parsed and waiting), with more
/// than one thread.
const DEPTH: usize = 3;

/// Parsers for the pool's threads (each parse takes one, and gives it back).
struct Parsers {
    cfg: EngineConfig,
    idle: Mutex<Vec<ChunkParser>>,
}

impl Parsers {
    fn parse(&self, slot: &Slot) {
        let taken = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut parser = taken.unwrap_or_else(|| ChunkParser::new(&self.cfg));
        if let Some(c) = slot
            .chunk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            if let Err(e) = parser.parse(c) {
                *slot.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            }
        }
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(parser);
        slot.done.store(true, Ordering::Release);
    }
}

/// A chunk read ahead: parsed once `done` (or failed to be: DuckDB could not be asked about
/// its typed values).
struct Slot {
    chunk: Mutex<Option<Chunk>>,
    done: AtomicBool,
    failed: Mutex<Option<EtlError>>,
}

/// A partition's chunks read ahead.
#[derive(Default)]
struct Lane {
    /// The chunk the merge is applying, and the next message in it (the merge may switch
    /// partitions after any message).
    current: Option<(Arc<Lent>, usize)>,
    /// Chunks read and handed to the parsers, in order.
    pending: VecDeque<Arc<Slot>>,
    /// The source had nothing more for this partition when last asked.
    source_done: bool,
}

/// Reading ahead for one run: each partition's lane, and spare chunks.
#[derive(Default)]
pub(crate) struct ReadAhead {
    lanes: Vec<Lane>,
    spare: Arc<Spare>,
    parsers: Option<Arc<Parsers>>,
}

impl ReadAhead {
    fn lane(&mut self, idx: usize) -> &mut Lane {
        if self.lanes.len() <= idx {
            self.lanes.resize_with(idx + 1, Lane::default);
        }
        &mut self.lanes[idx]
    }

    /// The partition may have more: look again (continuous runs, after a wait).
    pub(crate) fn look_again(&mut self) {
        for l in &mut self.lanes {
            l.source_done = false;
        }
    }

    /// Whether everything the source delivered for the partition has been applied (only then
    /// is the source's own position the partition's).
    pub fn drained(&self, idx: usize) -> bool {
        self.lanes
            .get(idx)
            .is_none_or(|l| l.current.is_none() && l.pending.is_empty())
    }

    /// Reads chunks off the source until the partition has enough ahead or the source has
    /// nothing more for now; each is handed to the pool to be parsed.
    fn fill(&mut self, idx: usize, source: &mut dyn Source, engine: &Engine) -> Result<()> {
        let pool = engine.pool();
        let depth = if pool.threads() > 1 { DEPTH } else { 1 };
        let parsers = Arc::clone(self.parsers.get_or_insert_with(|| {
            Arc::new(Parsers {
                cfg: engine.cfg().clone(),
                idle: Mutex::new(Vec::new()),
            })
        }));
        loop {
            let lane = self.lane(idx);
            let ahead = lane.pending.len() + usize::from(lane.current.is_some());
            if ahead >= depth || lane.source_done {
                return Ok(());
            }
            let mut chunk = self.spare.take();
            let pulled = source.fill(idx, &mut chunk, CHUNK_MESSAGES, CHUNK_BYTES)?;
            let lane = self.lane(idx);
            if pulled == Pull::Exhausted {
                lane.source_done = true;
            }
            if chunk.messages() == 0 && chunk.bytes() == 0 {
                self.spare.give(chunk);
                return Ok(());
            }
            chunk.idx = idx;
            chunk.partition = source
                .partitions()
                .get(idx)
                .map_or(idx as i32, |p| p.partition);
            let slot = Arc::new(Slot {
                chunk: Mutex::new(Some(chunk)),
                done: AtomicBool::new(false),
                failed: Mutex::new(None),
            });
            lane.pending.push_back(Arc::clone(&slot));
            let parsers = Arc::clone(&parsers);
            pool.submit(Box::new(move || parsers.parse(&slot)));
        }
    }

    /// The partition's next chunk in order, parsed (helping the pool while it is being
    /// parsed); None when nothing is ahead.
    fn next_chunk(&mut self, idx: usize, engine: &Engine) -> Result<Option<Arc<Lent>>> {
        let Some(slot) = self.lane(idx).pending.pop_front() else {
            return Ok(None);
        };
        engine
            .pool()
            .help_until(|| slot.done.load(Ordering::Acquire))?;
        if let Some(e) = slot
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            return Err(e);
        }
        let chunk = slot
            .chunk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| EtlError::Internal("a chunk was taken twice".into()))?;
        Ok(Some(Arc::new(Lent::new(chunk, Arc::clone(&self.spare)))))
    }

    /// Merges up to `budget` messages in order, starting with partition `idx`'s, until another
    /// partition comes first (its order key is `second`) or nothing more is there for now. When
    /// another comes first and its next message is already here, the merge goes on with it
    /// (partitions whose events interleave would otherwise switch through the caller at every
    /// message); `exhausted` says which partitions the caller still reads. Returns how it
    /// stopped (Paused: it may go on), how many it merged, and the partition it stopped in.
    pub(crate) fn deliver(
        &mut self,
        mut idx: usize,
        source: &mut dyn Source,
        engine: &mut Engine,
        budget: usize,
        mut second: Option<OrderKey>,
        exhausted: &[bool],
    ) -> Result<(Pull, usize, usize)> {
        let mut merged = 0;
        let mut arrived = true;
        loop {
            let (lent, mut pos) = match self.lane(idx).current.take() {
                Some(current) => current,
                None => {
                    self.fill(idx, source, engine)?;
                    match self.next_chunk(idx, engine)? {
                        Some(c) => (c, 0),
                        None => return Ok((Pull::Exhausted, merged, idx)),
                    }
                }
            };
            if arrived {
                engine.delivered(idx);
                arrived = false;
            }
            let len = lent.chunk.len();
            let (mut spent, mut overtaken) = (false, false);
            while pos < len {
                engine.merge(idx, &lent, pos);
                pos += 1;
                merged += 1;
                if merged == budget {
                    spent = true;
                    break;
                }
                if second.is_some_and(|s| engine.marks().order_key(idx) >= s) {
                    overtaken = true;
                    break;
                }
            }
            if pos < len {
                self.lane(idx).current = Some((lent, pos));
            } else {
                drop(lent);
                // Keep the partition's pipeline full while the merge goes on.
                self.fill(idx, source, engine)?;
            }
            if spent {
                return Ok((Pull::Paused, merged, idx));
            }
            if overtaken {
                // The caller would pick the same partition next (among the same ones); only
                // one whose chunk is at hand is taken here, the rest (reading, waiting, its
                // end) are the caller's.
                let (best, after) = engine.marks().in_order(exhausted);
                match best {
                    Some((_, next))
                        if next != idx
                            && self.lanes.get(next).is_some_and(|l| l.current.is_some()) =>
                    {
                        idx = next;
                        second = after;
                        arrived = true;
                        continue;
                    }
                    _ => return Ok((Pull::Paused, merged, idx)),
                }
            }
            let lane = self.lane(idx);
            if lane.source_done && lane.pending.is_empty() && lane.current.is_none() {
                return Ok((Pull::Exhausted, merged, idx));
            }
        }
    }
}
