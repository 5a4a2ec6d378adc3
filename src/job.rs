//! One run of a job: take the job's lock, restore its state from the checkpoint, finish any
//! output a killed run left in the outbox, then read in cycles, each handed to the committer
//! (which makes it durable while the next is read), until the source is caught up or a limit is
//! reached.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::checkpoint::{lock_job, Checkpoint, JobLock, Pending, StoredJob};
use crate::committer::{Committer, CycleState, Target};
use crate::decode::Decoder;
use crate::error::{EtlError, Result};
use crate::host::Host;
use crate::params::{RunConfig, SourceSpec, TableName, Tables};
use crate::pipeline::{
    read_cycle, reported_watermark, CycleLimits, Engine, PartitionProgress, Restored, Stop,
    TimeSpec,
};
use crate::sink;
use crate::source::file::FileSource;
use crate::source::kafka::KafkaSource;
use crate::source::Source;
use crate::state::{decode_windows, encode_windows, Batch, JobSettings, PartitionState};
use crate::watermark::PartitionClock;

/// Late and dead rows a cycle may gather before it checkpoints early (bounds memory).
const MAX_PENDING_ROWS: usize = 500_000;
/// Messages after which a cycle ends even before its interval: shorter cycles let the
/// committer write one while the next is read.
const MAX_CYCLE_MESSAGES: u64 = 200_000;

pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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
    pub partitions: u64,
    pub cycles: u64,
    /// `running` until the last row; then why the run stopped.
    pub status: &'static str,
}

pub struct Run {
    cfg: Arc<RunConfig>,
    source: Box<dyn Source>,
    engine: Engine,
    exhausted: Vec<bool>,
    names: Vec<String>,
    next_seq: i64,
    started: Instant,
    run_deadline: Option<Instant>,
    cycles: u64,
    stop: Option<Stop>,
    /// Declared before the lock: dropping the run finishes its commits, then frees the job.
    committer: Committer,
    _lock: JobLock,
}

fn settings_mismatch(job: &str, stored: &JobSettings, wanted: &JobSettings) -> Option<EtlError> {
    let diff = |setting: &'static str, a: String, b: String| {
        (a != b).then(|| EtlError::SettingsChanged {
            job: job.to_string(),
            setting,
            stored: a,
            requested: b,
        })
    };
    diff(
        "topic",
        format!("'{}'", stored.source),
        format!("'{}'", wanted.source),
    )
    .or_else(|| {
        diff(
            "window_ms",
            stored.window_ms.to_string(),
            wanted.window_ms.to_string(),
        )
    })
    .or_else(|| {
        diff(
            "lateness_ms",
            stored.lateness_ms.to_string(),
            wanted.lateness_ms.to_string(),
        )
    })
    .or_else(|| {
        diff(
            "key_field",
            format!("'{}'", stored.key_field),
            format!("'{}'", wanted.key_field),
        )
    })
    .or_else(|| {
        diff(
            "time_field",
            format!("'{}'", stored.time_field),
            format!("'{}'", wanted.time_field),
        )
    })
    .or_else(|| {
        diff(
            "value_field",
            format!("'{}'", stored.value_field),
            format!("'{}'", wanted.value_field),
        )
    })
}

fn tables_of(p: &Pending) -> Result<Tables> {
    let parse = |t: &str| {
        TableName::parse(t).ok_or_else(|| {
            EtlError::Internal(format!(
                "unreadable table name '{t}' in the checkpoint outbox"
            ))
        })
    };
    Ok(Tables {
        windows: parse(&p.windows_table)?,
        late: parse(&p.late_table)?,
        dead: parse(&p.dead_letter_table)?,
    })
}

impl Run {
    pub fn start(cfg: Arc<RunConfig>, host: &Arc<Host>) -> Result<Run> {
        let started = Instant::now();
        let lock = lock_job(&cfg.checkpoint, &cfg.job, host)?;
        let checkpoint = Checkpoint::open(&cfg.checkpoint, host)?;
        let conn = host.checkout()?;
        let now = wall_ms();
        let wanted = cfg.settings();
        let existing = checkpoint.load_job(&cfg.job)?;
        if let Some(s) = &existing {
            if let Some(e) = settings_mismatch(&cfg.job, &s.settings, &wanted) {
                return Err(e);
            }
        }
        let is_new = existing.is_none();
        // A new job is only written to the checkpoint once its source has opened, so a run that
        // fails at once (no such topic, unreachable broker) leaves nothing behind.
        let stored = existing.unwrap_or(StoredJob {
            settings: wanted.clone(),
            watermark_ms: crate::watermark::NO_WATERMARK,
            open_windows: None,
            next_seq: 1,
            partitions: Vec::new(),
        });

        sink::ensure_tables(conn.conn()?, &cfg.tables)?;
        // Output a killed run committed to the checkpoint but may not have written to DuckDB.
        for p in checkpoint.pending(&cfg.job)? {
            let batch =
                Batch::decode(&p.batch).map_err(|e| EtlError::checkpoint(checkpoint.path(), e))?;
            let tables = tables_of(&p)?;
            sink::ensure_tables(conn.conn()?, &tables)?;
            sink::apply(conn.conn()?, &tables, &p.topic, &batch)?;
            checkpoint.applied(&cfg.job, p.seq)?;
        }

        let known: Vec<(i32, String)> = stored
            .partitions
            .iter()
            .map(|p| (p.partition, p.name.clone()))
            .collect();
        let offsets: HashMap<i32, i64> = stored
            .partitions
            .iter()
            .map(|p| (p.partition, p.next_offset))
            .collect();
        let only = cfg.partitions.as_deref();
        let source: Box<dyn Source> = match &cfg.source {
            SourceSpec::Files { pattern } => Box::new(FileSource::open(
                &cfg.topic, pattern, &known, &offsets, only,
            )?),
            SourceSpec::Kafka { topic } => Box::new(KafkaSource::open(
                &cfg.topic, topic, &cfg.kafka, &offsets, only,
            )?),
        };

        if is_new {
            checkpoint.create_job(&cfg.job, &wanted, now)?;
        }

        let by_partition: HashMap<i32, &PartitionState> =
            stored.partitions.iter().map(|p| (p.partition, p)).collect();
        let progress: Vec<PartitionProgress> = source
            .partitions()
            .iter()
            .map(|sp| {
                let st = by_partition.get(&sp.partition);
                PartitionProgress {
                    partition: sp.partition,
                    next_offset: sp.start_offset,
                    clock: PartitionClock::new(
                        st.and_then(|s| s.max_event_time_ms),
                        st.map_or(now, |s| s.last_delivery_ms),
                    ),
                }
            })
            .collect();
        let names = source.partitions().iter().map(|p| p.name.clone()).collect();
        let open_windows = match &stored.open_windows {
            Some(b) => decode_windows(b).map_err(|e| EtlError::checkpoint(checkpoint.path(), e))?,
            None => Vec::new(),
        };
        let decoder = Decoder::new(
            cfg.key_field.clone(),
            cfg.time_field.clone(),
            cfg.value_field.clone(),
        );
        let exhausted = vec![false; progress.len()];
        let spec = TimeSpec {
            window_ms: cfg.window_ms,
            lateness_ms: cfg.lateness_ms,
            idle_timeout_ms: cfg.idle_timeout_ms,
        };
        let restored = Restored {
            floor_ms: stored.watermark_ms,
            partitions: progress,
            open_windows,
        };
        let mut engine = Engine::new(spec, decoder, restored, now);
        for gap in source.gaps() {
            engine.record_gap(gap.idx, gap.from, gap.to);
        }
        let committer = Committer::start(
            checkpoint,
            conn,
            Target {
                job: cfg.job.clone(),
                topic: cfg.topic.clone(),
                tables: cfg.tables.clone(),
            },
        )?;
        Ok(Run {
            run_deadline: cfg
                .max_runtime_ms
                .map(|ms| started + Duration::from_millis(ms as u64)),
            cfg,
            source,
            engine,
            exhausted,
            names,
            next_seq: stored.next_seq,
            started,
            cycles: 0,
            stop: None,
            committer,
            _lock: lock,
        })
    }

    pub fn is_done(&self) -> bool {
        self.stop.is_some_and(|s| s != Stop::CycleEnd)
    }

    /// Reads one checkpoint cycle and hands it to the committer. Returns false once the run is
    /// over; by then every cycle is durable.
    pub fn cycle(&mut self) -> Result<bool> {
        if self.is_done() {
            return Ok(false);
        }
        crate::testing::panic_point("cycle");
        self.confirm(false)?;
        // One row goes back to DuckDB per checkpoint interval; within it, sub-cycles of at most
        // MAX_CYCLE_MESSAGES go to the committer as they are read.
        let row_due =
            Instant::now() + Duration::from_millis(self.cfg.checkpoint_interval_ms as u64);
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
            };
            let read = read_cycle(
                &mut self.engine,
                self.source.as_mut(),
                &mut self.exhausted,
                &limits,
                &wall_ms,
            );
            match read {
                Ok(Stop::CycleEnd) if Instant::now() < row_due => {
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
            self.engine.set_now(wall_ms());
            if self.cfg.flush && stop == Stop::CaughtUp {
                self.engine.flush();
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
        let mut batch = Batch::default();
        self.engine.take_output(&mut batch);
        let partitions: Vec<PartitionState> = self
            .engine
            .progress()
            .iter()
            .enumerate()
            .map(|(i, p)| PartitionState {
                partition: p.partition,
                name: self.names[i].clone(),
                next_offset: p.next_offset,
                max_event_time_ms: p.clock.max_event_time_ms,
                last_delivery_ms: p.clock.last_delivery_ms,
                end_offset: self.source.end_offset(i),
            })
            .collect();
        let mut open_windows = Vec::new();
        encode_windows(
            self.engine.windows().iter(),
            self.engine.open_windows(),
            &mut open_windows,
        );
        let seq = (!batch.is_empty()).then(|| {
            self.next_seq += 1;
            self.next_seq - 1
        });
        self.committer.submit(CycleState {
            watermark_ms: self.engine.watermark_ms(),
            open_windows,
            open_window_count: self.engine.open_windows(),
            partitions,
            batch,
            seq,
            now_ms: wall_ms(),
        })
    }

    /// Tells the source about cycles the committer made durable (Kafka commits the offsets
    /// to the consumer group); `wait` waits for all of them.
    fn confirm(&mut self, wait: bool) -> Result<()> {
        for offsets in self.committer.committed(wait)? {
            self.source.checkpointed(&offsets)?;
        }
        Ok(())
    }

    pub fn stats(&self) -> RunStats {
        let c = self.engine.counters();
        let elapsed = self.started.elapsed();
        RunStats {
            job: self.cfg.job.clone(),
            events_consumed: c.events_consumed,
            windows_emitted: c.windows_emitted,
            late_events: c.late_events,
            dead_letters: c.dead_letters,
            watermark_ms: reported_watermark(self.engine.watermark_ms()),
            elapsed_ms: elapsed.as_millis() as i64,
            events_per_sec: if elapsed.as_secs_f64() > 0.0 {
                c.events_consumed as f64 / elapsed.as_secs_f64()
            } else {
                0.0
            },
            open_windows: self.engine.open_windows() as u64,
            partitions: self.names.len() as u64,
            cycles: self.cycles,
            status: match self.stop {
                None | Some(Stop::CycleEnd) => "running",
                Some(Stop::CaughtUp) => "caught_up",
                Some(Stop::MaxMessages) => "max_messages",
                Some(Stop::MaxRuntime) => "max_runtime",
            },
        }
    }
}
