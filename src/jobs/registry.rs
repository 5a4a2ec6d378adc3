//! The background jobs of one database in this process: each a thread of its own driving the
//! same runs a foreground call drives (see [`worker`](super::worker)), listed
//! (`streaming_etl_jobs()`), stopped at a cycle boundary (`streaming_etl_stop()`, the database's
//! close, the process's exit).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use streaming_etl_core::{EtlError, Result};

use super::job::{lock, new_job, Job, JobRow, JobSpec, State, StopReason};
use super::wal::WalWatch;
use super::worker::{work, Runnable, Starter};

/// How long a closing database or an exiting process waits for its jobs to reach a cycle
/// boundary (a cycle is a second by default; a source may be waiting on a broker's timeout).
pub const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// The background jobs of one database.
#[derive(Default)]
pub struct Jobs {
    jobs: Mutex<BTreeMap<String, Arc<Job>>>,
    /// The database file's WAL (None: an in-memory database).
    wal: Option<Arc<WalWatch>>,
}

/// Every database's jobs in this process, for the exit handler.
static ALL: Mutex<Vec<Weak<Jobs>>> = Mutex::new(Vec::new());

impl Jobs {
    /// The jobs of the database at `db_path` (None: in memory).
    pub fn new(db_path: Option<&str>) -> Arc<Jobs> {
        let jobs = Arc::new(Jobs {
            jobs: Mutex::default(),
            wal: db_path.map(|p| Arc::new(WalWatch::new(p))),
        });
        let mut all = lock(&ALL);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&jobs));
        jobs
    }

    /// Refuses a name a job of this database still runs under.
    pub fn check_free(&self, name: &str) -> Result<()> {
        match lock(&self.jobs).get(name) {
            Some(j) if !j.is_finished() => Err(EtlError::invalid(
                "job",
                format!(
                    "a background job of this name is {} in this database; streaming_etl_stop('{name}') stops it",
                    j.row().state.name()
                ),
                format!("'{name}'"),
            )),
            _ => Ok(()),
        }
    }

    /// A job that could not even be bound again (after a restart): listed as failed, with its
    /// record left as it is (`streaming_etl_stop` removes it).
    pub fn insert_failed(&self, spec: JobSpec, error: &EtlError) -> JobRow {
        let job = new_job(spec);
        {
            let mut inner = job.inner();
            inner.row.state = State::Failed;
            inner.row.last_error = Some(error.to_string());
            inner.finished = true;
        }
        let row = job.row();
        lock(&self.jobs).insert(job.name.clone(), job);
        row
    }

    /// The row of a job an earlier process recorded, taken off the record without running here:
    /// shown by the call that stopped it, and listed nowhere after.
    pub fn stopped_unlisted(spec: JobSpec) -> JobRow {
        let mut row = new_job(spec).row();
        row.state = State::Stopped;
        row
    }

    /// Starts a job's thread, with its first run already started (`first`), or with the fault
    /// that kept it from starting (it is retried after the backoff when transient).
    pub fn spawn(
        &self,
        spec: JobSpec,
        first: std::result::Result<Box<dyn Runnable>, EtlError>,
        starter: Starter,
    ) -> Result<JobRow> {
        self.check_free(&spec.name)?;
        let job = new_job(spec);
        let worker = Arc::clone(&job);
        let started_ms = job.row().started_ms;
        let wal = self.wal.clone();
        let handle = std::thread::Builder::new()
            .name(format!("streaming_etl-job-{}", job.name))
            .spawn(move || work(worker, starter, first, started_ms, wal))
            .map_err(|e| EtlError::Internal(format!("cannot start a thread for the job: {e}")))?;
        *lock(&job.thread) = Some(handle);
        let row = job.row();
        lock(&self.jobs).insert(job.name.clone(), job);
        Ok(row)
    }

    /// DuckDB's `checkpoint_threshold` as a starting run read it (see `WalWatch`).
    pub fn set_wal_threshold(&self, shown: &str) {
        if let Some(w) = &self.wal {
            w.set_threshold(shown);
        }
    }

    /// Every job's row, by name.
    pub fn rows(&self) -> Vec<JobRow> {
        let jobs: Vec<Arc<Job>> = lock(&self.jobs).values().cloned().collect();
        jobs.iter().map(|j| j.row()).collect()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Job>> {
        lock(&self.jobs).get(name).cloned()
    }

    /// Stops a job at a cycle boundary (everything it read committed), and returns its row
    /// once it has stopped.
    pub fn stop(&self, name: &str) -> Option<JobRow> {
        let job = self.get(name)?;
        job.ask_stop(StopReason::User);
        job.wait_finished(None);
        // A job that had failed or stopped by itself is not to be resumed either.
        job.deactivate_record(name);
        Some(job.row())
    }

    /// Whether any job's thread is still alive.
    pub fn any_alive(&self) -> bool {
        lock(&self.jobs).values().any(|j| !j.is_finished())
    }

    /// How many jobs other than `name` have a thread alive.
    pub fn alive_besides(&self, name: &str) -> usize {
        lock(&self.jobs)
            .values()
            .filter(|j| j.name != name && !j.is_finished())
            .count()
    }

    /// Stops every job for a closing database (they are resumed after a restart), waiting up to
    /// `limit` for them to reach a cycle boundary.
    pub fn stop_all(&self, limit: Duration) {
        let jobs: Vec<Arc<Job>> = lock(&self.jobs).values().cloned().collect();
        for j in &jobs {
            j.ask_stop(StopReason::Closing);
        }
        let deadline = Instant::now() + limit;
        for j in &jobs {
            j.wait_finished(Some(deadline.saturating_duration_since(Instant::now())));
        }
    }
}

/// At process exit: every database's jobs, stopped at a cycle boundary (bounded).
pub fn stop_everywhere(limit: Duration) {
    let all: Vec<Arc<Jobs>> = lock(&ALL).iter().filter_map(Weak::upgrade).collect();
    for jobs in all {
        jobs.stop_all(limit);
    }
}
