//! The side checkpoint: a SQLite database (WAL, synchronous=FULL) holding, per job, its
//! settings and its state: each partition's next offset and event-time progress, the watermark
//! floor and the open windows. Output rows are never stored here: they are written once, into
//! DuckDB.
//!
//! A cycle's state is committed here before its output is committed in DuckDB, together with a
//! marker of the batch (the job's `streaming_etl_batches` row, in the same DuckDB transaction).
//! Until the next cycle the job keeps two states: the one after the last batch known to be in
//! DuckDB, and the new one. A killed run leaves the new state in doubt; the next run asks
//! DuckDB's marker whether that batch landed, and keeps the new state if it did, else goes back
//! to the one before and reads the cycle again. Nothing is lost and nothing is counted twice,
//! and each row is written once.
//!
//! Checkpoints written before this protocol (open windows in `jobs`, batches in an `outbox`) are
//! still read: their outbox is applied once more, then their state becomes the first stored one.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::{params, Connection, OptionalExtension};

use streaming_etl_core::{EtlError, JobSettings, PartitionState, Result, NO_WATERMARK};

use crate::config::CheckpointLocation;
use crate::sink::Tables;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS streaming_etl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO streaming_etl_meta VALUES ('schema_version', '1');
CREATE TABLE IF NOT EXISTS jobs (
  job TEXT PRIMARY KEY,
  source TEXT NOT NULL,
  window_ms INTEGER NOT NULL,
  lateness_ms INTEGER NOT NULL,
  key_field TEXT NOT NULL,
  time_field TEXT NOT NULL,
  value_field TEXT NOT NULL,
  watermark_ms INTEGER,
  open_windows BLOB,
  open_window_count INTEGER NOT NULL DEFAULT 0,
  next_seq INTEGER NOT NULL DEFAULT 1,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  settings TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS partitions (
  job TEXT NOT NULL,
  partition INTEGER NOT NULL,
  name TEXT NOT NULL,
  next_offset INTEGER NOT NULL,
  max_event_time_ms INTEGER,
  last_delivery_ms INTEGER NOT NULL,
  end_offset INTEGER,
  updated_ms INTEGER NOT NULL,
  identity TEXT NOT NULL DEFAULT '',
  status TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (job, partition));
CREATE TABLE IF NOT EXISTS job_state (
  job TEXT NOT NULL,
  seq INTEGER NOT NULL,
  windows_table TEXT NOT NULL,
  late_table TEXT NOT NULL,
  dead_letter_table TEXT NOT NULL,
  watermark_ms INTEGER,
  open_windows BLOB,
  open_window_count INTEGER NOT NULL,
  partitions BLOB NOT NULL,
  updated_ms INTEGER NOT NULL,
  PRIMARY KEY (job, seq));
CREATE TABLE IF NOT EXISTS outbox (
  job TEXT NOT NULL,
  seq INTEGER NOT NULL,
  windows_table TEXT NOT NULL,
  late_table TEXT NOT NULL,
  dead_letter_table TEXT NOT NULL,
  topic TEXT NOT NULL,
  batch BLOB NOT NULL,
  PRIMARY KEY (job, seq));
CREATE TABLE IF NOT EXISTS background_jobs (
  job TEXT PRIMARY KEY,
  call TEXT NOT NULL,
  active INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL);
";

/// Columns added after version 0.1, added to older checkpoints when they are opened.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("jobs", "settings", "TEXT NOT NULL DEFAULT ''"),
    ("partitions", "identity", "TEXT NOT NULL DEFAULT ''"),
    ("partitions", "status", "TEXT NOT NULL DEFAULT ''"),
];

/// A job as stored: its settings, and the state after the last batch known to be in DuckDB.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredJob {
    pub settings: JobSettings,
    pub watermark_ms: i64,
    pub open_windows: Option<Vec<u8>>,
    pub next_seq: i64,
    /// When the job was created: with its name, it tells this job from an earlier one of the
    /// same name whose checkpoint was deleted.
    pub created_ms: i64,
    pub partitions: Vec<PartitionState>,
    /// The batch this state follows (0: none yet).
    pub seq: i64,
    /// A newer state, whose batch may not have reached DuckDB (a run died between the two
    /// commits): [`Checkpoint::resolve`] keeps or drops it.
    pub in_doubt: Option<InDoubt>,
    /// Stored before states were kept in `job_state` (see [`Checkpoint::adopt_legacy`]).
    pub legacy: bool,
}

/// A state committed here whose batch's DuckDB commit was not seen to finish.
#[derive(Debug, Clone, PartialEq)]
pub struct InDoubt {
    pub seq: i64,
    /// Where that batch went (its marker is beside the windows table).
    pub tables: Tables,
}

/// Output committed to the outbox of an older checkpoint but not yet confirmed in DuckDB.
pub struct Pending {
    pub seq: i64,
    /// The tables the batch goes to, as the sink named them.
    pub tables: Tables,
    /// The job's source as given (the outbox's `topic` column), which fills the `topic` column
    /// of batches stored by version 0.1.
    pub source: String,
    pub batch: Vec<u8>,
}

/// A job's state as one cycle commits it.
pub struct CycleCommit<'a> {
    /// The batch of the last state known to be in DuckDB: states before it are dropped.
    pub base: i64,
    /// The batch this state follows: `base` when the cycle wrote nothing, else the cycle's own
    /// batch, committed in DuckDB right after (the state is in doubt until then).
    pub seq: i64,
    /// Where the batch goes.
    pub tables: &'a Tables,
    pub watermark_ms: i64,
    pub open_windows: &'a [u8],
    pub open_window_count: usize,
    pub partitions: &'a [PartitionState],
    pub now_ms: i64,
}

/// One row of `streaming_etl_checkpoint()`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointRow {
    pub job: String,
    pub source: String,
    pub partition: Option<i32>,
    pub name: Option<String>,
    pub next_offset: Option<i64>,
    pub max_event_time_ms: Option<i64>,
    pub partition_watermark_ms: Option<i64>,
    pub global_watermark_ms: Option<i64>,
    pub open_windows: i64,
    pub pending_batches: i64,
    pub end_offset: Option<i64>,
    pub lag: Option<i64>,
    pub window_ms: i64,
    pub lateness_ms: i64,
    pub last_update_ms: i64,
    /// '' (read), 'released' or 'deleted' (see `PartitionState::status`).
    pub status: Option<String>,
    /// The checkpoint it was read from (`:memory:` for an in-memory one).
    pub checkpoint: String,
}

/// A job recorded as started in the background and not stopped since.
#[derive(Debug, Clone, PartialEq)]
pub struct BackgroundJob {
    pub job: String,
    /// Its call, as the extension encoded it.
    pub call: String,
}

/// An open checkpoint. Clones share the connection (the in-memory checkpoint of an in-memory
/// database is shared by every run against that database).
#[derive(Clone)]
pub struct Checkpoint {
    conn: Arc<Mutex<Connection>>,
    path: String,
}

fn sql_err(path: &str) -> impl Fn(rusqlite::Error) -> EtlError + '_ {
    move |e| EtlError::checkpoint(path, e)
}

/// Creates or upgrades the tables in one transaction: a reader that opens the file while a new
/// job creates it (`streaming_etl_checkpoint()` polled during a first run) sees every table or
/// none, never `jobs` without `partitions`.
fn create_schema(conn: &Connection, path: &str) -> Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| EtlError::checkpoint(path, format!("cannot write it: {e}")))?;
    let made = create_tables(conn, path);
    let end = if made.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn
        .execute_batch(end)
        .map_err(|e| EtlError::checkpoint(path, format!("cannot write it: {e}")));
    made.and(ended)
}

fn create_tables(conn: &Connection, path: &str) -> Result<()> {
    conn.execute_batch(SCHEMA)
        .map_err(|e| EtlError::checkpoint(path, format!("cannot write it: {e}")))?;
    for (table, column, decl) in ADDED_COLUMNS {
        let present: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
                [table, column],
                |r| r.get(0),
            )
            .map_err(sql_err(path))?;
        if present == 0 {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))
                .map_err(|e| EtlError::checkpoint(path, format!("cannot upgrade it: {e}")))?;
        }
    }
    Ok(())
}

fn page_size(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA page_size", [], |r| r.get(0))
}

impl Checkpoint {
    /// A new checkpoint in memory (it lives as long as the value and its clones).
    pub fn open_memory() -> Result<Checkpoint> {
        let c = Connection::open_in_memory().map_err(sql_err(":memory:"))?;
        create_schema(&c, ":memory:")?;
        Ok(Checkpoint {
            conn: Arc::new(Mutex::new(c)),
            path: ":memory:".into(),
        })
    }

    /// The settings a job was checkpointed with in the file at `path`, read without creating or
    /// changing anything (None: no such file, or no such job in it).
    pub fn stored_settings(path: &str, job: &str) -> Option<JobSettings> {
        if !std::path::Path::new(path).exists() {
            return None;
        }
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).ok()?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).ok()?;
        conn.query_row(
            "SELECT source, window_ms, lateness_ms, key_field, time_field, value_field, settings FROM jobs WHERE job = ?1",
            [job],
            |r| {
                Ok(JobSettings {
                    source: r.get(0)?,
                    window_ms: r.get(1)?,
                    lateness_ms: r.get(2)?,
                    key_field: r.get(3)?,
                    time_field: r.get(4)?,
                    value_field: r.get(5)?,
                    extra: JobSettings::parse_extra(&r.get::<_, String>(6)?),
                })
            },
        )
        .ok()
    }

    /// Opens (creating when missing) the checkpoint file at `path`.
    pub fn open_file(path: &str) -> Result<Checkpoint> {
        let conn = Connection::open(path)
            .map_err(|e| EtlError::checkpoint(path, format!("cannot open or create it: {e}")))?;
        let err = sql_err(path);
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(&err)?;
        // 16 KiB pages for a new file (an existing one keeps its own): a cycle's output passes
        // through the outbox as one blob, and with 4 KiB pages SQLite's work per page (allocating
        // it, spilling and checkpointing its WAL frame, a write call each) made the commit thread
        // the bound on many keys (3.8M window rows: 4.0 -> 3.2 s a run). 64 KiB measured little
        // faster again but writes 16x the bytes of a small cycle's few changed pages.
        conn.execute_batch("PRAGMA page_size = 16384;")
            .map_err(&err)?;
        // Reading the header first turns "not a database" into an error right here.
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| {
                EtlError::checkpoint(path, format!("not a usable checkpoint file: {e}"))
            })?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(EtlError::checkpoint(
                path,
                format!("cannot switch it to WAL mode (got journal_mode={mode}); is its directory writable?"),
            ));
        }
        // The WAL is checkpointed into the file once it passes 4 MiB, as with SQLite's default
        // of 1000 pages when pages were 4 KiB: a job's disk footprint stays what it was.
        let pages = (4_i64 << 20) / page_size(&conn).map_err(&err)?.max(512);
        conn.execute_batch(&format!(
            "PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint={pages};"
        ))
        .map_err(&err)?;
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(|e| EtlError::checkpoint(path, format!("the file is damaged: {e}")))?;
        if check != "ok" {
            return Err(EtlError::checkpoint(
                path,
                format!("the file is damaged: {check}"),
            ));
        }
        create_schema(&conn, path)?;
        Ok(Checkpoint {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_string(),
        })
    }

    /// Opens an existing checkpoint file for reading only; None when there is none (or it has
    /// no jobs table yet). Creates nothing.
    pub fn open_read_only(path: &str) -> Result<Option<Checkpoint>> {
        if !std::path::Path::new(path).exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| EtlError::checkpoint(path, format!("cannot open it: {e}")))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(sql_err(path))?;
        let has_jobs: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| {
                EtlError::checkpoint(path, format!("not a usable checkpoint file: {e}"))
            })?;
        if has_jobs == 0 {
            return Ok(None);
        }
        Ok(Some(Checkpoint {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_string(),
        }))
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn load_job(&self, job: &str) -> Result<Option<StoredJob>> {
        let db = self.db();
        let err = sql_err(&self.path);
        let head = db
            .query_row(
                "SELECT source, window_ms, lateness_ms, key_field, time_field, value_field,
                        watermark_ms, open_windows, next_seq, settings, created_ms FROM jobs WHERE job = ?1",
                [job],
                |r| {
                    Ok((
                        JobSettings {
                            source: r.get(0)?,
                            window_ms: r.get(1)?,
                            lateness_ms: r.get(2)?,
                            key_field: r.get(3)?,
                            time_field: r.get(4)?,
                            value_field: r.get(5)?,
                            extra: JobSettings::parse_extra(&r.get::<_, String>(9)?),
                        },
                        r.get::<_, Option<i64>>(6)?,
                        r.get::<_, Option<Vec<u8>>>(7)?,
                        r.get::<_, i64>(8)?,
                        r.get::<_, i64>(10)?,
                    ))
                },
            )
            .optional()
            .map_err(&err)?;
        let Some((settings, watermark, open_windows, next_seq, created_ms)) = head else {
            return Ok(None);
        };
        let mut states = stored_states(&db, job, &self.path)?;
        // With two states, the newer one is in doubt until its batch is found in DuckDB.
        let in_doubt = if states.len() > 1 { states.pop() } else { None };
        let Some(base) = states.pop() else {
            return Ok(Some(StoredJob {
                settings,
                watermark_ms: watermark.unwrap_or(NO_WATERMARK),
                open_windows,
                next_seq,
                created_ms,
                partitions: legacy_partitions(&db, job, &self.path)?,
                seq: next_seq - 1,
                in_doubt: None,
                legacy: true,
            }));
        };
        Ok(Some(StoredJob {
            settings,
            watermark_ms: base.watermark_ms,
            open_windows: base.open_windows,
            next_seq,
            created_ms,
            partitions: base.partitions,
            seq: base.seq,
            in_doubt: in_doubt.map(|s| InDoubt {
                seq: s.seq,
                tables: s.tables,
            }),
            legacy: false,
        }))
    }

    /// Records a new job and its first state: the partitions as its source opened them (so a
    /// run that dies before its first commit resumes where this one started, `start` resolved).
    pub fn create_job(
        &self,
        job: &str,
        s: &JobSettings,
        now_ms: i64,
        tables: &Tables,
        partitions: &[PartitionState],
    ) -> Result<()> {
        let mut db = self.db();
        let err = |e| EtlError::checkpoint(&self.path, format!("cannot write it: {e}"));
        let tx = db.transaction().map_err(err)?;
        tx.execute(
            "INSERT INTO jobs (job, source, window_ms, lateness_ms, key_field, time_field, value_field, created_ms, updated_ms, settings)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9)",
            params![job, s.source, s.window_ms, s.lateness_ms, s.key_field, s.time_field, s.value_field, now_ms, s.extra_text()],
        )
        .map_err(err)?;
        write_state(
            &tx,
            job,
            &CycleCommit {
                base: 0,
                seq: 0,
                tables,
                watermark_ms: NO_WATERMARK,
                open_windows: &[],
                open_window_count: 0,
                partitions,
                now_ms,
            },
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(())
    }

    /// A job stored before this protocol, its outbox applied: its state becomes the first one
    /// kept in `job_state` (and its open windows leave the `jobs` row).
    pub fn adopt_legacy(
        &self,
        job: &str,
        stored: &StoredJob,
        tables: &Tables,
        now_ms: i64,
    ) -> Result<()> {
        let mut db = self.db();
        let err = sql_err(&self.path);
        let tx = db.transaction().map_err(&err)?;
        let count: i64 = tx
            .query_row(
                "SELECT open_window_count FROM jobs WHERE job = ?1",
                [job],
                |r| r.get(0),
            )
            .map_err(&err)?;
        write_state(
            &tx,
            job,
            &CycleCommit {
                base: stored.seq,
                seq: stored.seq,
                tables,
                watermark_ms: stored.watermark_ms,
                open_windows: stored.open_windows.as_deref().unwrap_or(&[]),
                open_window_count: usize::try_from(count).unwrap_or(0),
                partitions: &stored.partitions,
                now_ms,
            },
        )
        .map_err(&err)?;
        tx.commit().map_err(&err)?;
        Ok(())
    }

    /// Settles a state in doubt: kept when its batch is in DuckDB (`landed`), else dropped, so
    /// the job goes on from the state before it and reads that cycle again.
    pub fn resolve(&self, job: &str, seq: i64, landed: bool) -> Result<()> {
        let mut db = self.db();
        let err = sql_err(&self.path);
        let tx = db.transaction().map_err(&err)?;
        let drop = if landed {
            "DELETE FROM job_state WHERE job = ?1 AND seq < ?2"
        } else {
            "DELETE FROM job_state WHERE job = ?1 AND seq = ?2"
        };
        tx.execute(drop, params![job, seq]).map_err(&err)?;
        // What `streaming_etl_checkpoint()` shows is the state kept.
        let mut states = stored_states(&tx, job, &self.path)?;
        if let Some(kept) = states.pop() {
            tx.execute("DELETE FROM partitions WHERE job = ?1", [job])
                .map_err(&err)?;
            show_state(
                &tx,
                job,
                &CycleCommit {
                    base: kept.seq,
                    seq: kept.seq,
                    tables: &kept.tables,
                    watermark_ms: kept.watermark_ms,
                    open_windows: kept.open_windows.as_deref().unwrap_or(&[]),
                    open_window_count: kept.open_window_count,
                    partitions: &kept.partitions,
                    now_ms: kept.updated_ms,
                },
            )
            .map_err(&err)?;
            tx.execute(
                "UPDATE jobs SET next_seq = ?2 WHERE job = ?1",
                params![job, kept.seq + 1],
            )
            .map_err(&err)?;
        }
        tx.commit().map_err(&err)?;
        Ok(())
    }

    /// Output of earlier cycles not yet confirmed in DuckDB, oldest first.
    pub fn pending(&self, job: &str) -> Result<Vec<Pending>> {
        let db = self.db();
        let err = sql_err(&self.path);
        let mut stmt = db
            .prepare(
                "SELECT seq, windows_table, late_table, dead_letter_table, topic, batch
                 FROM outbox WHERE job = ?1 ORDER BY seq",
            )
            .map_err(&err)?;
        let rows = stmt
            .query_map([job], |r| {
                Ok(Pending {
                    seq: r.get(0)?,
                    tables: Tables {
                        windows: r.get(1)?,
                        late: r.get(2)?,
                        dead: r.get(3)?,
                    },
                    source: r.get(4)?,
                    batch: r.get(5)?,
                })
            })
            .map_err(&err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&err);
        rows
    }

    /// Commits a cycle's state (see [`CycleCommit`]) in one transaction.
    pub fn commit_state(&self, job: &str, c: &CycleCommit<'_>) -> Result<()> {
        let mut db = self.db();
        let err = sql_err(&self.path);
        let tx = db.transaction().map_err(&err)?;
        write_state(&tx, job, c).map_err(&err)?;
        crate::fault::crash_point("checkpoint-before-commit");
        tx.commit().map_err(&err)?;
        Ok(())
    }

    /// Forgets the states before `base`, whose batch is known to be in DuckDB (at the end of a
    /// run, so that nothing is left in doubt).
    pub fn settle(&self, job: &str, base: i64) -> Result<()> {
        self.db()
            .execute(
                "DELETE FROM job_state WHERE job = ?1 AND seq < ?2",
                params![job, base],
            )
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    /// Forgets output of an older checkpoint's outbox that DuckDB has durably applied.
    pub fn applied(&self, job: &str, seq: i64) -> Result<()> {
        self.db()
            .execute(
                "DELETE FROM outbox WHERE job = ?1 AND seq = ?2",
                params![job, seq],
            )
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    /// Records a job started in the background (its call, as the extension encodes it), active:
    /// to be started again by the next process that resumes the database's jobs.
    pub fn record_background(&self, job: &str, call: &str, now_ms: i64) -> Result<()> {
        self.db()
            .execute(
                "INSERT OR REPLACE INTO background_jobs VALUES (?1, ?2, 1, ?3)",
                params![job, call, now_ms],
            )
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    /// Marks a recorded background job as no longer to be resumed (stopped by its user,
    /// finished, failed). Returns whether it was recorded as active.
    pub fn deactivate_background(&self, job: &str, now_ms: i64) -> Result<bool> {
        let n = self
            .db()
            .execute(
                "UPDATE background_jobs SET active = 0, updated_ms = ?2 WHERE job = ?1 AND active = 1",
                params![job, now_ms],
            )
            .map_err(sql_err(&self.path))?;
        Ok(n > 0)
    }

    /// The background jobs recorded as active in the checkpoint file at `path`, by name, read
    /// without creating or changing anything (none when there is no such file or record).
    pub fn active_background(path: &str) -> Result<Vec<BackgroundJob>> {
        let Some(c) = Checkpoint::open_read_only(path)? else {
            return Ok(Vec::new());
        };
        let db = c.db();
        let has: i64 = db
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'background_jobs'",
                [],
                |r| r.get(0),
            )
            .map_err(sql_err(path))?;
        if has == 0 {
            return Ok(Vec::new());
        }
        let mut stmt = db
            .prepare("SELECT job, call FROM background_jobs WHERE active = 1 ORDER BY job")
            .map_err(sql_err(path))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(BackgroundJob {
                    job: r.get(0)?,
                    call: r.get(1)?,
                })
            })
            .map_err(sql_err(path))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql_err(path))
    }

    /// Every job's partitions (a job without partitions yet gets one row).
    pub fn rows(&self, job: Option<&str>) -> Result<Vec<CheckpointRow>> {
        let db = self.db();
        let err = sql_err(&self.path);
        let mut stmt = db
            .prepare(
                "SELECT j.job, j.source, p.partition, p.name, p.next_offset, p.max_event_time_ms,
                        j.watermark_ms, j.open_window_count,
                        (SELECT count(*) FROM outbox o WHERE o.job = j.job)
                          + max((SELECT count(*) FROM job_state s WHERE s.job = j.job) - 1, 0),
                        p.end_offset, j.window_ms, j.lateness_ms,
                        COALESCE(p.updated_ms, j.updated_ms), p.status
                 FROM jobs j LEFT JOIN partitions p ON p.job = j.job
                 WHERE ?1 IS NULL OR j.job = ?1
                 ORDER BY j.job, p.partition",
            )
            .map_err(&err)?;
        let rows = stmt
            .query_map([job], |r| {
                let lateness: i64 = r.get(11)?;
                let max: Option<i64> = r.get(5)?;
                let next: Option<i64> = r.get(4)?;
                let end: Option<i64> = r.get(9)?;
                Ok(CheckpointRow {
                    job: r.get(0)?,
                    source: r.get(1)?,
                    partition: r.get(2)?,
                    name: r.get::<_, Option<String>>(3)?.filter(|n| !n.is_empty()),
                    next_offset: next,
                    max_event_time_ms: max,
                    partition_watermark_ms: max.map(|m| m.saturating_sub(lateness)),
                    global_watermark_ms: r.get(6)?,
                    open_windows: r.get(7)?,
                    pending_batches: r.get(8)?,
                    end_offset: end,
                    lag: end.zip(next).map(|(e, n)| (e - n).max(0)),
                    window_ms: r.get(10)?,
                    lateness_ms: lateness,
                    last_update_ms: r.get(12)?,
                    status: r.get(13)?,
                    checkpoint: String::new(),
                })
            })
            .map_err(&err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&err);
        rows
    }
}

/// One row of `job_state`.
struct StoredState {
    seq: i64,
    tables: Tables,
    watermark_ms: i64,
    open_windows: Option<Vec<u8>>,
    open_window_count: usize,
    partitions: Vec<PartitionState>,
    updated_ms: i64,
}

/// A job's stored states, oldest first.
fn stored_states(db: &Connection, job: &str, path: &str) -> Result<Vec<StoredState>> {
    let err = sql_err(path);
    let mut stmt = db
        .prepare_cached(
            "SELECT seq, windows_table, late_table, dead_letter_table, watermark_ms, open_windows,
                    open_window_count, partitions, updated_ms
             FROM job_state WHERE job = ?1 ORDER BY seq",
        )
        .map_err(&err)?;
    let rows = stmt
        .query_map([job], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                Tables {
                    windows: r.get(1)?,
                    late: r.get(2)?,
                    dead: r.get(3)?,
                },
                r.get::<_, Option<i64>>(4)?,
                r.get::<_, Option<Vec<u8>>>(5)?,
                r.get::<_, i64>(6)?,
                r.get::<_, Vec<u8>>(7)?,
                r.get::<_, i64>(8)?,
            ))
        })
        .map_err(&err)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(&err)?;
    rows.into_iter()
        .map(|(seq, tables, wm, open, count, parts, updated_ms)| {
            Ok(StoredState {
                seq,
                tables,
                watermark_ms: wm.unwrap_or(NO_WATERMARK),
                open_windows: open.filter(|o| !o.is_empty()),
                open_window_count: usize::try_from(count).unwrap_or(0),
                partitions: PartitionState::decode_list(&parts)
                    .map_err(|e| EtlError::checkpoint(path, e))?,
                updated_ms,
            })
        })
        .collect()
}

/// The partitions of a job stored before `job_state`.
fn legacy_partitions(db: &Connection, job: &str, path: &str) -> Result<Vec<PartitionState>> {
    let err = sql_err(path);
    let mut stmt = db
        .prepare(
            "SELECT partition, name, next_offset, max_event_time_ms, last_delivery_ms, end_offset,
                    identity, status
             FROM partitions WHERE job = ?1 ORDER BY partition",
        )
        .map_err(&err)?;
    let partitions = stmt
        .query_map([job], |r| {
            Ok(PartitionState {
                partition: r.get(0)?,
                name: r.get(1)?,
                next_offset: r.get(2)?,
                max_event_time_ms: r.get(3)?,
                last_delivery_ms: r.get(4)?,
                end_offset: r.get(5)?,
                identity: r.get(6)?,
                status: r.get(7)?,
            })
        })
        .map_err(&err)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(&err);
    partitions
}

/// Stores `c` as the job's state for batch `c.seq`, drops the states before `c.base`, and
/// shows it in `jobs` and `partitions` (what `streaming_etl_checkpoint()` reads).
fn write_state(db: &Connection, job: &str, c: &CycleCommit<'_>) -> rusqlite::Result<()> {
    db.execute(
        "DELETE FROM job_state WHERE job = ?1 AND seq < ?2",
        params![job, c.base],
    )?;
    let mut partitions = Vec::new();
    PartitionState::encode_list(c.partitions, &mut partitions);
    let watermark = (c.watermark_ms != NO_WATERMARK).then_some(c.watermark_ms);
    let open = (!c.open_windows.is_empty()).then_some(c.open_windows);
    db.prepare_cached(
        "INSERT OR REPLACE INTO job_state (job, seq, windows_table, late_table, dead_letter_table,
             watermark_ms, open_windows, open_window_count, partitions, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        job,
        c.seq,
        c.tables.windows,
        c.tables.late,
        c.tables.dead,
        watermark,
        open,
        c.open_window_count as i64,
        partitions,
        c.now_ms
    ])?;
    db.execute(
        "UPDATE jobs SET next_seq = max(next_seq, ?2) WHERE job = ?1",
        params![job, c.seq + 1],
    )?;
    show_state(db, job, c)
}

/// Shows a state in `jobs` and `partitions` (for `streaming_etl_checkpoint()`; the state itself
/// is read from `job_state`).
fn show_state(db: &Connection, job: &str, c: &CycleCommit<'_>) -> rusqlite::Result<()> {
    let watermark = (c.watermark_ms != NO_WATERMARK).then_some(c.watermark_ms);
    db.prepare_cached(
        "UPDATE jobs SET watermark_ms = ?2, open_windows = NULL, open_window_count = ?3,
                updated_ms = ?4 WHERE job = ?1",
    )?
    .execute(params![
        job,
        watermark,
        c.open_window_count as i64,
        c.now_ms
    ])?;
    let mut up = db.prepare_cached(
        "INSERT INTO partitions (job, partition, name, next_offset, max_event_time_ms, last_delivery_ms, end_offset, updated_ms, identity, status)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (job, partition) DO UPDATE SET name = excluded.name,
           next_offset = excluded.next_offset, max_event_time_ms = excluded.max_event_time_ms,
           last_delivery_ms = excluded.last_delivery_ms, end_offset = excluded.end_offset,
           updated_ms = excluded.updated_ms, identity = excluded.identity,
           status = excluded.status",
    )?;
    for p in c.partitions {
        up.execute(params![
            job,
            p.partition,
            p.name,
            p.next_offset,
            p.max_event_time_ms,
            p.last_delivery_ms,
            p.end_offset,
            c.now_ms,
            p.identity,
            p.status
        ])?;
    }
    Ok(())
}

/// The rows of `streaming_etl_checkpoint()`: reads without creating or changing anything (a
/// checkpoint that does not exist yet has no rows). `memory` is the in-memory checkpoint, if
/// one was made.
pub fn inspect(
    location: &CheckpointLocation,
    memory: Option<Checkpoint>,
    job: Option<&str>,
) -> Result<Vec<CheckpointRow>> {
    let checkpoint = match location {
        CheckpointLocation::Memory => memory,
        CheckpointLocation::File(path) => Checkpoint::open_read_only(path)?,
    };
    let mut rows = match checkpoint {
        Some(c) => c.rows(job)?,
        None => Vec::new(),
    };
    for r in &mut rows {
        r.checkpoint = location.shown().to_string();
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// New files get 16 KiB pages, existing ones keep theirs, and whatever a file's page size,
    /// its WAL is folded into it once past 4 MiB (SQLite counts that threshold in pages).
    #[test]
    fn the_wal_is_checkpointed_at_4_mib_whatever_the_page_size() {
        let dir = std::env::temp_dir().join(format!("setl-wal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, existing) in [("new", None), ("4k", Some(4096)), ("64k", Some(65536))] {
            let path = dir.join(name).to_string_lossy().into_owned();
            let _ = std::fs::remove_file(&path);
            if let Some(size) = existing {
                Connection::open(&path)
                    .unwrap()
                    .execute_batch(&format!("PRAGMA page_size = {size}; CREATE TABLE t (x);"))
                    .unwrap();
            }
            let c = Checkpoint::open_file(&path).unwrap();
            let db = c.db();
            let size = page_size(&db).unwrap();
            assert_eq!(size, existing.unwrap_or(16384), "{name}");
            let pages: i64 = db
                .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
                .unwrap();
            assert_eq!(pages * size, 4 << 20, "{name}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A reader polling a checkpoint while its first run creates it sees no rows or all its
    /// tables, never a `jobs` table without `partitions` ("no such table: partitions").
    #[test]
    fn a_checkpoint_being_created_reads_as_none_or_whole() {
        let dir = std::env::temp_dir().join(format!("setl-new-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..40 {
            let path = dir.join(format!("c{i}")).to_string_lossy().into_owned();
            let location = CheckpointLocation::File(path.clone());
            let writer = {
                let path = path.clone();
                std::thread::spawn(move || Checkpoint::open_file(&path).map(|_| ()))
            };
            while !writer.is_finished() {
                if let Err(e) = inspect(&location, None, None) {
                    panic!("{e}");
                }
            }
            writer.join().unwrap().unwrap();
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A recorded background job is active until deactivated; recording it again (a new start)
    /// replaces its call and makes it active again; a file without records reads as none.
    #[test]
    fn background_jobs_are_recorded_until_deactivated() {
        let dir = std::env::temp_dir().join(format!("setl-bg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ckpt").to_string_lossy().into_owned();
        let _ = std::fs::remove_file(&path);
        assert!(Checkpoint::active_background(&path).unwrap().is_empty());
        let c = Checkpoint::open_file(&path).unwrap();
        assert!(Checkpoint::active_background(&path).unwrap().is_empty());
        c.record_background("a", "call a", 1).unwrap();
        c.record_background("b", "call b", 1).unwrap();
        let names = |v: Vec<BackgroundJob>| v.into_iter().map(|b| b.job).collect::<Vec<_>>();
        assert_eq!(
            names(Checkpoint::active_background(&path).unwrap()),
            ["a", "b"]
        );
        assert!(c.deactivate_background("a", 2).unwrap());
        assert!(!c.deactivate_background("a", 3).unwrap());
        assert!(!c.deactivate_background("nope", 3).unwrap());
        assert_eq!(names(Checkpoint::active_background(&path).unwrap()), ["b"]);
        c.record_background("a", "call a2", 4).unwrap();
        let got = Checkpoint::active_background(&path).unwrap();
        assert_eq!(
            got[0],
            BackgroundJob {
                job: "a".into(),
                call: "call a2".into()
            }
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
