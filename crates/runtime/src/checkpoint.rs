//! The side checkpoint: a SQLite database (WAL, synchronous=FULL) holding, per job, its
//! settings, each partition's next offset and event-time progress, the watermark floor, the
//! open windows, and an outbox of output not yet confirmed in DuckDB.
//!
//! A cycle commits its new state together with its output rows in one SQLite transaction,
//! then applies the output to DuckDB idempotently and removes it from the outbox. A killed run
//! leaves either the old state (the cycle is redone) or the new state with its output in the
//! outbox (re-applied by the next run): nothing is lost and nothing is counted twice.

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
CREATE TABLE IF NOT EXISTS outbox (
  job TEXT NOT NULL,
  seq INTEGER NOT NULL,
  windows_table TEXT NOT NULL,
  late_table TEXT NOT NULL,
  dead_letter_table TEXT NOT NULL,
  topic TEXT NOT NULL,
  batch BLOB NOT NULL,
  PRIMARY KEY (job, seq));
";

/// Columns added after version 0.1, added to older checkpoints when they are opened.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("jobs", "settings", "TEXT NOT NULL DEFAULT ''"),
    ("partitions", "identity", "TEXT NOT NULL DEFAULT ''"),
    ("partitions", "status", "TEXT NOT NULL DEFAULT ''"),
];

/// A job as stored.
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
}

/// Output committed to the outbox but not yet confirmed in DuckDB.
pub struct Pending {
    pub seq: i64,
    /// The tables the batch goes to, as the sink named them.
    pub tables: Tables,
    /// The job's source as given (the outbox's `topic` column), which fills the `topic` column
    /// of batches stored by version 0.1.
    pub source: String,
    pub batch: Vec<u8>,
}

/// What one cycle commits.
pub struct CycleCommit<'a> {
    pub watermark_ms: i64,
    pub open_windows: &'a [u8],
    pub open_window_count: usize,
    pub partitions: &'a [PartitionState],
    /// The cycle's output, encoded, with where it goes; None when the cycle produced nothing.
    pub output: Option<&'a Pending>,
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

fn create_schema(conn: &Connection, path: &str) -> Result<()> {
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
            .map_err(&err)?;
        Ok(Some(StoredJob {
            settings,
            watermark_ms: watermark.unwrap_or(NO_WATERMARK),
            open_windows,
            next_seq,
            created_ms,
            partitions,
        }))
    }

    pub fn create_job(&self, job: &str, s: &JobSettings, now_ms: i64) -> Result<()> {
        self.db()
            .execute(
                "INSERT INTO jobs (job, source, window_ms, lateness_ms, key_field, time_field, value_field, created_ms, updated_ms, settings)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9)",
                params![job, s.source, s.window_ms, s.lateness_ms, s.key_field, s.time_field, s.value_field, now_ms, s.extra_text()],
            )
            .map_err(|e| EtlError::checkpoint(&self.path, format!("cannot write it: {e}")))?;
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

    /// Commits a cycle: state and output in one transaction.
    pub fn commit_cycle(&self, job: &str, c: &CycleCommit<'_>) -> Result<()> {
        let mut db = self.db();
        let err = sql_err(&self.path);
        let tx = db.transaction().map_err(&err)?;
        let watermark = (c.watermark_ms != NO_WATERMARK).then_some(c.watermark_ms);
        let next_seq = c.output.map(|p| p.seq + 1);
        tx.execute(
            "UPDATE jobs SET watermark_ms = ?2, open_windows = ?3, open_window_count = ?4,
                    next_seq = COALESCE(?5, next_seq), updated_ms = ?6 WHERE job = ?1",
            params![
                job,
                watermark,
                c.open_windows,
                c.open_window_count as i64,
                next_seq,
                c.now_ms
            ],
        )
        .map_err(&err)?;
        {
            let mut up = tx
                .prepare_cached(
                    "INSERT INTO partitions (job, partition, name, next_offset, max_event_time_ms, last_delivery_ms, end_offset, updated_ms, identity, status)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                     ON CONFLICT (job, partition) DO UPDATE SET name = excluded.name,
                       next_offset = excluded.next_offset, max_event_time_ms = excluded.max_event_time_ms,
                       last_delivery_ms = excluded.last_delivery_ms, end_offset = excluded.end_offset,
                       updated_ms = excluded.updated_ms, identity = excluded.identity,
                       status = excluded.status",
                )
                .map_err(&err)?;
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
                ])
                .map_err(&err)?;
            }
        }
        if let Some(p) = c.output {
            tx.execute(
                "INSERT INTO outbox (job, seq, windows_table, late_table, dead_letter_table, topic, batch)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![job, p.seq, p.tables.windows, p.tables.late, p.tables.dead, p.source, p.batch],
            )
            .map_err(&err)?;
        }
        crate::fault::crash_point("checkpoint-before-commit");
        tx.commit().map_err(&err)?;
        Ok(())
    }

    /// Forgets output that DuckDB has durably applied.
    pub fn applied(&self, job: &str, seq: i64) -> Result<()> {
        self.db()
            .execute(
                "DELETE FROM outbox WHERE job = ?1 AND seq = ?2",
                params![job, seq],
            )
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    /// Every job's partitions (a job without partitions yet gets one row).
    pub fn rows(&self, job: Option<&str>) -> Result<Vec<CheckpointRow>> {
        let db = self.db();
        let err = sql_err(&self.path);
        let mut stmt = db
            .prepare(
                "SELECT j.job, j.source, p.partition, p.name, p.next_offset, p.max_event_time_ms,
                        j.watermark_ms, j.open_window_count,
                        (SELECT count(*) FROM outbox o WHERE o.job = j.job),
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
                })
            })
            .map_err(&err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&err);
        rows
    }
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
    match checkpoint {
        Some(c) => c.rows(job),
        None => Ok(Vec::new()),
    }
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
}
