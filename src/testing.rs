//! Test hooks: `STREAMING_ETL_CRASH_AT=<point>[:<n>]` kills the process (SIGKILL) the n-th time
//! (default 1st) execution reaches the named point, so that reliability tests can hit the
//! narrow windows a random kill rarely lands in. Unset, a crash point costs one relaxed load.

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
