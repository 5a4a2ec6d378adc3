//! The database's WAL as its background jobs see it: DuckDB folds the WAL into the database file
//! once it passes `checkpoint_threshold`, unless a transaction older than the commits in it is
//! still open (an open transaction, or a result left unread, on any connection of the database).
//! Then the WAL and DuckDB's memory grow for as long as that lasts, and nothing else says so: a
//! WAL that stays above twice the threshold for a while is shown, with what to do about it, in
//! `streaming_etl_jobs()`.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The watch's state (a panic elsewhere while it was held leaves it as it was: still usable).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long the WAL must stay above twice the threshold, and over how many cycles, before the
/// jobs say so (DuckDB checkpoints at a commit after the WAL passes the threshold, so a WAL
/// checkpointed normally comes back below it within a cycle or two).
const HELD_FOR: Duration = Duration::from_secs(20);
const HELD_CYCLES: u32 = 3;

/// DuckDB's default `checkpoint_threshold` (16 MiB), until the setting is read.
const DEFAULT_THRESHOLD: u64 = 16 << 20;

/// The WAL of one database file, watched by its background jobs.
pub struct WalWatch {
    path: String,
    inner: Mutex<Watch>,
}

struct Watch {
    threshold: u64,
    /// Since when, and over how many observations, the WAL has stayed above twice the threshold.
    above: Option<(Instant, u32)>,
}

/// What the jobs show of the WAL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WalState {
    pub bytes: Option<i64>,
    pub warning: Option<String>,
}

impl WalWatch {
    /// The watch of the database file at `db` (its WAL is `<db>.wal`).
    pub fn new(db: &str) -> WalWatch {
        WalWatch {
            path: format!("{db}.wal"),
            inner: Mutex::new(Watch {
                threshold: DEFAULT_THRESHOLD,
                above: None,
            }),
        }
    }

    /// DuckDB's `checkpoint_threshold` as a run starting read it (`current_setting`'s text).
    pub fn set_threshold(&self, shown: &str) {
        if let Some(bytes) = parse_size(shown) {
            lock(&self.inner).threshold = bytes;
        }
    }

    /// The WAL now (a job's cycle ended).
    pub fn observe(&self) -> WalState {
        let bytes = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        let mut w = lock(&self.inner);
        let limit = w.threshold.saturating_mul(2);
        if bytes <= limit {
            w.above = None;
            return WalState {
                bytes: Some(bytes as i64),
                warning: None,
            };
        }
        let (since, seen) = w.above.get_or_insert((Instant::now(), 0));
        *seen += 1;
        let held = since.elapsed();
        let warning = (held >= HELD_FOR && *seen >= HELD_CYCLES).then(|| {
            format!(
                "the WAL ({:.1} MB) has stayed above twice checkpoint_threshold ({:.1} MB) for {} s: DuckDB cannot checkpoint while a transaction older than the jobs' commits is open. Likely an open transaction or a result left unread on some connection of this database (in Python, a result read with fetchone() and kept); read results whole (fetchall) or close them, and end open transactions",
                bytes as f64 / 1e6,
                w.threshold as f64 / 1e6,
                held.as_secs()
            )
        });
        WalState {
            bytes: Some(bytes as i64),
            warning,
        }
    }
}

/// A size as DuckDB shows one (`16.0 MiB`, `976.5 KiB`, `1.0 GB`, `512 bytes`), in bytes.
pub fn parse_size(shown: &str) -> Option<u64> {
    let s = shown.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let n: f64 = s[..split].trim().parse().ok()?;
    let unit = s[split..].trim().to_ascii_lowercase();
    let scale: f64 = match unit.as_str() {
        "" | "b" | "byte" | "bytes" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (n >= 0.0).then_some((n * scale) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_duckdb_shows_them() {
        assert_eq!(parse_size("16.0 MiB"), Some(16 << 20));
        assert_eq!(parse_size("976.5 KiB"), Some(999_936));
        assert_eq!(parse_size("1.0 GB"), Some(1_000_000_000));
        assert_eq!(parse_size("512 bytes"), Some(512));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("3 parsecs"), None);
    }

    #[test]
    fn a_wal_held_above_twice_the_threshold_is_named_and_clears_once_checkpointed() {
        let dir = std::env::temp_dir().join(format!("setl-wal-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("db").to_string_lossy().into_owned();
        let w = WalWatch::new(&db);
        w.set_threshold("1.0 KiB");
        assert_eq!(w.observe().bytes, Some(0));
        std::fs::write(format!("{db}.wal"), vec![0u8; 4096]).unwrap();
        // Seen above, but not yet for long enough.
        for _ in 0..HELD_CYCLES {
            assert_eq!(w.observe().warning, None);
        }
        lock(&w.inner).above = Some((Instant::now() - HELD_FOR, HELD_CYCLES));
        let s = w.observe();
        assert_eq!(s.bytes, Some(4096));
        assert!(s.warning.unwrap().contains("a result left unread"));
        std::fs::write(format!("{db}.wal"), vec![0u8; 10]).unwrap();
        assert_eq!(w.observe().warning, None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
