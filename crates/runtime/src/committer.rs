//! The committer: makes checkpoint cycles durable as long jobs of the run's pool while the run
//! reads the next cycle, so reading and writing overlap (a helper thread commits while the
//! others read). With one thread, a cycle commits where it is handed over. Cycles are committed
//! in order; after a failure nothing later is committed, and the run fails at its next cycle
//! boundary.
//!
//! A cycle commits its state to the checkpoint, then its rows and their batch marker in one
//! DuckDB transaction (see `checkpoint` for why that order loses and doubles nothing).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use streaming_etl_core::{
    Actor, Batch, Counters, EtlError, OutputSchemas, PartitionState, Pool, Result,
};

use crate::checkpoint::{Checkpoint, CycleCommit};
use crate::sink::{Output, OutputSink, Tables, Written};

/// Everything one cycle commits: the state after it and its output.
pub struct CycleState {
    pub watermark_ms: i64,
    pub open_windows: Vec<u8>,
    pub open_window_count: usize,
    pub partitions: Vec<PartitionState>,
    pub batch: Batch,
    /// The batch's number, when the batch is not empty.
    pub seq: Option<i64>,
    pub now_ms: i64,
    /// The run's last cycle: nothing is left in doubt after it.
    pub last: bool,
    /// What the engine counted in the cycle (the sink may count its tables' part itself).
    pub counts: Counters,
}

/// Where output goes and under which job.
pub struct Target {
    pub job: String,
    /// The batch of the job's last state known to be in DuckDB.
    pub base: i64,
    pub job_created_ms: i64,
    /// The job's source as given.
    pub source: String,
    pub tables: Tables,
    pub schemas: Arc<OutputSchemas>,
}

/// A cycle made durable: its partitions' next offsets, its (emptied) batch back for reuse, and
/// what it counted as its tables hold it.
pub struct Committed {
    pub offsets: Vec<(i32, i64)>,
    pub batch: Batch,
    pub counts: Counters,
}

/// Cycles committed (or failed), in order, not yet taken by the run.
type Done = Arc<Mutex<VecDeque<Result<Committed>>>>;

/// What commits: the checkpoint and the sink, and where the job stands.
struct Writer {
    checkpoint: Checkpoint,
    sink: Box<dyn OutputSink>,
    target: Target,
    failed: bool,
    /// A batch landed since the checkpoint last dropped the states before it.
    unsettled: bool,
    done: Done,
}

impl Writer {
    /// Commits one cycle (the actor's function).
    fn apply(w: &mut Writer, mut state: CycleState) {
        let result = if w.failed {
            Err(EtlError::Internal(
                "an earlier cycle failed to commit".into(),
            ))
        } else {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                commit(&w.checkpoint, w.sink.as_mut(), &mut w.target, &state)
            }))
            .unwrap_or_else(|p| {
                Err(EtlError::Internal(format!(
                    "commit panicked: {}",
                    panic_message(p)
                )))
            })
        };
        w.failed |= result.is_err();
        w.unsettled = state.seq.is_some() && !state.last;
        let offsets = state
            .partitions
            .iter()
            .map(|p| (p.partition, p.next_offset))
            .collect();
        state.batch.clear();
        let batch = state.batch;
        let counts = state.counts;
        w.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(result.map(|written| Committed {
                offsets,
                batch,
                counts: written.over(counts),
            }));
    }
}

pub struct Committer {
    writer: Actor<Writer, CycleState>,
    pool: Arc<Pool>,
    done: Done,
    /// Cycles handed over and not yet taken back.
    in_flight: usize,
}

impl Committer {
    pub fn start(
        checkpoint: Checkpoint,
        sink: Box<dyn OutputSink>,
        target: Target,
        pool: Arc<Pool>,
    ) -> Committer {
        let done = Done::default();
        let writer = Writer {
            checkpoint,
            sink,
            target,
            failed: false,
            unsettled: false,
            done: Arc::clone(&done),
        };
        Committer {
            writer: Actor::new(writer, Writer::apply),
            pool,
            done,
            in_flight: 0,
        }
    }

    fn finished(&self) -> usize {
        self.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Hands a cycle over. One cycle waits while another is written (memory stays at two
    /// cycles' output): past that, the run helps the pool until the older one is through.
    pub fn submit(&mut self, state: CycleState) -> Result<()> {
        let pool = Arc::clone(&self.pool);
        pool.help_until(|| self.in_flight - self.finished() < 2)?;
        self.writer.send(&self.pool, state, true);
        self.in_flight += 1;
        Ok(())
    }

    /// The cycles committed since the last call, in order, and the first failure after them, if
    /// any (the cycles committed before a failure are still the run's: their rows landed).
    pub fn committed(&mut self, wait_for_all: bool) -> (Vec<Committed>, Option<EtlError>) {
        if wait_for_all {
            let pool = Arc::clone(&self.pool);
            if let Err(e) = pool.help_until(|| self.finished() == self.in_flight) {
                return (Vec::new(), Some(e));
            }
        }
        let mut out = Vec::new();
        let finished: Vec<_> = self
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        let mut failed = None;
        for next in finished {
            self.in_flight -= 1;
            match next {
                Ok(c) if failed.is_none() => out.push(c),
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        (out, failed)
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // A run that is interrupted still writes every cycle it handed over, and leaves no
        // state in doubt.
        let writer = &self.writer;
        if self.pool.help_until(|| writer.idle()).is_ok() {
            let w = writer.state();
            if w.unsettled && !w.failed {
                let _ = w.checkpoint.settle(&w.target.job, w.target.base);
            }
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

/// The state to the checkpoint, then the rows and their marker to the sink (one transaction
/// each); once the sink's commit is through, the new state is the job's base.
fn commit(
    checkpoint: &Checkpoint,
    sink: &mut dyn OutputSink,
    target: &mut Target,
    state: &CycleState,
) -> Result<Written> {
    crate::fault::panic_point("commit");
    state.batch.check().map_err(EtlError::Internal)?;
    checkpoint.commit_state(
        &target.job,
        &CycleCommit {
            base: target.base,
            seq: state.seq.unwrap_or(target.base),
            tables: &target.tables,
            watermark_ms: state.watermark_ms,
            open_windows: &state.open_windows,
            open_window_count: state.open_window_count,
            partitions: &state.partitions,
            now_ms: state.now_ms,
        },
    )?;
    let mut written = Written::default();
    if let Some(seq) = state.seq {
        written = sink.apply(&Output {
            job: &target.job,
            seq,
            job_created_ms: target.job_created_ms,
            tables: &target.tables,
            schemas: &target.schemas,
            batch: &state.batch,
            replay: false,
        })?;
        crate::fault::crash_point("after-sink-commit");
        target.base = seq;
        if state.last {
            checkpoint.settle(&target.job, seq)?;
        }
    }
    Ok(written)
}
