//! One run of a job: restore its state from the checkpoint (settling a state a killed run left in
//! doubt by asking the sink whether its batch landed), open the source where the job left off,
//! then read in cycles, each handed to the committer (which makes it durable while the next is
//! read), until the source is caught up or a limit is reached.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use streaming_etl_core::{
    read_cycle, reported_watermark, Batch, Counters, CycleLimits, Engine, EtlError, OutputSchemas,
    PartitionClock, PartitionProgress, PartitionState, Pool, ReadState, Restored, Result, Source,
    Stop, NO_WATERMARK,
};

use crate::checkpoint::{Checkpoint, StoredJob};
use crate::clock::Clock;
use crate::committer::{Committer, CycleState, Target};
use crate::config::JobConfig;
use crate::lock::JobLock;
use crate::sink::{Output, OutputSink};

/// Late and dead rows a cycle may gather before it checkpoints early (bounds memory).
const MAX_PENDING_ROWS: usize = 500_000;
/// Messages after which a cycle ends even before its interval: shorter cycles let the
/// committer write one while the next is read.
const MAX_CYCLE_MESSAGES: u64 = 1_000_000;

/// Opens the job's source, given the partitions the checkpoint knows (with their offsets).
pub type SourceOpener = Box<dyn FnOnce(&[PartitionState]) -> Result<Box<dyn Source>> + Send>;

/// What a run is given to work with.
pub struct RunEnv {
    pub checkpoint: Checkpoint,
    /// The job's lock, already taken; held until the run is dropped.
    pub lock: JobLock,
    pub sink: Box<dyn OutputSink>,
    pub open_source: SourceOpener,
    pub clock: Arc<dyn Clock>,
}

/// What a run reports (the row of `streaming_etl_run`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    pub job: String,
    pub events_consumed: u64,
    pub windows_emitted: u64,
    pub late_events: u64,
    pub dead_letters: u64,
    pub watermark_ms: Option<i64>,
    pub elapsed_ms: i64,
    pub events_per_sec: f64,
    pub open_windows: u64,
    /// The bytes of the open windows' state in its checkpoint form, as last committed.
    pub state_bytes: u64,
    pub partitions: u64,
    pub cycles: u64,
    /// `running` until the last row; then why the run stopped.
    pub status: &'static str,
}

/// `a - b`, count by count (`b` counted before `a`, by the same engine).
pub fn minus(a: Counters, b: Counters) -> Counters {
    Counters {
        events_consumed: a.events_consumed.saturating_sub(b.events_consumed),
        windows_emitted: a.windows_emitted.saturating_sub(b.windows_emitted),
        late_events: a.late_events.saturating_sub(b.late_events),
        dead_letters: a.dead_letters.saturating_sub(b.dead_letters),
    }
}

/// `a + b`, count by count.
pub fn plus(a: Counters, b: Counters) -> Counters {
    Counters {
        events_consumed: a.events_consumed + b.events_consumed,
        windows_emitted: a.windows_emitted + b.windows_emitted,
        late_events: a.late_events + b.late_events,
        dead_letters: a.dead_letters + b.dead_letters,
    }
}

/// When this cycle's result row is due, given when it was (`due`, updated for the next cycle):
/// rows are due on a fixed grid, so a cycle that ran long does not push the next ones back.
pub(crate) fn next_row_due(due: &mut Option<Instant>, interval_ms: i64) -> Instant {
    let interval = Duration::from_millis(interval_ms as u64);
    let now = Instant::now();
    let row_due = match *due {
        Some(d) if d > now => d,
        _ => now + interval,
    };
    *due = Some(row_due + interval);
    row_due
}

impl RunStats {
    /// The row of a run with these totals, started at `started`, stopped by `stop` (None or a
    /// cycle's end: running); `(open windows, partitions)` as they are now.
    pub fn new(
        job: &str,
        c: Counters,
        watermark_ms: i64,
        started: Instant,
        (open_windows, partitions): (usize, usize),
        cycles: u64,
        stop: Option<Stop>,
    ) -> RunStats {
        let elapsed = started.elapsed();
        RunStats {
            job: job.to_string(),
            events_consumed: c.events_consumed,
            windows_emitted: c.windows_emitted,
            late_events: c.late_events,
            dead_letters: c.dead_letters,
            watermark_ms: reported_watermark(watermark_ms),
            elapsed_ms: elapsed.as_millis() as i64,
            events_per_sec: if elapsed.as_secs_f64() > 0.0 {
                c.events_consumed as f64 / elapsed.as_secs_f64()
            } else {
                0.0
            },
            open_windows: open_windows as u64,
            state_bytes: 0,
            partitions: partitions as u64,
            cycles,
            status: match stop {
                None | Some(Stop::CycleEnd) => "running",
                Some(Stop::CaughtUp) => "caught_up",
                Some(Stop::MaxMessages) => "max_messages",
                Some(Stop::MaxRuntime) => "max_runtime",
            },
        }
    }
}

pub struct Run {
    cfg: Arc<JobConfig>,
    source: Box<dyn Source>,
    engine: Engine,
    schemas: Arc<OutputSchemas>,
    read: ReadState,
    next_seq: i64,
    started: Instant,
    run_deadline: Option<Instant>,
    /// When the next result row is due (rows are due every checkpoint interval).
    next_row_due: Option<Instant>,
    cycles: u64,
    stop: Option<Stop>,
    clock: Arc<dyn Clock>,
    /// Batches the committer is done with, reused so a cycle does not allocate its buffers.
    spare: Vec<Batch>,
    /// Set by another thread to end the current cycle at once (see [`Run::interrupter`]).
    interrupt: Arc<AtomicBool>,
    /// The engine's counts as of the last cycle handed to the committer.
    submitted: Counters,
    /// The counts of the cycles committed, as their tables hold them: what the run reports (a
    /// cycle that failed to commit, and is read again by the next run, counts nowhere).
    committed: Counters,
    /// The size of the open windows' checkpoint form, as last handed to the committer.
    state_bytes: u64,
    /// Declared before the lock: dropping the run finishes its commits, then frees the job.
    committer: Committer,
    _lock: JobLock,
}

/// The job as stored, after checking that this run's settings are the checkpoint's.
fn restore(checkpoint: &Checkpoint, cfg: &JobConfig) -> Result<Option<StoredJob>> {
    let existing = checkpoint.load_job(&cfg.job)?;
    if let Some(s) = &existing {
        if let Some((setting, stored, requested)) = s.settings.first_difference(&cfg.settings) {
            return Err(EtlError::SettingsChanged {
                job: cfg.job.clone(),
                setting,
                stored,
                requested,
            });
        }
    }
    Ok(existing)
}

/// Applies the output that a killed run of an older version left in its checkpoint's outbox.
fn replay_pending(
    checkpoint: &Checkpoint,
    job: &str,
    job_created_ms: i64,
    sink: &mut dyn OutputSink,
) -> Result<()> {
    for p in checkpoint.pending(job)? {
        let (schemas, batch) = Batch::decode(&p.batch, &p.source)
            .map_err(|e| EtlError::checkpoint(checkpoint.path(), e))?;
        let tables = p.tables;
        sink.prepare(&tables, &schemas)?;
        sink.apply(&Output {
            job,
            seq: p.seq,
            job_created_ms,
            tables: &tables,
            schemas: &schemas,
            batch: &batch,
            replay: true,
        })?;
        checkpoint.applied(job, p.seq)?;
    }
    Ok(())
}

/// The job as stored, its settings checked, once whatever a killed run left is settled: an older
/// checkpoint's outbox is applied and its state adopted; a state in doubt is kept if its batch
/// is in the sink, else dropped (its cycle is read again).
fn settle_state(
    checkpoint: &Checkpoint,
    cfg: &JobConfig,
    sink: &mut dyn OutputSink,
    now_ms: i64,
) -> Result<Option<StoredJob>> {
    let Some(stored) = restore(checkpoint, cfg)? else {
        return Ok(None);
    };
    if stored.legacy {
        replay_pending(checkpoint, &cfg.job, stored.created_ms, sink)?;
        checkpoint.adopt_legacy(&cfg.job, &stored, &cfg.tables, now_ms)?;
    }
    if let Some(d) = &stored.in_doubt {
        let landed = sink.landed(&d.tables, &cfg.job, stored.created_ms, d.seq)?;
        checkpoint.resolve(&cfg.job, d.seq, landed)?;
    }
    if stored.legacy || stored.in_doubt.is_some() {
        return restore(checkpoint, cfg);
    }
    Ok(Some(stored))
}

/// A new job's partitions as its source opened them.
fn opened_partitions(source: &dyn Source, now_ms: i64) -> Vec<PartitionState> {
    source
        .partitions()
        .iter()
        .enumerate()
        .map(|(i, p)| PartitionState {
            partition: p.partition,
            name: p.name.clone(),
            identity: p.identity.clone(),
            next_offset: p.start_offset,
            max_event_time_ms: None,
            last_delivery_ms: now_ms,
            end_offset: source.end_offset(i),
            status: if p.gone {
                "deleted".into()
            } else {
                String::new()
            },
        })
        .collect()
}

/// The engine, resumed from the stored state for the partitions the source opened.
fn resume_engine(
    cfg: &JobConfig,
    stored: Option<&StoredJob>,
    source: &mut dyn Source,
    now_ms: i64,
    pool: &Arc<Pool>,
) -> Result<Engine> {
    let known = stored.map_or(&[][..], |s| &s.partitions[..]);
    let partitions = source
        .partitions()
        .iter()
        .map(|sp| {
            let st = known.iter().find(|p| p.partition == sp.partition);
            let mut clock = PartitionClock::new(
                st.and_then(|s| s.max_event_time_ms),
                st.map_or(now_ms, |s| s.last_delivery_ms),
            );
            clock.released = st.is_some_and(|s| s.status == "released");
            PartitionProgress {
                partition: sp.partition,
                next_offset: sp.start_offset,
                clock,
            }
        })
        .collect();
    let restored = Restored {
        floor_ms: stored.map_or(NO_WATERMARK, |s| s.watermark_ms),
        partitions,
        open_windows: stored.and_then(|s| s.open_windows.clone()),
    };
    let path = cfg.checkpoint.shown().to_string();
    let engine = Engine::with_pool(&cfg.engine, restored, now_ms, &cfg.source, Arc::clone(pool))
        .map_err(|e| EtlError::checkpoint(&path, e))?;
    Ok(engine)
}

impl Run {
    pub fn start(cfg: Arc<JobConfig>, env: RunEnv) -> Result<Run> {
        let started = Instant::now();
        let RunEnv {
            checkpoint,
            lock,
            mut sink,
            open_source,
            clock,
        } = env;
        let now = clock.wall_ms();
        let schemas = Arc::new(cfg.engine.schemas());
        sink.prepare(&cfg.tables, &schemas)?;
        let stored = settle_state(&checkpoint, &cfg, sink.as_mut(), now)?;
        let job_created_ms = stored.as_ref().map_or(now, |s| s.created_ms);
        let mut source = open_source(stored.as_ref().map_or(&[][..], |s| &s.partitions[..]))?;
        // A new job is only written to the checkpoint once its source has opened, so a run that
        // fails at once (no such topic, unreachable broker) leaves nothing behind.
        if stored.is_none() {
            let parts = opened_partitions(source.as_ref(), now);
            checkpoint.create_job(&cfg.job, &cfg.settings, now, &cfg.tables, &parts)?;
        }
        let pool = Arc::new(Pool::new(cfg.threads));
        let mut engine = resume_engine(&cfg, stored.as_ref(), source.as_mut(), now, &pool)?;
        for g in source.take_gaps() {
            engine.record_gap(g.partition, g.from, &g.message);
        }
        let committer = Committer::start(
            checkpoint,
            sink,
            Target {
                job: cfg.job.clone(),
                base: stored.as_ref().map_or(0, |s| s.seq),
                job_created_ms,
                source: cfg.source.clone(),
                tables: cfg.tables.clone(),
                schemas: Arc::clone(&schemas),
            },
            Arc::clone(&pool),
        );
        Ok(Run {
            next_row_due: None,
            run_deadline: cfg
                .max_runtime_ms
                .map(|ms| started + Duration::from_millis(ms as u64)),
            read: ReadState::new(source.partitions().len()),
            next_seq: stored.as_ref().map_or(1, |s| s.next_seq),
            cfg,
            source,
            engine,
            schemas,
            started,
            cycles: 0,
            stop: None,
            clock,
            spare: Vec::new(),
            interrupt: Arc::new(AtomicBool::new(false)),
            submitted: Counters::default(),
            committed: Counters::default(),
            state_bytes: 0,
            committer,
            _lock: lock,
        })
    }

    pub fn is_done(&self) -> bool {
        self.stop.is_some_and(|s| s != Stop::CycleEnd)
    }

    /// A flag that, once set, ends the cycle in progress early (within a wait of the source,
    /// 50 ms at most), everything read so far handed to the committer as at any cycle's end:
    /// how a background job stops without waiting out its cycle.
    pub fn interrupter(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.interrupt)
    }

    /// Reads one checkpoint cycle and hands it to the committer. Returns false once the run is
    /// over; by then every cycle is durable.
    pub fn cycle(&mut self) -> Result<bool> {
        if self.is_done() {
            return Ok(false);
        }
        crate::fault::panic_point("cycle");
        self.confirm(false)?;
        // One row goes back to DuckDB per checkpoint interval; within it, sub-cycles of at most
        // MAX_CYCLE_MESSAGES go to the committer as they are read.
        let row_due = next_row_due(&mut self.next_row_due, self.cfg.checkpoint_interval_ms);
        let clock = Arc::clone(&self.clock);
        let wall = move || clock.wall_ms();
        let stop = loop {
            let consumed = self.engine.counters().events_consumed;
            let limits = CycleLimits {
                remaining_messages: self
                    .cfg
                    .max_messages
                    .map_or(u64::MAX, |m| m.saturating_sub(consumed)),
                max_cycle_messages: MAX_CYCLE_MESSAGES,
                cycle_deadline: row_due,
                run_deadline: self.run_deadline,
                max_pending_rows: MAX_PENDING_ROWS,
                follow: self.cfg.follow,
                rolling: self.cfg.rolling,
                quiet_flush_ms: self.cfg.quiet_flush_ms,
                interrupt: Some(Arc::clone(&self.interrupt)),
            };
            let read = read_cycle(
                &mut self.engine,
                self.source.as_mut(),
                &mut self.read,
                &limits,
                &wall,
            );
            match read {
                Ok(Stop::CycleEnd) if Instant::now() < row_due && !limits.interrupted() => {
                    self.submit()?;
                    self.confirm(false)?;
                }
                Ok(stop) => break stop,
                Err(e) => {
                    // Keep what was processed before the source failed (a broker that went
                    // away), then fail the statement; the next run resumes right after it.
                    if self.submit().is_ok() {
                        let _ = self.confirm(true);
                    }
                    return Err(e);
                }
            }
        };
        self.stop = Some(stop);
        if stop != Stop::CycleEnd {
            // Idle partitions are judged by the wall clock at the end of the run too.
            self.engine.set_now(self.clock.wall_ms());
            if self.cfg.flush && stop == Stop::CaughtUp {
                self.engine.flush()?;
            }
        }
        self.submit()?;
        self.cycles += 1;
        if self.is_done() {
            // The last row reports a run whose every cycle is durable.
            self.confirm(true)?;
        }
        Ok(!self.is_done())
    }

    /// Hands the state after this cycle, and its output, to the committer.
    fn submit(&mut self) -> Result<()> {
        let mut batch = self
            .spare
            .pop()
            .unwrap_or_else(|| Batch::empty(&self.schemas));
        self.engine.take_output(&mut batch)?;
        let parts = self.source.partitions();
        let partitions: Vec<PartitionState> = self
            .engine
            .progress()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let sp = parts.get(i);
                PartitionState {
                    partition: p.partition,
                    name: sp.map(|s| s.name.clone()).unwrap_or_default(),
                    identity: sp.map(|s| s.identity.clone()).unwrap_or_default(),
                    next_offset: self
                        .source
                        .position(i)
                        .filter(|_| self.read.drained(i))
                        .map_or(p.next_offset, |at| at.max(p.next_offset)),
                    max_event_time_ms: p.clock.max_event_time_ms,
                    last_delivery_ms: p.clock.last_delivery_ms,
                    end_offset: self.source.end_offset(i),
                    status: if sp.is_some_and(|s| s.gone) {
                        "deleted".into()
                    } else if p.clock.released {
                        "released".into()
                    } else {
                        String::new()
                    },
                }
            })
            .collect();
        let mut open_windows = Vec::new();
        self.engine.encode_open_windows(&mut open_windows)?;
        self.state_bytes = open_windows.len() as u64;
        let seq = (!batch.is_empty()).then(|| {
            self.next_seq += 1;
            self.next_seq - 1
        });
        let now = self.engine.counters();
        let counts = minus(now, self.submitted);
        self.submitted = now;
        self.committer.submit(CycleState {
            watermark_ms: self.engine.watermark_ms(),
            open_windows,
            open_window_count: self.engine.open_windows(),
            partitions,
            batch,
            seq,
            now_ms: self.clock.wall_ms(),
            last: self.is_done(),
            counts,
        })
    }

    /// Tells the source about cycles the committer made durable (Kafka commits the offsets
    /// to the consumer group); `wait` waits for all of them.
    fn confirm(&mut self, wait: bool) -> Result<()> {
        let (done, failed) = self.committer.committed(wait);
        for done in done {
            // Counted first: the cycle's rows landed, whatever the source says next.
            self.committed = plus(self.committed, done.counts);
            self.source.checkpointed(&done.offsets)?;
            if self.spare.len() < 2 {
                self.spare.push(done.batch);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Waits until every cycle handed to the committer is committed (or failed): the counts of
    /// [`Run::stats`] are then the run's last.
    pub fn finish(&mut self) -> Result<()> {
        self.confirm(true)
    }

    /// The threads the run's parsing and windows use.
    pub fn threads(&self) -> usize {
        self.cfg.threads
    }

    /// How far the run is behind its source: the sum over its partitions of what the source
    /// knows past the run's position (Kafka: messages below the high watermark; files: bytes
    /// not yet read); None when the source knows no end.
    pub fn lag(&self) -> Option<i64> {
        let mut lag = None;
        for (i, p) in self.engine.progress().iter().enumerate() {
            if let Some(end) = self.source.end_offset(i) {
                let at = self
                    .source
                    .position(i)
                    .map_or(p.next_offset, |at| at.max(p.next_offset));
                *lag.get_or_insert(0) += (end - at).max(0);
            }
        }
        lag
    }

    /// A fault the run is riding out (its source's brokers out of reach), for reports.
    pub fn unreachable(&self) -> Option<String> {
        self.source.unreachable()
    }

    /// The run's row: the counts of what it committed.
    pub fn stats(&self) -> RunStats {
        let mut s = RunStats::new(
            &self.cfg.job,
            self.committed,
            self.engine.watermark_ms(),
            self.started,
            (self.engine.open_windows(), self.source.partitions().len()),
            self.cycles,
            self.stop,
        );
        s.state_bytes = self.state_bytes;
        s
    }
}
