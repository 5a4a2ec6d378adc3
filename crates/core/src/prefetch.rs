//! Decoding ahead of the event-time merge. A partition's next messages are taken off the source
//! in chunks and parsed (JSON to event time, key and aggregate inputs) on worker threads while
//! the merge applies earlier chunks, so a run uses more than one core. What a message parses to
//! depends on nothing but the message, so the merge order, which events are late, and where a
//! run resumes are exactly those of reading one message at a time.

use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::aggregate::Input;
use crate::chunk::{Chunk, OwnedInput};
use crate::config::{EngineConfig, MAX_AGGREGATES};
use crate::engine::Engine;
use crate::error::{EtlError, Result};
use crate::format::RecordDecoder;
use crate::record::{with_inputs, FieldPlan, Reject};
use crate::source::{Message, Pull, Source};

/// Messages per chunk (and bytes: whichever comes first).
const CHUNK_MESSAGES: usize = 1024;
const CHUNK_BYTES: usize = 256 << 10;
/// Chunks a partition may have read ahead (being parsed or parsed and waiting).
const DEPTH: usize = 3;

/// Parses chunks: a decoder and the job's field plan of its own (one per worker).
pub(crate) struct ChunkParser {
    decoder: RecordDecoder,
    plan: FieldPlan,
    n: usize,
    key: Vec<u8>,
}

impl ChunkParser {
    pub fn new(cfg: &EngineConfig) -> ChunkParser {
        let plan = FieldPlan::new(cfg);
        ChunkParser {
            decoder: plan.decoder(),
            plan,
            n: cfg.aggregates.len().min(MAX_AGGREGATES),
            key: Vec::new(),
        }
    }

    pub fn parse(&mut self, c: &mut Chunk) {
        let n = self.n;
        c.n_inputs = n;
        for i in 0..c.len() {
            let (a, b) = Chunk::span(&c.payload_ends, i);
            let msg_key = c.msg_key_ends[i].map(|end| {
                let start = c.msg_key_ends[..i]
                    .iter()
                    .rev()
                    .find_map(|e| *e)
                    .unwrap_or(0);
                (start, end)
            });
            let payload = &c.payload[a..b];
            let (time, rest) = match self.decoder.decode(payload, c.schemas[i]) {
                Err(e) => (Err(Reject::Syntax(e)), Ok(())),
                Ok(fields) => match self.plan.time(&fields, c.timestamps[i]) {
                    Err(r) => (Err(r), Ok(())),
                    Ok(t) => {
                        let key = msg_key.map(|(s, e)| &c.msg_keys[s..e]);
                        let rest = with_inputs(n, |inputs| {
                            let rest = self
                                .plan
                                .key(&fields, key, &mut self.key)
                                .and_then(|()| self.plan.inputs(&fields, inputs));
                            if rest.is_ok() {
                                c.keys.extend_from_slice(&self.key);
                                for input in inputs.iter() {
                                    c.inputs.push(match *input {
                                        Input::Skip => OwnedInput::Skip,
                                        Input::Num(v) => OwnedInput::Num(v),
                                        Input::Text(s) => {
                                            let start = c.texts.len();
                                            c.texts.extend_from_slice(s.as_bytes());
                                            OwnedInput::Text(start, c.texts.len())
                                        }
                                        Input::Hash(h) => OwnedInput::Hash(h),
                                        Input::Arg(by, s) => {
                                            let start = c.texts.len();
                                            c.texts.extend_from_slice(s.as_bytes());
                                            OwnedInput::Arg(by, start, c.texts.len())
                                        }
                                        Input::Present => OwnedInput::Present,
                                    });
                                }
                            }
                            rest
                        });
                        (Ok(t), rest)
                    }
                },
            };
            if time.is_err() || rest.is_err() {
                c.inputs.extend(std::iter::repeat_n(OwnedInput::Skip, n));
            }
            c.key_ends.push(c.keys.len());
            c.time.push(time);
            c.rest.push(rest);
        }
    }
}

/// Worker threads that parse chunks.
struct Pool {
    jobs: Option<Sender<Chunk>>,
    done: Receiver<Chunk>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    fn start(cfg: &EngineConfig, workers: usize) -> Option<Pool> {
        let (jobs, inbox) = channel::<Chunk>();
        let (report, done) = channel::<Chunk>();
        let inbox = Arc::new(Mutex::new(inbox));
        let mut handles = Vec::new();
        for w in 0..workers {
            let inbox = Arc::clone(&inbox);
            let report = report.clone();
            let mut parser = ChunkParser::new(cfg);
            let spawned = std::thread::Builder::new()
                .name(format!("streaming_etl-decode-{w}"))
                .spawn(move || loop {
                    let next = inbox.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok(mut chunk) = next else { return };
                    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        parser.parse(&mut chunk)
                    }))
                    .is_ok();
                    if !ok {
                        chunk.failed = true;
                        parser = ChunkParser {
                            decoder: parser.plan.decoder(),
                            plan: parser.plan.clone(),
                            n: parser.n,
                            key: Vec::new(),
                        };
                    }
                    if report.send(chunk).is_err() {
                        return;
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(_) if handles.is_empty() => return None,
                Err(_) => break,
            }
        }
        Some(Pool {
            jobs: Some(jobs),
            done,
            workers: handles,
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A partition's chunks read ahead.
#[derive(Default)]
struct Lane {
    /// The chunk the merge is applying (the merge may switch partitions after any message, so
    /// it stays here rather than moving in and out of `ready`).
    current: Option<Chunk>,
    /// Parsed chunks by sequence number, waiting for the merge.
    ready: BTreeMap<u64, Chunk>,
    /// Sequence numbers handed to the pool so far, and the next one the merge applies.
    sent: u64,
    next: u64,
    /// The source had nothing more for this partition when last asked.
    source_done: bool,
}

impl Lane {
    /// Chunks read and not yet fully applied (the current one included).
    fn ahead(&self) -> usize {
        (self.sent - self.next) as usize
    }
}

/// Decoding ahead for one run: the pool, each partition's lane, spare chunks.
pub(crate) struct DecodeAhead {
    pool: Pool,
    lanes: Vec<Lane>,
    spare: Vec<Chunk>,
}

impl DecodeAhead {
    /// None when no worker thread could be started (the run then reads one message at a time).
    pub fn start(cfg: &EngineConfig, workers: usize) -> Option<DecodeAhead> {
        Some(DecodeAhead {
            pool: Pool::start(cfg, workers.max(1))?,
            lanes: Vec::new(),
            spare: Vec::new(),
        })
    }

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
            .is_none_or(|l| l.ahead() == 0 && l.ready.is_empty())
    }

    /// Reads chunks off the source until the partition has DEPTH ahead or the source has
    /// nothing more for now.
    fn fill(&mut self, idx: usize, source: &mut dyn Source) -> Result<()> {
        while self.lane(idx).ahead() < DEPTH && !self.lane(idx).source_done {
            let mut chunk = self.spare.pop().unwrap_or_default();
            chunk.clear();
            let pulled = source.pull(idx, &mut |m: &Message<'_>| {
                chunk.push(m);
                chunk.len() < CHUNK_MESSAGES && chunk.payload.len() < CHUNK_BYTES
            })?;
            let lane = self.lane(idx);
            if pulled == Pull::Exhausted {
                lane.source_done = true;
            }
            if chunk.len() == 0 {
                self.spare.push(chunk);
                break;
            }
            chunk.idx = idx;
            chunk.seq = lane.sent;
            lane.sent += 1;
            let jobs = self
                .pool
                .jobs
                .as_ref()
                .ok_or_else(|| EtlError::Internal("decode pool closed".into()))?;
            jobs.send(chunk)
                .map_err(|_| EtlError::Internal("the decode threads stopped".into()))?;
        }
        Ok(())
    }

    /// The partition's next chunk in order, waiting for the pool if it is being parsed; None
    /// when nothing is ahead.
    fn next_chunk(&mut self, idx: usize) -> Result<Option<Chunk>> {
        loop {
            let lane = self.lane(idx);
            if lane.ahead() == 0 {
                return Ok(None);
            }
            let want = lane.next;
            if let Some(c) = lane.ready.remove(&want) {
                if c.failed {
                    return Err(EtlError::Internal("a decode thread panicked".into()));
                }
                return Ok(Some(c));
            }
            let c = self
                .pool
                .done
                .recv()
                .map_err(|_| EtlError::Internal("the decode threads stopped".into()))?;
            let (i, s) = (c.idx, c.seq);
            self.lane(i).ready.insert(s, c);
        }
    }

    /// Applies the partition's messages to the engine, in order, until `after` returns false
    /// (it is called after each one) or nothing more is there for now.
    pub(crate) fn deliver(
        &mut self,
        idx: usize,
        source: &mut dyn Source,
        engine: &mut Engine,
        each: &mut dyn FnMut(&mut Engine) -> bool,
    ) -> Result<Pull> {
        let mut first = true;
        loop {
            if self.lane(idx).current.is_none() {
                self.fill(idx, source)?;
                let next = self.next_chunk(idx)?;
                match next {
                    Some(c) => self.lanes[idx].current = Some(c),
                    None => return Ok(Pull::Exhausted),
                }
            }
            let lane = &mut self.lanes[idx];
            let Some(chunk) = lane.current.as_mut() else {
                return Ok(Pull::Exhausted);
            };
            let mut paused = false;
            while chunk.pos < chunk.len() {
                if first {
                    engine.delivered(idx);
                    first = false;
                }
                engine.process_parsed(idx, chunk, chunk.pos);
                chunk.pos += 1;
                if !each(engine) {
                    paused = true;
                    break;
                }
            }
            if chunk.pos >= chunk.len() {
                if let Some(done) = lane.current.take() {
                    self.spare.push(done);
                }
                lane.next += 1;
                // Keep the partition's pipeline full while this one is applied.
                self.fill(idx, source)?;
            }
            if paused {
                return Ok(Pull::Paused);
            }
            let lane = &self.lanes[idx];
            if lane.source_done && lane.ahead() == 0 {
                return Ok(Pull::Exhausted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EngineConfig {
        EngineConfig::for_tests(1000, 0)
    }

    #[test]
    fn a_chunk_parses_as_messages_one_at_a_time_do() {
        let mut c = Chunk::default();
        let lines = [
            r#"{"key":"a","event_time_ms":1500,"payload":{"value":2.5}}"#,
            "not json",
            r#"{"key":"b","event_time_ms":"x"}"#,
            r#"{"key":7,"event_time_ms":2500}"#,
            r#"{"event_time_ms":2500}"#,
        ];
        for (i, l) in lines.iter().enumerate() {
            c.push(&Message {
                offset: i as i64,
                next_offset: i as i64 + 1,
                payload: l.as_bytes(),
                key: (i == 4).then_some(b"kafka-key".as_slice()),
                timestamp: None,
                schema: None,
            });
        }
        ChunkParser::new(&cfg()).parse(&mut c);
        assert_eq!(c.parsed(0), (Ok(1500), Ok(())));
        assert!(matches!(c.parsed(1).0, Err(Reject::Syntax(_))));
        assert!(c.parsed(2).0.is_err());
        assert_eq!(c.parsed(3), (Ok(2500), Ok(())));
        assert_eq!(c.key(4), b"kafka-key");
        assert_eq!(c.key(3), b"7");
        let mut inputs = [Input::Skip; MAX_AGGREGATES];
        c.inputs(0, &mut inputs[..4]);
        assert!(matches!(inputs[1], Input::Num(v) if v == 2.5));
        assert_eq!(c.message(1).payload, b"not json");
        assert_eq!(c.message(4).key, Some(b"kafka-key".as_slice()));
    }
}
