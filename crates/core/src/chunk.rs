//! A chunk: up to a thousand or so messages of one partition, copied off the source into flat
//! buffers (or, for lines of a file, read straight into one as a block), then parsed (event
//! time, key and its hash, aggregate inputs) by whichever thread of the run is free, so the
//! event-time merge and the window shards apply them without touching the source again.

use std::sync::{Arc, Mutex, PoisonError};

use crate::aggregate::Input;
use crate::columns::OwnedTyped;
use crate::message::Message;
use crate::record::Reject;

/// Chunks kept for reuse beyond this many, or this many bytes of buffers, are freed: a burst
/// (many partitions at once, very long messages) does not leave its peak behind for the rest of
/// a long run.
const MAX_SPARE: usize = 256;
pub(crate) const MAX_SPARE_BYTES: usize = 16 << 20;
/// A chunk whose buffers grew past this (a few very long messages) is not kept.
const MAX_KEPT_CHUNK_BYTES: usize = 2 << 20;

/// Chunks no longer in use, kept so that a new one reuses their buffers.
#[derive(Default)]
pub(crate) struct Spare(Mutex<(Vec<Chunk>, usize)>);

impl Spare {
    pub(crate) fn take(&self) -> Chunk {
        let mut spare = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut c = match spare.0.pop() {
            Some(c) => {
                spare.1 = spare.1.saturating_sub(c.held_bytes());
                c
            }
            None => Chunk::default(),
        };
        drop(spare);
        c.clear();
        c
    }

    pub(crate) fn give(&self, c: Chunk) {
        let bytes = c.held_bytes();
        let mut spare = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.0.len() < MAX_SPARE
            && bytes <= MAX_KEPT_CHUNK_BYTES
            && spare.1 + bytes <= MAX_SPARE_BYTES
        {
            spare.1 += bytes;
            spare.0.push(c);
        }
    }

    /// The bytes of the spare chunks' buffers.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).1
    }
}

/// A parsed chunk shared by the merge and the window shards' work; it goes back to the spare
/// chunks when the last of them lets go.
pub(crate) struct Lent {
    pub(crate) chunk: Chunk,
    home: Arc<Spare>,
}

impl Lent {
    pub(crate) fn new(chunk: Chunk, home: Arc<Spare>) -> Lent {
        Lent { chunk, home }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.home.give(std::mem::take(&mut self.chunk));
    }
}

/// An aggregate input as parsed, owned by its chunk (text as a range of the chunk's arena).
#[derive(Debug, Clone, Copy)]
pub(crate) enum OwnedInput {
    Skip,
    Num(f64),
    Text(u32, u32),
    Hash(u64),
    Arg(f64, u32, u32),
    Present,
}

/// A value of a chunk only DuckDB can convert: message `at`, typed column `column`, its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ask {
    pub at: u32,
    pub column: u32,
    pub json: String,
}

/// Why a message of a chunk is a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejected {
    /// Before its time was known.
    Time(Reject),
    /// Its time was read; its key or an input rejects it.
    Rest(Reject),
}

/// A message's `status` when it parsed.
pub(crate) const PARSED: u32 = u32::MAX;

/// Messages of one partition, as read and then as parsed. Reused from chunk to chunk.
#[derive(Default)]
pub struct Chunk {
    /// The partition's index in the source, and its number.
    pub(crate) idx: usize,
    pub(crate) partition: i32,
    pub(crate) offsets: Vec<i64>,
    pub(crate) next_offsets: Vec<i64>,
    pub(crate) timestamps: Vec<Option<i64>>,
    pub(crate) schemas: Vec<Option<u32>>,
    /// The messages' bytes; `used` of them are valid (a block read keeps the buffer's length).
    pub(crate) payload: Vec<u8>,
    pub(crate) used: usize,
    /// Per message: where its bytes are in `payload`.
    pub(crate) spans: Vec<(usize, usize)>,
    /// Kafka message keys (None: the message had none).
    pub(crate) msg_keys: Vec<u8>,
    pub(crate) msg_key_spans: Vec<Option<(usize, usize)>>,
    /// A block of lines not split yet: the stream offset of its first byte, and whether its
    /// last line ends without a newline (the end of a compressed stream).
    pub(crate) block: Option<(i64, bool)>,
    /// The event time (of a message that parsed).
    pub(crate) time: Vec<i64>,
    /// Per message: whether it parsed; else the place of its reason in `rejects`.
    pub(crate) status: Vec<u32>,
    /// Why messages are dead letters: the time's reason, or the key's or an input's (checked
    /// after the time, as one at a time) with the time it had.
    pub(crate) rejects: Vec<Rejected>,
    pub(crate) keys: Vec<u8>,
    pub(crate) key_ends: Vec<usize>,
    /// The hash of each key (which window shard takes it; the panes' tables reuse it).
    pub(crate) hashes: Vec<u64>,
    pub(crate) inputs: Vec<OwnedInput>,
    pub(crate) texts: Vec<u8>,
    pub(crate) n_inputs: usize,
    /// Per message, its typed columns as converted (`n_typed` each).
    pub(crate) typed: Vec<OwnedTyped>,
    pub(crate) n_typed: usize,
    /// Values to ask DuckDB about, and the reasons of messages whose values did not convert
    /// (`Reject::Unconverted` holds a place among them).
    pub(crate) asks: Vec<Ask>,
    pub(crate) reasons: Vec<String>,
    /// A job of several statements: each statement's keys of the messages and their hashes.
    pub(crate) layers: Vec<LayerKeys>,
}

/// One statement's keys of a chunk's messages (a job of several statements), as `keys`,
/// `key_ends` and `hashes` are the job's own.
#[derive(Default)]
pub(crate) struct LayerKeys {
    pub(crate) keys: Vec<u8>,
    pub(crate) ends: Vec<usize>,
    pub(crate) hashes: Vec<u64>,
}

impl LayerKeys {
    fn clear(&mut self) {
        self.keys.clear();
        self.ends.clear();
        self.hashes.clear();
    }
}

/// The bytes a vector's buffer holds.
fn cap<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

impl Chunk {
    /// The bytes its buffers hold (their capacity), about.
    pub(crate) fn held_bytes(&self) -> usize {
        cap(&self.offsets)
            + cap(&self.next_offsets)
            + cap(&self.timestamps)
            + cap(&self.schemas)
            + cap(&self.payload)
            + cap(&self.spans)
            + cap(&self.msg_keys)
            + cap(&self.msg_key_spans)
            + cap(&self.time)
            + cap(&self.status)
            + cap(&self.rejects)
            + cap(&self.keys)
            + cap(&self.key_ends)
            + cap(&self.hashes)
            + cap(&self.inputs)
            + cap(&self.texts)
            + cap(&self.typed)
            + cap(&self.asks)
            + cap(&self.reasons)
            + self
                .layers
                .iter()
                .map(|l| cap(&l.keys) + cap(&l.ends) + cap(&l.hashes))
                .sum::<usize>()
    }

    pub(crate) fn clear(&mut self) {
        self.offsets.clear();
        self.next_offsets.clear();
        self.timestamps.clear();
        self.schemas.clear();
        if self.block.is_none() {
            self.payload.clear();
        }
        self.used = 0;
        self.spans.clear();
        self.msg_keys.clear();
        self.msg_key_spans.clear();
        self.block = None;
        self.unparse();
    }

    /// Forgets what parsing wrote (the messages stay), to parse them again.
    pub(crate) fn unparse(&mut self) {
        self.time.clear();
        self.status.clear();
        self.rejects.clear();
        self.keys.clear();
        self.key_ends.clear();
        self.hashes.clear();
        self.inputs.clear();
        self.texts.clear();
        self.typed.clear();
        self.asks.clear();
        self.reasons.clear();
        self.layers.iter_mut().for_each(LayerKeys::clear);
    }

    /// The reason of a dead letter whose value did not convert.
    pub(crate) fn reason(&self, at: u32) -> &str {
        self.reasons.get(at as usize).map_or("", String::as_str)
    }

    /// Message `i`'s typed columns as converted.
    pub(crate) fn typed(&self, i: usize) -> &[OwnedTyped] {
        let n = self.n_typed;
        self.typed.get(i * n..(i + 1) * n).unwrap_or(&[])
    }

    /// A text value of the chunk's arena.
    pub(crate) fn text(&self, a: u32, b: u32) -> &str {
        std::str::from_utf8(self.texts.get(a as usize..b as usize).unwrap_or(&[])).unwrap_or("")
    }

    pub(crate) fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Bytes of messages held.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Messages held.
    pub fn messages(&self) -> usize {
        self.len()
    }

    /// Appends a message as the source delivered it.
    pub fn push(&mut self, m: &Message<'_>) {
        self.payload.truncate(self.used);
        self.offsets.push(m.offset);
        self.next_offsets.push(m.next_offset);
        self.timestamps.push(m.timestamp);
        self.schemas.push(m.schema);
        let start = self.payload.len();
        self.payload.extend_from_slice(m.payload);
        self.used = self.payload.len();
        self.spans.push((start, self.used));
        self.msg_key_spans.push(m.key.map(|k| {
            let at = self.msg_keys.len();
            self.msg_keys.extend_from_slice(k);
            (at, self.msg_keys.len())
        }));
    }

    /// The buffer a block of lines is read into, at least `min` bytes long, and the bytes of it
    /// already used (a block is read in several pieces).
    pub(crate) fn block_buffer(&mut self, min: usize) -> (&mut [u8], usize) {
        if self.payload.len() < min {
            // Zeroed once: the buffer keeps its length from block to block.
            self.payload.resize(min, 0);
        }
        (&mut self.payload, self.used)
    }

    /// Marks `used` bytes of the block buffer as lines starting at stream offset `base`;
    /// `open_end`: the last one has no newline and is complete (a finished compressed stream).
    pub(crate) fn set_block(&mut self, used: usize, base: i64, open_end: bool) {
        self.used = used;
        self.block = Some((base, open_end));
    }

    /// Splits a block into its lines (each without its newline), as messages.
    pub(crate) fn split_lines(&mut self) {
        let Some((base, open_end)) = self.block else {
            return;
        };
        let bytes = &self.payload[..self.used];
        let mut at = 0;
        for nl in memchr::memchr_iter(b'\n', bytes) {
            self.spans.push((at, nl));
            self.offsets.push(base + at as i64);
            self.next_offsets.push(base + nl as i64 + 1);
            at = nl + 1;
        }
        if open_end && at < bytes.len() {
            self.spans.push((at, bytes.len()));
            self.offsets.push(base + at as i64);
            self.next_offsets.push(base + bytes.len() as i64);
        }
        let n = self.spans.len();
        self.timestamps.resize(n, None);
        self.schemas.resize(n, None);
        self.msg_key_spans.resize(n, None);
    }

    fn payload(&self, i: usize) -> &[u8] {
        let (a, b) = self.spans[i];
        &self.payload[a..b]
    }

    fn msg_key(&self, i: usize) -> Option<&[u8]> {
        let (a, b) = self.msg_key_spans[i]?;
        Some(&self.msg_keys[a..b])
    }

    /// The message at `i` as the source delivered it.
    pub(crate) fn message(&self, i: usize) -> Message<'_> {
        Message {
            offset: self.offsets[i],
            next_offset: self.next_offsets[i],
            payload: self.payload(i),
            key: self.msg_key(i),
            timestamp: self.timestamps[i],
            schema: self.schemas[i],
        }
    }

    /// What message `i` parsed to: its event time, or why it is a dead letter.
    #[inline]
    pub(crate) fn parsed(&self, i: usize) -> std::result::Result<i64, Rejected> {
        match self.status[i] {
            PARSED => Ok(self.time[i]),
            at => Err(self.rejects[at as usize]),
        }
    }

    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let a = if i == 0 { 0 } else { self.key_ends[i - 1] };
        &self.keys[a..self.key_ends[i]]
    }

    /// Message `i`'s key in a statement's layer (None: the job's own key).
    #[inline]
    pub(crate) fn key_in(&self, layer: Option<usize>, i: usize) -> &[u8] {
        let Some(k) = layer.and_then(|l| self.layers.get(l)) else {
            return self.key(i);
        };
        let a = if i == 0 { 0 } else { k.ends[i - 1] };
        &k.keys[a..k.ends[i]]
    }

    /// The hash of message `i`'s key in a statement's layer (None: the job's own).
    #[inline]
    pub(crate) fn hash_in(&self, layer: Option<usize>, i: usize) -> u64 {
        match layer.and_then(|l| self.layers.get(l)) {
            Some(k) => k.hashes[i],
            None => self.hashes[i],
        }
    }

    /// Message `i`'s aggregate inputs from the `from`th on, as many as `out` takes (a
    /// statement's own of a job of several).
    pub(crate) fn inputs_from<'a>(&'a self, i: usize, from: usize, out: &mut [Input<'a>]) {
        let n = self.n_inputs;
        let text = |a: u32, b: u32| {
            // The decoder checked the message is UTF-8.
            std::str::from_utf8(&self.texts[a as usize..b as usize]).unwrap_or_default()
        };
        let mine = self
            .inputs
            .get(i * n + from.min(n)..(i + 1) * n)
            .unwrap_or(&[]);
        for (slot, o) in out.iter_mut().zip(mine) {
            *slot = match *o {
                OwnedInput::Skip => Input::Skip,
                OwnedInput::Num(v) => Input::Num(v),
                OwnedInput::Text(a, b) => Input::Text(text(a, b)),
                OwnedInput::Hash(h) => Input::Hash(h),
                OwnedInput::Arg(by, a, b) => Input::Arg(by, text(a, b)),
                OwnedInput::Present => Input::Present,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_splits_into_lines_with_their_offsets() {
        let mut c = Chunk::default();
        let data = b"{\"a\":1}\n\n{\"b\":2}\r\ntail";
        let (buf, used) = c.block_buffer(64);
        assert_eq!(used, 0);
        buf[..data.len()].copy_from_slice(data);
        c.set_block(data.len(), 100, false);
        c.split_lines();
        let got: Vec<(i64, i64, &[u8])> = (0..c.len())
            .map(|i| {
                let m = c.message(i);
                (m.offset, m.next_offset, m.payload)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (100, 108, &b"{\"a\":1}"[..]),
                (108, 109, &b""[..]),
                (109, 118, &b"{\"b\":2}\r"[..]),
            ]
        );
        // The end of a compressed stream: its last line counts without a newline.
        c.clear();
        let (buf, _) = c.block_buffer(8);
        buf[..5].copy_from_slice(b"x\nyz\n");
        c.set_block(4, 0, true);
        c.split_lines();
        assert_eq!(c.len(), 2);
        assert_eq!(c.message(1).payload, b"yz");
        assert_eq!((c.message(1).offset, c.message(1).next_offset), (2, 4));
    }

    #[test]
    fn spare_chunks_are_kept_up_to_a_bound_of_bytes() {
        let spare = Spare::default();
        let mut chunks = Vec::new();
        for _ in 0..64 {
            let mut c = spare.take();
            let (buf, _) = c.block_buffer(1 << 20);
            buf[0] = b'\n';
            chunks.push(c);
        }
        for c in chunks {
            spare.give(c);
        }
        let held = spare.held_bytes();
        assert!(
            (MAX_SPARE_BYTES / 2..=MAX_SPARE_BYTES).contains(&held),
            "{held}"
        );
        // A chunk grown past what a chunk is kept with is freed.
        let mut big = spare.take();
        let _ = big.block_buffer(8 << 20);
        let before = spare.held_bytes();
        spare.give(big);
        assert_eq!(spare.held_bytes(), before);
    }
}
