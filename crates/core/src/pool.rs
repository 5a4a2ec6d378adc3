//! The threads of one run, as many as DuckDB's `threads` allows: the calling thread and
//! `threads - 1` helpers. Work is handed over as jobs: short ones (parsing a chunk, applying an
//! epoch of events to a window shard) that any thread takes, the calling thread included while
//! it waits for a result; long ones (a cycle's commit) that only helpers take, so the merge never
//! stalls behind a database write. With one thread there are no helpers and every job runs at
//! once, where it is handed over: a run then uses exactly one core.
//!
//! An [`Actor`] is state that jobs change one piece of work at a time, in the order the work was
//! sent (a window shard, the committer), whichever thread runs them.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{EtlError, Result};

/// Work handed to the pool.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// How long a waiting thread sleeps before it looks again (every completion wakes it anyway).
const RECHECK: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Queue {
    short: VecDeque<Job>,
    long: VecDeque<Job>,
    closed: bool,
    /// The first job that panicked (the run fails with it).
    panicked: Option<String>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a job is queued and when one finishes.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a job, turning a panic into the pool's failure instead of a lost thread.
    fn run(&self, job: Job) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(job)) {
            let message = match p.downcast::<String>() {
                Ok(s) => *s,
                Err(p) => match p.downcast::<&'static str>() {
                    Ok(s) => (*s).to_string(),
                    Err(_) => "unknown panic".to_string(),
                },
            };
            self.lock().panicked.get_or_insert(message);
        }
        // Taking the lock first: a waiter checks its condition and starts waiting under it, so
        // the job's effect is either seen by that check or followed by this wake-up.
        drop(self.lock());
        self.changed.notify_all();
    }
}

/// The threads of a run.
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` threads in all, the caller's included (at least one). Helpers that
    /// cannot be started are done without: the work is the same, done by fewer threads.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared::default());
        let mut helpers = Vec::new();
        for n in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("streaming_etl-t{n}"))
                .spawn(move || helper(&s));
            match spawned {
                Ok(h) => helpers.push(h),
                Err(_) => break,
            }
        }
        Pool { shared, helpers }
    }

    /// Threads in all, the calling one included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Hands a short job over (with no helpers, runs it now).
    pub fn submit(&self, job: Job) {
        self.hand_over(job, false);
    }

    fn hand_over(&self, job: Job, long: bool) {
        if self.helpers.is_empty() {
            self.shared.run(job);
            return;
        }
        let mut q = self.shared.lock();
        if long {
            q.long.push_back(job);
        } else {
            q.short.push_back(job);
        }
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Runs short jobs on the calling thread until `done` holds, waiting when there is none to
    /// run. Fails when a job panicked (its work is lost, so the run cannot go on).
    pub fn help_until(&self, mut done: impl FnMut() -> bool) -> Result<()> {
        loop {
            let mut q = self.shared.lock();
            if let Some(p) = &q.panicked {
                return Err(EtlError::Internal(format!("a worker thread panicked: {p}")));
            }
            if done() {
                return Ok(());
            }
            match q.short.pop_front() {
                Some(job) => {
                    drop(q);
                    self.shared.run(job);
                }
                None => {
                    let _ = self
                        .shared
                        .changed
                        .wait_timeout(q, RECHECK)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }
}

fn helper(shared: &Shared) {
    loop {
        let mut q = shared.lock();
        // A commit waiting goes first: it frees a cycle's memory and makes it visible.
        let job = match q.long.pop_front().or_else(|| q.short.pop_front()) {
            Some(job) => job,
            None if q.closed => return,
            None => {
                let _ = shared
                    .changed
                    .wait_timeout(q, RECHECK)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
        };
        drop(q);
        shared.run(job);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Helpers finish what is queued, then leave.
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

struct Inbox<W> {
    work: VecDeque<W>,
    /// A job is queued or running that will apply what the inbox holds.
    scheduled: bool,
}

struct ActorInner<S, W> {
    state: Mutex<S>,
    inbox: Mutex<Inbox<W>>,
    apply: fn(&mut S, W),
}

/// State that work is applied to one piece at a time, in the order it was sent, on the pool.
pub struct Actor<S, W> {
    inner: Arc<ActorInner<S, W>>,
}

impl<S: Send + 'static, W: Send + 'static> Actor<S, W> {
    pub fn new(state: S, apply: fn(&mut S, W)) -> Actor<S, W> {
        Actor {
            inner: Arc::new(ActorInner {
                state: Mutex::new(state),
                inbox: Mutex::new(Inbox {
                    work: VecDeque::new(),
                    scheduled: false,
                }),
                apply,
            }),
        }
    }

    fn inbox(&self) -> MutexGuard<'_, Inbox<W>> {
        self.inner
            .inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends work; `long`: it may take a while (only helpers run it).
    pub fn send(&self, pool: &Pool, work: W, long: bool) {
        let mut inbox = self.inbox();
        inbox.work.push_back(work);
        if inbox.scheduled {
            return;
        }
        inbox.scheduled = true;
        drop(inbox);
        let inner = Arc::clone(&self.inner);
        pool.hand_over(Box::new(move || drain(&inner)), long);
    }

    /// Pieces of work sent and not yet taken up.
    pub fn backlog(&self) -> usize {
        self.inbox().work.len()
    }

    /// Nothing sent is waiting or being applied.
    pub fn idle(&self) -> bool {
        let inbox = self.inbox();
        inbox.work.is_empty() && !inbox.scheduled
    }

    /// The state (wait for [`Actor::idle`] first to see every piece of work applied).
    pub fn state(&self) -> MutexGuard<'_, S> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn drain<S, W>(inner: &ActorInner<S, W>) {
    loop {
        let next = {
            let mut inbox = inner.inbox.lock().unwrap_or_else(PoisonError::into_inner);
            match inbox.work.pop_front() {
                Some(w) => w,
                None => {
                    inbox.scheduled = false;
                    return;
                }
            }
        };
        let mut state = inner.state.lock().unwrap_or_else(PoisonError::into_inner);
        (inner.apply)(&mut state, next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn an_actor_applies_work_in_order_whatever_the_threads() {
        for threads in [1, 2, 4] {
            let pool = Pool::new(threads);
            assert_eq!(pool.threads(), threads);
            let actors: Vec<Actor<Vec<u32>, u32>> = (0..3)
                .map(|_| Actor::new(Vec::new(), |s: &mut Vec<u32>, w| s.push(w)))
                .collect();
            for i in 0..3000u32 {
                actors[(i % 3) as usize].send(&pool, i, i % 7 == 0);
            }
            pool.help_until(|| actors.iter().all(Actor::idle)).unwrap();
            for (k, a) in actors.iter().enumerate() {
                let want: Vec<u32> = (0..3000).filter(|i| i % 3 == k as u32).collect();
                assert_eq!(*a.state(), want, "threads {threads}");
            }
        }
    }

    #[test]
    fn one_thread_runs_each_job_where_it_is_handed_over() {
        let pool = Pool::new(1);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        pool.submit(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_panicking_job_fails_the_waiter_instead_of_hanging_it() {
        for threads in [1, 2] {
            let pool = Pool::new(threads);
            pool.submit(Box::new(|| panic!("boom")));
            let e = pool.help_until(|| false).unwrap_err().to_string();
            assert!(e.contains("a worker thread panicked: boom"), "{e}");
        }
    }
}
