//! A `subscribe` run: the consumer group assigns this process some of the topic's partitions,
//! and each assigned partition is a task of its own, as in Kafka Streams: its windows aggregate
//! only its events and close on its own watermark. A task's state (offset, watermark, open
//! windows) lives in the output catalog beside its rows and is committed in the same
//! transaction, so the next owner of a partition resumes exactly where the last commit left it.
//! Each state row carries its owner's generation; a commit checks it inside its transaction,
//! so a member whose partition moved while it was paused cannot commit for it afterwards.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use streaming_etl_core::{
    read_cycle, Batch, CycleLimits, Engine, EtlError, JobSettings, OutputSchemas, PartitionClock,
    PartitionProgress, Pool, ReadState, Restored, Result, Source, Stop, NO_WATERMARK,
};

use crate::clock::Clock;
use crate::config::JobConfig;
use crate::job::{next_row_due, RunStats};
use crate::sink::Written;

/// Messages a task reads before the next task has its turn (tasks share the thread).
const TURN_MESSAGES: u64 = 20_000;
/// Late and dead rows a task may gather before the cycle commits early (bounds memory).
const MAX_PENDING_ROWS: usize = 500_000;
/// A partition whose commit found another owner is claimed again after this long if the group
/// still assigns it here (by then a revoke has usually arrived, and it is not).
const RECLAIM_AFTER: Duration = Duration::from_secs(2);
/// How long a run waits when every task is caught up, serving the group meanwhile.
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// A partition's state as the output catalog keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionSnapshot {
    /// Commits of this partition so far (a commit whose outcome was unknown is recognised by
    /// it: the stored row already has the number).
    pub seq: i64,
    pub next_offset: i64,
    pub max_event_time_ms: Option<i64>,
    pub last_delivery_ms: i64,
    pub watermark_ms: i64,
    pub open_windows: Option<Vec<u8>>,
}

/// A partition taken over by this member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub partition: i32,
    /// This member's generation for the partition: one more than any before.
    pub generation: i64,
    /// Its state, None for a partition no member has committed yet.
    pub stored: Option<PartitionSnapshot>,
}

/// One partition's part of a cycle's commit.
pub struct PartitionCommit<'a> {
    pub partition: i32,
    pub generation: i64,
    pub state: PartitionSnapshot,
    pub batch: &'a Batch,
}

/// A partition whose state row names a newer owner than the member committing for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub partition: i32,
    pub our_generation: i64,
    pub generation: i64,
    pub owner: String,
}

/// Where partition state and output go: the output catalog.
pub trait PartitionStore: Send {
    /// Makes sure the output tables and the state table exist (idempotent).
    fn prepare(&mut self, schemas: &OutputSchemas) -> Result<()>;

    /// Takes the partitions over for `owner`: reads their state and, in one transaction,
    /// writes each back under a generation above every earlier one (one catalog commit for
    /// all a rebalance assigns). Fails when a stored state was written under other settings.
    /// The claims are in the order of `partitions`.
    fn claim(&mut self, partitions: &[i32], owner: &str) -> Result<Vec<Claim>>;

    /// Commits the partitions' rows and states in one transaction, provided each state row is
    /// still this member's; otherwise nothing is written and the partitions that moved are
    /// returned. With what the store counted of the rows it wrote.
    fn commit(
        &mut self,
        owner: &str,
        parts: &[PartitionCommit<'_>],
    ) -> Result<(Vec<Moved>, Written)>;
}

/// Takes partitions over (the group source calls it when the group assigns them, before they
/// are read, so reading starts at the stored offsets).
pub type Claimer = Box<dyn FnMut(&[i32]) -> Result<Vec<Claim>> + Send>;

/// A change to this member's assignment.
pub enum GroupEvent {
    /// The partition was assigned and claimed; its source reads from the claimed offset.
    Assigned {
        claim: Claim,
        source: Box<dyn Source>,
    },
    /// The partition was revoked (or lost): nothing more of it may be committed.
    Revoked(i32),
    /// The group rebalanced (whether or not this member's partitions changed): the partitions
    /// it kept are repositioned before they are read again.
    Rebalanced,
}

/// The consumer group, as a run sees it.
pub trait GroupSource: Send {
    /// Serves the group protocol for up to `wait` and returns the changes to the assignment.
    fn poll(&mut self, wait: Duration) -> Result<Vec<GroupEvent>>;
    /// Whether the group has given this member its first assignment (possibly empty).
    fn joined(&self) -> bool;
    /// How long the run waits for that.
    fn join_timeout(&self) -> Duration;
    /// Offsets that are durable in the catalog (committed to the group, for lag tools).
    fn committed(&mut self, offsets: &[(i32, i64)]);
    /// Claims again a partition whose commit found another owner, if the group still assigns
    /// it to this member (a coordinator can leave two members each believing they own it for a
    /// while); None once it does not.
    fn reclaim(&mut self, partition: i32) -> Result<Option<GroupEvent>>;
    /// After a rebalance: the partitions this member kept, each to be read on from the given
    /// offset (a rebalance may move the client's own fetch position of a partition it keeps).
    fn resume_at(&mut self, positions: &[(i32, i64)]) -> Result<()>;
    /// A fault the member rides out (its brokers out of reach for longer than its timeout),
    /// for reports; None while the group answers.
    fn unreachable(&mut self) -> Option<String> {
        None
    }
}

/// Opens the group, given how it claims partitions.
pub type GroupOpener = Box<dyn FnOnce(Claimer) -> Result<Box<dyn GroupSource>> + Send>;

/// What a `subscribe` run is given to work with.
pub struct GroupEnv {
    pub store: Box<dyn PartitionStore>,
    pub open_group: GroupOpener,
    pub clock: Arc<dyn Clock>,
    /// This member's name in the state rows (unique per run).
    pub owner: String,
}

/// One assigned partition.
struct Task {
    generation: i64,
    seq: i64,
    engine: Engine,
    source: Box<dyn Source>,
    read: ReadState,
    caught_up: bool,
    /// What its last commit (or its claim) stored.
    committed_offset: i64,
    committed_watermark_ms: i64,
    /// The size of its open windows' checkpoint form, as last committed.
    state_bytes: u64,
    batch: Batch,
}

impl Task {
    /// How many messages the partition's source knows past those the task has read (None: it
    /// knows no end).
    fn lag(&self) -> Option<i64> {
        let read = self.engine.progress().first().map_or(-1, |p| p.next_offset);
        let at = self.source.position(0).map_or(read, |p| p.max(read));
        self.source.end_offset(0).map(|end| (end - at).max(0))
    }

    /// Whether the partition's source knows of messages past those the task has read.
    fn behind(&self) -> bool {
        self.lag().is_some_and(|l| l > 0)
    }
}

pub struct GroupRun {
    cfg: Arc<JobConfig>,
    /// The run's threads (DuckDB's `threads`): partition tasks take their turns on them at once.
    pool: Arc<Pool>,
    store: Arc<Mutex<Box<dyn PartitionStore>>>,
    group: Box<dyn GroupSource>,
    tasks: BTreeMap<i32, Task>,
    schemas: Arc<OutputSchemas>,
    owner: String,
    started: Instant,
    run_deadline: Option<Instant>,
    next_row_due: Option<Instant>,
    cycles: u64,
    stop: Option<Stop>,
    clock: Arc<dyn Clock>,
    /// Counts of tasks this run no longer has (revoked), as of their last commit.
    retired: streaming_etl_core::Counters,
    /// Tasks' counts as of their last commit (what `retired` takes on a revoke).
    committed_counts: BTreeMap<i32, streaming_etl_core::Counters>,
    /// What the store counted of its tables beyond the engine's counts (see `Written`):
    /// windows, late events.
    written_adjust: (i64, i64),
    /// Partitions whose commit found a newer owner, with what was said about it.
    pub moved: Vec<Moved>,
    /// Each task's generation as of the last rebalance (tells kept tasks from new ones).
    generations: BTreeMap<i32, i64>,
    /// Partitions whose commit found another owner, and when.
    fenced: BTreeMap<i32, Instant>,
    /// Set by another thread to end the current cycle at once (see [`GroupRun::interrupter`]).
    interrupt: Arc<AtomicBool>,
}

/// The engine of one partition, resumed from its stored state.
fn task_engine(cfg: &JobConfig, claim: &Claim, now_ms: i64, start: i64) -> Result<Engine> {
    let stored = claim.stored.as_ref();
    let clock = PartitionClock::new(
        stored.and_then(|s| s.max_event_time_ms),
        stored.map_or(now_ms, |s| s.last_delivery_ms),
    );
    let restored = Restored {
        floor_ms: stored.map_or(NO_WATERMARK, |s| s.watermark_ms),
        partitions: vec![PartitionProgress {
            partition: claim.partition,
            next_offset: start,
            clock,
        }],
        open_windows: stored.and_then(|s| s.open_windows.clone()),
    };
    Engine::new(&cfg.engine, restored, now_ms, &cfg.source).map_err(|e| {
        EtlError::Internal(format!(
            "the stored state of partition {} of job '{}' cannot be read: {e}",
            claim.partition, cfg.job
        ))
    })
}

fn add(a: &mut streaming_etl_core::Counters, b: streaming_etl_core::Counters) {
    a.events_consumed += b.events_consumed;
    a.windows_emitted += b.windows_emitted;
    a.late_events += b.late_events;
    a.dead_letters += b.dead_letters;
}

impl GroupRun {
    pub fn start(cfg: Arc<JobConfig>, env: GroupEnv) -> Result<GroupRun> {
        let started = Instant::now();
        let GroupEnv {
            mut store,
            open_group,
            clock,
            owner,
        } = env;
        let schemas = Arc::new(cfg.engine.schemas());
        store.prepare(&schemas)?;
        let store = Arc::new(Mutex::new(store));
        // The group claims through a weak handle: once the run is over, a late callback of a
        // consumer still closing finds nothing to claim with.
        let weak: Weak<Mutex<Box<dyn PartitionStore>>> = Arc::downgrade(&store);
        let claim_owner = owner.clone();
        let claimer: Claimer = Box::new(move |partitions| {
            let store = weak
                .upgrade()
                .ok_or_else(|| EtlError::Internal("the run is over".into()))?;
            let mut store = store.lock().unwrap_or_else(PoisonError::into_inner);
            store.claim(partitions, &claim_owner)
        });
        let group = open_group(claimer)?;
        Ok(GroupRun {
            pool: Arc::new(Pool::new(cfg.threads)),
            run_deadline: cfg
                .max_runtime_ms
                .map(|ms| started + Duration::from_millis(ms as u64)),
            cfg,
            store,
            group,
            tasks: BTreeMap::new(),
            schemas,
            owner,
            started,
            next_row_due: None,
            cycles: 0,
            stop: None,
            clock,
            retired: Default::default(),
            committed_counts: BTreeMap::new(),
            written_adjust: (0, 0),
            interrupt: Arc::new(AtomicBool::new(false)),
            moved: Vec::new(),
            generations: BTreeMap::new(),
            fenced: BTreeMap::new(),
        })
    }

    pub fn is_done(&self) -> bool {
        self.stop.is_some_and(|s| s != Stop::CycleEnd)
    }

    /// The partitions this member works on now.
    pub fn partitions(&self) -> Vec<i32> {
        self.tasks.keys().copied().collect()
    }

    /// Applies the group's changes: new tasks for assigned partitions, revoked ones dropped
    /// with whatever they read since their last commit (the next owner reads it again).
    fn serve_group(&mut self, wait: Duration) -> Result<()> {
        let events = self.group.poll(wait)?;
        if events.is_empty() {
            return Ok(());
        }
        let kept: Vec<i32> = self.tasks.keys().copied().collect();
        for event in events {
            match event {
                GroupEvent::Assigned { claim, source } => {
                    self.fenced.remove(&claim.partition);
                    self.add_task(claim, source)?;
                }
                GroupEvent::Revoked(p) => {
                    self.fenced.remove(&p);
                    self.retire(p);
                }
                GroupEvent::Rebalanced => {}
            }
        }
        let positions: Vec<(i32, i64)> = kept
            .into_iter()
            .filter_map(|p| {
                let t = self.tasks.get(&p)?;
                // Only tasks that stayed (a partition assigned again starts where its claim
                // says).
                (t.generation == self.generations.get(&p).copied()?)
                    .then(|| t.engine.progress().first().map(|pp| (p, pp.next_offset)))
                    .flatten()
            })
            .collect();
        self.group.resume_at(&positions)?;
        // What was read ahead of the merge is read again from where the merge stands.
        for (p, _) in &positions {
            if let Some(t) = self.tasks.get_mut(p) {
                t.read = ReadState::new(1);
            }
        }
        self.generations = self.tasks.iter().map(|(&p, t)| (p, t.generation)).collect();
        Ok(())
    }

    fn add_task(&mut self, claim: Claim, mut source: Box<dyn Source>) -> Result<()> {
        let now = self.clock.wall_ms();
        let start = source.partitions().first().map_or(0, |p| p.start_offset);
        let mut engine = task_engine(&self.cfg, &claim, now, start)?;
        for g in source.take_gaps() {
            engine.record_gap(g.partition, g.from, &g.message);
        }
        let stored = claim.stored.as_ref();
        let task = Task {
            generation: claim.generation,
            seq: stored.map_or(0, |s| s.seq),
            committed_offset: stored.map_or(-1, |s| s.next_offset),
            committed_watermark_ms: stored.map_or(NO_WATERMARK, |s| s.watermark_ms),
            state_bytes: 0,
            engine,
            source,
            read: ReadState::new(1),
            caught_up: false,
            batch: Batch::empty(&self.schemas),
        };
        self.committed_counts
            .insert(claim.partition, Default::default());
        // Assigned again without a revoke in between (an eager rebalance): the claim re-read
        // the state, so the old task's uncommitted work goes.
        self.tasks.insert(claim.partition, task);
        Ok(())
    }

    /// Partitions fenced a while ago that the group still assigns here are claimed again.
    fn reclaim_fenced(&mut self) -> Result<()> {
        let due: Vec<i32> = self
            .fenced
            .iter()
            .filter(|(_, at)| at.elapsed() >= RECLAIM_AFTER)
            .map(|(&p, _)| p)
            .collect();
        for p in due {
            match self.group.reclaim(p) {
                Ok(Some(GroupEvent::Assigned { claim, source })) => {
                    self.fenced.remove(&p);
                    self.add_task(claim, source)?;
                    self.generations
                        .insert(p, self.tasks.get(&p).map_or(0, |t| t.generation));
                }
                Ok(_) => {
                    self.fenced.remove(&p);
                }
                // Tried again later (the partition may be mid-rebalance).
                Err(_) => {
                    self.fenced.insert(p, Instant::now());
                }
            }
        }
        Ok(())
    }

    fn retire(&mut self, partition: i32) {
        if self.tasks.remove(&partition).is_some() {
            if let Some(c) = self.committed_counts.remove(&partition) {
                add(&mut self.retired, c);
            }
        }
    }

    fn consumed(&self) -> u64 {
        self.retired.events_consumed
            + self
                .tasks
                .values()
                .map(|t| t.engine.counters().events_consumed)
                .sum::<u64>()
    }

    /// Reads one checkpoint cycle of every task and commits it. Returns false once the run is
    /// over.
    pub fn cycle(&mut self) -> Result<bool> {
        if self.is_done() {
            return Ok(false);
        }
        let row_due = next_row_due(&mut self.next_row_due, self.cfg.checkpoint_interval_ms);
        let join_deadline = self.started + self.group.join_timeout();
        let stop = loop {
            if self.interrupt.load(Ordering::Relaxed) {
                // What the tasks read so far is committed as at any cycle's end.
                break Stop::CycleEnd;
            }
            self.serve_group(Duration::ZERO)?;
            self.reclaim_fenced()?;
            if !self.group.joined() {
                if Instant::now() >= join_deadline {
                    return Err(EtlError::source(
                        &self.cfg.source,
                        format!(
                            "the consumer group gave this member no assignment within {} ms (is the group coordinator reachable?)",
                            self.group.join_timeout().as_millis()
                        ),
                    ));
                }
                self.serve_group(IDLE_WAIT)?;
                if let Some(s) = self.deadline_passed(row_due) {
                    break s;
                }
                continue;
            }
            if let Some(s) = self.read_tasks(row_due)? {
                break s;
            }
            if self.tasks.values().all(|t| t.caught_up) {
                if !self.cfg.follow {
                    break Stop::CaughtUp;
                }
                // A task short of the end its partition's last fetch reported is waiting on
                // the fetcher, not caught up: what it closed goes with the cycle's commit. A
                // member working off a backlog would otherwise commit at every gap between
                // two fetches (a catalog commit each).
                let behind: Vec<i32> = self
                    .tasks
                    .iter()
                    .filter(|(_, t)| t.behind())
                    .map(|(&p, _)| p)
                    .collect();
                let mut closed = false;
                if behind.is_empty() {
                    for t in self.tasks.values_mut() {
                        closed |= t.engine.closed_windows_waiting()?;
                    }
                }
                if closed {
                    // Windows just closed are committed now rather than at the cycle's end.
                    break Stop::CycleEnd;
                }
                if let Some(s) = self.deadline_passed(row_due) {
                    break s;
                }
                if !behind.is_empty() {
                    self.wait_for_fetches(&behind, row_due);
                    self.serve_group(Duration::ZERO)?;
                } else {
                    self.serve_group(IDLE_WAIT)?;
                }
                for t in self.tasks.values_mut() {
                    t.caught_up = false;
                }
            }
        };
        self.stop = Some(stop);
        if stop != Stop::CycleEnd {
            let now = self.clock.wall_ms();
            for t in self.tasks.values_mut() {
                t.engine.set_now(now);
                if self.cfg.flush && stop == Stop::CaughtUp {
                    t.engine.flush()?;
                }
            }
        }
        self.commit()?;
        self.cycles += 1;
        Ok(!self.is_done())
    }

    /// Waits, at most IDLE_WAIT and not past the cycle, for a fetch to reach one of the tasks
    /// that are `behind` (each partition has its own queue: a short wait on each in turn).
    fn wait_for_fetches(&mut self, behind: &[i32], row_due: Instant) {
        let deadline = (Instant::now() + IDLE_WAIT).min(row_due);
        let slice = (IDLE_WAIT / behind.len().max(1) as u32).max(Duration::from_millis(1));
        while Instant::now() < deadline {
            for p in behind {
                let Some(t) = self.tasks.get_mut(p) else {
                    continue;
                };
                if t.source.wait(slice) || Instant::now() >= deadline {
                    return;
                }
            }
        }
    }

    fn deadline_passed(&self, row_due: Instant) -> Option<Stop> {
        let now = Instant::now();
        if self.run_deadline.is_some_and(|d| now >= d) {
            Some(Stop::MaxRuntime)
        } else if now >= row_due {
            Some(Stop::CycleEnd)
        } else {
            None
        }
    }

    /// Gives each task not caught up a turn, on the run's threads at once (each task has its own
    /// engine: what it reads does not depend on where or with which other task it runs); a stop
    /// when the cycle or the run is over. The tasks' results are taken in partition order, so
    /// the stop a run reports does not depend on the thread count either.
    fn read_tasks(&mut self, row_due: Instant) -> Result<Option<Stop>> {
        let remaining = self
            .cfg
            .max_messages
            .map_or(u64::MAX, |m| m.saturating_sub(self.consumed()));
        if remaining == 0 {
            return Ok(Some(Stop::MaxMessages));
        }
        let active: Vec<i32> = self
            .tasks
            .iter()
            .filter(|(_, t)| !t.caught_up)
            .map(|(&p, _)| p)
            .collect();
        if active.is_empty() {
            return Ok(None);
        }
        // max_messages shared out: no turn may take a message past it, whichever runs first.
        let share = |i: usize| {
            let n = active.len() as u64;
            (remaining / n + u64::from((i as u64) < remaining % n)).min(remaining)
        };
        // A task whose share is nothing waits for the next turns (by then the others have read
        // theirs or caught up, and what is left is shared out again).
        let turns: Vec<(i32, Arc<Mutex<Turn>>)> = active
            .iter()
            .enumerate()
            .filter_map(|(i, &p)| {
                let budget = share(i);
                let task = (budget > 0).then(|| self.tasks.remove(&p)).flatten()?;
                Some((p, Arc::new(Mutex::new(Turn::new(task, budget)))))
            })
            .collect();
        for (_, turn) in &turns {
            let turn = Arc::clone(turn);
            let clock = Arc::clone(&self.clock);
            let limits = CycleLimits {
                remaining_messages: 0,
                max_cycle_messages: TURN_MESSAGES,
                cycle_deadline: row_due,
                run_deadline: self.run_deadline,
                max_pending_rows: MAX_PENDING_ROWS,
                // The run waits for more itself, for all tasks at once.
                follow: false,
                rolling: false,
                quiet_flush_ms: self.cfg.quiet_flush_ms,
                interrupt: Some(Arc::clone(&self.interrupt)),
            };
            self.pool
                .submit(Box::new(move || lock(&turn).take(limits, &*clock)));
        }
        // A turn is over once its job is gone (it holds the turn until it returns).
        let waited = self
            .pool
            .help_until(|| turns.iter().all(|(_, t)| Arc::strong_count(t) == 1));
        let mut outcome: Result<Option<Stop>> = waited.map(|()| None);
        for (p, turn) in turns {
            let Turn { task, stop, .. } = match Arc::try_unwrap(turn) {
                Ok(m) => m.into_inner().unwrap_or_else(PoisonError::into_inner),
                Err(_) => {
                    outcome = Err(EtlError::Internal(format!(
                        "the turn of partition {p} was still running"
                    )));
                    continue;
                }
            };
            let mut task = task;
            let stop = stop
                .unwrap_or_else(|| Err(EtlError::Internal("a turn ended without a result".into())));
            match (stop, &outcome) {
                (Err(e), Ok(_)) => outcome = Err(e),
                (Ok(Stop::CaughtUp), _) => {
                    task.caught_up = true;
                    task.read.look_again();
                }
                // Its turn is over (messages or pending rows): the next turn goes on, unless
                // the task holds a cycle's worth.
                (Ok(Stop::CycleEnd), Ok(None))
                    if Instant::now() < row_due && task.engine.cycle_full(MAX_PENDING_ROWS) =>
                {
                    outcome = Ok(Some(Stop::CycleEnd));
                }
                (Ok(Stop::CycleEnd), Ok(None)) if Instant::now() < row_due => {}
                // Its share of max_messages is read, not necessarily the run's: the next turn
                // looks at what is left.
                (Ok(Stop::MaxMessages), Ok(None)) => {}
                (Ok(other), Ok(None)) => outcome = Ok(Some(other)),
                _ => {}
            }
            self.tasks.insert(p, task);
        }
        if let Ok(None) = outcome {
            // A rebalance is served between turns, so a revoked partition stops being read.
            self.serve_group(Duration::ZERO)?;
        }
        outcome
    }

    /// Commits the tasks that changed; a task whose partition moved to a newer owner is
    /// dropped with what it read, and the others are committed without it.
    fn commit(&mut self) -> Result<()> {
        let mut ids = Vec::new();
        let mut states = Vec::new();
        for (&p, t) in self.tasks.iter_mut() {
            t.engine.take_output(&mut t.batch)?;
            let progress = t.engine.progress();
            let Some(pp) = progress.first() else { continue };
            // The source's own position only when nothing it delivered waits to be merged.
            let next_offset = t
                .source
                .position(0)
                .filter(|_| t.read.drained(0))
                .map_or(pp.next_offset, |at| at.max(pp.next_offset));
            let watermark_ms = t.engine.watermark_ms();
            if t.batch.is_empty()
                && next_offset == t.committed_offset
                && watermark_ms == t.committed_watermark_ms
            {
                continue;
            }
            let mut open_windows = Vec::new();
            t.engine.encode_open_windows(&mut open_windows)?;
            t.state_bytes = open_windows.len() as u64;
            ids.push(p);
            states.push(PartitionSnapshot {
                seq: t.seq + 1,
                next_offset,
                max_event_time_ms: pp.clock.max_event_time_ms,
                last_delivery_ms: pp.clock.last_delivery_ms,
                watermark_ms,
                open_windows: Some(open_windows),
            });
        }
        let mut written = Written::default();
        while !ids.is_empty() {
            let parts: Vec<PartitionCommit<'_>> = ids
                .iter()
                .zip(&states)
                .filter_map(|(p, s)| {
                    let t = self.tasks.get(p)?;
                    Some(PartitionCommit {
                        partition: *p,
                        generation: t.generation,
                        state: s.clone(),
                        batch: &t.batch,
                    })
                })
                .collect();
            let moved = {
                let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
                let (moved, w) = store.commit(&self.owner, &parts)?;
                written = w;
                moved
            };
            drop(parts);
            if moved.is_empty() {
                break;
            }
            for m in moved {
                eprintln!(
                    "streaming_etl: job '{}': partition {} moved to another member ({}, generation {}; ours was {}): this member stopped working on it, and what it read since its last commit is not written (the new owner reads it again)",
                    self.cfg.job, m.partition, m.owner, m.generation, m.our_generation
                );
                if let Some(i) = ids.iter().position(|&p| p == m.partition) {
                    ids.remove(i);
                    states.remove(i);
                }
                self.retire(m.partition);
                self.fenced.insert(m.partition, Instant::now());
                self.moved.push(m);
            }
        }
        let mut offsets = Vec::new();
        let mut engine = streaming_etl_core::Counters::default();
        for (p, s) in ids.iter().zip(states) {
            if let Some(t) = self.tasks.get_mut(p) {
                let before = self.committed_counts.get(p).copied().unwrap_or_default();
                add(&mut engine, crate::job::minus(t.engine.counters(), before));
                t.seq = s.seq;
                t.committed_offset = s.next_offset;
                t.committed_watermark_ms = s.watermark_ms;
                t.batch.clear();
                offsets.push((*p, s.next_offset));
                self.committed_counts.insert(*p, t.engine.counters());
            }
        }
        if let Some(w) = written.windows {
            self.written_adjust.0 += w as i64 - engine.windows_emitted as i64;
        }
        if let Some(l) = written.late {
            self.written_adjust.1 += l as i64 - engine.late_events as i64;
        }
        for t in self.tasks.values_mut() {
            t.batch.clear();
        }
        if !offsets.is_empty() {
            self.group.committed(&offsets);
        }
        Ok(())
    }

    /// The threads the run's parsing and windows use.
    pub fn threads(&self) -> usize {
        self.cfg.threads
    }

    /// A flag that, once set, ends the cycle in progress early (the tasks' turns within a wait
    /// of their sources), everything read so far committed as at any cycle's end: how a
    /// background job stops without waiting out its cycle.
    pub fn interrupter(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.interrupt)
    }

    /// A fault the member rides out (its brokers out of reach), for reports.
    pub fn unreachable(&mut self) -> Option<String> {
        self.group.unreachable()
    }

    /// How far the member's partitions are behind the high watermarks its consumer last saw
    /// (messages); None before any partition is assigned.
    pub fn lag(&self) -> Option<i64> {
        self.tasks
            .values()
            .filter_map(Task::lag)
            .fold(None, |sum, l| Some(sum.unwrap_or(0) + l))
    }

    /// The run's row: the counts of what it committed.
    pub fn stats(&self) -> RunStats {
        let mut c = self.retired;
        for p in self.tasks.keys() {
            if let Some(done) = self.committed_counts.get(p) {
                add(&mut c, *done);
            }
        }
        let adjust = |n: u64, by: i64| (n as i64 + by).max(0) as u64;
        c.windows_emitted = adjust(c.windows_emitted, self.written_adjust.0);
        c.late_events = adjust(c.late_events, self.written_adjust.1);
        // The watermark reported is the lowest of the tasks' (each closes on its own).
        let watermark = self
            .tasks
            .values()
            .map(|t| t.engine.watermark_ms())
            .filter(|&w| w != NO_WATERMARK)
            .min()
            .unwrap_or(NO_WATERMARK);
        let open: usize = self.tasks.values().map(|t| t.engine.open_windows()).sum();
        let state_bytes = self.tasks.values().map(|t| t.state_bytes).sum();
        let mut s = RunStats::new(
            &self.cfg.job,
            c,
            watermark,
            self.started,
            (open, self.tasks.len()),
            self.cycles,
            self.stop,
        );
        s.state_bytes = state_bytes;
        s
    }
}

/// One task's turn, run on any of the run's threads.
struct Turn {
    task: Task,
    /// The messages it may take (its share of what `max_messages` leaves).
    budget: u64,
    stop: Option<Result<Stop>>,
}

impl Turn {
    fn new(task: Task, budget: u64) -> Turn {
        Turn {
            task,
            budget,
            stop: None,
        }
    }

    fn take(&mut self, mut limits: CycleLimits, clock: &dyn Clock) {
        limits.remaining_messages = self.budget;
        let wall = || clock.wall_ms();
        let t = &mut self.task;
        self.stop = Some(read_cycle(
            &mut t.engine,
            t.source.as_mut(),
            &mut t.read,
            &limits,
            &wall,
        ));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The settings as stored in a state row: one `name=value` per line, fixed entries first.
pub fn settings_text(s: &JobSettings) -> String {
    let mut text = format!(
        "topic={}\nwindow_ms={}\nlateness_ms={}\nkey_field={}\ntime_field={}\nvalue_field={}\n",
        s.source, s.window_ms, s.lateness_ms, s.key_field, s.time_field, s.value_field
    );
    text += &s.extra_text();
    text
}

/// The settings back from [`settings_text`]; None when the text is not in that form.
pub fn parse_settings(text: &str) -> Option<JobSettings> {
    let mut all = JobSettings::parse_extra(text);
    let mut take = |k: &str| all.remove(k);
    let source = take("topic")?;
    let window_ms = take("window_ms")?.parse().ok()?;
    let lateness_ms = take("lateness_ms")?.parse().ok()?;
    let key_field = take("key_field")?;
    let time_field = take("time_field")?;
    let value_field = take("value_field")?;
    Some(JobSettings {
        source,
        window_ms,
        lateness_ms,
        key_field,
        time_field,
        value_field,
        extra: all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn settings_survive_their_stored_form() {
        let mut s = JobSettings {
            source: "orders".into(),
            window_ms: 1000,
            lateness_ms: 200,
            key_field: "key".into(),
            time_field: "ts".into(),
            value_field: "v".into(),
            extra: BTreeMap::new(),
        };
        s.extra.insert("subscribe".into(), "true".into());
        s.extra.insert("hop_ms".into(), "500".into());
        assert_eq!(parse_settings(&settings_text(&s)), Some(s));
        assert_eq!(parse_settings("window_ms=5\n"), None);
    }
}
