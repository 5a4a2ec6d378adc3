//! A chunk: up to a thousand messages of one partition, copied off the source into flat
//! buffers and then parsed (event time, key, aggregate inputs) by a decode worker, so the
//! event-time merge applies them without touching the source again.

use crate::aggregate::Input;
use crate::record::Reject;
use crate::source::Message;

/// An aggregate input as parsed, owned by its chunk (text as a range of the chunk's arena).
#[derive(Debug, Clone, Copy)]
pub(crate) enum OwnedInput {
    Skip,
    Num(f64),
    Text(usize, usize),
    Hash(u64),
    Arg(f64, usize, usize),
    Present,
}

/// Messages of one partition, as read and then as parsed. Reused from run to run of the pool.
#[derive(Default)]
pub(crate) struct Chunk {
    pub(crate) idx: usize,
    pub(crate) seq: u64,
    pub(crate) offsets: Vec<i64>,
    pub(crate) next_offsets: Vec<i64>,
    pub(crate) timestamps: Vec<Option<i64>>,
    pub(crate) schemas: Vec<Option<u32>>,
    pub(crate) payload: Vec<u8>,
    pub(crate) payload_ends: Vec<usize>,
    /// Kafka message keys (None: the message had none).
    pub(crate) msg_keys: Vec<u8>,
    pub(crate) msg_key_ends: Vec<Option<usize>>,
    /// The event time, or why the message is a dead letter before its time is known.
    pub(crate) time: Vec<std::result::Result<i64, Reject>>,
    /// Why the key or an input rejects the message (checked after the time, as one at a time).
    pub(crate) rest: Vec<std::result::Result<(), Reject>>,
    pub(crate) keys: Vec<u8>,
    pub(crate) key_ends: Vec<usize>,
    pub(crate) inputs: Vec<OwnedInput>,
    pub(crate) texts: Vec<u8>,
    pub(crate) n_inputs: usize,
    /// The next message the merge applies.
    pub(crate) pos: usize,
    /// The worker that parsed it panicked.
    pub(crate) failed: bool,
}

impl Chunk {
    pub(crate) fn clear(&mut self) {
        self.offsets.clear();
        self.next_offsets.clear();
        self.timestamps.clear();
        self.schemas.clear();
        self.payload.clear();
        self.payload_ends.clear();
        self.msg_keys.clear();
        self.msg_key_ends.clear();
        self.time.clear();
        self.rest.clear();
        self.keys.clear();
        self.key_ends.clear();
        self.inputs.clear();
        self.texts.clear();
        self.pos = 0;
        self.failed = false;
    }

    pub(crate) fn len(&self) -> usize {
        self.offsets.len()
    }

    pub(crate) fn push(&mut self, m: &Message<'_>) {
        self.offsets.push(m.offset);
        self.next_offsets.push(m.next_offset);
        self.timestamps.push(m.timestamp);
        self.schemas.push(m.schema);
        self.payload.extend_from_slice(m.payload);
        self.payload_ends.push(self.payload.len());
        self.msg_key_ends.push(m.key.map(|k| {
            self.msg_keys.extend_from_slice(k);
            self.msg_keys.len()
        }));
    }

    pub(crate) fn span(ends: &[usize], i: usize) -> (usize, usize) {
        (if i == 0 { 0 } else { ends[i - 1] }, ends[i])
    }

    fn payload(&self, i: usize) -> &[u8] {
        let (a, b) = Chunk::span(&self.payload_ends, i);
        &self.payload[a..b]
    }

    fn msg_key(&self, i: usize) -> Option<&[u8]> {
        let end = self.msg_key_ends[i]?;
        let start = self.msg_key_ends[..i]
            .iter()
            .rev()
            .find_map(|e| *e)
            .unwrap_or(0);
        Some(&self.msg_keys[start..end])
    }

    /// The message at `i` as the source delivered it.
    pub fn message(&self, i: usize) -> Message<'_> {
        Message {
            offset: self.offsets[i],
            next_offset: self.next_offsets[i],
            payload: self.payload(i),
            key: self.msg_key(i),
            timestamp: self.timestamps[i],
            schema: self.schemas[i],
        }
    }

    /// What message `i` parsed to: its time (or the reason it has none), and the reason its key
    /// or inputs reject it, if any.
    pub(crate) fn parsed(
        &self,
        i: usize,
    ) -> (
        std::result::Result<i64, Reject>,
        std::result::Result<(), Reject>,
    ) {
        (self.time[i], self.rest[i])
    }

    pub fn key(&self, i: usize) -> &[u8] {
        let (a, b) = Chunk::span(&self.key_ends, i);
        &self.keys[a..b]
    }

    /// Message `i`'s aggregate inputs into `out`.
    pub(crate) fn inputs<'a>(&'a self, i: usize, out: &mut [Input<'a>]) {
        let n = self.n_inputs;
        for (k, o) in self.inputs[i * n..(i + 1) * n].iter().enumerate() {
            out[k] = match *o {
                OwnedInput::Skip => Input::Skip,
                OwnedInput::Num(v) => Input::Num(v),
                // The decoder checked the message is UTF-8.
                OwnedInput::Text(a, b) => {
                    Input::Text(std::str::from_utf8(&self.texts[a..b]).unwrap_or_default())
                }
                OwnedInput::Hash(h) => Input::Hash(h),
                OwnedInput::Arg(by, a, b) => Input::Arg(
                    by,
                    std::str::from_utf8(&self.texts[a..b]).unwrap_or_default(),
                ),
                OwnedInput::Present => Input::Present,
            };
        }
    }
}
