//! One background job: what its thread reports (its state, counts, rate, last error: a row of
//! `streaming_etl_jobs()`), what it is asked (to stop, and why), and its record in the checkpoint,
//! kept while it is to be resumed after a restart.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use streaming_etl_core::EtlError;
use streaming_etl_runtime::checkpoint::Checkpoint;
use streaming_etl_runtime::job::RunStats;

use super::wal::WalState;

/// How far back `events_per_sec` looks.
const RATE_WINDOW: Duration = Duration::from_secs(60);

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a background job is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// A run is in progress.
    Running,
    /// Between two scheduled runs.
    Waiting,
    /// A transient fault (broker, catalog, registry down; disk full): trying again after a wait.
    Retrying,
    /// A permanent fault (bad settings, a changed job): it will not run again by itself.
    Failed,
    /// Stopped by its user, its database closing, or its one run ending.
    Stopped,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Waiting => "waiting",
            State::Retrying => "retrying",
            State::Failed => "failed",
            State::Stopped => "stopped",
        }
    }
}

/// Why a job is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `streaming_etl_stop`: it is not resumed after a restart.
    User,
    /// The database closing or the process exiting: it is resumed after a restart.
    Closing,
}

/// A job as `streaming_etl_jobs()` shows it.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub job: String,
    /// The call, its secrets hidden.
    pub call: String,
    pub state: State,
    pub started_ms: i64,
    pub last_cycle_ms: Option<i64>,
    pub runs: u64,
    /// The threads of its current (or last) run: its share of DuckDB's `threads`.
    pub threads: u64,
    pub cycles: u64,
    pub events: u64,
    pub events_per_sec: f64,
    pub lag: Option<i64>,
    pub windows_emitted: u64,
    pub late_events: u64,
    pub dead_letters: u64,
    pub watermark_ms: Option<i64>,
    /// How the last run ended (`caught_up`, `max_messages`, `max_runtime`, `stopped`).
    pub last_status: Option<&'static str>,
    pub last_error: Option<String>,
    /// Attempts since the last cycle that succeeded.
    pub retries: u64,
    pub next_run_ms: Option<i64>,
    /// Open windows, and the bytes of their state in its checkpoint form (its last cycle's).
    pub open_windows: u64,
    pub state_bytes: u64,
    /// The database's WAL as the last cycle saw it, and a warning while DuckDB's checkpoint is
    /// held back (see `WalWatch`).
    pub wal_bytes: Option<i64>,
    pub warning: Option<String>,
}

/// What a job's thread reports, and what it is asked.
pub(super) struct Inner {
    pub(super) row: JobRow,
    /// Counts of the runs that ended (the current run's are added to them).
    done: RunStats,
    /// (when, events so far) at the end of recent cycles.
    samples: VecDeque<(Instant, u64)>,
    stop: Option<StopReason>,
    /// The thread has ended.
    pub(super) finished: bool,
}

/// One background job.
pub struct Job {
    pub(super) name: String,
    /// The checkpoint file it is recorded in (None: an in-memory database's job, not resumed).
    record: Option<String>,
    pub(super) every_ms: Option<i64>,
    inner: Mutex<Inner>,
    changed: Condvar,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    /// Ends the current run's cycle early when the job is asked to stop.
    interrupt: Mutex<Option<Arc<AtomicBool>>>,
}

fn zero_stats(job: &str) -> RunStats {
    RunStats {
        job: job.to_string(),
        events_consumed: 0,
        windows_emitted: 0,
        late_events: 0,
        dead_letters: 0,
        watermark_ms: None,
        elapsed_ms: 0,
        events_per_sec: 0.0,
        open_windows: 0,
        state_bytes: 0,
        partitions: 0,
        cycles: 0,
        status: "running",
    }
}

impl Job {
    pub(super) fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Its row as of now.
    pub fn row(&self) -> JobRow {
        let inner = self.inner();
        let mut row = inner.row.clone();
        row.events_per_sec = rate(&inner.samples, row.events, Instant::now());
        row
    }

    /// The stop asked for, if any.
    pub(super) fn stopping(&self) -> Option<StopReason> {
        self.inner().stop
    }

    /// Waits until `deadline_ms` (wall clock) or a stop; returns whether it was asked to stop.
    pub(super) fn wait_until(&self, deadline_ms: i64) -> bool {
        let mut inner = self.inner();
        loop {
            if inner.stop.is_some() {
                return true;
            }
            let left = deadline_ms - now_ms();
            if left <= 0 {
                return false;
            }
            inner = self
                .changed
                .wait_timeout(inner, Duration::from_millis(left as u64))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A run started (`interrupt` ends its cycles early) on `threads` threads.
    pub(super) fn run_started(&self, interrupt: Option<Arc<AtomicBool>>, threads: usize) {
        // Kept before stopping() is read, as ask_stop sets the stop before it reads this: a stop
        // asked meanwhile is seen by one of the two.
        *lock(&self.interrupt) = interrupt.clone();
        if let (Some(i), true) = (&interrupt, self.stopping().is_some()) {
            i.store(true, Ordering::Relaxed);
        }
        let mut inner = self.inner();
        inner.row.state = State::Running;
        inner.row.runs += 1;
        inner.row.threads = threads as u64;
        inner.row.next_run_ms = None;
    }

    /// A cycle of the current run ended with these totals.
    pub(super) fn cycled(
        &self,
        stats: &RunStats,
        lag: Option<i64>,
        unreachable: Option<String>,
        wal: WalState,
    ) {
        let now = Instant::now();
        let mut inner = self.inner();
        let d = &inner.done;
        let events = d.events_consumed + stats.events_consumed;
        let (windows, late, dead, cycles) = (
            d.windows_emitted + stats.windows_emitted,
            d.late_events + stats.late_events,
            d.dead_letters + stats.dead_letters,
            d.cycles + stats.cycles,
        );
        let row = &mut inner.row;
        row.last_cycle_ms = Some(now_ms());
        row.events = events;
        row.windows_emitted = windows;
        row.late_events = late;
        row.dead_letters = dead;
        row.cycles = cycles;
        row.lag = lag;
        row.watermark_ms = stats.watermark_ms.or(row.watermark_ms);
        row.open_windows = stats.open_windows;
        row.state_bytes = stats.state_bytes;
        row.wal_bytes = wal.bytes.or(row.wal_bytes);
        row.warning = wal.warning;
        match unreachable {
            // The run waits for its brokers (the client reconnects with its own backoff).
            Some(e) => {
                if row.state != State::Retrying {
                    row.retries += 1;
                }
                row.state = State::Retrying;
                row.last_error = Some(e);
            }
            None => {
                row.state = State::Running;
                row.retries = 0;
                row.last_error = None;
            }
        }
        inner.samples.push_back((now, events));
        // Keep one sample older than the window, as the baseline of the rate.
        while inner.samples.len() > 2 && inner.samples[1].0 + RATE_WINDOW < now {
            inner.samples.pop_front();
        }
    }

    /// The current run ended (its totals, from its last cycle, join the done runs').
    pub(super) fn run_ended(&self, last: Option<RunStats>, status: Option<&'static str>) {
        let mut inner = self.inner();
        if let Some(s) = last {
            let d = &mut inner.done;
            d.events_consumed += s.events_consumed;
            d.windows_emitted += s.windows_emitted;
            d.late_events += s.late_events;
            d.dead_letters += s.dead_letters;
            d.cycles += s.cycles;
            // The run's last counts (its cycles committed as it ended) are the row's.
            let d = inner.done.clone();
            let row = &mut inner.row;
            row.events = d.events_consumed;
            row.windows_emitted = d.windows_emitted;
            row.late_events = d.late_events;
            row.dead_letters = d.dead_letters;
            row.cycles = d.cycles;
        }
        if status.is_some() {
            inner.row.last_status = status;
        }
    }

    /// A fault: shown with its error; `retry_at_ms` says when it is tried again (None: never).
    pub(super) fn faulted(&self, error: &EtlError, retry_at_ms: Option<i64>) {
        let mut inner = self.inner();
        let row = &mut inner.row;
        row.last_error = Some(error.to_string());
        row.next_run_ms = retry_at_ms;
        match retry_at_ms {
            Some(_) => {
                row.state = State::Retrying;
                row.retries += 1;
            }
            None => row.state = State::Failed,
        }
    }

    /// Waiting for the next scheduled run.
    pub(super) fn waiting(&self, next_run_ms: i64) {
        let mut inner = self.inner();
        inner.row.state = State::Waiting;
        inner.row.next_run_ms = Some(next_run_ms);
    }

    /// The thread is ending: the job's final state, and whether its record is kept active (a
    /// job its database's close stopped is resumed after a restart; one its user stopped, that
    /// failed or whose one run ended is not).
    pub(super) fn finish(&self) {
        let (keep_record, name) = {
            let mut inner = self.inner();
            let closing = inner.stop == Some(StopReason::Closing);
            if inner.row.state != State::Failed {
                inner.row.state = State::Stopped;
            }
            inner.row.next_run_ms = None;
            (closing, self.name.clone())
        };
        if !keep_record {
            self.deactivate_record(&name);
        }
        self.inner().finished = true;
        self.changed.notify_all();
    }

    pub(super) fn deactivate_record(&self, name: &str) {
        if let Some(path) = &self.record {
            // Best effort: a record left active only means a resume starts the job again,
            // which the user can stop.
            if let Ok(c) = Checkpoint::open_file(path) {
                let _ = c.deactivate_background(name, now_ms());
            }
        }
    }

    /// Asks the job to stop (the first reason given stands) and wakes it if it is waiting.
    pub(super) fn ask_stop(&self, reason: StopReason) {
        let mut inner = self.inner();
        if inner.stop.is_none() {
            inner.stop = Some(reason);
        }
        drop(inner);
        if let Some(i) = lock(&self.interrupt).as_ref() {
            i.store(true, Ordering::Relaxed);
        }
        self.changed.notify_all();
    }

    /// Waits until its thread has ended, at most `limit` (None: for as long as it takes).
    pub(super) fn wait_finished(&self, limit: Option<Duration>) -> bool {
        let deadline = limit.map(|l| Instant::now() + l);
        let mut inner = self.inner();
        while !inner.finished {
            let wait = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(w) if !w.is_zero() => w,
                    _ => return false,
                },
                None => Duration::from_secs(3600),
            };
            inner = self
                .changed
                .wait_timeout(inner, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(inner);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        true
    }

    pub(super) fn is_finished(&self) -> bool {
        self.inner().finished
    }
}

/// Events per second over the last minute, from the samples and the total now.
fn rate(samples: &VecDeque<(Instant, u64)>, events: u64, now: Instant) -> f64 {
    let since = now.checked_sub(RATE_WINDOW);
    // The baseline: the last sample at or before a minute ago, else the first one.
    let base = samples
        .iter()
        .rev()
        .find(|(t, _)| since.is_some_and(|s| *t <= s))
        .or(samples.front());
    let Some(&(t0, e0)) = base else {
        return 0.0;
    };
    let secs = now.duration_since(t0).min(RATE_WINDOW).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    events.saturating_sub(e0) as f64 / secs
}

/// What starting a job needs to know besides its runs.
pub struct JobSpec {
    pub name: String,
    /// The call, its secrets hidden.
    pub call_shown: String,
    /// The checkpoint file the job is recorded in, to be resumed after a restart.
    pub record: Option<String>,
    pub every_ms: Option<i64>,
}

/// A job's handle, before its thread starts.
pub(super) fn new_job(spec: JobSpec) -> Arc<Job> {
    let started_ms = now_ms();
    Arc::new(Job {
        name: spec.name.clone(),
        record: spec.record,
        every_ms: spec.every_ms,
        inner: Mutex::new(Inner {
            row: JobRow {
                job: spec.name.clone(),
                call: spec.call_shown,
                state: State::Running,
                started_ms,
                last_cycle_ms: None,
                runs: 0,
                threads: 0,
                cycles: 0,
                events: 0,
                events_per_sec: 0.0,
                lag: None,
                windows_emitted: 0,
                late_events: 0,
                dead_letters: 0,
                watermark_ms: None,
                last_status: None,
                last_error: None,
                retries: 0,
                next_run_ms: None,
                open_windows: 0,
                state_bytes: 0,
                wal_bytes: None,
                warning: None,
            },
            done: zero_stats(&spec.name),
            // The rate's first baseline: nothing read when the job started.
            samples: VecDeque::from([(Instant::now(), 0)]),
            stop: None,
            finished: false,
        }),
        changed: Condvar::new(),
        thread: Mutex::new(None),
        interrupt: Mutex::new(None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_over_the_last_minute() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut samples = VecDeque::new();
        assert_eq!(rate(&samples, 0, at(1)), 0.0);
        samples.push_back((at(0), 0));
        samples.push_back((at(10), 1000));
        // 1000 events in 10 s.
        assert_eq!(rate(&samples, 1000, at(10)), 100.0);
        samples.push_back((at(100), 7000));
        // Baseline: the sample at 10 s (at or before 100 - 60 s); 6000 events over 60 s.
        assert_eq!(rate(&samples, 7000, at(100)), 100.0);
        // Quiet since: the rate falls as the minute moves on.
        assert_eq!(rate(&samples, 7000, at(200)), 0.0);
    }
}
