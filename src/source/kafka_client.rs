//! The librdkafka consumer both Kafka sources are built on (`kafka.rs`, partitions assigned
//! explicitly; `kafka_group.rs`, a member of the job's consumer group): its configuration, the
//! context that keeps its last error and hands a group's rebalances to the member, and what
//! they ask the brokers before reading (the topic's partitions, the offsets at a point in time,
//! where a partition starts).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use streaming_etl_core::Gap;

use crate::params::{KafkaParams, Start};

/// Keeps librdkafka's last error, so a timeout can say what went wrong (refused connection,
/// failed authentication, ...), and keeps its logs out of the user's terminal.
#[derive(Default)]
pub struct Context {
    last_error: Mutex<Option<String>>,
    /// How many errors librdkafka has reported (a member looks at its brokers after one).
    errors: AtomicU64,
    /// A `subscribe` consumer's rebalance handling (None: partitions assigned explicitly).
    group: Option<Arc<dyn Rebalance>>,
}

/// What a subscribed consumer does when the group assigns or revokes partitions (the group
/// member's hooks, in `kafka_group.rs`); called inside `poll`, on the run's thread.
pub(super) trait Rebalance: Send + Sync {
    fn rebalance(
        &self,
        ctx: &Context,
        consumer: &BaseConsumer<Context>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    );
}

impl Context {
    /// The context of a subscribed consumer.
    pub(super) fn with_group(group: Arc<dyn Rebalance>) -> Context {
        Context {
            last_error: Mutex::new(None),
            errors: AtomicU64::new(0),
            group: Some(group),
        }
    }

    pub(super) fn set_last_error(&self, error: String) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error);
    }

    /// How many errors librdkafka has reported so far.
    pub(super) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ClientContext for Context {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {}

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.set_last_error(format!("{error} ({reason})"));
    }
}

impl ConsumerContext for Context {
    /// Only a subscribed consumer is rebalanced; it claims what it is given before reading it.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        if let Some(g) = &self.group {
            g.rebalance(self, consumer, err, tpl);
        }
    }
}

pub(super) fn kafka_error(e: &KafkaError) -> String {
    e.to_string()
}

/// Messages taken from a partition's queue per call.
pub(super) const BATCH: usize = 4096;

/// The consumer's configuration: the source's own settings, then the user's properties.
pub(super) fn client_config(params: &KafkaParams, follow: bool) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &params.brokers)
        .set("group.id", &params.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set(
            "socket.timeout.ms",
            params.timeout_ms.clamp(10, 300_000).to_string(),
        )
        .set("client.id", "streaming_etl")
        // librdkafka prefetches up to 64 MiB per partition by default; a few MiB keep the
        // fetcher ahead of the pipeline without the memory. Once a partition's prefetch is
        // full, the fetcher pauses it for fetch.queue.backoff.ms (1 s by default): reading
        // partitions evenly drains it in well under that, so the pause would starve the run.
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.queue.backoff.ms", "5");
    if follow {
        // A continuous run waits for new messages: the broker answers a fetch as soon as
        // data arrives, or after this long.
        config.set("fetch.wait.max.ms", "100");
    }
    for (k, v) in &params.properties {
        config.set(k, v);
    }
    config
}

/// Where partition `p` (offsets `low..high` on the broker) is read from: its `stored` next
/// offset, moved up to `low` with a gap when retention deleted what it pointed at; without one,
/// where `new` says (`by_time`: the first offset at or after its time, when it has one).
pub(super) fn start_offset(
    p: i32,
    stored: Option<i64>,
    (low, high): (i64, i64),
    new: Start,
    by_time: Option<i64>,
    gaps: &mut Vec<Gap>,
) -> i64 {
    match stored {
        Some(next) if next < low => {
            gaps.push(Gap {
                partition: p,
                from: next,
                message: format!(
                    "messages at offsets {next} to {} were deleted by the broker (retention) before this job read them",
                    low - 1
                ),
            });
            low
        }
        Some(next) => next,
        None => match new {
            Start::Earliest => low,
            Start::Latest => high,
            Start::Time(_) => by_time.unwrap_or(high).clamp(low, high),
        },
    }
}

pub(super) enum PartitionsError {
    Kafka(KafkaError),
    Other(String),
}

/// The topic's partition ids, sorted.
pub(super) fn partition_ids(
    consumer: &BaseConsumer<Context>,
    source_name: &str,
    topic: &str,
    brokers: &str,
    timeout: Duration,
) -> std::result::Result<Vec<i32>, PartitionsError> {
    let _ = source_name;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(PartitionsError::Kafka)?;
    let Some(meta) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Err(PartitionsError::Other(format!(
            "topic '{topic}' does not exist on '{brokers}'"
        )));
    };
    if let Some(e) = meta.error() {
        let code = RDKafkaErrorCode::from(e);
        return Err(PartitionsError::Other(match code {
            RDKafkaErrorCode::UnknownTopicOrPartition => {
                format!("topic '{topic}' does not exist on '{brokers}'")
            }
            other => format!("topic '{topic}' on '{brokers}': {other}"),
        }));
    }
    let mut ids: Vec<i32> = meta.partitions().iter().map(|p| p.id()).collect();
    ids.sort_unstable();
    if ids.is_empty() {
        return Err(PartitionsError::Other(format!(
            "topic '{topic}' has no partitions"
        )));
    }
    Ok(ids)
}

/// For each partition, the first offset whose timestamp is at or after `t` (None past the end).
pub(super) fn offsets_for_time(
    consumer: &BaseConsumer<Context>,
    topic: &str,
    ids: &[i32],
    t: i64,
    timeout: Duration,
) -> std::result::Result<HashMap<i32, i64>, String> {
    let mut tpl = TopicPartitionList::new();
    for &p in ids {
        tpl.add_partition_offset(topic, p, Offset::Offset(t))
            .map_err(|e| kafka_error(&e))?;
    }
    let got = consumer
        .offsets_for_times(tpl, timeout)
        .map_err(|e| kafka_error(&e))?;
    let mut out = HashMap::new();
    for e in got.elements() {
        if let Err(err) = e.error() {
            return Err(kafka_error(&err));
        }
        if let Offset::Offset(o) = e.offset() {
            out.insert(e.partition(), o);
        }
    }
    Ok(out)
}
