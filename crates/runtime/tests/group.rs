//! `subscribe` runs without DuckDB or Kafka: a store that keeps state rows and output tables in
//! memory (checking each commit's generation as the DuckLake store does) and a group whose
//! assignment the test sets. A partition handed from one member to another mid-stream ends as
//! one straight run; a member whose partition was claimed by another cannot commit it, and takes
//! it back from the last commit if the group still assigns it there.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use streaming_etl_core::{
    MemorySource, Message, OutputSchemas, OwnedCell, Pull, Result, Source, SourcePartition,
};
use streaming_etl_runtime::config::{CheckpointLocation, JobConfig};
use streaming_etl_runtime::group::{
    Claim, Claimer, GroupEnv, GroupEvent, GroupRun, GroupSource, Moved, PartitionCommit,
    PartitionSnapshot, PartitionStore,
};
use streaming_etl_runtime::sink::Written;

/// The catalog: state rows by partition, and the output rows (windows keyed, as upserts are).
#[derive(Default)]
struct Lake {
    state: BTreeMap<i32, (i64, String, Option<PartitionSnapshot>)>,
    windows: BTreeMap<String, Vec<OwnedCell>>,
    late: Vec<Vec<OwnedCell>>,
    dead: Vec<Vec<OwnedCell>>,
    /// Partitions another member claims just before this member's next commit.
    steal: BTreeSet<i32>,
}

type Shared = Arc<Mutex<Lake>>;

struct Store(Shared);

impl PartitionStore for Store {
    fn prepare(&mut self, _schemas: &OutputSchemas) -> Result<()> {
        Ok(())
    }

    fn claim(&mut self, partitions: &[i32], owner: &str) -> Result<Vec<Claim>> {
        let mut lake = self.0.lock().unwrap();
        let mut claims = Vec::new();
        for &partition in partitions {
            let (generation, stored) = lake
                .state
                .get(&partition)
                .map_or((0, None), |(g, _, s)| (*g, s.clone()));
            lake.state
                .insert(partition, (generation + 1, owner.into(), stored.clone()));
            claims.push(Claim {
                partition,
                generation: generation + 1,
                stored,
            });
        }
        Ok(claims)
    }

    fn commit(
        &mut self,
        owner: &str,
        parts: &[PartitionCommit<'_>],
    ) -> Result<(Vec<Moved>, Written)> {
        let mut lake = self.0.lock().unwrap();
        for p in std::mem::take(&mut lake.steal) {
            let (g, _, s) = lake
                .state
                .get(&p)
                .cloned()
                .unwrap_or((0, String::new(), None));
            lake.state.insert(p, (g + 1, "thief".into(), s));
        }
        let moved: Vec<Moved> = parts
            .iter()
            .filter_map(|p| {
                let (g, o, _) = lake.state.get(&p.partition)?;
                (*g != p.generation || o != owner).then(|| Moved {
                    partition: p.partition,
                    our_generation: p.generation,
                    generation: *g,
                    owner: o.clone(),
                })
            })
            .collect();
        if !moved.is_empty() {
            return Ok((moved, Written::default()));
        }
        for p in parts {
            for mut row in p.batch.windows.to_vec() {
                row.push(OwnedCell::I32(p.partition));
                lake.windows.insert(
                    format!("{:?}", &row[..3]) + &format!("{:?}", row.last()),
                    row,
                );
            }
            lake.late.extend(p.batch.late.to_vec());
            lake.dead.extend(p.batch.dead.to_vec());
            lake.state.insert(
                p.partition,
                (p.generation, owner.into(), Some(p.state.clone())),
            );
        }
        Ok((Vec::new(), Written::default()))
    }
}

/// What the test tells a member's group: assign or revoke partitions at its next poll.
#[derive(Default)]
struct Coordinator {
    pending: BTreeMap<String, Vec<(bool, i32)>>,
}

struct Group {
    owner: String,
    coordinator: Arc<Mutex<Coordinator>>,
    data: Arc<Vec<Vec<String>>>,
    claimer: Claimer,
    assigned: BTreeSet<i32>,
}

impl Group {
    fn open(&mut self, p: i32) -> Result<GroupEvent> {
        let claim = (self.claimer)(&[p])?.remove(0);
        self.source(claim)
    }

    fn source(&self, claim: Claim) -> Result<GroupEvent> {
        let p = claim.partition;
        let start = claim.stored.as_ref().map_or(0, |s| s.next_offset);
        let source = MemorySource::new(vec![self.data[p as usize].clone()], &[start]);
        Ok(GroupEvent::Assigned {
            claim,
            source: Box::new(source) as Box<dyn Source>,
        })
    }
}

impl GroupSource for Group {
    fn poll(&mut self, _wait: Duration) -> Result<Vec<GroupEvent>> {
        let changes = self
            .coordinator
            .lock()
            .unwrap()
            .pending
            .remove(&self.owner)
            .unwrap_or_default();
        // What one rebalance assigns is claimed at once, as the Kafka group does.
        let assigned: Vec<i32> = changes.iter().filter(|c| c.0).map(|c| c.1).collect();
        let mut claims = (self.claimer)(&assigned)?.into_iter();
        let mut events = Vec::new();
        for (assign, p) in changes {
            if assign {
                self.assigned.insert(p);
                let claim = claims.next().expect("a claim per partition assigned");
                assert_eq!(claim.partition, p);
                events.push(self.source(claim)?);
            } else {
                self.assigned.remove(&p);
                events.push(GroupEvent::Revoked(p));
            }
        }
        Ok(events)
    }

    fn joined(&self) -> bool {
        true
    }

    fn join_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn committed(&mut self, _offsets: &[(i32, i64)]) {}

    fn reclaim(&mut self, partition: i32) -> Result<Option<GroupEvent>> {
        if !self.assigned.contains(&partition) {
            return Ok(None);
        }
        self.open(partition).map(Some)
    }

    fn resume_at(&mut self, _positions: &[(i32, i64)]) -> Result<()> {
        Ok(())
    }
}

/// The common job, without the flush; `follow_ms`: a follow run that long.
fn config(max_messages: Option<u64>, follow_ms: Option<i64>) -> JobConfig {
    let mut cfg = common::config(CheckpointLocation::Memory, max_messages, 1000);
    cfg.flush = false;
    cfg.follow = follow_ms.is_some();
    cfg.max_runtime_ms = follow_ms;
    cfg.checkpoint_interval_ms = 300;
    cfg
}

struct Cluster {
    lake: Shared,
    coordinator: Arc<Mutex<Coordinator>>,
    data: Arc<Vec<Vec<String>>>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            lake: Shared::default(),
            coordinator: Arc::default(),
            data: Arc::new(common::data(0)),
        }
    }

    fn assign(&self, owner: &str, partitions: &[i32], assign: bool) {
        let mut c = self.coordinator.lock().unwrap();
        let pending = c.pending.entry(owner.to_string()).or_default();
        pending.extend(partitions.iter().map(|&p| (assign, p)));
    }

    fn member(&self, owner: &str, max_messages: Option<u64>, follow_ms: Option<i64>) -> GroupRun {
        self.member_on(owner, max_messages, follow_ms, 1)
    }

    /// A member whose partition tasks take their turns on `threads` threads.
    fn member_on(
        &self,
        owner: &str,
        max_messages: Option<u64>,
        follow_ms: Option<i64>,
        threads: usize,
    ) -> GroupRun {
        let mut cfg = config(max_messages, follow_ms);
        cfg.threads = threads;
        let (coordinator, data, name) = (
            Arc::clone(&self.coordinator),
            Arc::clone(&self.data),
            owner.to_string(),
        );
        GroupRun::start(
            Arc::new(cfg),
            GroupEnv {
                store: Box::new(Store(Arc::clone(&self.lake))),
                open_group: Box::new(move |claimer| {
                    Ok(Box::new(Group {
                        owner: name,
                        coordinator,
                        data,
                        claimer,
                        assigned: BTreeSet::new(),
                    }) as Box<dyn GroupSource>)
                }),
                clock: Arc::new(common::FixedClock),
                owner: owner.to_string(),
            },
        )
        .unwrap()
    }

    fn tables(&self) -> (Vec<Vec<OwnedCell>>, Vec<String>, Vec<String>) {
        let lake = self.lake.lock().unwrap();
        let mut late: Vec<String> = lake.late.iter().map(|r| format!("{r:?}")).collect();
        let mut dead: Vec<String> = lake.dead.iter().map(|r| format!("{r:?}")).collect();
        late.sort();
        dead.sort();
        (lake.windows.values().cloned().collect(), late, dead)
    }
}

fn to_end(run: &mut GroupRun) -> &'static str {
    while run.cycle().unwrap() {}
    run.stats().status
}

fn straight() -> (Vec<Vec<OwnedCell>>, Vec<String>, Vec<String>) {
    let c = Cluster::new();
    c.assign("s", &[0, 1, 2], true);
    assert_eq!(to_end(&mut c.member("s", None, None)), "caught_up");
    c.tables()
}

#[test]
fn partitions_handed_between_members_mid_stream_end_as_one_straight_run() {
    let want = straight();
    assert!(!want.0.is_empty() && !want.1.is_empty() && !want.2.is_empty());
    let c = Cluster::new();
    c.assign("a", &[0, 1, 2], true);
    assert_eq!(to_end(&mut c.member("a", Some(400), None)), "max_messages");
    // b takes p1 over where a's commit left it and reads part of it.
    c.assign("b", &[1], true);
    assert_eq!(to_end(&mut c.member("b", Some(150), None)), "max_messages");
    // c, a follow run, reads the rest; then p1 is revoked from it.
    c.assign("c", &[0, 1, 2], true);
    let mut m = c.member("c", None, Some(60_000));
    assert!(m.cycle().unwrap());
    c.assign("c", &[1], false);
    assert!(m.cycle().unwrap());
    assert_eq!(m.partitions(), vec![0, 2]);
    drop(m);
    c.assign("d", &[0, 1, 2], true);
    assert_eq!(to_end(&mut c.member("d", None, None)), "caught_up");
    assert_eq!(c.tables(), want);
    let lake = c.lake.lock().unwrap();
    assert!(lake
        .state
        .values()
        .all(|(g, _, s)| *g >= 3 && s.as_ref().unwrap().next_offset == 300));
}

#[test]
fn tasks_that_take_their_turns_on_several_threads_write_the_one_threads_rows() {
    let want = straight();
    for threads in [2, 3, 4] {
        let c = Cluster::new();
        // In pieces whose max_messages is shared out among the tasks, then to the end.
        for (owner, max, status) in [
            ("a", Some(250), "max_messages"),
            ("b", Some(101), "max_messages"),
            ("c", None, "caught_up"),
        ] {
            c.assign(owner, &[0, 1, 2], true);
            assert_eq!(to_end(&mut c.member_on(owner, max, None, threads)), status);
        }
        assert_eq!(c.tables(), want, "threads = {threads}");
        let lake = c.lake.lock().unwrap();
        assert!(lake
            .state
            .values()
            .all(|(_, _, s)| s.as_ref().unwrap().next_offset == 300));
    }
}

#[test]
fn max_messages_shared_out_among_uneven_partitions_is_read_in_full() {
    for threads in [1, 2] {
        let c = Cluster::new();
        c.assign("a", &[0], true);
        assert_eq!(to_end(&mut c.member("a", None, None)), "caught_up");
        // p0 has nothing left: its share goes to p1 and p2 once they have read theirs.
        c.assign("b", &[0, 1, 2], true);
        let mut b = c.member_on("b", Some(400), None, threads);
        assert_eq!(to_end(&mut b), "max_messages");
        assert_eq!(b.stats().events_consumed, 400, "threads = {threads}");
    }
}

#[test]
fn a_member_whose_partition_was_claimed_cannot_commit_it_and_takes_it_back_from_the_last_commit() {
    let c = Cluster::new();
    c.assign("a", &[0], true);
    let mut a = c.member("a", None, Some(4000));
    c.lake.lock().unwrap().steal.insert(0);
    // The whole partition is read in the first cycle; its commit finds a newer owner.
    assert!(a.cycle().unwrap());
    assert_eq!(a.moved.len(), 1);
    assert_eq!(
        (a.moved[0].partition, a.moved[0].owner.as_str()),
        (0, "thief")
    );
    assert!(a.partitions().is_empty());
    assert!(c.tables().0.is_empty() && c.tables().2.is_empty());
    // Still assigned to a by its group: a while later it claims it again, from the last
    // commit (none: the thief never committed), and writes it once.
    assert_eq!(to_end(&mut a), "max_runtime");
    assert_eq!(a.partitions(), vec![0]);
    let lake = c.lake.lock().unwrap();
    assert_eq!(lake.state[&0].0, 3);
    assert_eq!(lake.state[&0].2.as_ref().unwrap().next_offset, 300);
    assert_eq!(lake.dead.len(), 5);
}

/// A partition whose messages arrive while the run goes on (shared with the test); `fetch`:
/// messages the broker has and the fetcher brings at the next wait (counted in the end offset).
struct Growing {
    parts: Vec<SourcePartition>,
    lines: Arc<Mutex<Vec<String>>>,
    next: usize,
    fetch: Vec<String>,
}

impl Source for Growing {
    fn partitions(&self) -> &[SourcePartition] {
        &self.parts
    }

    fn pull(&mut self, _idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull> {
        let lines = self.lines.lock().unwrap();
        while let Some(l) = lines.get(self.next) {
            let offset = self.next as i64;
            self.next += 1;
            let go_on = each(&Message {
                offset,
                next_offset: offset + 1,
                payload: l.as_bytes(),
                key: None,
                timestamp: None,
                schema: None,
            });
            if !go_on {
                return Ok(Pull::Paused);
            }
        }
        Ok(Pull::Exhausted)
    }

    fn end_offset(&self, _idx: usize) -> Option<i64> {
        (!self.fetch.is_empty())
            .then(|| (self.lines.lock().unwrap().len() + self.fetch.len()) as i64)
    }

    fn wait(&mut self, _timeout: Duration) -> bool {
        let fetched = std::mem::take(&mut self.fetch);
        let arrived = !fetched.is_empty();
        self.lines.lock().unwrap().extend(fetched);
        arrived
    }
}

struct OnePartition {
    claimer: Claimer,
    lines: Arc<Mutex<Vec<String>>>,
    opened: bool,
    fetch: Vec<String>,
}

impl GroupSource for OnePartition {
    fn poll(&mut self, _wait: Duration) -> Result<Vec<GroupEvent>> {
        if self.opened {
            return Ok(Vec::new());
        }
        self.opened = true;
        let claim = (self.claimer)(&[0])?.remove(0);
        let parts = vec![SourcePartition {
            partition: 0,
            name: String::new(),
            identity: String::new(),
            start_offset: 0,
            gone: false,
        }];
        let source = Growing {
            parts,
            lines: Arc::clone(&self.lines),
            next: 0,
            fetch: std::mem::take(&mut self.fetch),
        };
        Ok(vec![GroupEvent::Assigned {
            claim,
            source: Box::new(source),
        }])
    }

    fn joined(&self) -> bool {
        true
    }

    fn join_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn committed(&mut self, _offsets: &[(i32, i64)]) {}

    fn reclaim(&mut self, _partition: i32) -> Result<Option<GroupEvent>> {
        Ok(None)
    }

    fn resume_at(&mut self, _positions: &[(i32, i64)]) -> Result<()> {
        Ok(())
    }
}

/// A follow member on one partition whose queue holds `lines` and whose broker has `fetch`
/// more; the catalog it commits to.
fn one_partition_member(lines: &Arc<Mutex<Vec<String>>>, fetch: Vec<String>) -> (GroupRun, Shared) {
    let lake = Shared::default();
    let (shared, claimed) = (Arc::clone(lines), Arc::clone(&lake));
    let run = GroupRun::start(
        Arc::new(config(None, Some(60_000))),
        GroupEnv {
            store: Box::new(Store(claimed)),
            open_group: Box::new(move |claimer| {
                Ok(Box::new(OnePartition {
                    claimer,
                    lines: shared,
                    opened: false,
                    fetch,
                }) as Box<dyn GroupSource>)
            }),
            clock: Arc::new(common::FixedClock),
            owner: "m".into(),
        },
    )
    .unwrap();
    (run, lake)
}

fn committed_offset(lake: &Shared) -> i64 {
    let lake = lake.lock().unwrap();
    lake.state[&0].2.as_ref().map_or(0, |s| s.next_offset)
}

#[test]
fn a_member_behind_its_broker_waits_for_the_fetch_rather_than_commit_what_it_closed() {
    let data = common::data(0).swap_remove(0);
    let lines = Arc::new(Mutex::new(data[..100].to_vec()));
    let (mut run, lake) = one_partition_member(&lines, data[100..300].to_vec());
    // The first 100 messages close windows, but the broker has 200 more: the cycle waits for
    // them and commits all 300 at once (caught up, it would have committed the 100 alone).
    while committed_offset_or_none(&lake).is_none() {
        assert!(run.cycle().unwrap());
    }
    assert_eq!(committed_offset(&lake), 300);
}

fn committed_offset_or_none(lake: &Shared) -> Option<i64> {
    let lake = lake.lock().unwrap();
    lake.state.get(&0)?.2.as_ref().map(|s| s.next_offset)
}

#[test]
fn a_follow_member_reads_what_arrives_after_it_caught_up() {
    let data = common::data(0).swap_remove(0);
    let lines = Arc::new(Mutex::new(data[..100].to_vec()));
    let (mut run, lake) = one_partition_member(&lines, Vec::new());
    let committed = || committed_offset(&lake);
    for (upto, cycles) in [(100, 0), (250, 1), (300, 2)] {
        let mut held = lines.lock().unwrap();
        let from = held.len();
        held.extend_from_slice(&data[from..upto]);
        drop(held);
        for _ in 0..20 {
            assert!(run.cycle().unwrap());
            if committed() == upto as i64 {
                break;
            }
        }
        assert_eq!(committed(), upto as i64, "after {cycles} appends");
    }
}
