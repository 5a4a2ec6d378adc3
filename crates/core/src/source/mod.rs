//! Sources: partitioned logs of messages, each addressed by (partition, offset). A source only
//! delivers bytes; decoding, watermarks and windows happen in the pipeline.

pub(crate) mod avro_file;
pub mod file;
pub mod glob;
pub mod lines;

use crate::chunk::Chunk;
use crate::error::Result;
pub use crate::message::Message;

/// Why a pull returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pull {
    /// The callback asked to stop; the partition may have more.
    Paused,
    /// The partition has nothing more to deliver in this run.
    Exhausted,
}

/// A partition of a source, as opened for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePartition {
    pub partition: i32,
    /// The file's absolute path (file source); empty for Kafka.
    pub name: String,
    /// What the partition is besides its number: a file's device and inode; empty for Kafka.
    pub identity: String,
    pub start_offset: i64,
    /// It will never deliver again (a deleted file).
    pub gone: bool,
}

/// Data a source cannot deliver (Kafka messages deleted by retention before the job read
/// them, a file deleted before it was read to its end, a damaged compressed file). Reported as
/// a dead letter at `from`, never skipped silently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub partition: i32,
    pub from: i64,
    /// The dead letter's reason.
    pub message: String,
}

pub trait Source: Send {
    /// The partitions this run reads, in partition order.
    fn partitions(&self) -> &[SourcePartition];

    /// Delivers messages of the partition at `idx` (an index into `partitions()`) to `each`
    /// until it returns false or the partition has nothing more to deliver.
    fn pull(&mut self, idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull>;

    /// Fills `chunk` with the partition's next messages: about `max_bytes` of them, or
    /// `max_messages`. A source that can hand over many messages at once does (a file's lines
    /// are read as one block, split by whichever thread parses it).
    fn fill(
        &mut self,
        idx: usize,
        chunk: &mut Chunk,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<Pull> {
        self.pull(idx, &mut |m: &Message<'_>| {
            chunk.push(m);
            chunk.messages() < max_messages && chunk.bytes() < max_bytes
        })
    }

    /// The end offset the source knows for the partition at `idx` (for lag), if any.
    fn end_offset(&self, idx: usize) -> Option<i64>;

    /// A fault a continuous run is riding out rather than failing on (Kafka: its brokers out of
    /// reach for longer than its timeout; the client keeps reconnecting), for reports; None
    /// while all is well.
    fn unreachable(&self) -> Option<String> {
        None
    }

    /// Where the source stands in the partition at `idx` when that is past the last message it
    /// delivered (Kafka: the end of partition, past transaction markers), so the checkpoint
    /// resumes there and lag reads 0.
    fn position(&self, _idx: usize) -> Option<i64> {
        None
    }

    /// Data found undeliverable since the last call (see [`Gap`]).
    fn take_gaps(&mut self) -> Vec<Gap> {
        Vec::new()
    }

    /// Continuous runs: looks for partitions that appeared since (files that now match the
    /// pattern, partitions added to a topic) and appends them to `partitions()`; returns how
    /// many were added.
    fn discover(&mut self) -> Result<usize> {
        Ok(0)
    }

    /// Continuous runs: waits, at most `timeout`, for something to read (a blocking wait, not a
    /// busy loop); whether something arrived (false: the wait ran out, or the source cannot
    /// tell).
    fn wait(&mut self, timeout: std::time::Duration) -> bool {
        std::thread::sleep(timeout);
        false
    }

    /// Called once a checkpoint holding these next offsets is durable (Kafka commits them to
    /// the consumer group so that lag tools see the progress).
    fn checkpointed(&mut self, _next_offsets: &[(i32, i64)]) -> Result<()> {
        Ok(())
    }
}

/// A source over messages held in memory (tests, benchmarks, and anything that already has its
/// messages at hand).
pub mod memory {
    use super::*;

    pub struct MemorySource {
        parts: Vec<SourcePartition>,
        messages: Vec<Vec<Vec<u8>>>,
        pos: Vec<usize>,
    }

    impl MemorySource {
        /// Partition i holds `messages[i]`; offsets are message indexes.
        pub fn new(messages: Vec<Vec<String>>, start: &[i64]) -> MemorySource {
            let parts = (0..messages.len())
                .map(|i| SourcePartition {
                    partition: i as i32,
                    name: String::new(),
                    identity: String::new(),
                    start_offset: start.get(i).copied().unwrap_or(0),
                    gone: false,
                })
                .collect::<Vec<_>>();
            let pos = parts.iter().map(|p| p.start_offset as usize).collect();
            MemorySource {
                parts,
                messages: messages
                    .into_iter()
                    .map(|m| m.into_iter().map(String::into_bytes).collect())
                    .collect(),
                pos,
            }
        }
    }

    impl Source for MemorySource {
        fn partitions(&self) -> &[SourcePartition] {
            &self.parts
        }

        fn pull(&mut self, idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull> {
            while let Some(m) = self.messages[idx].get(self.pos[idx]) {
                let offset = self.pos[idx] as i64;
                self.pos[idx] += 1;
                let msg = Message {
                    offset,
                    next_offset: offset + 1,
                    payload: m,
                    key: None,
                    timestamp: None,
                    schema: None,
                };
                if !each(&msg) {
                    return Ok(if self.pos[idx] < self.messages[idx].len() {
                        Pull::Paused
                    } else {
                        Pull::Exhausted
                    });
                }
            }
            Ok(Pull::Exhausted)
        }

        fn end_offset(&self, idx: usize) -> Option<i64> {
            Some(self.messages[idx].len() as i64)
        }
    }
}
