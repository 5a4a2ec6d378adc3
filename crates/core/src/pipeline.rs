//! The pipeline: a source read into the engine in event-time order, cycle by cycle.
//!
//! Reading order: the next message always comes from the partition (among those with
//! something to deliver) whose largest event time so far is smallest, ties going to the lower
//! partition. That keeps partitions level in event time, so the global watermark moves and
//! windows close as early as they can, and it makes the order a function of the data and the
//! checkpointed state alone: a run that is stopped or killed and resumed processes the same
//! messages in the same order as a straight run, and so classifies the same events as late.
//! Messages are read and parsed ahead in chunks on the run's threads (`prefetch`); the merge
//! itself is one thread's, in this order. (Half of the file is its tests: order, resume,
//! threads.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{Engine, PartitionProgress};
use crate::error::Result;
use crate::prefetch::ReadAhead;
use crate::source::{Pull, Source};
use crate::watermark::NO_WATERMARK;

/// Why reading stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The cycle is over (time or output size); the run goes on.
    CycleEnd,
    /// Every partition is caught up.
    CaughtUp,
    MaxMessages,
    MaxRuntime,
}

/// Bounds of one cycle of reading, and how the run reads.
pub struct CycleLimits {
    /// Messages the run may still consume.
    pub remaining_messages: u64,
    /// Messages after which the cycle ends (the run goes on).
    pub max_cycle_messages: u64,
    pub cycle_deadline: Instant,
    pub run_deadline: Option<Instant>,
    /// The cycle ends once this many late/dead rows are waiting (bounds memory).
    pub max_pending_rows: usize,
    /// Keep reading what arrives instead of stopping when caught up.
    pub follow: bool,
    /// Rolling files: a caught-up partition stops holding the watermark back once a partition
    /// that sorts after it (by name) has delivered data.
    pub rolling: bool,
    /// Once every partition has been silent this long (wall clock), close every open window.
    pub quiet_flush_ms: Option<i64>,
    /// Set by another thread to end the cycle early (a job asked to stop while its source is
    /// quiet ends at once, not at the cycle's deadline).
    pub interrupt: Option<Arc<AtomicBool>>,
}

impl CycleLimits {
    /// A bounded run of at most `max` messages, in one cycle (tests).
    #[cfg(test)]
    pub(crate) fn for_tests(max: u64) -> CycleLimits {
        CycleLimits {
            remaining_messages: max,
            max_cycle_messages: u64::MAX,
            cycle_deadline: Instant::now() + Duration::from_secs(3600),
            run_deadline: None,
            max_pending_rows: usize::MAX,
            follow: false,
            rolling: false,
            quiet_flush_ms: None,
            interrupt: None,
        }
    }

    /// Whether another thread asked the cycle to end.
    pub fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|i| i.load(Ordering::Relaxed))
    }

    /// The stop a clock reading of `now` calls for: the run's deadline first, then the cycle's
    /// (or an interrupt).
    fn deadline_passed(&self, now: Instant) -> Option<Stop> {
        if self.run_deadline.is_some_and(|d| now >= d) {
            Some(Stop::MaxRuntime)
        } else if now >= self.cycle_deadline || self.interrupted() {
            Some(Stop::CycleEnd)
        } else {
            None
        }
    }

    fn next_deadline(&self) -> Instant {
        match self.run_deadline {
            Some(r) => r.min(self.cycle_deadline),
            None => self.cycle_deadline,
        }
    }
}

/// How often (in messages) the clock is read while one partition delivers.
const CLOCK_EVERY: u32 = 2048;
/// How often (in pulls) the clock is read while the reader moves between partitions.
const PULLS_PER_CLOCK: u32 = 16;
/// A continuous run waits at most this long at a time for more to read.
const WAIT: Duration = Duration::from_millis(50);
/// A continuous run looks for new partitions (files, topic partitions) this often.
const DISCOVER_EVERY: Duration = Duration::from_millis(1000);

/// What the reader keeps between the cycles of a run.
pub struct ReadState {
    /// Partitions caught up in this look (a continuous run looks again after a wait).
    pub exhausted: Vec<bool>,
    /// When the source was last asked for new partitions.
    last_discover: Instant,
    /// Chunks read and parsed ahead of the merge.
    ahead: ReadAhead,
}

impl ReadState {
    pub fn new(partitions: usize) -> ReadState {
        ReadState {
            exhausted: vec![false; partitions],
            last_discover: Instant::now(),
            ahead: ReadAhead::default(),
        }
    }

    /// Whether the source's own position in the partition (see `Source::position`) is where
    /// the engine stands: nothing it delivered is still waiting to be applied.
    pub fn drained(&self, idx: usize) -> bool {
        self.ahead.drained(idx)
    }

    /// Every partition may have more: the next read asks the source again (a continuous run
    /// after a wait).
    pub fn look_again(&mut self) {
        self.exhausted.fill(false);
        self.ahead.look_again();
    }

    /// Continuous runs: asks the source for new partitions when it is time to.
    fn discover_due(
        &mut self,
        engine: &mut Engine,
        source: &mut dyn Source,
        now_ms: i64,
    ) -> Result<()> {
        if self.last_discover.elapsed() >= DISCOVER_EVERY {
            self.last_discover = Instant::now();
            discover(engine, source, &mut self.exhausted, now_ms)?;
        }
        Ok(())
    }
}

/// Records what the source could not deliver as dead letters.
fn absorb_gaps(engine: &mut Engine, source: &mut dyn Source) {
    for g in source.take_gaps() {
        engine.record_gap(g.partition, g.from, &g.message);
    }
}

/// Rolling files: releases every caught-up partition that a later one (by name) has followed.
fn release_followed(engine: &mut Engine, source: &dyn Source, exhausted: &[bool]) {
    let parts = source.partitions();
    let Some(latest) = (0..parts.len())
        .filter(|&i| engine.max_event_time_ms(i).is_some())
        .map(|i| parts[i].name.as_str())
        .max()
    else {
        return;
    };
    let latest = latest.to_string();
    for (i, p) in parts.iter().enumerate() {
        if (exhausted.get(i).copied().unwrap_or(false) || p.gone)
            && !engine.is_released(i)
            && p.name.as_str() < latest.as_str()
        {
            engine.release(i);
        }
    }
}

/// Adds the partitions the source found since (continuous runs).
fn discover(
    engine: &mut Engine,
    source: &mut dyn Source,
    exhausted: &mut Vec<bool>,
    now_ms: i64,
) -> Result<()> {
    if source.discover()? > 0 {
        for p in &source.partitions()[exhausted.len()..] {
            engine.add_partition(PartitionProgress {
                partition: p.partition,
                next_offset: p.start_offset,
                clock: crate::watermark::PartitionClock::new(None, now_ms),
            });
        }
        exhausted.resize(source.partitions().len(), false);
    }
    absorb_gaps(engine, source);
    Ok(())
}

/// Reads from the source into the engine until the cycle or the run is over. Then every
/// event read has been placed (the engine's counts are the run's).
pub fn read_cycle(
    engine: &mut Engine,
    source: &mut dyn Source,
    state: &mut ReadState,
    limits: &CycleLimits,
    wall_ms: &dyn Fn() -> i64,
) -> Result<Stop> {
    let stop = read(engine, source, state, limits, wall_ms);
    let placed = engine.settle();
    let stop = stop?;
    placed?;
    Ok(stop)
}

fn read(
    engine: &mut Engine,
    source: &mut dyn Source,
    state: &mut ReadState,
    limits: &CycleLimits,
    wall_ms: &dyn Fn() -> i64,
) -> Result<Stop> {
    let mut remaining = limits.remaining_messages;
    let mut cycle_left = limits.max_cycle_messages;
    let mut since_clock = 0u32;
    let mut pulls = 0u32;
    engine.set_now(wall_ms());
    loop {
        if remaining == 0 {
            return Ok(Stop::MaxMessages);
        }
        // The partition to read next, and the order key it may run up to before another
        // partition comes first.
        let (best, second) = engine.marks().in_order(&state.exhausted);
        let Some((_, idx)) = best else {
            // Every partition is caught up.
            absorb_gaps(engine, source);
            if limits.rolling {
                release_followed(engine, source, &state.exhausted);
            }
            engine.set_now(wall_ms());
            if let Some(q) = limits.quiet_flush_ms {
                engine.flush_if_quiet(q)?;
            }
            if !limits.follow {
                return Ok(Stop::CaughtUp);
            }
            if engine.closed_windows_waiting()? {
                // Caught up with windows just closed: committed now, not at the cycle's end
                // (a window's row is visible within moments of the watermark passing it).
                return Ok(Stop::CycleEnd);
            }
            let now = Instant::now();
            if let Some(s) = limits.deadline_passed(now) {
                return Ok(s);
            }
            source.wait(WAIT.min(limits.next_deadline().saturating_duration_since(now)));
            state.discover_due(engine, source, wall_ms())?;
            state.look_again();
            continue;
        };
        // The partition goes on until another comes first, or until this many messages, after
        // which the limits and the clock are looked at.
        let budget = remaining
            .min(cycle_left)
            .min(u64::from(CLOCK_EVERY - since_clock));
        let (pulled, merged, idx) = state.ahead.deliver(
            idx,
            source,
            engine,
            budget.max(1) as usize,
            second,
            &state.exhausted,
        )?;
        let merged_u64 = merged as u64;
        remaining -= merged_u64.min(remaining);
        cycle_left = cycle_left.saturating_sub(merged_u64);
        since_clock += merged as u32;
        let delivered = merged > 0;
        if pulled == Pull::Exhausted {
            state.exhausted[idx] = true;
            absorb_gaps(engine, source);
            if limits.rolling {
                release_followed(engine, source, &state.exhausted);
            }
        }
        let mut stop = None;
        if since_clock >= CLOCK_EVERY {
            since_clock = 0;
            stop = limits.deadline_passed(Instant::now());
            if engine.failed() {
                // A worker thread failed: the cycle ends, and with it the run.
                stop = Some(Stop::CycleEnd);
            }
            if stop.is_none() {
                engine.set_now(wall_ms());
            }
        }
        if stop.is_none()
            && remaining > 0
            && (cycle_left == 0 || engine.cycle_full(limits.max_pending_rows))
        {
            stop = Some(Stop::CycleEnd);
        }
        if let Some(s) = stop {
            return Ok(s);
        }
        // Switching partitions can happen every message: look at the clock every few pulls,
        // and after any pull that delivered nothing (it may have waited for the broker).
        pulls += 1;
        if pulls < PULLS_PER_CLOCK && delivered {
            continue;
        }
        pulls = 0;
        if let Some(s) = limits.deadline_passed(Instant::now()) {
            return Ok(s);
        }
        if limits.follow {
            // A run that never catches up still sees new files and partitions.
            state.discover_due(engine, source, wall_ms())?;
        }
    }
}

/// The watermark as reported to users: NULL before any watermark exists.
pub fn reported_watermark(ms: i64) -> Option<i64> {
    (ms != NO_WATERMARK).then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::engine::Restored;
    use crate::pool::Pool;
    use crate::rows::OwnedCell;
    use crate::source::memory::MemorySource;
    use crate::source::Message;
    use crate::state::Batch;
    use crate::watermark::PartitionClock;
    use std::sync::Arc;

    fn config(window: i64, lateness: i64) -> EngineConfig {
        EngineConfig::for_tests(window, lateness)
    }

    fn ev(key: &str, t: i64, v: f64) -> String {
        format!(r#"{{"key":"{key}","event_time_ms":{t},"payload":{{"value":{v}}}}}"#)
    }

    /// A new job's state: `parts` partitions, nothing read yet.
    fn from_the_start(parts: usize) -> Restored {
        Restored {
            floor_ms: NO_WATERMARK,
            partitions: (0..parts)
                .map(|i| PartitionProgress {
                    partition: i as i32,
                    next_offset: 0,
                    clock: PartitionClock::new(None, 0),
                })
                .collect(),
            open_windows: None,
        }
    }

    fn engine(parts: usize, window: i64, lateness: i64) -> Engine {
        Engine::new(&config(window, lateness), from_the_start(parts), 0, "t").unwrap()
    }

    /// The output gathered so far (taken: a second call starts afresh).
    fn output(eng: &mut Engine) -> Batch {
        let mut b = Batch::empty(&eng.cfg().schemas());
        eng.take_output(&mut b).unwrap();
        b
    }

    fn i64_of(c: &OwnedCell) -> i64 {
        match c {
            OwnedCell::I64(v) => *v,
            OwnedCell::I32(v) => i64::from(*v),
            other => panic!("not an integer: {other:?}"),
        }
    }

    fn str_of(c: &OwnedCell) -> String {
        match c {
            OwnedCell::Str(s) => s.clone(),
            other => panic!("not text: {other:?}"),
        }
    }

    fn limits(max: u64) -> CycleLimits {
        CycleLimits::for_tests(max)
    }

    /// (window start, key, count, sum) of every window emitted.
    type Windows = Vec<(i64, String, i64, Option<f64>)>;

    /// Runs to the end, optionally stopping every `stop_every` messages and resuming from the
    /// engine's own progress (as a new run from a checkpoint would); returns sorted windows,
    /// late (partition, offset) pairs and the dead count.
    fn run(data: &[Vec<String>], stop_every: u64, flush: bool) -> (Windows, Vec<(i32, i64)>, u64) {
        run_with(data, stop_every, flush, 1)
    }

    /// As `run`, on `threads` threads (as many window shards).
    fn run_with(
        data: &[Vec<String>],
        stop_every: u64,
        flush: bool,
        threads: usize,
    ) -> (Windows, Vec<(i32, i64)>, u64) {
        let pool = Arc::new(Pool::new(threads));
        let fresh = |restored| {
            Engine::with_pool(&config(1000, 200), restored, 0, "t", Arc::clone(&pool)).unwrap()
        };
        let mut eng = fresh(from_the_start(data.len()));
        let mut windows = Vec::new();
        let mut late = Vec::new();
        let mut dead = 0;
        loop {
            let starts: Vec<i64> = eng.progress().iter().map(|p| p.next_offset).collect();
            let mut src = MemorySource::new(data.to_vec(), &starts);
            let mut state = ReadState::new(data.len());
            let stop =
                read_cycle(&mut eng, &mut src, &mut state, &limits(stop_every), &|| 0).unwrap();
            if stop == Stop::CaughtUp && flush {
                eng.flush().unwrap();
            }
            let b = output(&mut eng);
            windows.extend(b.windows.to_vec().iter().map(|w| {
                let sum = match w[4] {
                    OwnedCell::F64(v) => Some(v),
                    _ => None,
                };
                (i64_of(&w[0]), str_of(&w[2]), i64_of(&w[3]), sum)
            }));
            late.extend(
                b.late
                    .to_vec()
                    .iter()
                    .map(|l| (i64_of(&l[8]) as i32, i64_of(&l[9]))),
            );
            dead += b.dead.len() as u64;
            if stop == Stop::CaughtUp {
                break;
            }
            // Resume like a restart: rebuild the engine from its checkpointable state.
            let mut open = Vec::new();
            eng.encode_open_windows(&mut open).unwrap();
            let progress = eng.progress();
            let floor = eng.watermark_ms();
            eng = fresh(Restored {
                floor_ms: floor,
                partitions: progress,
                open_windows: Some(open),
            });
        }
        windows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        late.sort();
        (windows, late, dead)
    }

    #[test]
    fn reading_partitions_in_sequence_makes_no_event_late() {
        // Partition 1's events are all older than partition 0's newest: reading partition 0
        // first would make them late under a per-topic watermark.
        let p0: Vec<String> = (0..50).map(|i| ev("a", 10_000 + i * 100, 1.0)).collect();
        let p1: Vec<String> = (0..50).map(|i| ev("b", i * 100, 1.0)).collect();
        let mut eng = engine(2, 1000, 0);
        let mut src = MemorySource::new(vec![p0.clone(), vec![]], &[0, 0]);
        // Only partition 0 is readable in this first run: nothing may close or be late.
        let mut state = ReadState::new(2);
        state.exhausted[1] = true;
        read_cycle(&mut eng, &mut src, &mut state, &limits(u64::MAX), &|| 0).unwrap();
        assert_eq!(output(&mut eng).windows.len(), 0);
        let mut src = MemorySource::new(vec![p0, p1], &[50, 0]);
        let mut state = ReadState::new(2);
        read_cycle(&mut eng, &mut src, &mut state, &limits(u64::MAX), &|| 0).unwrap();
        assert_eq!(eng.counters().late_events, 0);
        assert_eq!(eng.counters().events_consumed, 100);
    }

    #[test]
    fn late_events_go_to_the_side_output_with_the_watermark() {
        let p0 = vec![
            ev("a", 1000, 1.0),
            ev("a", 5000, 1.0),
            ev("a", 1500, 2.0),
            ev("a", 4300, 3.0),
        ];
        let mut eng = engine(1, 1000, 200);
        let mut src = MemorySource::new(vec![p0], &[0]);
        read_cycle(
            &mut eng,
            &mut src,
            &mut ReadState::new(1),
            &limits(u64::MAX),
            &|| 0,
        )
        .unwrap();
        let out = output(&mut eng);
        let late = out.late.to_vec();
        assert_eq!(late.len(), 1);
        let l: Vec<i64> = [1, 4, 5, 6, 9]
            .iter()
            .map(|&c| i64_of(&late[0][c]))
            .collect();
        assert_eq!(l, vec![1500, 1000, 2000, 4800, 2]);
        assert_eq!(str_of(&late[0][7]), "t");
        // Window [1000,2000) closed at watermark 4800 with one event; 4300 is on time (end 5000 > 4800).
        assert_eq!(out.windows.len(), 1);
        assert_eq!(eng.open_windows(), 2);
    }

    #[test]
    fn window_end_equal_to_watermark_is_late() {
        let p0 = vec![ev("a", 2200, 1.0), ev("a", 1999, 1.0)];
        let mut eng = engine(1, 1000, 200);
        let mut src = MemorySource::new(vec![p0], &[0]);
        read_cycle(
            &mut eng,
            &mut src,
            &mut ReadState::new(1),
            &limits(u64::MAX),
            &|| 0,
        )
        .unwrap();
        assert_eq!(
            eng.counters().late_events,
            1,
            "window [1000,2000) ends at watermark 2000"
        );
    }

    #[test]
    fn bad_messages_are_dead_letters_and_reading_goes_on() {
        let p0 = vec![
            "garbage".to_string(),
            ev("a", 10, 1.0),
            r#"{"key":"a"}"#.to_string(),
            r#"{"event_time_ms":1}"#.to_string(),
        ];
        let mut eng = engine(1, 1000, 0);
        let mut src = MemorySource::new(vec![p0], &[0]);
        read_cycle(
            &mut eng,
            &mut src,
            &mut ReadState::new(1),
            &limits(u64::MAX),
            &|| 0,
        )
        .unwrap();
        let reasons: Vec<_> = output(&mut eng)
            .dead
            .to_vec()
            .iter()
            .map(|d| (i64_of(&d[2]), str_of(&d[5])))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (0, "not JSON: expected a value".to_string()),
                (2, "missing event time field 'event_time_ms'".to_string()),
                (3, "missing key field 'key'".to_string()),
            ]
        );
        assert_eq!(eng.counters().events_consumed, 4);
        assert_eq!(eng.open_windows(), 1);
    }

    #[test]
    fn flush_closes_everything_and_raises_the_watermark() {
        let mut eng = engine(1, 1000, 0);
        let mut src = MemorySource::new(vec![vec![ev("a", 100, 1.0), ev("b", 2500, 2.0)]], &[0]);
        read_cycle(
            &mut eng,
            &mut src,
            &mut ReadState::new(1),
            &limits(u64::MAX),
            &|| 0,
        )
        .unwrap();
        eng.flush().unwrap();
        assert_eq!(output(&mut eng).windows.len(), 2);
        assert_eq!(eng.watermark_ms(), 3000);
        assert_eq!(eng.open_windows(), 0);
    }

    fn skewed_data() -> Vec<Vec<String>> {
        skewed_data_of(400)
    }

    fn skewed_data_of(per_partition: i64) -> Vec<Vec<String>> {
        // Four partitions; partition 2 is 5 s behind; every 20th event is 2-5 windows late;
        // a few bad lines.
        (0..4)
            .map(|p| {
                (0..per_partition)
                    .map(|i| {
                        let base = 1_000_000 + i * 40 + p * 10 - if p == 2 { 5000 } else { 0 };
                        if i % 97 == 13 {
                            "{bad".to_string()
                        } else if i % 20 == 7 {
                            ev(
                                &format!("k{}", i % 5),
                                base - 1000 * (2 + i % 4),
                                i as f64 * 0.37,
                            )
                        } else {
                            ev(&format!("k{}", i % 5), base, i as f64 * 0.37)
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn stop_and_resume_anywhere_equals_a_straight_run() {
        let data = skewed_data();
        let straight = run(&data, u64::MAX, true);
        assert!(!straight.1.is_empty(), "the fixture has late events");
        let total: i64 = straight.0.iter().map(|w| w.2).sum::<i64>()
            + straight.1.len() as i64
            + straight.2 as i64;
        assert_eq!(total, 1600, "every message counted exactly once");
        for every in [1, 7, 100, 399, 1000] {
            assert_eq!(
                run(&data, every, true),
                straight,
                "stopping every {every} messages"
            );
        }
    }

    #[test]
    fn every_thread_count_gives_the_same_windows_late_events_and_resume() {
        // Several chunks per partition, the merge switching partitions inside chunks, and
        // many keys, so every shard has some.
        let data: Vec<Vec<String>> = skewed_data_of(3000)
            .into_iter()
            .map(|p| {
                p.into_iter()
                    .enumerate()
                    .map(|(i, l)| l.replace("\"key\":\"k", &format!("\"key\":\"{}k", i % 37)))
                    .collect()
            })
            .collect();
        let straight = run(&data, u64::MAX, true);
        assert!(!straight.1.is_empty() && straight.2 > 0);
        for threads in [2, 3, 4] {
            for every in [u64::MAX, 997, 4096] {
                assert_eq!(
                    run_with(&data, every, true, threads),
                    straight,
                    "{threads} threads, stopping every {every} messages"
                );
            }
        }
    }

    #[test]
    fn kafka_key_is_used_when_the_json_has_none() {
        let mut eng = engine(1, 1000, 0);
        let payload = br#"{"event_time_ms":5}"#;
        eng.process(
            0,
            &Message {
                offset: 0,
                next_offset: 1,
                payload,
                key: Some(b"from-kafka"),
                timestamp: None,
                schema: None,
            },
        );
        eng.process(
            0,
            &Message {
                offset: 1,
                next_offset: 2,
                payload,
                key: Some(&[0xff]),
                timestamp: None,
                schema: None,
            },
        );
        eng.flush().unwrap();
        let out = output(&mut eng);
        assert_eq!(str_of(&out.windows.to_vec()[0][2]), "from-kafka");
        assert_eq!(out.dead.len(), 1);
    }

    /// Runs `cfg` over `data` in cycles of `every` messages, flushing at the end; `resume`:
    /// rebuild the engine from its checkpoint form after every cycle. Returns every window row
    /// and late row written, in order.
    fn cycles(
        cfg: &EngineConfig,
        data: &[Vec<String>],
        every: u64,
        resume: bool,
    ) -> (Vec<Vec<OwnedCell>>, Vec<Vec<OwnedCell>>) {
        cycles_on(cfg, data, every, resume, 1)
    }

    /// As `cycles`, on `threads` threads.
    fn cycles_on(
        cfg: &EngineConfig,
        data: &[Vec<String>],
        every: u64,
        resume: bool,
        threads: usize,
    ) -> (Vec<Vec<OwnedCell>>, Vec<Vec<OwnedCell>>) {
        let pool = Arc::new(Pool::new(threads));
        let fresh = |restored| Engine::with_pool(cfg, restored, 0, "t", Arc::clone(&pool)).unwrap();
        let mut eng = fresh(from_the_start(data.len()));
        let (mut windows, mut late) = (Vec::new(), Vec::new());
        loop {
            let starts: Vec<i64> = eng.progress().iter().map(|p| p.next_offset).collect();
            let mut src = MemorySource::new(data.to_vec(), &starts);
            let mut state = ReadState::new(data.len());
            let stop = read_cycle(&mut eng, &mut src, &mut state, &limits(every), &|| 0).unwrap();
            if stop == Stop::CaughtUp {
                eng.flush().unwrap();
            }
            let b = output(&mut eng);
            b.check().unwrap();
            windows.extend(b.windows.to_vec());
            late.extend(b.late.to_vec());
            if stop == Stop::CaughtUp {
                return (windows, late);
            }
            if resume {
                let mut open = Vec::new();
                eng.encode_open_windows(&mut open).unwrap();
                eng = fresh(Restored {
                    floor_ms: eng.watermark_ms(),
                    partitions: eng.progress(),
                    open_windows: Some(open),
                });
            }
        }
    }

    /// The final rows of a job with revisions, as `emit := 'close'` writes them: per key and
    /// window start, the latest revision, unless retracted, without the revision columns.
    fn latest(rows: &[Vec<OwnedCell>], width: usize) -> Vec<Vec<OwnedCell>> {
        let mut by_window = std::collections::BTreeMap::new();
        for r in rows {
            let id = (i64_of(&r[0]), str_of(&r[2]));
            let rev = i64_of(&r[width + 1]);
            let e = by_window.entry(id).or_insert((0, r));
            if rev > e.0 {
                *e = (rev, r);
            }
        }
        by_window
            .into_values()
            .filter(|(_, r)| r[width + 2] == OwnedCell::Bool(false))
            .map(|(_, r)| r[..width].to_vec())
            .collect()
    }

    #[test]
    fn running_rows_resume_exactly_and_end_as_the_close_rows() {
        use crate::config::Emit;
        use crate::config::WindowKind;
        let data = skewed_data_of(300);
        let kinds = [
            WindowKind::Tumbling,
            WindowKind::Hopping { hop_ms: 250 },
            WindowKind::Session,
        ];
        for window in kinds {
            let mut close = config(1000, 200);
            close.window = window;
            let (close_rows, close_late) = cycles(&close, &data, 97, false);
            let mut close_sorted = close_rows.clone();
            close_sorted.sort_by_key(|r| (i64_of(&r[0]), str_of(&r[2])));
            let mut update = close.clone();
            update.emit = Emit::Update;
            let straight = cycles(&update, &data, 97, false);
            let resumed = cycles(&update, &data, 97, true);
            assert_eq!(straight, resumed, "{window:?}: resumed after every cycle");
            let width = close_rows[0].len();
            assert!(
                straight.0.len() > close_rows.len(),
                "{window:?}: running rows too"
            );
            assert_eq!(
                latest(&straight.0, width),
                close_sorted,
                "{window:?}: final rows"
            );
            assert_eq!(straight.1, close_late, "{window:?}: the same late events");
            // Every final row is the last of its window, and revisions count 1, 2, ...
            let mut seen = std::collections::BTreeMap::new();
            for r in &straight.0 {
                let id = (i64_of(&r[0]), str_of(&r[2]));
                let rev = seen.entry(id).or_insert(0);
                *rev += 1;
                assert_eq!(
                    i64_of(&r[width + 1]),
                    *rev,
                    "{window:?}: revisions in order"
                );
            }
        }
    }

    #[test]
    fn late_updates_correct_kept_windows_and_resume_exactly() {
        use crate::config::WindowKind;
        let data = skewed_data_of(300);
        for window in [WindowKind::Tumbling, WindowKind::Hopping { hop_ms: 500 }] {
            let mut close = config(1000, 200);
            close.window = window;
            let (_, close_late) = cycles(&close, &data, 50, false);
            let mut cfg = close.clone();
            cfg.late_updates_ms = Some(2500);
            let straight = cycles(&cfg, &data, 50, false);
            assert_eq!(
                straight,
                cycles(&cfg, &data, 50, true),
                "{window:?}: resumed"
            );
            let (rows, late) = &straight;
            assert_eq!(late.len(), close_late.len(), "the same events are late");
            let applied = late
                .iter()
                .filter(|l| l[10] == OwnedCell::Bool(true))
                .count();
            assert!(
                applied > 0 && applied < late.len(),
                "{window:?}: {applied} applied"
            );
            // Every event counts once: in the latest row of each window it belongs to, or
            // as a late event not applied. With tumbling windows the counts add up.
            if window == WindowKind::Tumbling {
                let width = rows[0].len() - 3;
                let counted: i64 = latest(rows, width).iter().map(|r| i64_of(&r[3])).sum();
                let dead = data
                    .iter()
                    .flatten()
                    .filter(|l| l.starts_with("{bad"))
                    .count();
                let not_applied = late.len() - applied;
                assert_eq!(counted as usize + not_applied + dead, 1200);
            }
        }
    }

    #[test]
    fn late_corrections_of_the_cycle_that_flushes_are_written() {
        // One cycle reads everything and flushes: the corrections its late events made to kept
        // windows are written before the flush moves the watermark past those windows.
        let data = skewed_data_of(300);
        let mut cfg = config(1000, 200);
        cfg.late_updates_ms = Some(2500);
        let (rows, late) = cycles(&cfg, &data, u64::MAX, false);
        let applied = late
            .iter()
            .filter(|l| l[10] == OwnedCell::Bool(true))
            .count();
        assert!(applied > 0);
        let width = rows[0].len() - 3;
        let counted: i64 = latest(&rows, width).iter().map(|r| i64_of(&r[3])).sum();
        let dead = data
            .iter()
            .flatten()
            .filter(|l| l.starts_with("{bad"))
            .count();
        assert_eq!(counted as usize + late.len() - applied + dead, 1200);
    }

    fn sorted(mut rows: Vec<Vec<OwnedCell>>) -> Vec<Vec<OwnedCell>> {
        rows.sort_by_cached_key(|r| format!("{r:?}"));
        rows
    }

    #[test]
    fn window_kinds_revisions_and_order_sensitive_aggregates_agree_across_threads() {
        use crate::aggregate::AggSpec;
        use crate::config::{Emit, WindowKind};
        let data = skewed_data_of(600);
        let aggs = [
            "count(*)",
            "first(key) AS f",
            "last(key) AS l",
            "arg_max(key, payload.value) AS am",
            "approx_count_distinct(payload.value) AS d",
            "approx_quantile(payload.value, 0.5) AS q",
        ];
        let kinds = [
            WindowKind::Tumbling,
            WindowKind::Hopping { hop_ms: 250 },
            WindowKind::Session,
        ];
        for window in kinds {
            for (emit, late_updates) in [
                (Emit::Close, None),
                (Emit::Update, None),
                (Emit::Close, Some(2500)),
            ] {
                if window == WindowKind::Session && late_updates.is_some() {
                    continue;
                }
                let mut cfg = config(1000, 200);
                cfg.window = window;
                cfg.emit = emit;
                cfg.late_updates_ms = late_updates;
                cfg.aggregates = aggs.iter().map(|a| AggSpec::parse(a).unwrap()).collect();
                let one = cycles_on(&cfg, &data, 173, true, 1);
                assert!(!one.0.is_empty() && !one.1.is_empty());
                for threads in [2, 4] {
                    for resume in [false, true] {
                        let many = cycles_on(&cfg, &data, 173, resume, threads);
                        assert_eq!(
                            (sorted(many.0), sorted(many.1)),
                            (sorted(one.0.clone()), sorted(one.1.clone())),
                            "{window:?} {emit:?} {late_updates:?}: {threads} threads, resumed {resume}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_checkpoint_of_one_thread_count_resumes_under_another() {
        let data = skewed_data_of(800);
        let cfg = config(1000, 200);
        let straight = sorted(cycles(&cfg, &data, u64::MAX, false).0);
        // Cycles alternate between 1, 3 and 2 threads, each resuming the last one's checkpoint.
        let mut restored = from_the_start(data.len());
        let mut windows = Vec::new();
        for threads in [1, 3, 2].into_iter().cycle() {
            let pool = Arc::new(Pool::new(threads));
            let mut eng = Engine::with_pool(&cfg, restored, 0, "t", pool).unwrap();
            let starts: Vec<i64> = eng.progress().iter().map(|p| p.next_offset).collect();
            let mut src = MemorySource::new(data.clone(), &starts);
            let stop = read_cycle(
                &mut eng,
                &mut src,
                &mut ReadState::new(4),
                &limits(301),
                &|| 0,
            )
            .unwrap();
            if stop == Stop::CaughtUp {
                eng.flush().unwrap();
            }
            windows.extend(output(&mut eng).windows.to_vec());
            if stop == Stop::CaughtUp {
                break;
            }
            let mut open = Vec::new();
            eng.encode_open_windows(&mut open).unwrap();
            restored = Restored {
                floor_ms: eng.watermark_ms(),
                partitions: eng.progress(),
                open_windows: Some(open),
            };
        }
        assert_eq!(sorted(windows), straight);
    }
}
