//! When a background job runs next: the start of a schedule's next run (`every := INTERVAL
//! ...`), and the backoff between the retries of a job that hit a transient fault. Plain
//! arithmetic on epoch milliseconds, tested without a clock.

/// The first retry waits this long; each further one twice as long, up to [`MAX_BACKOFF_MS`].
pub const FIRST_BACKOFF_MS: i64 = 1_000;
/// The longest wait between two retries.
pub const MAX_BACKOFF_MS: i64 = 60_000;

/// When the next scheduled run starts: the first tick of the schedule (`anchor_ms` + k ×
/// `every_ms`) after `now_ms`, the end of the last run. A run longer than the interval skips the
/// ticks it overran, as cron does: runs never overlap and never queue up.
pub fn next_start_ms(anchor_ms: i64, every_ms: i64, now_ms: i64) -> i64 {
    if now_ms < anchor_ms {
        return anchor_ms;
    }
    let ticks = (now_ms - anchor_ms) / every_ms + 1;
    anchor_ms.saturating_add(ticks.saturating_mul(every_ms))
}

/// The waits between the retries of a job after a transient fault: 1 s, 2 s, 4 s, ... up to a
/// minute; a run that gets going again resets it.
#[derive(Debug, Default)]
pub struct Backoff {
    attempts: u32,
}

impl Backoff {
    /// The wait before the next attempt.
    pub fn next_ms(&mut self) -> i64 {
        let wait = FIRST_BACKOFF_MS
            .saturating_mul(1_i64 << self.attempts.min(20))
            .min(MAX_BACKOFF_MS);
        self.attempts += 1;
        wait
    }

    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_run_is_the_next_tick_after_the_last_run_ended() {
        // Every 10 s from t = 1000: a run that ended at 5000 waits for 11000.
        assert_eq!(next_start_ms(1_000, 10_000, 5_000), 11_000);
        // Ended exactly on a tick: the tick after it (the run took that tick).
        assert_eq!(next_start_ms(1_000, 10_000, 11_000), 21_000);
        // Overran two ticks: skips them.
        assert_eq!(next_start_ms(1_000, 10_000, 33_000), 41_000);
        // Before the anchor: the anchor.
        assert_eq!(next_start_ms(1_000, 10_000, 500), 1_000);
        assert_eq!(next_start_ms(i64::MAX - 5, 10, i64::MAX - 1), i64::MAX);
    }

    #[test]
    fn backoff_doubles_up_to_a_minute_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<i64> = (0..9).map(|_| b.next_ms()).collect();
        assert_eq!(
            waits,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]
        );
        for _ in 0..100 {
            assert_eq!(b.next_ms(), 60_000);
        }
        b.reset();
        assert_eq!(b.next_ms(), 1_000);
    }
}
