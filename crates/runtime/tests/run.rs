//! A run end to end without DuckDB or Kafka: an in-memory or file checkpoint, a memory source
//! and a sink that keeps tables in memory (keyed like the real ones, counting any row written
//! twice) with the batch markers the protocol asks about. Stop and resume, crashes between the
//! two commits, settings mismatches and the job lock.

mod common;

use common::{config, FixedClock};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use streaming_etl_core::{
    EtlError, MemorySource, OutputSchemas, OwnedCell, PartitionState, Result, Source,
};
use streaming_etl_runtime::checkpoint::Checkpoint;
use streaming_etl_runtime::config::{CheckpointLocation, JobConfig};
use streaming_etl_runtime::job::{Run, RunEnv};
use streaming_etl_runtime::lock::{JobLock, MemoryLocks};
use streaming_etl_runtime::sink::{Output, OutputSink, Tables, Written};

/// Table name → primary key (shown) → row.
type TableRows = BTreeMap<String, BTreeMap<String, Vec<OwnedCell>>>;

/// A batch's number and its stored form.
type StoredBatch = (i64, Vec<u8>);

/// Tables in memory: rows keyed by their primary key, as DuckDB's are; a row whose key is
/// there already is counted as doubled (no window, late event or dead letter is written twice).
/// And each job's latest batch marker.
#[derive(Default, Clone)]
struct MemoryTables {
    rows: Arc<Mutex<TableRows>>,
    doubled: Arc<AtomicUsize>,
    markers: Arc<Mutex<BTreeMap<(String, i64), i64>>>,
    /// The batch of the failed apply, as an older version's outbox held it.
    failed_batch: Arc<Mutex<Option<StoredBatch>>>,
}

impl MemoryTables {
    fn snapshot(&self) -> TableRows {
        assert_eq!(self.doubled.load(Ordering::SeqCst), 0, "rows written twice");
        self.rows.lock().unwrap().clone()
    }

    fn count(&self, table: &str) -> usize {
        self.rows.lock().unwrap().get(table).map_or(0, |t| t.len())
    }
}

/// Fails `apply` after `ok_applies` successful ones: before writing (a failed DuckDB
/// transaction) or after (a crash between DuckDB's commit and clearing the outbox).
struct MemorySink {
    tables: MemoryTables,
    ok_applies: Arc<AtomicUsize>,
    fail_after_write: bool,
}

impl OutputSink for MemorySink {
    fn prepare(&mut self, _tables: &Tables, _schemas: &OutputSchemas) -> Result<()> {
        Ok(())
    }

    fn apply(&mut self, out: &Output<'_>) -> Result<Written> {
        let left = self.ok_applies.load(Ordering::SeqCst);
        if left == 0 && !self.fail_after_write {
            let mut stored = Vec::new();
            out.batch.encode(out.schemas, &mut stored);
            *self.tables.failed_batch.lock().unwrap() = Some((out.seq, stored));
            return Err(EtlError::Sink {
                table: out.tables.windows.clone(),
                message: "injected failure".into(),
            });
        }
        let mut all = self.tables.rows.lock().unwrap();
        let parts = out.tables.as_ref().zip(out.schemas.as_ref());
        for ((name, schema), rows) in parts.zip(out.batch.as_ref()) {
            let table = all.entry(name.clone()).or_default();
            let key_cols: Vec<usize> = schema
                .primary_key
                .iter()
                .map(|k| schema.columns.iter().position(|c| &c.name == k).unwrap())
                .collect();
            for row in rows.to_vec() {
                let key = format!(
                    "{:?}",
                    key_cols.iter().map(|&i| &row[i]).collect::<Vec<_>>()
                );
                if table.insert(key, row).is_some() {
                    self.tables.doubled.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        self.tables
            .markers
            .lock()
            .unwrap()
            .insert((out.job.to_string(), out.job_created_ms), out.seq);
        if left == 0 {
            return Err(EtlError::Internal("injected crash after the write".into()));
        }
        self.ok_applies.fetch_sub(1, Ordering::SeqCst);
        Ok(Written::default())
    }

    fn landed(&mut self, _: &Tables, job: &str, created_ms: i64, seq: i64) -> Result<bool> {
        let markers = self.tables.markers.lock().unwrap();
        Ok(markers
            .get(&(job.to_string(), created_ms))
            .is_some_and(|&m| m >= seq))
    }
}

struct Harness {
    checkpoint: Checkpoint,
    locks: Arc<MemoryLocks>,
    tables: MemoryTables,
    /// Successful applies left before the sink fails (across runs).
    ok_applies: Arc<AtomicUsize>,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            checkpoint: Checkpoint::open_memory().unwrap(),
            locks: Arc::new(MemoryLocks::default()),
            tables: MemoryTables::default(),
            ok_applies: Arc::new(AtomicUsize::new(usize::MAX)),
        }
    }

    fn env(&self, fail_after_write: bool) -> Result<RunEnv> {
        let messages = common::data(3000);
        Ok(RunEnv {
            checkpoint: self.checkpoint.clone(),
            lock: JobLock::memory(&self.locks, "job")?,
            sink: Box::new(MemorySink {
                tables: self.tables.clone(),
                ok_applies: Arc::clone(&self.ok_applies),
                fail_after_write,
            }),
            open_source: Box::new(move |known: &[PartitionState]| {
                let starts: Vec<i64> = (0..messages.len() as i32)
                    .map(|p| {
                        known
                            .iter()
                            .find(|s| s.partition == p)
                            .map_or(0, |s| s.next_offset)
                    })
                    .collect();
                Ok(Box::new(MemorySource::new(messages, &starts)) as Box<dyn Source>)
            }),
            clock: Arc::new(FixedClock),
        })
    }

    /// Runs to the end of the run; returns the last status.
    fn run(&self, cfg: JobConfig, fail_after_write: bool) -> Result<&'static str> {
        let mut run = Run::start(Arc::new(cfg), self.env(fail_after_write)?)?;
        while run.cycle()? {}
        Ok(run.stats().status)
    }
}

fn straight() -> TableRows {
    let h = Harness::new();
    assert_eq!(
        h.run(config(CheckpointLocation::Memory, None, 1000), false)
            .unwrap(),
        "caught_up"
    );
    let t = h.tables.snapshot();
    let windows: i64 = t["windows"]
        .values()
        .map(|r| match r[3] {
            OwnedCell::I64(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(
        windows as usize + h.tables.count("late") + h.tables.count("dead"),
        900,
        "every message accounted for once"
    );
    assert!(h.tables.count("late") > 0 && h.tables.count("dead") > 0);
    t
}

#[test]
fn a_job_stopped_again_and_again_ends_like_a_straight_run() {
    let want = straight();
    for (step, threads) in [(1, 1), (13, 1), (250, 1), (13, 3), (250, 2)] {
        let h = Harness::new();
        let mut runs = 0;
        let mut cfg = config(CheckpointLocation::Memory, Some(step), 1000);
        cfg.threads = threads;
        while h.run(cfg.clone(), false).unwrap() != "caught_up" {
            runs += 1;
            assert!(runs < 2000);
        }
        assert_eq!(
            h.tables.snapshot(),
            want,
            "stopping every {step} messages on {threads} threads"
        );
    }
}

#[test]
fn output_committed_but_not_written_is_written_by_the_next_run() {
    let want = straight();
    // The sink fails before writing, and (second case) after writing, as if the run died
    // between DuckDB's commit and the next: the failed run reports the error and leaves its
    // last state in doubt; the next run keeps it (the batch landed) or drops it and reads the
    // cycle again, and the job ends exactly like a straight run, nothing written twice.
    for fail_after_write in [false, true] {
        for ok in [0, 1, 3] {
            let h = Harness::new();
            let mut cfg = config(CheckpointLocation::Memory, Some(200), 1000);
            // Commits on a helper thread, and where they are handed over.
            cfg.threads = 1 + ok % 2;
            let mut failures = 0;
            h.ok_applies.store(ok, Ordering::SeqCst);
            loop {
                match h.run(cfg.clone(), fail_after_write) {
                    Ok("caught_up") => break,
                    Ok(_) => {}
                    Err(e) => {
                        assert!(e.to_string().contains("injected"), "{e}");
                        failures += 1;
                        let pending: i64 = h
                            .checkpoint
                            .rows(Some("job"))
                            .unwrap()
                            .iter()
                            .map(|r| r.pending_batches)
                            .max()
                            .unwrap_or(0);
                        assert!(pending >= 1, "the failed batch's state is in doubt");
                        h.ok_applies.store(usize::MAX, Ordering::SeqCst);
                    }
                }
            }
            assert_eq!(failures, 1);
            assert_eq!(
                h.tables.snapshot(),
                want,
                "fail_after_write {fail_after_write}, after {ok} batches"
            );
            let pending: i64 = h
                .checkpoint
                .rows(Some("job"))
                .unwrap()
                .iter()
                .map(|r| r.pending_batches)
                .sum();
            assert_eq!(pending, 0);
        }
    }
}

#[test]
fn a_cycle_that_failed_to_commit_counts_nowhere() {
    // A run whose batch fails to commit reports none of it; the run after it reads that cycle
    // again, and the runs' counts add up to what the tables hold, every message once.
    let h = Harness::new();
    let first = config(CheckpointLocation::Memory, Some(300), 1000);
    let mut run = Run::start(Arc::new(first), h.env(false).unwrap()).unwrap();
    while run.cycle().unwrap() {}
    let a = run.stats();
    drop(run);
    assert_eq!(a.events_consumed, 300);
    let rest = config(CheckpointLocation::Memory, None, 1000);
    h.ok_applies.store(0, Ordering::SeqCst);
    let mut run = Run::start(Arc::new(rest.clone()), h.env(false).unwrap()).unwrap();
    let failed = loop {
        match run.cycle() {
            Ok(true) => {}
            Ok(false) => panic!("the sink should have failed"),
            Err(e) => break e,
        }
    };
    assert!(failed.to_string().contains("injected"), "{failed}");
    let b = run.stats();
    drop(run);
    assert_eq!(
        (
            b.events_consumed,
            b.windows_emitted,
            b.late_events,
            b.dead_letters
        ),
        (0, 0, 0, 0)
    );
    h.ok_applies.store(usize::MAX, Ordering::SeqCst);
    let mut run = Run::start(Arc::new(rest), h.env(false).unwrap()).unwrap();
    while run.cycle().unwrap() {}
    let c = run.stats();
    assert_eq!(a.events_consumed + c.events_consumed, 900);
    let counted = |table: &str| h.tables.count(table) as u64;
    assert_eq!(
        (
            a.windows_emitted + c.windows_emitted,
            a.late_events + c.late_events,
            a.dead_letters + c.dead_letters
        ),
        (counted("windows"), counted("late"), counted("dead"))
    );
}

#[test]
fn other_settings_than_the_checkpoints_are_refused_naming_the_setting() {
    let h = Harness::new();
    h.run(config(CheckpointLocation::Memory, Some(10), 1000), false)
        .unwrap();
    let e = h
        .run(config(CheckpointLocation::Memory, None, 500), false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "job 'job' was checkpointed with window_ms = 1000, but this run has window_ms = 500; run it with the same settings, or under another job name (job := '...') or checkpoint"
    );
}

#[test]
fn a_second_run_of_a_running_job_is_refused() {
    let h = Harness::new();
    let first = Run::start(
        Arc::new(config(CheckpointLocation::Memory, None, 1000)),
        h.env(false).unwrap(),
    )
    .unwrap();
    let e = h.env(false).err().unwrap().to_string();
    assert!(e.contains("job 'job' is already running"), "{e}");
    drop(first);
    assert!(h.env(false).is_ok());
}

/// Runs the job over the file checkpoint at `path` until it has caught up, on a new checkpoint
/// connection each run as separate processes would have; what its tables hold then.
fn run_reopening(path: &str) -> TableRows {
    let tables = MemoryTables::default();
    let loc = CheckpointLocation::File(path.to_string());
    for _ in 0..100 {
        let h = Harness {
            checkpoint: Checkpoint::open_file(path).unwrap(),
            locks: Arc::new(MemoryLocks::default()),
            tables: tables.clone(),
            ok_applies: Arc::new(AtomicUsize::new(usize::MAX)),
        };
        if h.run(config(loc.clone(), Some(321), 1000), false).unwrap() == "caught_up" {
            break;
        }
    }
    tables.snapshot()
}

/// A directory of this process's own for a test's checkpoint file (removed when dropped), and
/// the file's path in it.
struct ScratchFile(std::path::PathBuf, String);

impl ScratchFile {
    fn new(test: &str) -> ScratchFile {
        let dir = std::env::temp_dir().join(format!("setl-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jobs.ckpt").to_string_lossy().into_owned();
        ScratchFile(dir, path)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_file_checkpoint_survives_reopening() {
    let file = ScratchFile::new("run");
    assert_eq!(run_reopening(&file.1), straight());
}

/// A checkpoint file an earlier version made with 4 KiB pages (new ones get 16 KiB) keeps them
/// and serves as before.
#[test]
fn a_checkpoint_file_with_4_kib_pages_serves_as_before() {
    let file = ScratchFile::new("pages");
    let old = rusqlite::Connection::open(&file.1).unwrap();
    old.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; CREATE TABLE earlier (x);",
    )
    .unwrap();
    assert_eq!(run_reopening(&file.1), straight());
    let size: i64 = old.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    assert_eq!(size, 4096);
}

/// A checkpoint of the version before this protocol: the state committed with its batch in an
/// outbox, the batch not yet in DuckDB (the run died between the two). The next run applies the
/// outbox, adopts the state, and the job ends like a straight run.
#[test]
fn an_older_checkpoint_with_its_outbox_is_finished_and_adopted() {
    let file = ScratchFile::new("legacy");
    let tables = MemoryTables::default();
    let loc = CheckpointLocation::File(file.1.clone());
    let harness = |ok: usize| Harness {
        checkpoint: Checkpoint::open_file(&file.1).unwrap(),
        locks: Arc::new(MemoryLocks::default()),
        tables: tables.clone(),
        ok_applies: Arc::new(AtomicUsize::new(ok)),
    };
    // Two batches land, the third fails before it is written: its state is in doubt.
    let first = harness(2);
    let e = loop {
        if let Err(e) = first.run(config(loc.clone(), Some(200), 1000), false) {
            break e;
        }
    };
    assert!(e.to_string().contains("injected"), "{e}");
    drop(first);
    let (seq, batch) = tables.failed_batch.lock().unwrap().take().unwrap();
    // What the older version would have left: that state in `jobs` and `partitions` (shown
    // there already), its batch in the outbox, no `job_state`.
    let db = rusqlite::Connection::open(&file.1).unwrap();
    db.execute_batch(&format!(
        "UPDATE jobs SET open_windows = (SELECT open_windows FROM job_state WHERE seq = {seq}),
                         watermark_ms = (SELECT watermark_ms FROM job_state WHERE seq = {seq}),
                         next_seq = {seq} + 1;
         DELETE FROM job_state;"
    ))
    .unwrap();
    db.execute(
        "INSERT INTO outbox VALUES ('job', ?1, 'windows', 'late', 'dead', 'mem', ?2)",
        rusqlite::params![seq, batch],
    )
    .unwrap();
    drop(db);
    for _ in 0..100 {
        if harness(usize::MAX)
            .run(config(loc.clone(), Some(321), 1000), false)
            .unwrap()
            == "caught_up"
        {
            break;
        }
    }
    assert_eq!(tables.snapshot(), straight());
    let c = Checkpoint::open_file(&file.1).unwrap();
    let rows = c.rows(Some("job")).unwrap();
    assert!(rows.iter().all(|r| r.pending_batches == 0));
}

#[test]
fn an_interrupt_ends_a_quiet_follow_cycle_at_once_with_everything_read_kept() {
    let want = straight();
    let h = Harness::new();
    let mut cfg = config(CheckpointLocation::Memory, None, 1000);
    cfg.follow = true;
    cfg.checkpoint_interval_ms = 60_000;
    let mut run = Run::start(Arc::new(cfg), h.env(false).unwrap()).unwrap();
    let stop = run.interrupter();
    let asked = std::time::Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
    });
    // Everything is read at once, then the cycle waits for more: the interrupt ends it, not its
    // minute-long deadline.
    assert!(
        run.cycle().unwrap(),
        "the run goes on; only its cycle ended"
    );
    let took = asked.elapsed();
    t.join().unwrap();
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    assert!(run.stats().events_consumed > 0);
    drop(run);
    // What it read is committed: a bounded run of the job reads nothing more and ends where a
    // straight run ends.
    let mut cfg = config(CheckpointLocation::Memory, None, 1000);
    cfg.follow = false;
    assert_eq!(h.run(cfg, false).unwrap(), "caught_up");
    assert_eq!(h.tables.snapshot(), want);
}
