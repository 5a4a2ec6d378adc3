//! The committer: makes checkpoint cycles durable on a thread of its own while the run reads
//! the next cycle, so reading and writing overlap (on two cores, the DuckDB and SQLite writes
//! of one cycle cost about as much as reading it). Cycles are committed in order; after a
//! failure nothing later is committed, and the run fails at its next cycle boundary.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use streaming_etl_core::{Batch, EtlError, OutputSchemas, PartitionState, Result};

use crate::checkpoint::{Checkpoint, CycleCommit, Pending};
use crate::sink::{Output, OutputSink, Tables};

/// Everything one cycle commits: the state after it and its output.
pub struct CycleState {
    pub watermark_ms: i64,
    pub open_windows: Vec<u8>,
    pub open_window_count: usize,
    pub partitions: Vec<PartitionState>,
    pub batch: Batch,
    /// Outbox sequence number, when the batch is not empty.
    pub seq: Option<i64>,
    pub now_ms: i64,
}

/// Where output goes and under which job.
pub struct Target {
    pub job: String,
    pub job_created_ms: i64,
    /// The job's source as given.
    pub source: String,
    pub tables: Tables,
    pub schemas: Arc<OutputSchemas>,
}

/// A cycle made durable: its partitions' next offsets, and its (emptied) batch back for reuse.
pub struct Committed {
    pub offsets: Vec<(i32, i64)>,
    pub batch: Batch,
}

pub struct Committer {
    jobs: Option<SyncSender<CycleState>>,
    done: Receiver<Result<Committed>>,
    thread: Option<JoinHandle<()>>,
    in_flight: usize,
}

impl Committer {
    pub fn start(
        checkpoint: Checkpoint,
        mut sink: Box<dyn OutputSink>,
        target: Target,
    ) -> Result<Committer> {
        // One cycle queued while another is written: memory stays at two cycles' output.
        let (jobs, inbox) = sync_channel::<CycleState>(1);
        let (report, done) = sync_channel::<Result<Committed>>(64);
        let thread = std::thread::Builder::new()
            .name("streaming_etl-commit".into())
            .spawn(move || {
                let mut failed = false;
                for mut state in inbox {
                    if failed {
                        continue;
                    }
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        commit(&checkpoint, sink.as_mut(), &target, &state)
                    }))
                    .unwrap_or_else(|p| {
                        Err(EtlError::Internal(format!(
                            "commit thread panicked: {}",
                            panic_message(p)
                        )))
                    });
                    failed = result.is_err();
                    let offsets = state
                        .partitions
                        .iter()
                        .map(|p| (p.partition, p.next_offset))
                        .collect();
                    state.batch.clear();
                    let batch = state.batch;
                    if report
                        .send(result.map(|()| Committed { offsets, batch }))
                        .is_err()
                    {
                        return;
                    }
                }
            })
            .map_err(|e| EtlError::Internal(format!("cannot start the commit thread: {e}")))?;
        Ok(Committer {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            in_flight: 0,
        })
    }

    /// Hands a cycle over (waits while the previous one is still queued).
    pub fn submit(&mut self, state: CycleState) -> Result<()> {
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| EtlError::Internal("committer closed".into()))?;
        jobs.send(state)
            .map_err(|_| EtlError::Internal("the commit thread stopped".into()))?;
        self.in_flight += 1;
        Ok(())
    }

    /// The cycles committed since the last call; the first failure, if any.
    pub fn committed(&mut self, wait_for_all: bool) -> Result<Vec<Committed>> {
        let mut out = Vec::new();
        while self.in_flight > 0 {
            let next = if wait_for_all {
                self.done
                    .recv()
                    .map_err(|_| EtlError::Internal("the commit thread stopped".into()))?
            } else {
                match self.done.try_recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            self.in_flight -= 1;
            out.push(next?);
        }
        Ok(out)
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish what it has, then it exits: a run that is
        // interrupted still writes every cycle it handed over.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Turns a panic payload into text for an error message.
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "unknown panic".to_string(),
        },
    }
}

/// State and output to SQLite in one transaction, output to the sink in one transaction, then
/// the output is marked applied.
fn commit(
    checkpoint: &Checkpoint,
    sink: &mut dyn OutputSink,
    target: &Target,
    state: &CycleState,
) -> Result<()> {
    crate::fault::panic_point("commit");
    state.batch.check().map_err(EtlError::Internal)?;
    let pending = match state.seq {
        Some(seq) => {
            let mut encoded = Vec::with_capacity(state.batch.windows.byte_len() + 4096);
            state.batch.encode(&target.schemas, &mut encoded);
            Some(Pending {
                seq,
                tables: target.tables.clone(),
                source: target.source.clone(),
                batch: encoded,
            })
        }
        None => None,
    };
    checkpoint.commit_cycle(
        &target.job,
        &CycleCommit {
            watermark_ms: state.watermark_ms,
            open_windows: &state.open_windows,
            open_window_count: state.open_window_count,
            partitions: &state.partitions,
            output: pending.as_ref(),
            now_ms: state.now_ms,
        },
    )?;
    if let Some(p) = pending {
        sink.apply(&Output {
            job: &target.job,
            seq: p.seq,
            job_created_ms: target.job_created_ms,
            tables: &target.tables,
            schemas: &target.schemas,
            batch: &state.batch,
            replay: false,
        })?;
        crate::fault::crash_point("after-sink-commit");
        checkpoint.applied(&target.job, p.seq)?;
    }
    Ok(())
}
