//! Event-time watermarks. A partition's watermark is the largest event time it has delivered
//! minus the allowed lateness; the global watermark is the minimum over the partitions a run
//! reads, leaving out idle ones. A partition that has delivered nothing holds the global
//! watermark back (as in Flink), so reading partitions one after another, or one starting late,
//! never turns another partition's on-time events into late ones. The global watermark never
//! goes backwards: it is kept as a floor, also across restarts.

/// The global watermark before any partition has advanced it.
pub const NO_WATERMARK: i64 = i64::MIN;

/// What is known about one partition's event-time progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionClock {
    /// Largest event time delivered so far; `None` until the first event.
    pub max_event_time_ms: Option<i64>,
    /// Wall-clock time (epoch ms) of its last delivery, or of when the job first saw it.
    pub last_delivery_ms: i64,
    pub idle: bool,
    /// For good out of the global watermark (a rolling file that a later file followed).
    pub released: bool,
}

impl PartitionClock {
    pub fn new(max_event_time_ms: Option<i64>, last_delivery_ms: i64) -> Self {
        PartitionClock {
            max_event_time_ms,
            last_delivery_ms,
            idle: false,
            released: false,
        }
    }

    /// Whether it holds the global watermark back.
    fn counts(&self) -> bool {
        !self.idle && !self.released
    }
}

/// Where a partition stands in the event-time merge: its largest event time so far, then its
/// index (the partition with the least goes next).
pub(crate) type OrderKey = (i64, usize);

pub(crate) struct Watermarks {
    lateness_ms: i64,
    idle_timeout_ms: Option<i64>,
    clocks: Vec<PartitionClock>,
    global_ms: i64,
    /// The minimum partition watermark over non-idle partitions (NO_WATERMARK while one of
    /// them has delivered nothing), cached so that an event only triggers a recomputation when
    /// it advances the partition that holds the minimum.
    active_min_ms: i64,
}

impl Watermarks {
    #[inline]
    pub(crate) fn order_key(&self, idx: usize) -> OrderKey {
        (self.max_event_time_ms(idx).unwrap_or(i64::MIN), idx)
    }

    /// The partition to read next (the least order key among those not `exhausted`), and the
    /// order key it may run up to before another partition comes first.
    pub(crate) fn in_order(&self, exhausted: &[bool]) -> (Option<OrderKey>, Option<OrderKey>) {
        let mut best: Option<OrderKey> = None;
        let mut second: Option<OrderKey> = None;
        for (idx, _) in exhausted.iter().enumerate().filter(|(_, &done)| !done) {
            let k = self.order_key(idx);
            if best.is_none_or(|b| k < b) {
                second = best;
                best = Some(k);
            } else if second.is_none_or(|s| k < s) {
                second = Some(k);
            }
        }
        (best, second)
    }

    /// `floor_ms` is the global watermark the job had reached before (NO_WATERMARK if none).
    pub fn new(
        lateness_ms: i64,
        idle_timeout_ms: Option<i64>,
        floor_ms: i64,
        clocks: Vec<PartitionClock>,
    ) -> Watermarks {
        let mut w = Watermarks {
            lateness_ms,
            idle_timeout_ms,
            clocks,
            global_ms: floor_ms,
            active_min_ms: NO_WATERMARK,
        };
        w.recompute();
        w
    }

    #[inline]
    pub(crate) fn global_ms(&self) -> i64 {
        self.global_ms
    }

    pub(crate) fn clocks(&self) -> &[PartitionClock] {
        &self.clocks
    }

    #[inline]
    pub fn max_event_time_ms(&self, idx: usize) -> Option<i64> {
        self.clocks[idx].max_event_time_ms
    }

    /// Records an event time of partition `idx`; returns whether the global watermark advanced.
    #[inline]
    pub(crate) fn observe(&mut self, idx: usize, event_time_ms: i64) -> bool {
        let lateness = self.lateness_ms;
        let active_min = self.active_min_ms;
        let c = &mut self.clocks[idx];
        let held_minimum = match c.max_event_time_ms {
            Some(m) if m >= event_time_ms => return false,
            Some(m) => c.counts() && m.saturating_sub(lateness) <= active_min,
            None => c.counts(),
        };
        c.max_event_time_ms = Some(event_time_ms);
        held_minimum && self.recompute()
    }

    /// Records that partition `idx` delivered at wall-clock `now_ms`: it is not idle.
    pub(crate) fn delivered(&mut self, idx: usize, now_ms: i64) -> bool {
        let c = &mut self.clocks[idx];
        c.last_delivery_ms = now_ms;
        if c.idle {
            c.idle = false;
            self.recompute()
        } else {
            false
        }
    }

    /// Marks partitions idle that have not delivered for `idle_timeout_ms` at wall-clock
    /// `now_ms`; returns whether the global watermark advanced. Partitions that went idle since
    /// the last look are taken in the order they went idle, so the result is the one a
    /// continuous look would have given (one partition going quiet before another lets the
    /// watermark move in between).
    pub(crate) fn refresh_idle(&mut self, now_ms: i64) -> bool {
        let Some(timeout) = self.idle_timeout_ms else {
            return false;
        };
        let mut newly: Vec<(i64, usize)> = self
            .clocks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.counts() && now_ms.saturating_sub(c.last_delivery_ms) >= timeout)
            .map(|(i, c)| (c.last_delivery_ms, i))
            .collect();
        newly.sort_unstable();
        let mut advanced = false;
        let mut k = 0;
        while k < newly.len() {
            // Partitions that went quiet at the same instant go idle together.
            let at = newly[k].0;
            while k < newly.len() && newly[k].0 == at {
                self.clocks[newly[k].1].idle = true;
                k += 1;
            }
            advanced |= self.recompute();
        }
        advanced
    }

    /// Raises the floor (after a flush closed windows ahead of the watermark).
    pub(crate) fn raise_to(&mut self, ms: i64) {
        self.global_ms = self.global_ms.max(ms);
    }

    /// A partition that appeared during the run (it holds the watermark back until it
    /// delivers, as every partition does).
    pub fn add(&mut self, clock: PartitionClock) -> bool {
        self.clocks.push(clock);
        self.recompute()
    }

    /// Takes partition `idx` out of the global watermark for good; returns whether it advanced.
    pub fn release(&mut self, idx: usize) -> bool {
        match self.clocks.get_mut(idx) {
            Some(c) if !c.released => {
                c.released = true;
                self.recompute()
            }
            _ => false,
        }
    }

    /// Whether every partition has been silent for `quiet_ms` of wall clock at `now_ms`.
    pub(crate) fn all_quiet(&self, now_ms: i64, quiet_ms: i64) -> bool {
        !self.clocks.is_empty()
            && self
                .clocks
                .iter()
                .all(|c| now_ms.saturating_sub(c.last_delivery_ms) >= quiet_ms)
    }

    fn recompute(&mut self) -> bool {
        let mut min = None::<i64>;
        for c in self.clocks.iter().filter(|c| c.counts()) {
            let pw = c
                .max_event_time_ms
                .map_or(NO_WATERMARK, |m| m.saturating_sub(self.lateness_ms));
            min = Some(min.map_or(pw, |x| x.min(pw)));
        }
        // With every partition idle there is nothing to move the watermark forward.
        self.active_min_ms = min.unwrap_or(NO_WATERMARK);
        if self.active_min_ms > self.global_ms {
            self.global_ms = self.active_min_ms;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(n: usize, lateness: i64) -> Watermarks {
        Watermarks::new(
            lateness,
            None,
            NO_WATERMARK,
            vec![PartitionClock::new(None, 0); n],
        )
    }

    #[test]
    fn partition_watermark_is_max_minus_lateness() {
        let mut w = marks(1, 200);
        assert!(w.observe(0, 1000));
        assert_eq!(w.global_ms(), 800);
        assert!(!w.observe(0, 900), "an older event does not move it");
        assert_eq!(w.clocks()[0].max_event_time_ms, Some(1000));
    }

    #[test]
    fn a_silent_partition_holds_the_global_watermark_back() {
        let mut w = marks(2, 0);
        // Partition 0 read to the end before partition 1 delivers anything.
        for t in 0..10_000 {
            w.observe(0, t);
        }
        assert_eq!(w.global_ms(), NO_WATERMARK);
        assert!(w.observe(1, 50));
        assert_eq!(w.global_ms(), 50);
        w.observe(1, 20_000);
        assert_eq!(w.global_ms(), 9_999);
    }

    #[test]
    fn never_goes_backwards() {
        let mut w = Watermarks::new(0, None, 5_000, vec![PartitionClock::new(None, 0); 2]);
        assert_eq!(w.global_ms(), 5_000);
        w.observe(0, 100);
        w.observe(1, 200);
        assert_eq!(w.global_ms(), 5_000, "the restored floor stays");
        w.observe(0, 7_000);
        w.observe(1, 6_000);
        assert_eq!(w.global_ms(), 6_000);
    }

    #[test]
    fn idle_partitions_stop_holding_it_back_until_they_deliver() {
        let mut w = Watermarks::new(
            0,
            Some(1_000),
            NO_WATERMARK,
            vec![PartitionClock::new(None, 0); 2],
        );
        w.delivered(0, 500);
        w.observe(0, 10_000);
        assert_eq!(w.global_ms(), NO_WATERMARK);
        assert!(!w.refresh_idle(900));
        assert!(w.refresh_idle(1_200), "partition 1 idle since 0");
        assert_eq!(w.global_ms(), 10_000);
        // Partition 1 wakes up behind: the global watermark does not go back.
        w.delivered(1, 1_300);
        w.observe(1, 50);
        assert_eq!(w.global_ms(), 10_000);
        w.observe(0, 20_000);
        assert_eq!(w.global_ms(), 10_000, "partition 1 holds it again");
        w.observe(1, 15_000);
        assert_eq!(w.global_ms(), 15_000);
    }

    #[test]
    fn partitions_going_idle_one_after_another_let_the_watermark_move_in_between() {
        // Partition 1 never delivered (seen at 0); partition 0 delivered at 10. Looking only at
        // 1_000, both are idle, but partition 1 went quiet first.
        let mut w = Watermarks::new(
            0,
            Some(100),
            NO_WATERMARK,
            vec![PartitionClock::new(None, 0); 2],
        );
        w.delivered(0, 10);
        w.observe(0, 5_000);
        assert!(w.refresh_idle(1_000));
        assert_eq!(w.global_ms(), 5_000);
    }

    #[test]
    fn all_idle_does_not_advance() {
        let mut w = Watermarks::new(
            0,
            Some(10),
            NO_WATERMARK,
            vec![PartitionClock::new(Some(100), 0); 2],
        );
        assert_eq!(w.global_ms(), 100);
        w.refresh_idle(1_000);
        assert_eq!(w.global_ms(), 100);
    }

    #[test]
    fn released_partitions_stop_holding_it_back_for_good() {
        let mut w = marks(2, 0);
        w.observe(0, 100);
        w.observe(1, 5_000);
        assert_eq!(w.global_ms(), 100);
        assert!(w.release(0));
        assert_eq!(w.global_ms(), 5_000);
        // A late line of the released file does not hold it back again.
        w.delivered(0, 1);
        w.observe(0, 150);
        w.observe(1, 6_000);
        assert_eq!(w.global_ms(), 6_000);
        // A partition that appears later holds it back until it delivers.
        assert!(!w.add(PartitionClock::new(None, 0)));
        w.observe(1, 7_000);
        assert_eq!(w.global_ms(), 6_000);
        w.observe(2, 6_500);
        assert_eq!(w.global_ms(), 6_500);
    }

    #[test]
    fn huge_lateness_saturates() {
        let mut w = marks(1, i64::MAX);
        w.observe(0, -5);
        assert_eq!(w.global_ms(), NO_WATERMARK);
    }
}
