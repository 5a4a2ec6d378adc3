//! The Kafka source: a topic's partitions, assigned explicitly (no group rebalancing) and read
//! from the checkpoint's offsets, each through its own librdkafka queue so the pipeline can
//! take the next message from whichever partition it wants without copying. A bounded run reads
//! each partition up to the end offset it saw when it started; a continuous one (`follow`)
//! keeps reading, and picks up partitions added to the topic. After each checkpoint the same
//! offsets are committed to the consumer group, for lag tools; the checkpoint stays the truth.
//! One file for the open consumer's life (open, assignment, reading, waiting, commits, close):
//! its parts share the consumer's state; its configuration and what it asks the brokers before
//! reading are in `kafka_client.rs`. A `subscribe` run reads each partition the group assigns it
//! through one of these too, on the group's consumer (`kafka_group.rs`).
//! Tested against real brokers in `test/python/test_kafka.py` and `test_group.py`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use streaming_etl_core::{EtlError, Gap, Message, Pull, Result, Source, SourcePartition};

use super::kafka_batch::{self, PartitionBatches, KAFKA_PARTITION_EOF};
use super::kafka_client::{
    client_config, kafka_error, offsets_for_time, partition_ids, start_offset, Context,
    PartitionsError, BATCH,
};
use super::registry::Registry;
use crate::params::{KafkaParams, Start};

/// How the source reads.
#[derive(Clone)]
pub struct KafkaOptions {
    pub follow: bool,
    pub start: Start,
    /// Avro and Protobuf: where the records' schema ids are looked up.
    pub registry: Option<Arc<Registry>>,
}

/// The open consumer; dropped on a thread of its own (see `Drop for KafkaSource`).
struct OpenConsumer {
    topic: String,
    source_name: String,
    brokers: String,
    consumer: Arc<BaseConsumer<Context>>,
    queues: Vec<PartitionBatches<Context>>,
    parts: Vec<SourcePartition>,
    /// The high watermark each partition had when the run started (bounded runs stop there).
    ends: Vec<i64>,
    next: Vec<i64>,
    /// The position after the end of data, past any transaction markers, when the partition
    /// reported its end.
    eof_at: Vec<Option<i64>>,
    done: Vec<bool>,
    timeout: Duration,
    follow: bool,
    /// The last offsets sent to the consumer group.
    last_commit: Option<TopicPartitionList>,
    only: Option<Vec<i32>>,
    /// Whether pulls serve the consumer's callbacks. A group's partitions leave that to the
    /// run, which repositions the partitions it keeps right after a rebalance, before any of
    /// them is read again.
    serves_callbacks: bool,
    registry: Option<Arc<Registry>>,
    /// The schema ids the last record's value and key named (known to the cache).
    last_schema: [Option<u32>; 2],
    /// A continuous run: since when, and why, the brokers have not answered a metadata request.
    unreachable: Option<(Instant, String)>,
}

pub struct KafkaSource {
    reader: Option<OpenConsumer>,
    gaps: Vec<Gap>,
}

impl KafkaSource {
    /// Connects, checks the topic, and assigns its partitions (or `only` those) at the
    /// checkpointed offsets (`offsets`); partitions the job has not read start where `start`
    /// says on its first run (`first_run`) and at the beginning afterwards.
    pub fn open(
        source_name: &str,
        topic: &str,
        params: &KafkaParams,
        offsets: &HashMap<i32, i64>,
        only: Option<&[i32]>,
        opts: KafkaOptions,
    ) -> Result<KafkaSource> {
        let err = |m: String| EtlError::source(source_name, m);
        let timeout = Duration::from_millis(params.timeout_ms as u64);
        let config = client_config(params, opts.follow);
        let consumer: BaseConsumer<Context> = config
            .create_with_context(Context::default())
            .map_err(|e| err(format!("invalid Kafka configuration: {}", kafka_error(&e))))?;
        let consumer = Arc::new(consumer);
        let unreachable = |e: KafkaError, c: &Context| {
            let detail = c.last_error().unwrap_or_else(|| kafka_error(&e));
            err(format!(
                "cannot reach Kafka brokers '{}' within {} ms: {detail}",
                params.brokers, params.timeout_ms
            ))
        };
        let mut ids = partition_ids(&consumer, source_name, topic, &params.brokers, timeout)
            .map_err(|e| match e {
                PartitionsError::Kafka(k) => unreachable(k, consumer.context()),
                PartitionsError::Other(m) => err(m),
            })?;
        if let Some(only) = only {
            let missing: Vec<i32> = only.iter().copied().filter(|p| !ids.contains(p)).collect();
            if !missing.is_empty() {
                return Err(err(format!(
                    "partitions {missing:?} do not exist: topic '{topic}' has partitions 0..{}",
                    ids.len()
                )));
            }
            ids.retain(|p| only.contains(p));
        }
        let first_run = offsets.is_empty();
        let by_time = match (first_run, opts.start) {
            (true, Start::Time(t)) => Some(offsets_for_time(&consumer, topic, &ids, t, timeout)
                .map_err(|e| err(format!(
                    "cannot look up the offsets at start time {t} of topic '{topic}' on '{}' (the broker must support ListOffsets by timestamp): {e}",
                    params.brokers
                )))?),
            _ => None,
        };
        let mut reader = OpenConsumer {
            topic: topic.to_string(),
            source_name: source_name.to_string(),
            brokers: params.brokers.clone(),
            consumer: Arc::clone(&consumer),
            queues: Vec::new(),
            parts: Vec::new(),
            ends: Vec::new(),
            next: Vec::new(),
            eof_at: Vec::new(),
            done: Vec::new(),
            timeout,
            follow: opts.follow,
            last_commit: None,
            only: only.map(<[i32]>::to_vec),
            serves_callbacks: true,
            registry: opts.registry.clone(),
            last_schema: [None; 2],
            unreachable: None,
        };
        let mut gaps = Vec::new();
        let mut assignment = TopicPartitionList::new();
        for &p in &ids {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, timeout)
                .map_err(|e| unreachable(e, consumer.context()))?;
            let by_time = by_time.as_ref().and_then(|m| m.get(&p).copied());
            let new = if first_run {
                opts.start
            } else {
                Start::Earliest
            };
            let start = start_offset(
                p,
                offsets.get(&p).copied(),
                (low, high),
                new,
                by_time,
                &mut gaps,
            );
            reader.add(p, start, high, &mut assignment).map_err(err)?;
        }
        consumer
            .assign(&assignment)
            .map_err(|e| err(kafka_error(&e)))?;
        Ok(KafkaSource {
            gaps,
            reader: Some(reader),
        })
    }

    /// One partition of a subscribed consumer, read from `start` through its own queue (split
    /// off before the partition was assigned); a bounded run reads it up to `high`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_partition(
        consumer: &Arc<BaseConsumer<Context>>,
        source_name: &str,
        topic: &str,
        brokers: &str,
        timeout: Duration,
        follow: bool,
        queue: PartitionBatches<Context>,
        (partition, start, high): (i32, i64, i64),
        gaps: Vec<Gap>,
        registry: Option<Arc<Registry>>,
    ) -> KafkaSource {
        let reader = OpenConsumer {
            topic: topic.to_string(),
            source_name: source_name.to_string(),
            brokers: brokers.to_string(),
            consumer: Arc::clone(consumer),
            queues: vec![queue],
            parts: vec![SourcePartition {
                partition,
                name: String::new(),
                identity: String::new(),
                start_offset: start,
                gone: false,
            }],
            ends: vec![high],
            next: vec![start],
            eof_at: vec![None],
            done: vec![!follow && start >= high],
            timeout,
            follow,
            last_commit: None,
            only: Some(vec![partition]),
            serves_callbacks: false,
            registry,
            last_schema: [None; 2],
            unreachable: None,
        };
        KafkaSource {
            reader: Some(reader),
            gaps,
        }
    }

    fn reader(&mut self) -> Result<&mut OpenConsumer> {
        self.reader
            .as_mut()
            .ok_or_else(|| EtlError::Internal("Kafka consumer already closed".into()))
    }
}

impl OpenConsumer {
    /// Takes partition `p` (reading from `start`) into the reader and the assignment.
    fn add(
        &mut self,
        p: i32,
        start: i64,
        high: i64,
        assignment: &mut TopicPartitionList,
    ) -> std::result::Result<(), String> {
        assignment
            .add_partition_offset(&self.topic, p, Offset::Offset(start))
            .map_err(|e| kafka_error(&e))?;
        // The partition gets its own queue before fetching starts, so no message lands in the
        // consumer's main queue.
        self.queues.push(
            PartitionBatches::split(&self.consumer, &self.topic, p, BATCH)
                .ok_or_else(|| format!("cannot open a queue for partition {p}"))?,
        );
        self.parts.push(SourcePartition {
            partition: p,
            name: String::new(),
            identity: String::new(),
            start_offset: start,
            gone: false,
        });
        self.ends.push(high);
        self.next.push(start);
        self.eof_at.push(None);
        self.done.push(!self.follow && start >= high);
        Ok(())
    }

    /// Serves librdkafka's callbacks (errors go to the context).
    fn serve_callbacks(&self) {
        if !self.serves_callbacks {
            return;
        }
        if let Some(Err(e)) = self.consumer.poll(Duration::ZERO) {
            self.consumer.context().set_last_error(kafka_error(&e));
        }
    }

    fn stalled(&self, idx: usize) -> EtlError {
        let detail = self
            .consumer
            .context()
            .last_error()
            .map(|e| format!("; last broker error: {e}"))
            .unwrap_or_default();
        EtlError::source(
            &self.source_name,
            format!(
                "no message from partition {} of '{}' on '{}' for {} ms, though it has messages up to offset {} (next is {}){detail}",
                self.parts[idx].partition,
                self.topic,
                self.brokers,
                self.timeout.as_millis(),
                self.ends[idx],
                self.next[idx]
            ),
        )
    }

    fn pull(&mut self, idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull> {
        let mut waiting_since: Option<Instant> = None;
        if self.follow {
            // A continuous run looks again each time: the partition may have grown.
            self.done[idx] = false;
        }
        loop {
            if self.done[idx] {
                return Ok(Pull::Exhausted);
            }
            if self.queues[idx].peek().is_none() && self.queues[idx].refill(0) == 0 {
                if self.follow {
                    // Nothing ready: the run waits between looks (Source::wait).
                    self.serve_callbacks();
                    return Ok(Pull::Exhausted);
                }
                // Nothing fetched yet: serve librdkafka's callbacks (errors go to the context)
                // and wait a little, up to the timeout overall.
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.timeout {
                    return Err(self.stalled(idx));
                }
                self.serve_callbacks();
                self.queues[idx].refill(50);
                continue;
            }
            waiting_since = None;
            let queue = &mut self.queues[idx];
            let Some(m) = queue.peek() else { continue };
            if let Some((code, text)) = m.error {
                let offset = m.offset;
                queue.advance();
                if code == KAFKA_PARTITION_EOF {
                    // The end of what the broker has: its offset is past control records
                    // (transaction markers) and compacted gaps.
                    self.eof_at[idx] = Some(offset);
                    self.done[idx] = true;
                    continue;
                }
                return Err(EtlError::source(
                    &self.source_name,
                    format!("partition {}: {text}", self.parts[idx].partition),
                ));
            }
            let offset = m.offset;
            if offset < self.next[idx] {
                // Delivered again: the fetcher went back (librdkafka resets a partition's fetch
                // position in some rebalances); what the job already read is not read twice.
                queue.advance();
                continue;
            }
            if let Some(reg) = &self.registry {
                // A record's schema is known before the record goes on (decoding never waits
                // on the network); a registry out of reach fails the run here, before this
                // offset is consumed, so the next run reads it again.
                // (A key in the wire format is read with its own schema: a tombstone, `key`.)
                let wire_id = |b: &[u8]| match b.get(..5) {
                    Some([0, a, b, c, d]) => Some(u32::from_be_bytes([*a, *b, *c, *d])),
                    _ => None,
                };
                let ids = [wire_id(m.payload), m.key.and_then(wire_id)];
                for (id, last) in ids.into_iter().zip([0, 1]) {
                    let Some(id) = id.filter(|&id| self.last_schema[last] != Some(id)) else {
                        continue;
                    };
                    reg.resolve(id).map_err(|e| {
                        EtlError::source(
                            &self.source_name,
                            format!(
                                "partition {} offset {offset}: {e}",
                                self.parts[idx].partition
                            ),
                        )
                    })?;
                    self.last_schema[last] = Some(id);
                }
            }
            let timestamp = m.timestamp;
            self.next[idx] = offset + 1;
            if !self.follow && self.next[idx] >= self.ends[idx] {
                self.done[idx] = true;
            }
            let keep = each(&Message {
                offset,
                next_offset: offset + 1,
                payload: m.payload,
                key: m.key,
                timestamp,
                schema: None,
            });
            queue.advance();
            if !keep {
                return Ok(if self.done[idx] {
                    Pull::Exhausted
                } else {
                    Pull::Paused
                });
            }
        }
    }

    /// Partitions added to the topic since the source opened, read from their beginning.
    fn discover(&mut self) -> Result<usize> {
        let ids = match partition_ids(
            &self.consumer,
            &self.source_name,
            &self.topic,
            &self.brokers,
            self.timeout,
        ) {
            Ok(ids) => {
                self.unreachable = None;
                ids
            }
            // A metadata request that fails now is tried again at the next look; a run that
            // keeps failing to reach the brokers says so (Source::unreachable).
            Err(e) => {
                if self.unreachable.is_none() {
                    let why = match e {
                        PartitionsError::Kafka(k) => self
                            .consumer
                            .context()
                            .last_error()
                            .unwrap_or_else(|| kafka_error(&k)),
                        PartitionsError::Other(m) => m,
                    };
                    self.unreachable = Some((Instant::now(), why));
                }
                return Ok(0);
            }
        };
        let mut assignment = TopicPartitionList::new();
        let before = self.parts.len();
        for p in ids {
            if self.parts.iter().any(|q| q.partition == p)
                || self.only.as_ref().is_some_and(|o| !o.contains(&p))
            {
                continue;
            }
            let (low, high) = self
                .consumer
                .fetch_watermarks(&self.topic, p, self.timeout)
                .unwrap_or((0, 0));
            self.add(p, low, high, &mut assignment)
                .map_err(|e| EtlError::source(&self.source_name, e))?;
        }
        if self.parts.len() > before {
            self.consumer
                .incremental_assign(&assignment)
                .map_err(|e| EtlError::source(&self.source_name, kafka_error(&e)))?;
        }
        Ok(self.parts.len() - before)
    }

    fn checkpointed(&mut self, next_offsets: &[(i32, i64)]) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for &(p, next) in next_offsets {
            if tpl
                .add_partition_offset(&self.topic, p, Offset::Offset(next))
                .is_err()
            {
                return Ok(());
            }
        }
        // Informational: the checkpoint is what the job resumes from, so the group commit is
        // asynchronous (a coordinator that is down must not block the run) and a failed one
        // does not fail the run.
        let _ = self.consumer.poll(Duration::ZERO);
        if self.consumer.commit(&tpl, CommitMode::Async).is_ok() {
            self.last_commit = Some(tpl);
        }
        Ok(())
    }

    /// Continuous runs: blocks until a partition has a message ready (librdkafka's own queue
    /// wait, so a message is taken within a few milliseconds of its fetch), at most `timeout`;
    /// whether one has.
    fn wait_for_messages(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.serve_callbacks();
        if self.queues.is_empty() {
            std::thread::sleep(timeout);
            return false;
        }
        // A short turn on each partition's queue until one has something (they fill at the
        // same fetches, so waiting on them in turn costs little).
        let turn = (timeout / self.queues.len() as u32)
            .clamp(Duration::from_millis(1), Duration::from_millis(10));
        loop {
            for q in &mut self.queues {
                if q.peek().is_some() || q.refill(turn.as_millis() as i32) > 0 {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
            }
        }
    }

    fn end_offset(&self, idx: usize) -> Option<i64> {
        let known = *self.ends.get(idx)?;
        if !self.follow {
            return Some(known);
        }
        // The high watermark librdkafka last saw in a fetch response (no request).
        let p = self.parts.get(idx)?.partition;
        Some(
            kafka_batch::cached_high_watermark(&self.consumer, &self.topic, p)
                .map_or(known, |high| high.max(known)),
        )
    }
}

impl Source for KafkaSource {
    fn partitions(&self) -> &[SourcePartition] {
        self.reader.as_ref().map_or(&[], |r| &r.parts[..])
    }

    fn pull(&mut self, idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull> {
        self.reader()?.pull(idx, each)
    }

    fn end_offset(&self, idx: usize) -> Option<i64> {
        self.reader.as_ref().and_then(|r| r.end_offset(idx))
    }

    fn unreachable(&self) -> Option<String> {
        let r = self.reader.as_ref()?;
        let (since, why) = r.unreachable.as_ref()?;
        (since.elapsed() >= r.timeout).then(|| {
            format!(
                "cannot reach Kafka brokers '{}' for {} s (the run waits for them): {why}",
                r.brokers,
                since.elapsed().as_secs()
            )
        })
    }

    fn take_gaps(&mut self) -> Vec<Gap> {
        std::mem::take(&mut self.gaps)
    }

    fn checkpointed(&mut self, next_offsets: &[(i32, i64)]) -> Result<()> {
        self.reader()?.checkpointed(next_offsets)
    }

    fn discover(&mut self) -> Result<usize> {
        self.reader()?.discover()
    }

    fn wait(&mut self, timeout: Duration) -> bool {
        match self.reader.as_mut() {
            Some(r) => r.wait_for_messages(timeout),
            None => {
                std::thread::sleep(timeout);
                false
            }
        }
    }

    fn position(&self, idx: usize) -> Option<i64> {
        self.reader
            .as_ref()
            .and_then(|r| r.eof_at.get(idx).copied().flatten())
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        let Some(mut reader) = self.reader.take() else {
            return;
        };
        reader.wait_for_last_commit();
        // Closing a consumer that belongs to a group waits for the group coordinator, up to
        // ~45 s when the broker is gone: do it on a thread of its own so the statement ends now.
        let closing = std::thread::Builder::new()
            .name("streaming_etl-kafka-close".into())
            .spawn(move || drop(reader));
        if let Err(e) = closing {
            // No thread: close here rather than leak the consumer.
            drop(e);
        }
    }
}

impl OpenConsumer {
    /// Waits (bounded: the broker may be gone) until the group shows the last commit, so lag
    /// tools see the final offsets once the run is over.
    fn wait_for_last_commit(&mut self) {
        let Some(last) = self.last_commit.take() else {
            return;
        };
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(5));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.consumer.committed_offsets(last.clone(), left) {
                Ok(got) if got.to_topic_map() == last.to_topic_map() => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => return,
            }
        }
    }
}
