//! The host database as the extension sees it: a small pool of connections of its own (runs
//! write through them, independent of the caller's transaction), and a watcher that lets go of
//! them once the user has closed every connection of theirs. Without the watcher those
//! connections would keep the database open forever (database → registered function →
//! connection → database): its file lock held, its WAL never checkpointed, and a reopen in the
//! same process spinning in DuckDB's instance cache.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, PoisonError};
use std::time::{Duration, Instant};

use duckdb::Connection;
use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::checkpoint::Checkpoint;
use streaming_etl_runtime::lock::MemoryLocks;

use crate::jobs::registry::{stop_everywhere, Jobs, CLOSE_WAIT};

/// Connections opened at load time (DuckDB hands an extension its database only while it
/// loads, so the pool cannot grow later): a background job holds one for as long as a run
/// lasts, a foreground run one, a bind one for a moment. More foreground runs at once wait for
/// one to be free; a background job never takes the last free one.
pub const POOL_SIZE: usize = 16;

/// How often the watcher looks at the connection count: often right after the extension was
/// used (when a user is most likely to close the database and open it again), rarely once it
/// has been idle for a while, since each look is a small query (0.2-1 ms of CPU measured here:
/// about 12% of a core while looking every 2 ms, 2% every 50 ms, 0.4% every 250 ms).
/// How long the database must have had no user connection before the extension lets go of it.
const RELEASE_GRACE: Duration = Duration::from_millis(20);

fn watch_interval(idle_for: Duration) -> Duration {
    match idle_for.as_secs() {
        0..=1 => Duration::from_millis(2),
        2..=59 => Duration::from_millis(50),
        _ => Duration::from_millis(250),
    }
}

pub struct Host {
    pool: Mutex<Vec<Connection>>,
    /// Since when the watcher has seen no user connection (and no run).
    unused_since: Mutex<Option<Instant>>,
    freed: Condvar,
    /// Connections the extension holds (the pool may shrink to one, see release_if_unused).
    size: AtomicUsize,
    released: AtomicBool,
    /// When the extension was last used (load, a run starting or ending).
    last_activity: Mutex<Instant>,
    /// The database file, or None for an in-memory database.
    db_path: Option<String>,
    /// The in-memory checkpoint of an in-memory database (lives as long as the database).
    memory_checkpoint: Mutex<Option<Checkpoint>>,
    /// Jobs running against the in-memory checkpoint (file checkpoints use file locks).
    memory_locks: Arc<MemoryLocks>,
    /// The database's background jobs.
    jobs: Arc<Jobs>,
    /// Connections lent to background jobs (the rest of those lent serve a user's statement).
    lent_to_jobs: AtomicUsize,
}

/// Held by a watcher while it talks to DuckDB; taken for good when the process exits, so that
/// no watcher runs DuckDB code while the process tears DuckDB down.
static EXIT_GATE: Mutex<()> = Mutex::new(());
static EXITING: AtomicBool = AtomicBool::new(false);
static AT_EXIT: Once = Once::new();
/// At process exit, keep the watchers out of DuckDB for good: exit handlers registered after
/// ours (lazily created statics of DuckDB among them) have already run, so closing a database
/// now could touch destroyed objects. A database whose user closed it an instant before exit is
/// then left with its WAL, which DuckDB replays on the next open; nothing is lost.
extern "C" fn on_exit() {
    if EXITING.swap(true, Ordering::SeqCst) {
        return;
    }
    // Background jobs end at a cycle boundary first, everything they read committed.
    let _ = std::panic::catch_unwind(|| stop_everywhere(CLOSE_WAIT));
    let guard = EXIT_GATE.lock().unwrap_or_else(PoisonError::into_inner);
    std::mem::forget(guard);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves nothing half-updated that matters more
    // than refusing every later run would.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Host {
    /// Takes the connections opened at load time and starts the watcher.
    pub fn start(conns: Vec<Connection>, db_path: Option<String>) -> Arc<Host> {
        AT_EXIT.call_once(|| crate::host::os::at_exit(on_exit));
        let jobs = Jobs::new(db_path.as_deref());
        let host = Arc::new(Host {
            size: AtomicUsize::new(conns.len()),
            pool: Mutex::new(conns),
            unused_since: Mutex::new(None),
            freed: Condvar::new(),
            released: AtomicBool::new(false),
            last_activity: Mutex::new(Instant::now()),
            db_path,
            memory_checkpoint: Mutex::new(None),
            memory_locks: Arc::new(MemoryLocks::default()),
            jobs,
            lent_to_jobs: AtomicUsize::new(0),
        });
        let watched = Arc::clone(&host);
        let spawned = std::thread::Builder::new()
            .name("streaming_etl-watch".into())
            .spawn(move || watched.watch());
        if spawned.is_err() {
            // Without a watcher the database stays pinned until the process exits; runs still work.
            eprintln!("streaming_etl: could not start the connection watcher thread");
        }
        host
    }

    pub fn db_path(&self) -> Option<&str> {
        self.db_path.as_deref()
    }

    /// The database's background jobs.
    pub fn jobs(&self) -> &Arc<Jobs> {
        &self.jobs
    }

    /// A background job is starting: the exit handler is registered again, so that at exit it
    /// runs (and stops the job) before DuckDB's objects created since load are torn down.
    pub fn job_starting(&self) {
        crate::host::os::at_exit(on_exit);
    }

    fn watch(self: Arc<Self>) {
        loop {
            let idle_for = lock(&self.last_activity).elapsed();
            std::thread::sleep(watch_interval(idle_for));
            if EXITING.load(Ordering::SeqCst) {
                return;
            }
            let _gate = lock(&EXIT_GATE);
            if EXITING.load(Ordering::SeqCst) {
                return;
            }
            if self.release_if_unused() {
                return;
            }
        }
    }

    /// Closes the extension's connections if nothing else uses the database any more: no run
    /// in progress and no user connection left. Returns whether they are released.
    ///
    /// A user may reconnect while this runs (in Python, to the very same database, as long as
    /// any connection keeps it open), so all but one connection are closed first and the count
    /// is looked at again right before the last one goes; a user who came back finds the
    /// extension working, with one connection.
    fn release_if_unused(&self) -> bool {
        if self.released.load(Ordering::SeqCst) {
            return true;
        }
        let mut pool = lock(&self.pool);
        let size = self.size.load(Ordering::SeqCst);
        let mut unused_since = lock(&self.unused_since);
        // A connection lent to anything but a background job serves a user's statement.
        let jobs = self.lent_to_jobs.load(Ordering::SeqCst);
        if pool.len() + jobs < size || pool.is_empty() {
            *unused_since = None;
            return false;
        }
        if !matches!(connection_count(&pool[0]), Ok(n) if n <= size as i64) {
            *unused_since = None;
            return false;
        }
        // Only once no user connection has been seen for a while: a user who closes and at
        // once reconnects (to the same, still open database) keeps the extension as it is.
        match *unused_since {
            None => {
                *unused_since = Some(Instant::now());
                return false;
            }
            Some(t) if t.elapsed() < RELEASE_GRACE => return false,
            Some(_) => {}
        }
        drop(unused_since);
        if jobs > 0 || self.jobs.any_alive() {
            // The user has gone: the background jobs stop at a cycle boundary (to be resumed
            // after a restart), handing their connections back; the next look releases them.
            drop(pool);
            self.jobs.stop_all(CLOSE_WAIT);
            return false;
        }
        let Some(last) = pool.pop() else {
            return false;
        };
        drop(std::mem::take(&mut *pool));
        self.size.store(1, Ordering::SeqCst);
        if !matches!(connection_count(&last), Ok(1)) {
            pool.push(last);
            return false;
        }
        self.released.store(true, Ordering::SeqCst);
        drop(pool);
        // Dropping the last connection closes the database (checkpoint, file lock) here,
        // outside the pool lock. Registering the exit handler again first makes an exit that
        // races this close wait for it, before DuckDB's statics created since load are gone.
        crate::host::os::at_exit(on_exit);
        drop(last);
        self.freed.notify_all();
        true
    }

    /// Records that a user statement used the extension (the watcher looks more often after).
    pub fn touch(&self) {
        *lock(&self.last_activity) = Instant::now();
    }

    /// Borrows a connection for one run, waiting while all are in use.
    pub fn checkout(self: &Arc<Self>) -> Result<PooledConn> {
        let mut pool = lock(&self.pool);
        loop {
            if self.released.load(Ordering::SeqCst) {
                return Err(EtlError::Detached);
            }
            if let Some(conn) = pool.pop() {
                *lock(&self.last_activity) = Instant::now();
                return Ok(PooledConn {
                    host: Arc::clone(self),
                    conn: Some(conn),
                    for_job: false,
                });
            }
            pool = self
                .freed
                .wait(pool)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Refuses a new background job when no connection is left for it (one stays free for the
    /// user's statements), naming how many run.
    pub fn check_room_for_job(&self) -> Result<()> {
        let pool = lock(&self.pool);
        if pool.len() >= 2 {
            return Ok(());
        }
        let jobs = self.lent_to_jobs.load(Ordering::SeqCst);
        Err(EtlError::invalid(
            "background",
            format!(
                "{jobs} background jobs run in this database, and the extension has {} connections to it (opened when it loaded), one of which stays free for your statements; stop a job (streaming_etl_stop), or run this one in another process",
                self.size.load(Ordering::SeqCst)
            ),
            true,
        ))
    }

    /// Whether the database is open read-only (`access_mode = 'read_only'`): nothing is to be
    /// written, neither its tables nor its checkpoint files.
    pub fn read_only(self: &Arc<Self>) -> Result<bool> {
        let pooled = self.checkout()?;
        pooled
            .conn()?
            .query_row(
                "SELECT readonly FROM duckdb_databases() WHERE database_name = current_database()",
                [],
                |r| r.get::<_, bool>(0),
            )
            .map_err(|e| EtlError::Duck(e.to_string()))
    }

    /// Borrows a connection for a background job's run. It never waits, and never takes the
    /// last free connection (the user's statements and the watcher need one).
    pub fn checkout_for_job(self: &Arc<Self>) -> Result<PooledConn> {
        let mut pool = lock(&self.pool);
        if self.released.load(Ordering::SeqCst) {
            return Err(EtlError::Detached);
        }
        if pool.len() < 2 {
            return Err(EtlError::Duck(format!(
                "every connection of the extension to this database is in use ({} in all, {} by background jobs); a background run waits for one",
                self.size.load(Ordering::SeqCst),
                self.lent_to_jobs.load(Ordering::SeqCst)
            )));
        }
        let conn = pool.pop();
        self.lent_to_jobs.fetch_add(1, Ordering::SeqCst);
        *lock(&self.last_activity) = Instant::now();
        Ok(PooledConn {
            host: Arc::clone(self),
            conn,
            for_job: true,
        })
    }

    /// A global DuckDB setting as the extension's own connection sees it, as its type and its
    /// text (the DuckDB 1.4 build, whose C API cannot read a caller's settings; the sandbox's
    /// settings are global).
    #[cfg(feature = "capi-v1-2")]
    pub fn global_setting(self: &Arc<Self>, name: &str) -> Option<(String, Option<String>)> {
        let pooled = self.checkout().ok()?;
        pooled
            .conn()
            .ok()?
            .query_row(
                "SELECT typeof(current_setting(?)), current_setting(?)::VARCHAR",
                duckdb::params![name, name],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
            )
            .ok()
    }

    /// The in-memory checkpoint of this (in-memory) database, created on first use.
    pub fn memory_checkpoint(&self) -> Result<Checkpoint> {
        let mut slot = lock(&self.memory_checkpoint);
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Checkpoint::open_memory()?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The in-memory checkpoint, if a run has created it.
    pub fn existing_memory_checkpoint(&self) -> Option<Checkpoint> {
        lock(&self.memory_checkpoint).clone()
    }

    /// The jobs running against the in-memory checkpoint.
    pub fn memory_locks(&self) -> &Arc<MemoryLocks> {
        &self.memory_locks
    }
}

/// How many connections the database has open (its users' and the extension's own).
fn connection_count(conn: &Connection) -> duckdb::Result<i64> {
    conn.prepare_cached("SELECT count FROM duckdb_connection_count()")?
        .query_row([], |r| r.get(0))
}

/// A connection borrowed from the pool, returned on drop.
pub struct PooledConn {
    host: Arc<Host>,
    conn: Option<Connection>,
    /// Lent to a background job's run.
    for_job: bool,
}

impl PooledConn {
    pub fn conn(&self) -> Result<&Connection> {
        self.conn.as_ref().ok_or(EtlError::Detached)
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            // Leave no transaction open on a pooled connection (a failed cycle may have).
            let _ = c.execute_batch("ROLLBACK");
            *lock(&self.host.last_activity) = Instant::now();
            let mut pool = lock(&self.host.pool);
            pool.push(c);
            if self.for_job {
                self.host.lent_to_jobs.fetch_sub(1, Ordering::SeqCst);
            }
            drop(pool);
            self.host.freed.notify_one();
        }
    }
}

/// A pooled connection the parts of one run use in turn: its sink's writes, and DuckDB's
/// conversions of typed values while chunks are parsed (a run never waits for a second
/// connection of the pool, so runs cannot hold the pool's connections waiting for each other).
#[derive(Clone)]
pub struct SharedConn(Arc<Mutex<PooledConn>>);

impl SharedConn {
    pub fn new(conn: PooledConn) -> SharedConn {
        SharedConn(Arc::new(Mutex::new(conn)))
    }

    /// The connection, for one statement or transaction at a time.
    pub fn lock(&self) -> MutexGuard<'_, PooledConn> {
        lock(&self.0)
    }
}
