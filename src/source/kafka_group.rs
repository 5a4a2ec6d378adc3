//! The Kafka source of a `subscribe` run: a member of the job's consumer group, using the
//! classic group protocol with cooperative-sticky assignment (only the partitions that move are
//! revoked). When the group assigns a partition, the rebalance callback claims it in the output
//! catalog first (which says where its last owner's commit left it), splits off its queue and
//! only then assigns it at that offset, so no message is fetched from anywhere else. A revoke
//! is handed to the run, which drops the partition's task before it commits again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Message as _, Offset, TopicPartitionList};

use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::group::{Claim, Claimer, GroupEvent, GroupSource};

use super::kafka::KafkaSource;
use super::kafka_batch::PartitionBatches;
use super::kafka_client::{
    client_config, kafka_error, offsets_for_time, start_offset, Context, Rebalance, BATCH,
};
use super::registry::Registry;
use crate::params::{KafkaParams, Start};

/// What the rebalance callback needs (it runs inside `poll`, on the run's thread).
pub struct GroupHooks {
    consumer: OnceLock<Weak<BaseConsumer<Context>>>,
    claimer: Mutex<Claimer>,
    events: Mutex<Vec<GroupEvent>>,
    failure: Mutex<Option<EtlError>>,
    joined: AtomicBool,
    topic: String,
    source_name: String,
    brokers: String,
    timeout: Duration,
    follow: bool,
    start: Start,
    registry: Option<Arc<Registry>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl GroupHooks {
    fn fail(&self, e: EtlError) {
        locked(&self.failure).get_or_insert(e);
    }

    /// Claims `partitions` (one catalog transaction for all).
    fn claim(&self, partitions: &[i32]) -> Result<Vec<Claim>> {
        (locked(&self.claimer))(partitions)
    }

    /// Opens the source of a claimed partition; returns where reading starts.
    fn take(
        &self,
        consumer: &Arc<BaseConsumer<Context>>,
        claim: Claim,
    ) -> Result<(i64, GroupEvent)> {
        let err = |m: String| EtlError::source(&self.source_name, m);
        let p = claim.partition;
        let (low, high) = consumer
            .fetch_watermarks(&self.topic, p, self.timeout)
            .map_err(|e| err(format!("partition {p}: {}", kafka_error(&e))))?;
        let stored = claim.stored.as_ref().map(|s| s.next_offset);
        let by_time = match (stored, self.start) {
            (None, Start::Time(t)) => {
                offsets_for_time(consumer, &self.topic, &[p], t, self.timeout)
                    .map_err(err)?
                    .get(&p)
                    .copied()
            }
            _ => None,
        };
        let mut gaps = Vec::new();
        let start = start_offset(p, stored, (low, high), self.start, by_time, &mut gaps);
        let mut queue = PartitionBatches::split(consumer, &self.topic, p, BATCH)
            .ok_or_else(|| err(format!("cannot open a queue for partition {p}")))?;
        // Not assigned yet: whatever waits in its queue was fetched for an earlier assignment.
        queue.discard_waiting();
        let source = KafkaSource::group_partition(
            consumer,
            &self.source_name,
            &self.topic,
            &self.brokers,
            self.timeout,
            self.follow,
            queue,
            (p, start, high),
            gaps,
            self.registry.clone(),
        );
        Ok((
            start,
            GroupEvent::Assigned {
                claim,
                source: Box::new(source),
            },
        ))
    }
}

impl Rebalance for GroupHooks {
    fn rebalance(
        &self,
        ctx: &Context,
        consumer: &BaseConsumer<Context>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let ids: Vec<i32> = tpl
            .elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let Some(arc) = self.consumer.get().and_then(Weak::upgrade) else {
                    return;
                };
                let mut taken = TopicPartitionList::new();
                let mut events = Vec::new();
                // The run fails at its next look; what is not taken is left unread.
                match self.claim(&ids) {
                    Ok(claims) => {
                        for claim in claims {
                            let p = claim.partition;
                            match self.take(&arc, claim) {
                                Ok((start, event)) => {
                                    if taken
                                        .add_partition_offset(&self.topic, p, Offset::Offset(start))
                                        .is_ok()
                                    {
                                        events.push(event);
                                    }
                                }
                                Err(e) => self.fail(e),
                            }
                        }
                    }
                    Err(e) => self.fail(e),
                }
                let assigned = if cooperative {
                    consumer.incremental_assign(&taken)
                } else {
                    consumer.assign(&taken)
                };
                if let Err(e) = assigned {
                    self.fail(EtlError::source(
                        &self.source_name,
                        format!("cannot assign partitions: {}", kafka_error(&e)),
                    ));
                }
                events.push(GroupEvent::Rebalanced);
                locked(&self.events).extend(events);
                self.joined.store(true, Ordering::Release);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // The run drops these tasks before it commits again (it commits on this thread,
                // never while a rebalance callback runs).
                let mut events = locked(&self.events);
                events.extend(ids.into_iter().map(GroupEvent::Revoked));
                events.push(GroupEvent::Rebalanced);
                drop(events);
                let _ = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
            }
            other => {
                ctx.set_last_error(format!("rebalance failed: {other:?}"));
                let _ = consumer.unassign();
            }
        }
    }
}

/// A member of the job's consumer group.
pub struct KafkaGroup {
    consumer: Option<Arc<BaseConsumer<Context>>>,
    /// The rebalance callback's state, shared with the consumer's context.
    hooks: Arc<GroupHooks>,
    topic: String,
    source_name: String,
    timeout: Duration,
    brokers: String,
    /// Since when, and why, the brokers have not answered (see `unreachable`).
    outage: Option<(Instant, String)>,
    /// When the brokers were last asked, and the client's error count then.
    probed: Option<(Instant, u64)>,
}

/// How often a member asks its brokers for the topic while they do not answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);

impl KafkaGroup {
    /// Joins the group `params.group_id` for `topic`; partitions are claimed with `claimer` as
    /// they are assigned.
    pub fn open(
        source_name: &str,
        topic: &str,
        params: &KafkaParams,
        follow: bool,
        start: Start,
        claimer: Claimer,
        registry: Option<Arc<Registry>>,
    ) -> Result<KafkaGroup> {
        let err = |m: String| EtlError::source(source_name, m);
        let mut config = client_config(params, follow);
        // The user's `kafka` properties come last and win, except for the strategy's default.
        if !params
            .properties
            .iter()
            .any(|(k, _)| k == "partition.assignment.strategy")
        {
            config.set("partition.assignment.strategy", "cooperative-sticky");
        }
        let timeout = Duration::from_millis(params.timeout_ms as u64);
        let hooks = Arc::new(GroupHooks {
            consumer: OnceLock::new(),
            claimer: Mutex::new(claimer),
            events: Mutex::new(Vec::new()),
            failure: Mutex::new(None),
            joined: AtomicBool::new(false),
            topic: topic.to_string(),
            source_name: source_name.to_string(),
            brokers: params.brokers.clone(),
            timeout,
            follow,
            start,
            registry,
        });
        let context = Context::with_group(Arc::clone(&hooks) as Arc<dyn Rebalance>);
        let consumer: BaseConsumer<Context> = config
            .create_with_context(context)
            .map_err(|e| err(format!("invalid Kafka configuration: {}", kafka_error(&e))))?;
        let consumer = Arc::new(consumer);
        let _ = hooks.consumer.set(Arc::downgrade(&consumer));
        // The topic must exist: subscribing to a missing one would wait for it silently.
        let metadata = consumer.fetch_metadata(Some(topic), timeout).map_err(|e| {
            let detail = consumer
                .context()
                .last_error()
                .unwrap_or_else(|| kafka_error(&e));
            err(format!(
                "cannot reach Kafka brokers '{}' within {} ms: {detail}",
                params.brokers, params.timeout_ms
            ))
        })?;
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Err(err(format!(
                "topic '{topic}' does not exist on '{}'",
                params.brokers
            )));
        }
        consumer.subscribe(&[topic]).map_err(|e| {
            err(format!(
                "cannot subscribe to '{topic}': {}",
                kafka_error(&e)
            ))
        })?;
        Ok(KafkaGroup {
            consumer: Some(consumer),
            hooks,
            topic: topic.to_string(),
            source_name: source_name.to_string(),
            timeout,
            brokers: params.brokers.clone(),
            outage: None,
            probed: None,
        })
    }

    /// The rebalance callback's state, while the consumer is open.
    fn hooks(&self) -> Option<&GroupHooks> {
        self.consumer.as_ref().map(|_| &*self.hooks)
    }
}

impl GroupSource for KafkaGroup {
    fn poll(&mut self, wait: Duration) -> Result<Vec<GroupEvent>> {
        let Some(consumer) = &self.consumer else {
            return Ok(Vec::new());
        };
        match consumer.poll(wait) {
            // Every assigned partition has its own queue: a message here would be one no task
            // reads, so the run stops rather than lose it.
            Some(Ok(m)) => {
                return Err(EtlError::source(
                    &self.source_name,
                    format!(
                        "a message of partition {} arrived outside its partition's queue (offset {}); the run stops so that nothing is lost, and the next run resumes from the last commit",
                        m.partition(),
                        m.offset()
                    ),
                ))
            }
            Some(Err(e)) => consumer.context().set_last_error(kafka_error(&e)),
            None => {}
        }
        let Some(h) = self.hooks() else {
            return Ok(Vec::new());
        };
        if let Some(e) = locked(&h.failure).take() {
            return Err(e);
        }
        Ok(std::mem::take(&mut *locked(&h.events)))
    }

    /// The group's brokers out of reach for longer than the timeout. A member whose client
    /// reported an error (or that is in an outage) asks the brokers for the topic's metadata,
    /// at most once a second; a member that hears nothing wrong asks nothing.
    fn unreachable(&mut self) -> Option<String> {
        let consumer = self.consumer.as_ref()?;
        let errors = consumer.context().errors();
        let due = match self.probed {
            None => errors > 0,
            Some((at, seen)) => {
                (seen != errors || self.outage.is_some()) && at.elapsed() >= PROBE_EVERY
            }
        };
        if due {
            self.probed = Some((Instant::now(), errors));
            let wait = self.timeout.min(Duration::from_millis(500));
            match consumer.fetch_metadata(Some(&self.topic), wait) {
                Ok(_) => self.outage = None,
                Err(e) if self.outage.is_none() => {
                    let why = consumer
                        .context()
                        .last_error()
                        .unwrap_or_else(|| kafka_error(&e));
                    self.outage = Some((Instant::now(), why));
                }
                Err(_) => {}
            }
        }
        let (since, why) = self.outage.as_ref()?;
        (since.elapsed() >= self.timeout).then(|| {
            format!(
                "cannot reach Kafka brokers '{}' for {} s (the member waits for them): {why}",
                self.brokers,
                since.elapsed().as_secs()
            )
        })
    }

    fn joined(&self) -> bool {
        self.hooks()
            .is_some_and(|h| h.joined.load(Ordering::Acquire))
    }

    fn join_timeout(&self) -> Duration {
        // Joining waits for the group's other members to rejoin too (up to a session timeout,
        // 45 s by default), so the bound is generous.
        self.timeout.max(Duration::from_secs(60))
    }

    fn committed(&mut self, offsets: &[(i32, i64)]) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        for &(p, next) in offsets {
            if tpl
                .add_partition_offset(&self.topic, p, Offset::Offset(next))
                .is_err()
            {
                return;
            }
        }
        // Informational (lag tools): the catalog's state rows are what partitions resume from.
        let _ = consumer.commit(&tpl, CommitMode::Async);
    }

    fn reclaim(&mut self, partition: i32) -> Result<Option<GroupEvent>> {
        let Some(consumer) = self.consumer.clone() else {
            return Ok(None);
        };
        let assigned = consumer.assignment().is_ok_and(|tpl| {
            tpl.elements()
                .iter()
                .any(|e| e.topic() == self.topic && e.partition() == partition)
        });
        if !assigned {
            return Ok(None);
        }
        let Some(claim) = self.hooks.claim(&[partition])?.pop() else {
            return Ok(None);
        };
        let (start, event) = self.hooks.take(&consumer, claim)?;
        // Assigned all along: the fetcher is moved to where the claim says, and what its queue
        // held was dropped by the claim.
        self.seek(partition, start)?;
        Ok(Some(event))
    }

    fn resume_at(&mut self, positions: &[(i32, i64)]) -> Result<()> {
        // librdkafka (2.12) pauses every assigned partition while a rebalance callback is due
        // and resumes it at the position after the last message handed out. That position is
        // wrong for our batched reads: an end-of-partition event counts as a message (the
        // partition resumes one past its end, skipping the next message produced), and a
        // partition paused before anything was handed out resumes at the group's committed
        // offset (or the earliest). A seek puts each kept partition where its task stands.
        for &(p, next) in positions {
            self.seek(p, next)?;
        }
        Ok(())
    }
}

impl KafkaGroup {
    fn seek(&self, p: i32, next: i64) -> Result<()> {
        let Some(consumer) = &self.consumer else {
            return Ok(());
        };
        consumer
            .seek(&self.topic, p, Offset::Offset(next), self.timeout)
            .map_err(|e| {
                EtlError::source(
                    &self.source_name,
                    format!(
                        "cannot go on reading partition {p} at offset {next} after a rebalance: {}; the next run resumes from the last commit",
                        kafka_error(&e)
                    ),
                )
            })
    }
}

impl Drop for KafkaGroup {
    fn drop(&mut self) {
        let Some(consumer) = self.consumer.take() else {
            return;
        };
        // Leaving the group waits for the coordinator (long when the broker is gone): on a
        // thread of its own. The tasks' queues hold the consumer too; whichever goes last
        // closes it.
        let closing = std::thread::Builder::new()
            .name("streaming_etl-kafka-leave".into())
            .spawn(move || drop(consumer));
        drop(closing);
    }
}
