//! Fault injection for the reliability tests, compiled only with the `fault-injection` feature
//! (the artifact users load has none of it). `STREAMING_ETL_CRASH_AT=<point>[:<n>]` kills the
//! process (SIGKILL) the n-th time (default 1st) execution reaches the named point, so tests hit
//! the narrow windows a random kill rarely lands in; `STREAMING_ETL_PANIC_AT=<point>` panics
//! there, to prove a bug surfaces as an SQL error and leaves DuckDB usable.

#[cfg(feature = "fault-injection")]
mod hooks {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    struct CrashAt {
        point: String,
        nth: u64,
        seen: AtomicU64,
    }

    fn crash_at() -> Option<&'static CrashAt> {
        static CRASH_AT: OnceLock<Option<CrashAt>> = OnceLock::new();
        CRASH_AT
            .get_or_init(|| {
                let spec = std::env::var("STREAMING_ETL_CRASH_AT").ok()?;
                let (point, nth) = match spec.rsplit_once(':') {
                    Some((p, n)) => (p.to_string(), n.parse().ok()?),
                    None => (spec, 1),
                };
                Some(CrashAt {
                    point,
                    nth,
                    seen: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    pub fn crash_point(name: &str) {
        if let Some(c) = crash_at() {
            if c.point == name && c.seen.fetch_add(1, Ordering::Relaxed) + 1 == c.nth {
                // SIGKILL from outside: no unwinding, no exit handlers, no flushing.
                let pid = std::process::id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status();
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
    }

    pub fn panic_point(name: &str) {
        static PANIC_AT: OnceLock<Option<String>> = OnceLock::new();
        if PANIC_AT
            .get_or_init(|| std::env::var("STREAMING_ETL_PANIC_AT").ok())
            .as_deref()
            == Some(name)
        {
            panic!("forced panic at '{name}' (STREAMING_ETL_PANIC_AT)");
        }
    }
}

/// Kills the process here if the test hook asks for it (no-op without `fault-injection`).
#[inline]
pub fn crash_point(_name: &str) {
    #[cfg(feature = "fault-injection")]
    hooks::crash_point(_name);
}

/// Panics here if the test hook asks for it (no-op without `fault-injection`).
#[inline]
pub fn panic_point(_name: &str) {
    #[cfg(feature = "fault-injection")]
    hooks::panic_point(_name);
}
