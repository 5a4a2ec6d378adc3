//! A background job's thread: the runs of one job, one after the other, each driven cycle by
//! cycle exactly as a foreground call drives it (`Run::cycle`, the one run loop), then dropped
//! at a cycle boundary, which commits what it read and frees its lock and connection. Between
//! runs it waits for its schedule, or, after a transient fault, for its backoff; every new run
//! resumes from the checkpoint, so retries keep exactly-once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::committer::panic_message;
use streaming_etl_runtime::job::RunStats;

use super::job::{now_ms, Job, StopReason};
use super::schedule::{next_start_ms, Backoff};
use super::wal::WalWatch;

/// A run as a background job drives it.
pub trait Runnable: Send {
    /// One checkpoint cycle; false once the run is over.
    fn cycle(&mut self) -> Result<bool>;
    fn stats(&self) -> RunStats;
    /// How far behind its source the run is (messages or bytes), where the source knows.
    fn lag(&self) -> Option<i64>;
    /// A fault the run rides out without failing (its brokers out of reach): the job shows
    /// `retrying` with it while it lasts.
    fn unreachable(&mut self) -> Option<String>;
    /// The threads its parsing and windows use.
    fn threads(&self) -> usize;
    /// A flag that ends the run's cycle early once set (None: the cycle runs its course).
    fn interrupter(&self) -> Option<Arc<AtomicBool>>;
    /// Waits for the cycles still being committed, so that `stats` counts all of them.
    fn finish(&mut self) -> Result<()>;
}

/// Starts the job's next run (from its checkpoint).
pub type Starter = Box<dyn FnMut() -> Result<Box<dyn Runnable>> + Send>;

/// Whether a fault may go away by itself (a broker, catalog or registry down, a full disk,
/// another run holding the job), so the job retries; anything else (bad settings, a changed
/// job, a bug) fails it.
pub fn is_transient(e: &EtlError) -> bool {
    matches!(
        e,
        EtlError::Source { .. }
            | EtlError::Sink { .. }
            | EtlError::Duck(_)
            | EtlError::Checkpoint { .. }
            | EtlError::JobBusy { .. }
    )
}

/// Runs `f`, a panic becoming an internal error (the job fails; the process goes on).
fn contained<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(EtlError::Internal(format!(
            "a bug; please report it: {}",
            panic_message(p)
        )))
    })
}

/// Drops a run (finishing its commits), a panic while doing so being an internal error.
fn finish_run(run: Box<dyn Runnable>) -> Result<()> {
    contained(move || {
        drop(run);
        Ok(())
    })
}

/// How a run ended.
enum RunEnd {
    /// On its own: caught up, or a limit.
    Done(&'static str),
    /// Asked to stop.
    Stopped,
    Fault(EtlError),
}

/// Drives one run until it ends, is stopped or fails.
fn drive(job: &Job, run: &mut dyn Runnable, wal: Option<&WalWatch>) -> RunEnd {
    loop {
        if job.stopping().is_some() {
            return RunEnd::Stopped;
        }
        match contained(|| run.cycle()) {
            Ok(more) => {
                let wal = wal.map(WalWatch::observe).unwrap_or_default();
                job.cycled(&run.stats(), run.lag(), run.unreachable(), wal);
                if !more {
                    return RunEnd::Done(run.stats().status);
                }
            }
            Err(e) => return RunEnd::Fault(e),
        }
    }
}

/// The thread of a job: `first` is its first run, started by the statement that started the
/// job (or the fault that kept it from starting); `anchor_ms` is when its schedule began.
pub(super) fn work(
    job: Arc<Job>,
    starter: Starter,
    first: std::result::Result<Box<dyn Runnable>, EtlError>,
    anchor_ms: i64,
    wal: Option<Arc<WalWatch>>,
) {
    // Whatever happens in the loop, the job ends with a state and wakes whoever waits for it.
    let wal = wal.as_deref();
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| {
        runs(&job, starter, first, anchor_ms, wal)
    })) {
        let e = EtlError::Internal(format!("a bug; please report it: {}", panic_message(p)));
        job.faulted(&e, None);
    }
    job.finish();
}

/// The job's runs, one after the other, until it stops, fails or its one run ends.
fn runs(
    job: &Job,
    mut starter: Starter,
    first: std::result::Result<Box<dyn Runnable>, EtlError>,
    anchor_ms: i64,
    wal: Option<&WalWatch>,
) {
    let mut backoff = Backoff::default();
    let mut next = Some(first);
    loop {
        let started = match next.take() {
            Some(r) => r,
            None if job.stopping().is_some() => break,
            None => contained(&mut starter),
        };
        let mut run = match started {
            Ok(r) => r,
            Err(e) => {
                if fault(job, e, &mut backoff) {
                    continue;
                }
                break;
            }
        };
        job.run_started(run.interrupter(), run.threads());
        let mut end = drive(job, run.as_mut(), wal);
        // The cycles still being committed count in the run's last row (a failed one does not).
        if let Err(e) = contained(|| run.finish()) {
            if !matches!(end, RunEnd::Fault(_)) {
                end = RunEnd::Fault(e);
            }
        }
        let last = run.stats();
        let dropped = finish_run(run);
        let status = match &end {
            RunEnd::Done(s) => Some(*s),
            RunEnd::Stopped => Some("stopped"),
            RunEnd::Fault(_) => None,
        };
        job.run_ended(Some(last), status);
        let end = match (end, dropped) {
            (RunEnd::Fault(e), _) | (_, Err(e)) => RunEnd::Fault(e),
            (end, Ok(())) => end,
        };
        match end {
            RunEnd::Stopped => break,
            RunEnd::Fault(e) => {
                if !fault(job, e, &mut backoff) {
                    break;
                }
            }
            RunEnd::Done(_) => {
                backoff.reset();
                let Some(every) = job.every_ms else { break };
                crate::host::os::release_free_memory();
                let at = next_start_ms(anchor_ms, every, now_ms());
                job.waiting(at);
                if job.wait_until(at) {
                    break;
                }
            }
        }
    }
}

/// A fault: a transient one is shown as `retrying` until the backoff has passed (true: try
/// again), a permanent one as `failed` (false). A stop asked for meanwhile ends the wait.
fn fault(job: &Job, e: EtlError, backoff: &mut Backoff) -> bool {
    if matches!(e, EtlError::Detached) {
        // The database is closing: the job stops as its close asks (and is resumed later).
        job.ask_stop(StopReason::Closing);
        return false;
    }
    if !is_transient(&e) {
        job.faulted(&e, None);
        return false;
    }
    let at = now_ms() + backoff.next_ms();
    job.faulted(&e, Some(at));
    !job.wait_until(at)
}
