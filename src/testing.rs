//! Test hooks, inert unless their environment variable is set: `STREAMING_ETL_CRASH_AT=<point>[:<n>]`
//! kills the process (SIGKILL) the n-th time (default 1st) execution reaches the named point, so
//! reliability tests can hit the narrow windows a random kill rarely lands in;
//! `STREAMING_ETL_PANIC_AT=<point>` panics there.

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

/// Kills the process here if the test hook asks for it.
pub fn crash_point(name: &str) {
    if let Some(c) = crash_at() {
        if c.point == name && c.seen.fetch_add(1, Ordering::Relaxed) + 1 == c.nth {
            crate::ffi::kill_self();
        }
    }
}

/// Panics here if `STREAMING_ETL_PANIC_AT` names this point: proves that a bug surfaces as an SQL
/// error and leaves DuckDB usable (every callback contains panics).
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
