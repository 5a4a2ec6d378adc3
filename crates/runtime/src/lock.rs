//! The job lock: one run of a job at a time. The run only holds it; how it is taken depends on
//! where the checkpoint is (a lock on a file beside a checkpoint file, taken by the extension;
//! for the in-memory checkpoint, the set of jobs running against it, here).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use streaming_etl_core::{EtlError, Result};

/// Jobs running against one in-memory checkpoint.
#[derive(Default)]
pub struct MemoryLocks(Mutex<HashSet<String>>);

/// Exclusive right to run one job, released on drop (a file lock also when the process dies).
pub struct JobLock {
    _held: Box<dyn Send>,
}

struct MemoryClaim(Arc<MemoryLocks>, String);

impl Drop for MemoryClaim {
    fn drop(&mut self) {
        self.0
             .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.1);
    }
}

impl JobLock {
    /// A lock taken elsewhere (held as long as `guard` lives).
    pub fn held(guard: impl Send + 'static) -> JobLock {
        JobLock {
            _held: Box::new(guard),
        }
    }

    /// Takes the lock of `job` in an in-memory checkpoint.
    pub fn memory(locks: &Arc<MemoryLocks>, job: &str) -> Result<JobLock> {
        let mut running = locks.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !running.insert(job.to_string()) {
            return Err(EtlError::JobBusy {
                job: job.to_string(),
                path: ":memory:".to_string(),
            });
        }
        Ok(JobLock::held(MemoryClaim(
            Arc::clone(locks),
            job.to_string(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_the_same_job_is_refused_until_the_first_is_dropped() {
        let locks = Arc::new(MemoryLocks::default());
        let m = JobLock::memory(&locks, "a").unwrap();
        let e = JobLock::memory(&locks, "a").err().unwrap().to_string();
        assert!(e.contains("job 'a' is already running"), "{e}");
        let _b = JobLock::memory(&locks, "b").unwrap();
        drop(m);
        JobLock::memory(&locks, "a").unwrap();
    }
}
