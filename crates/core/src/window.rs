//! Tumbling and hopping event-time windows per key. A window is `[start, start + size)`; hopping
//! windows start every `hop` ms (size a multiple of hop; tumbling is hop = size). Events are
//! aggregated into panes of `hop` ms, and a window's row combines the panes it spans when the
//! watermark passes its end, so an event costs the same whatever the number of windows it
//! belongs to. Panes are kept by start, so the windows a watermark closes are found in order
//! without scanning the open ones.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashTable;

use crate::aggregate::{
    decode_states, encode_states, fresh_states, merge_states, AggSpec, AggState, Input, States,
};
use crate::codec::{CodecError, Reader, Writer};
use crate::emit::{Shape, Tail};
use crate::rows::Rows;

/// `floor(event_time_ms / size_ms) * size_ms`, flooring also for negative times.
#[inline]
pub(crate) fn window_start_ms(event_time_ms: i64, size_ms: i64) -> i64 {
    event_time_ms.div_euclid(size_ms) * size_ms
}

/// The exclusive end of the window that starts at `start_ms`.
#[inline]
pub(crate) fn window_end_ms(start_ms: i64, size_ms: i64) -> i64 {
    start_ms.saturating_add(size_ms)
}

/// FxHash: keys are short byte strings hashed once per event, where SipHash would cost more
/// than the rest of the window update.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const FX: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            h = (h.rotate_left(5) ^ w).wrapping_mul(FX);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(FX);
        }
        self.0 = h;
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(FX);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Per key, the partial aggregates of one pane (or session).
pub(crate) type KeyMap<V> = HashMap<Box<[u8]>, V, BuildHasherDefault<FxHasher>>;

/// One pane's partial aggregates per key. The keys sit end to end in one buffer and the states
/// in one vector, found through a table of entry numbers: a (key, pane) pair seen for the first
/// time appends to vectors that a reused pane has already grown, and closing a pane frees nothing
/// per key. With many keys (about one window per event), allocating and freeing each window's
/// key and states was a third of the read thread, and its scattered keys missed the cache when
/// the window was written.
#[derive(Default)]
struct Pane {
    /// Entry numbers, by the hash of their key.
    index: HashTable<usize>,
    /// Per entry: where its key is in `keys`.
    spans: Vec<(usize, usize)>,
    keys: Vec<u8>,
    /// `width` states per entry, in entry order.
    states: Vec<AggState>,
    width: usize,
    /// Per entry (jobs with revisions): the store's change number of its last change since
    /// the cycle's rows were written, 0 when none.
    changed: Vec<u64>,
    any_dirty: bool,
}

/// The hash of a key: the panes' tables use it, and it says which window shard has the key.
#[inline]
pub(crate) fn hash_key(key: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(key);
    h.finish()
}

impl Pane {
    fn len(&self) -> usize {
        self.spans.len()
    }

    fn key(&self, i: usize) -> &[u8] {
        let (at, len) = self.spans[i];
        &self.keys[at..at + len]
    }

    fn states(&self, i: usize) -> &[AggState] {
        &self.states[i * self.width..(i + 1) * self.width]
    }

    /// The entry of `key`, if the pane has one.
    fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let (spans, keys) = (&self.spans, &self.keys);
        self.index
            .find(hash, |&i| {
                let (at, len) = spans[i];
                &keys[at..at + len] == key
            })
            .copied()
    }

    /// Appends an entry for `key` (not in the pane) with `states`.
    fn push(&mut self, hash: u64, key: &[u8], states: impl IntoIterator<Item = AggState>) -> usize {
        let i = self.spans.len();
        self.spans.push((self.keys.len(), key.len()));
        self.keys.extend_from_slice(key);
        self.changed.push(0);
        let before = self.states.len();
        self.states.extend(states);
        self.width = self.states.len() - before;
        let (spans, keys) = (&self.spans, &self.keys);
        self.index.insert_unique(hash, i, |&j| {
            let (at, len) = spans[j];
            hash_key(&keys[at..at + len])
        });
        i
    }

    /// The entry of `key`, a new one (with states for `aggs`) when the pane has none; whether
    /// the entry is new.
    #[inline]
    fn entry(&mut self, key: &[u8], hash: u64, aggs: &[AggSpec]) -> (usize, bool) {
        match self.find(hash, key) {
            Some(i) => (i, false),
            None => (self.push(hash, key, fresh_states(aggs)), true),
        }
    }

    /// Adds an event to entry `i`; `change`: the store's change number (0: not tracked).
    #[inline]
    fn add(&mut self, i: usize, t: i64, inputs: &[Input<'_>], change: u64) {
        let w = self.width;
        for (s, input) in self.states[i * w..(i + 1) * w].iter_mut().zip(inputs) {
            s.add(t, *input);
        }
        if change != 0 {
            self.changed[i] = change;
            self.any_dirty = true;
        }
    }

    /// Sets the states of `key` (restoring a checkpoint); whether the entry is new.
    fn put(&mut self, key: &[u8], states: States) -> bool {
        let hash = hash_key(key);
        match self.find(hash, key) {
            Some(i) => {
                let w = self.width;
                for (into, s) in self.states[i * w..(i + 1) * w].iter_mut().zip(states) {
                    *into = s;
                }
                false
            }
            None => {
                self.push(hash, key, states);
                true
            }
        }
    }

    /// Empties the pane, keeping what it allocated.
    fn clear(&mut self) {
        self.index.clear();
        self.spans.clear();
        self.keys.clear();
        self.states.clear();
        self.changed.clear();
        self.any_dirty = false;
    }

    fn clean(&mut self) {
        self.changed.iter_mut().for_each(|d| *d = 0);
        self.any_dirty = false;
    }

    fn encode_entries(&self, w: &mut Writer<'_>) {
        for i in 0..self.len() {
            w.bytes(self.key(i));
            encode_states(self.states(i), w);
        }
    }
}

/// Emptied panes kept for reuse.
const SPARE_PANES: usize = 4;

/// Which windows of changed panes [`PaneStore::emit_changed`] writes.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// At a cycle's end: open windows (running rows) and the corrected closed ones still kept.
    Cycle { watermark_ms: i64 },
    /// Before the watermark moves from `from` to `to`: corrected closed windows that the move
    /// puts out of reach (their correction would be forgotten with them).
    Expiring { from: i64, to: i64 },
}

/// What a job with revisions (`emit := 'update'`, `late_updates_ms`) keeps beyond open panes.
struct Track {
    /// `emit := 'update'`: each cycle writes the running values of the open windows it changed.
    running: bool,
    /// `late_updates_ms`: a closed window stays correctable until the watermark passes its end
    /// plus this.
    retain_ms: Option<i64>,
    /// Per window start and key: the revision of its last row, and the change number it was
    /// written at (a change after it is not in the row yet; 0 after a restore, when every
    /// change is newer).
    revisions: BTreeMap<i64, KeyMap<(i64, u64)>>,
    /// Numbers changes to pane entries, from 1.
    change: u64,
    /// Panes no open window needs, kept while a closed window they belong to is correctable.
    retained: BTreeMap<i64, Pane>,
}

/// The open panes of a tumbling or hopping job.
pub(crate) struct PaneStore {
    size_ms: i64,
    hop_ms: i64,
    shape: Shape,
    panes: BTreeMap<i64, Pane>,
    /// (pane, key) entries held.
    entries: usize,
    /// Every window ending at or before this was written.
    closed_ms: i64,
    /// Emptied panes kept for reuse, so a new pane starts with the room an earlier one grew.
    spare: Vec<Pane>,
    /// Hopping: the per-key combination of the window being written, stamped with the
    /// window's number (see `emit`).
    scratch: KeyMap<(u64, States)>,
    generation: u64,
    track: Option<Box<Track>>,
}

impl PaneStore {
    pub fn new(size_ms: i64, hop_ms: i64, shape: Shape, closed_ms: i64) -> PaneStore {
        PaneStore {
            size_ms,
            hop_ms,
            shape,
            panes: BTreeMap::new(),
            entries: 0,
            closed_ms,
            spare: Vec::new(),
            scratch: KeyMap::default(),
            generation: 0,
            track: None,
        }
    }

    /// Keeps what running values (`running`) and late updates (`retain_ms`) need.
    pub fn tracking(mut self, running: bool, retain_ms: Option<i64>) -> PaneStore {
        self.track = (running || retain_ms.is_some()).then(|| {
            Box::new(Track {
                running,
                retain_ms,
                revisions: BTreeMap::new(),
                change: 0,
                retained: BTreeMap::new(),
            })
        });
        self
    }

    /// The window an event at `t` is reported late against, if it is late: the last window it
    /// belongs to, when that one's end is at or before the watermark.
    #[inline]
    pub(crate) fn late_window(&self, t: i64, watermark_ms: i64) -> Result<(), (i64, i64)> {
        let start = window_start_ms(t, self.hop_ms);
        let end = window_end_ms(start, self.size_ms);
        if end <= watermark_ms {
            Err((start, end))
        } else {
            Ok(())
        }
    }

    /// Adds an event (not late) to its pane. Allocates only when a pane's vectors must grow.
    #[cfg(test)]
    pub fn add(&mut self, t: i64, key: &[u8], inputs: &[Input<'_>], aggs: &[AggSpec]) {
        self.add_hashed(t, key, hash_key(key), inputs, aggs);
    }

    /// [`PaneStore::add`] with the key's hash ([`hash_key`]) known.
    #[inline]
    pub(crate) fn add_hashed(
        &mut self,
        t: i64,
        key: &[u8],
        hash: u64,
        inputs: &[Input<'_>],
        aggs: &[AggSpec],
    ) {
        let pane = window_start_ms(t, self.hop_ms);
        let spare = &mut self.spare;
        let p = self
            .panes
            .entry(pane)
            .or_insert_with(|| spare.pop().unwrap_or_default());
        let (i, new) = p.entry(key, hash, aggs);
        let change = match self.track.as_mut() {
            Some(track) => {
                track.change += 1;
                track.change
            }
            None => 0,
        };
        p.add(i, t, inputs, change);
        self.entries += usize::from(new);
    }

    /// A late event (see [`PaneStore::late_window`]) corrects the closed windows it belongs to
    /// when they are still kept (`late_updates_ms`); whether it did.
    pub fn add_late(
        &mut self,
        t: i64,
        key: &[u8],
        inputs: &[Input<'_>],
        aggs: &[AggSpec],
        watermark_ms: i64,
    ) -> bool {
        let Some(track) = self.track.as_mut() else {
            return false;
        };
        let Some(retain) = track.retain_ms else {
            return false;
        };
        let pane = window_start_ms(t, self.hop_ms);
        if window_end_ms(pane, self.size_ms).saturating_add(retain) <= watermark_ms {
            return false;
        }
        track.change += 1;
        let p = match self.panes.get_mut(&pane) {
            Some(p) => p,
            None => track.retained.entry(pane).or_default(),
        };
        let (i, _) = p.entry(key, hash_key(key), aggs);
        p.add(i, t, inputs, track.change);
        true
    }

    pub fn open_windows(&self) -> usize {
        self.entries
    }

    /// The first pane a window row may still read (open or kept for late updates): the staged
    /// events of earlier panes are never needed again.
    pub(crate) fn first_live_pane(&self) -> Option<i64> {
        let open = self.panes.keys().next().copied();
        let kept = self
            .track
            .as_ref()
            .and_then(|t| t.retained.keys().next().copied());
        match (open, kept) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Restores one (pane, key) entry.
    pub(crate) fn insert_states(&mut self, pane: i64, key: &[u8], states: States) {
        if self.panes.entry(pane).or_default().put(key, states) {
            self.entries += 1;
        }
    }

    /// The first window start not written yet, given the panes and what was closed.
    fn next_start(&self, first_pane: i64) -> i64 {
        let from_pane = first_pane - self.size_ms + self.hop_ms;
        if self.closed_ms == i64::MIN {
            return from_pane;
        }
        // The smallest multiple of hop whose window ends after closed_ms.
        let s = window_start_ms(self.closed_ms - self.size_ms, self.hop_ms) + self.hop_ms;
        s.max(from_pane)
    }

    /// Writes every window whose end is at or before `watermark_ms` (rows of the windows table)
    /// and forgets the panes no open window needs. Returns how many rows were written.
    pub(crate) fn close_through(&mut self, watermark_ms: i64, out: &mut Rows) -> usize {
        if self.corrections_may_expire(watermark_ms) {
            // A correction made this cycle to a window the new watermark puts out of reach is
            // written now.
            let (from, to) = (self.closed_ms, watermark_ms);
            self.emit_changed(Pick::Expiring { from, to }, out);
        }
        let mut written = 0;
        while let Some(&first) = self.panes.keys().next() {
            let start = self.next_start(first);
            let end = window_end_ms(start, self.size_ms);
            if end > watermark_ms {
                break;
            }
            written += self.emit(start, end, out);
        }
        self.closed_ms = self.closed_ms.max(watermark_ms);
        self.expire(watermark_ms);
        written
    }

    /// Writes every open window (end of bounded input); returns the latest end written.
    pub(crate) fn close_all(&mut self, out: &mut Rows) -> Option<i64> {
        let mut last_end = None;
        while let Some(&first) = self.panes.keys().next() {
            let start = self.next_start(first);
            let end = window_end_ms(start, self.size_ms);
            self.emit(start, end, out);
            last_end = Some(end);
        }
        if let Some(e) = last_end {
            self.closed_ms = self.closed_ms.max(e);
        }
        last_end
    }

    fn recycle(&mut self, mut pane: Pane) {
        self.entries -= pane.len();
        // A pane keeps the room its busiest use grew; panes open and close one per hop, so a
        // few spares serve every new one, and a watermark that closes many at once leaves no
        // more than these held for the rest of a long run.
        if self.spare.len() < SPARE_PANES {
            pane.clear();
            self.spare.push(pane);
        }
    }

    /// A pane no open window needs: kept while late updates may still reach its windows.
    fn retire(&mut self, start: i64, pane: Pane) {
        match self.track.as_mut() {
            Some(track) if track.retain_ms.is_some() => {
                self.entries -= pane.len();
                // Its changes stay marked: they may be corrections of closed windows.
                track.retained.insert(start, pane);
            }
            _ => self.recycle(pane),
        }
    }

    /// Whether moving the watermark to `watermark_ms` puts a closed window out of the reach of
    /// late updates (windows go out of reach one hop at a time: this is cheap to ask on every
    /// move of the watermark).
    fn corrections_may_expire(&self, watermark_ms: i64) -> bool {
        let Some(retain) = self.track.as_ref().and_then(|t| t.retain_ms) else {
            return false;
        };
        let reach_start = |wm: i64| {
            window_start_ms(
                wm.saturating_sub(self.size_ms).saturating_sub(retain),
                self.hop_ms,
            )
        };
        self.closed_ms != i64::MIN && reach_start(watermark_ms) > reach_start(self.closed_ms)
    }

    /// Forgets the kept panes and revisions of windows no late update can reach any more.
    fn expire(&mut self, watermark_ms: i64) {
        let Some(track) = self.track.as_mut() else {
            return;
        };
        let (size, retain, closed) = (self.size_ms, track.retain_ms.unwrap_or(0), self.closed_ms);
        let reach = |start: i64| window_end_ms(start, size).saturating_add(retain);
        while let Some(entry) = track.retained.first_entry() {
            if reach(*entry.key()) > watermark_ms {
                break;
            }
            let mut pane = entry.remove();
            if self.spare.len() < SPARE_PANES {
                pane.clear();
                self.spare.push(pane);
            }
        }
        while let Some(entry) = track.revisions.first_entry() {
            let start = *entry.key();
            if reach(start) > watermark_ms || window_end_ms(start, size) > closed {
                break;
            }
            entry.remove();
        }
    }

    /// The revision of a window's row being written at its close.
    fn final_revision(&mut self, start: i64, key: &[u8]) -> i64 {
        let Some(track) = self.track.as_mut() else {
            return 1;
        };
        let rev = track
            .revisions
            .get(&start)
            .and_then(|m| m.get(key))
            .map_or(1, |r| r.0 + 1);
        if track.retain_ms.is_some() {
            let change = track.change;
            track
                .revisions
                .entry(start)
                .or_default()
                .insert(key.into(), (rev, change));
        } else if let Some(m) = track.revisions.get_mut(&start) {
            m.remove(key);
            if m.is_empty() {
                track.revisions.remove(&start);
            }
        }
        rev
    }

    /// Writes the window `[start, end)` and drops the panes no later window needs. Rows come in
    /// the order their keys first appeared in the window.
    fn emit(&mut self, start: i64, end: i64, out: &mut Rows) -> usize {
        let mut written = 0;
        if self.hop_ms == self.size_ms {
            // Tumbling: the pane is the window.
            if let Some(pane) = self.panes.remove(&start) {
                for i in 0..pane.len() {
                    let rev = self.final_revision(start, pane.key(i));
                    let (key, states) = (pane.key(i), pane.states(i));
                    self.shape.write_final(out, start, end, key, states, rev);
                }
                written = pane.len();
                self.retire(start, pane);
            }
        } else {
            // Combine the window's panes per key. The scratch map outlives one window: an entry
            // stamped with an older window is overwritten in place (no new key or state
            // allocation per window), and entries of keys gone quiet are dropped now and then.
            self.generation += 1;
            let generation = self.generation;
            let merged = &mut self.scratch;
            for (_, pane) in self.panes.range(start..end) {
                for i in 0..pane.len() {
                    let (key, states) = (pane.key(i), pane.states(i));
                    match merged.get_mut(key) {
                        Some((g, m)) if *g == generation => merge_states(m, states),
                        Some((g, m)) if m.len() == states.len() => {
                            *g = generation;
                            m.clone_from_slice(states);
                        }
                        _ => {
                            merged.insert(key.into(), (generation, states.into()));
                        }
                    }
                }
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            for (key, (g, states)) in scratch.iter() {
                if *g == generation {
                    let rev = self.final_revision(start, key);
                    self.shape.write_final(out, start, end, key, states, rev);
                    written += 1;
                }
            }
            if scratch.len() > 2 * written + 64 {
                scratch.retain(|_, (g, _)| *g == generation);
            }
            self.scratch = scratch;
            // Later windows start at start + hop or after: panes before that are done.
            while let Some(entry) = self.panes.first_entry() {
                if *entry.key() > start {
                    break;
                }
                let (at, pane) = entry.remove_entry();
                self.retire(at, pane);
            }
        }
        self.closed_ms = self.closed_ms.max(end);
        written
    }

    /// Writes the running value of every window whose panes changed since the last call: open
    /// windows (`emit := 'update'`) and closed ones a late update corrected. Returns the rows.
    pub(crate) fn emit_updates(&mut self, watermark_ms: i64, out: &mut Rows) -> usize {
        self.emit_changed(Pick::Cycle { watermark_ms }, out)
    }

    /// Writes the corrections of closed windows whose late events are not in a row yet (a flush
    /// is about to close everything and move the watermark past every kept window).
    pub(crate) fn emit_corrections(&mut self, out: &mut Rows) -> usize {
        self.emit_changed(
            Pick::Expiring {
                from: i64::MIN,
                to: i64::MAX,
            },
            out,
        )
    }

    /// Writes the windows `pick` chooses among those of changed pane entries whose last row
    /// does not hold the change yet.
    fn emit_changed(&mut self, pick: Pick, out: &mut Rows) -> usize {
        let Some(track) = self.track.as_mut() else {
            return 0;
        };
        let (size, hop, closed_ms) = (self.size_ms, self.hop_ms, self.closed_ms);
        let (running, retain) = (track.running, track.retain_ms);
        let wanted = |end: i64| {
            let closed = end <= closed_ms;
            match (pick, retain) {
                (Pick::Cycle { .. }, _) if !closed => running,
                (Pick::Cycle { watermark_ms }, Some(n)) => end.saturating_add(n) > watermark_ms,
                (Pick::Expiring { from, to }, Some(n)) => {
                    let reach = end.saturating_add(n);
                    closed && reach > from && reach <= to
                }
                _ => false,
            }
        };
        let revisions = &track.revisions;
        let mut todo: BTreeMap<i64, Vec<Box<[u8]>>> = BTreeMap::new();
        for (&p, pane) in self.panes.iter_mut().chain(track.retained.iter_mut()) {
            if !pane.any_dirty {
                continue;
            }
            for i in 0..pane.len() {
                let changed = pane.changed[i];
                if changed == 0 {
                    continue;
                }
                let key = pane.key(i);
                let mut s = p - size + hop;
                while s <= p {
                    let written = revisions
                        .get(&s)
                        .and_then(|m| m.get(key))
                        .map_or(0, |r| r.1);
                    if changed > written && wanted(window_end_ms(s, size)) {
                        todo.entry(s).or_default().push(key.into());
                    }
                    s += hop;
                }
            }
            if let Pick::Cycle { .. } = pick {
                pane.clean();
            }
        }
        let mut written = 0;
        for (s, mut keys) in todo {
            keys.sort_unstable();
            keys.dedup();
            let end = window_end_ms(s, size);
            for key in keys {
                let hash = hash_key(&key);
                let mut acc: Option<States> = None;
                let mut q = s;
                while q < end {
                    let pane = self.panes.get(&q).or_else(|| track.retained.get(&q));
                    if let Some((pane, i)) = pane.and_then(|p| p.find(hash, &key).map(|i| (p, i))) {
                        match acc.as_mut() {
                            None => acc = Some(pane.states(i).into()),
                            Some(m) => merge_states(m, pane.states(i)),
                        }
                    }
                    q += hop;
                }
                let Some(states) = acc else { continue };
                let entry = track
                    .revisions
                    .entry(s)
                    .or_default()
                    .entry(key.clone())
                    .or_insert((0, 0));
                *entry = (entry.0 + 1, track.change);
                let tail = Tail {
                    closed: end <= closed_ms,
                    revision: entry.0,
                    retracted: false,
                    correction: end <= closed_ms,
                };
                self.shape.write(out, s, end, &key, Some(&states), tail);
                written += 1;
            }
        }
        written
    }

    /// Panes in start order, each pane's entries in the order their keys first appeared (as
    /// kept in memory, so a resumed run holds its windows exactly as the straight run did);
    /// then, for a job with revisions, the kept panes and the revisions written.
    #[cfg(test)]
    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        PaneStore::encode_all(&[self], w);
    }

    /// The open windows of several stores that split a job's keys between them (window
    /// shards, closed through the same watermark) in the form of one store
    /// ([`PaneStore::encode`]): a pane's entries are those of each store in turn.
    pub(crate) fn encode_all(stores: &[&PaneStore], w: &mut Writer<'_>) {
        let closed = stores.iter().map(|s| s.closed_ms).max().unwrap_or(i64::MIN);
        w.i64(closed);
        encode_panes(stores.iter().map(|s| &s.panes).collect(), w);
        let tracks: Vec<&Track> = stores.iter().filter_map(|s| s.track.as_deref()).collect();
        if tracks.is_empty() {
            return;
        }
        encode_panes(tracks.iter().map(|t| &t.retained).collect(), w);
        let starts: std::collections::BTreeSet<i64> = tracks
            .iter()
            .flat_map(|t| t.revisions.keys().copied())
            .collect();
        w.u64(starts.len() as u64);
        for start in starts {
            w.i64(start);
            let mut sorted: Vec<(&[u8], i64)> = tracks
                .iter()
                .filter_map(|t| t.revisions.get(&start))
                .flat_map(|keys| keys.iter().map(|(k, r)| (&k[..], r.0)))
                .collect();
            sorted.sort_unstable();
            w.u64(sorted.len() as u64);
            for (key, rev) in sorted {
                w.bytes(key);
                w.i64(rev);
            }
        }
    }

    /// Restores a store encoded by [`PaneStore::encode`] (`store`: a new one, with the job's
    /// tracking, whose windows ending at or before the stored point are closed).
    #[cfg(test)]
    pub(crate) fn decode(
        store: PaneStore,
        aggs: &[AggSpec],
        r: &mut Reader<'_>,
    ) -> Result<PaneStore, CodecError> {
        let mut stores = [store];
        PaneStore::decode_into(&mut stores, &|_| 0, aggs, r)?;
        let [store] = stores;
        Ok(store)
    }

    /// Restores what [`PaneStore::encode_all`] wrote into `stores` (new ones, as
    /// [`PaneStore::decode`] takes), each key's entries into the store `route` names.
    pub(crate) fn decode_into(
        stores: &mut [PaneStore],
        route: &dyn Fn(&[u8]) -> usize,
        aggs: &[AggSpec],
        r: &mut Reader<'_>,
    ) -> Result<(), CodecError> {
        let closed = r.i64()?;
        let n = stores.len();
        let store_of = |key: &[u8]| -> Result<usize, CodecError> {
            let s = route(key);
            if s < n {
                Ok(s)
            } else {
                Err(CodecError("no store for a key"))
            }
        };
        for s in stores.iter_mut() {
            s.closed_ms = closed;
        }
        for _ in 0..r.count()? {
            let start = r.i64()?;
            for _ in 0..r.count()? {
                let key = r.bytes()?;
                let at = store_of(key)?;
                stores[at].insert_states(start, key, decode_states(aggs, r)?);
            }
        }
        if stores.iter().all(|s| s.track.is_none()) {
            return Ok(());
        }
        for _ in 0..r.count()? {
            let start = r.i64()?;
            for _ in 0..r.count()? {
                let key = r.bytes()?;
                let at = store_of(key)?;
                let states = decode_states(aggs, r)?;
                if let Some(track) = stores[at].track.as_mut() {
                    track.retained.entry(start).or_default().put(key, states);
                }
            }
        }
        for _ in 0..r.count()? {
            let start = r.i64()?;
            for _ in 0..r.count()? {
                let key = r.bytes()?;
                let at = store_of(key)?;
                let rev = r.i64()?;
                if let Some(track) = stores[at].track.as_mut() {
                    track
                        .revisions
                        .entry(start)
                        .or_default()
                        .insert(key.into(), (rev, 0));
                }
            }
        }
        Ok(())
    }
}

/// Panes of several stores by start, as the panes of one: each start once, its entries those
/// of every store that has the pane.
fn encode_panes(stores: Vec<&BTreeMap<i64, Pane>>, w: &mut Writer<'_>) {
    let starts: std::collections::BTreeSet<i64> =
        stores.iter().flat_map(|p| p.keys().copied()).collect();
    w.u64(starts.len() as u64);
    for start in starts {
        let panes: Vec<&Pane> = stores.iter().filter_map(|p| p.get(&start)).collect();
        w.i64(start);
        w.u64(panes.iter().map(|p| p.len() as u64).sum());
        for pane in panes {
            pane.encode_entries(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::AggSpec;
    use crate::rows::OwnedCell::{self, Str, F64, I64};
    use crate::rows::{ColumnType, Rows};

    fn shape() -> Shape {
        Shape::new(1, &aggs(), false)
    }

    fn aggs() -> Vec<AggSpec> {
        ["count(*)", "sum(v)"]
            .iter()
            .map(|s| AggSpec::parse(s).unwrap())
            .collect()
    }

    fn rows() -> Rows {
        use ColumnType::*;
        Rows::new(vec![BigInt, BigInt, Varchar, BigInt, Double])
    }

    fn add(s: &mut PaneStore, t: i64, key: &str, v: f64) {
        s.add(t, key.as_bytes(), &[Input::Present, Input::Num(v)], &aggs());
    }

    fn sorted(out: &Rows) -> Vec<Vec<OwnedCell>> {
        let mut v = out.to_vec();
        v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        v
    }

    #[test]
    fn window_bounds_floor_also_for_negative_times() {
        assert_eq!(window_start_ms(0, 1000), 0);
        assert_eq!(window_start_ms(999, 1000), 0);
        assert_eq!(window_start_ms(1000, 1000), 1000);
        assert_eq!(window_start_ms(-1, 1000), -1000);
        assert_eq!(window_start_ms(-1000, 1000), -1000);
        assert_eq!(window_start_ms(-1001, 1000), -2000);
        assert_eq!(window_end_ms(-1000, 1000), 0);
        assert_eq!(window_end_ms(i64::MAX - 5, 1000), i64::MAX);
    }

    #[test]
    fn tumbling_closes_in_watermark_order_only_what_the_watermark_passed() {
        let mut w = PaneStore::new(1000, 1000, shape(), i64::MIN);
        add(&mut w, 100, "a", 1.0);
        add(&mut w, 200, "b", 2.0);
        add(&mut w, 1500, "a", 3.0);
        add(&mut w, -5, "a", 0.5);
        add(&mut w, 300, "a", 5.0);
        assert_eq!(w.open_windows(), 4);
        let mut out = rows();
        assert_eq!(w.close_through(999, &mut out), 1);
        assert_eq!(
            out.to_vec()[0],
            vec![I64(-1000), I64(0), Str("a".into()), I64(1), F64(0.5)]
        );
        out.clear();
        assert_eq!(w.close_through(1000, &mut out), 2);
        assert_eq!(
            sorted(&out)[0],
            vec![I64(0), I64(1000), Str("a".into()), I64(2), F64(6.0)]
        );
        assert_eq!(w.late_window(999, 1000), Err((0, 1000)));
        assert_eq!(w.late_window(1000, 1000), Ok(()));
        let mut saved = Vec::new();
        w.encode(&mut Writer(&mut saved));
        let mut back = PaneStore::decode(
            PaneStore::new(1000, 1000, shape(), i64::MIN),
            &aggs(),
            &mut Reader { b: &saved, i: 0 },
        )
        .unwrap();
        assert_eq!(back.open_windows(), 1);
        out.clear();
        assert_eq!(back.close_all(&mut out), Some(2000));
        assert_eq!(back.open_windows(), 0);
    }

    #[test]
    fn hopping_windows_combine_their_panes() {
        // Windows of 3 s every 1 s: an event at 2.5 s is in [0,3), [1,4) and [2,5).
        let mut w = PaneStore::new(3000, 1000, shape(), i64::MIN);
        add(&mut w, 2500, "k", 1.0);
        add(&mut w, 3500, "k", 10.0);
        let mut out = rows();
        assert_eq!(w.close_through(4000, &mut out), 2);
        assert_eq!(
            sorted(&out),
            vec![
                vec![I64(0), I64(3000), Str("k".into()), I64(1), F64(1.0)],
                vec![I64(1000), I64(4000), Str("k".into()), I64(2), F64(11.0)],
            ]
        );
        // An event at 2.7 s after the watermark passed 4 s still counts in [2,5) (open).
        assert_eq!(w.late_window(2700, 4000), Ok(()));
        add(&mut w, 2700, "k", 100.0);
        // An event at 1.5 s: its last window [1,4) is closed: late.
        assert_eq!(w.late_window(1500, 4000), Err((1000, 4000)));
        out.clear();
        assert_eq!(w.close_all(&mut out), Some(6000));
        assert_eq!(
            sorted(&out),
            vec![
                vec![I64(2000), I64(5000), Str("k".into()), I64(3), F64(111.0)],
                vec![I64(3000), I64(6000), Str("k".into()), I64(1), F64(10.0)],
            ]
        );
        assert_eq!(w.open_windows(), 0);
    }

    #[test]
    fn hopping_skips_empty_stretches_and_resumes_from_the_checkpoint() {
        let mut w = PaneStore::new(2000, 1000, shape(), i64::MIN);
        add(&mut w, 0, "a", 1.0);
        add(&mut w, 1_000_000, "a", 2.0);
        let mut out = rows();
        assert_eq!(
            w.close_through(10_000, &mut out),
            2,
            "[-1000,1000) and [0,2000)"
        );
        let mut saved = Vec::new();
        w.encode(&mut Writer(&mut saved));
        let mut back = PaneStore::decode(
            PaneStore::new(2000, 1000, shape(), i64::MIN),
            &aggs(),
            &mut Reader { b: &saved, i: 0 },
        )
        .unwrap();
        out.clear();
        assert_eq!(
            back.close_through(1_001_000, &mut out),
            1,
            "[999000,1001000)"
        );
        assert_eq!(back.close_all(&mut out), Some(1_002_000));
        assert_eq!(out.len(), 2);
    }

    /// Many keys over panes that are closed, recycled and checkpointed: every window row equals
    /// what a plain map of (window, key) sums gives, so an entry read through another's number,
    /// a reused pane that keeps an old entry, or a restore that loses or doubles one shows up.
    #[test]
    fn many_keys_through_recycled_and_restored_panes_match_a_plain_map() {
        use std::collections::BTreeMap as Map;
        for (size, hop) in [(1000, 1000), (3000, 1000)] {
            let mut w = PaneStore::new(size, hop, shape(), i64::MIN);
            let mut want: Map<(i64, String), (i64, f64)> = Map::new();
            let mut got: Map<(i64, String), (i64, f64)> = Map::new();
            let mut out = rows();
            let mut x: u64 = 7;
            let collect = |out: &mut Rows, got: &mut Map<(i64, String), (i64, f64)>| {
                for r in out.to_vec() {
                    let (I64(start), Str(k), I64(n), F64(v)) = (&r[0], &r[2], &r[3], &r[4]) else {
                        panic!("row {r:?}");
                    };
                    assert!(
                        got.insert((*start, k.clone()), (*n, *v)).is_none(),
                        "{r:?} twice"
                    );
                }
                out.clear();
            };
            for step in 0..40_000i64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = step / 4 + (x >> 60) as i64 * 10;
                let key = format!("key-{}", (x >> 33) % 3000);
                let v = ((x >> 20) % 100) as f64;
                add(&mut w, t, &key, v);
                let first = window_start_ms(t, hop) - size + hop;
                for s in (first..=window_start_ms(t, hop)).step_by(hop as usize) {
                    let e = want.entry((s, key.clone())).or_insert((0, 0.0));
                    e.0 += 1;
                    e.1 += v;
                }
                if step % 2_500 == 2_499 {
                    w.close_through(t - 200, &mut out);
                    collect(&mut out, &mut got);
                }
                if step % 10_000 == 9_999 {
                    let mut saved = Vec::new();
                    w.encode(&mut Writer(&mut saved));
                    let open = w.open_windows();
                    w = PaneStore::decode(
                        PaneStore::new(size, hop, shape(), i64::MIN),
                        &aggs(),
                        &mut Reader { b: &saved, i: 0 },
                    )
                    .unwrap();
                    assert_eq!(w.open_windows(), open);
                }
            }
            w.close_all(&mut out);
            collect(&mut out, &mut got);
            assert_eq!(w.open_windows(), 0);
            // Events at most 150 ms behind (t - 200 closed): every window holds all its events.
            assert_eq!(got.len(), want.len(), "size {size} hop {hop}");
            assert_eq!(got, want, "size {size} hop {hop}");
        }
    }

    #[test]
    fn a_restored_entry_replaces_the_one_held() {
        let mut w = PaneStore::new(1000, 1000, shape(), i64::MIN);
        add(&mut w, 10, "a", 1.0);
        add(&mut w, 20, "b", 2.0);
        let fresh: States = aggs().iter().map(|a| AggState::new(a.func)).collect();
        let mut restored = fresh.clone();
        restored[0].add(5, Input::Present);
        restored[1].add(5, Input::Num(40.0));
        w.insert_states(0, b"a", restored);
        w.insert_states(0, b"c", fresh);
        assert_eq!(w.open_windows(), 3);
        let mut out = rows();
        w.close_all(&mut out);
        assert_eq!(
            out.to_vec(),
            vec![
                vec![I64(0), I64(1000), Str("a".into()), I64(1), F64(40.0)],
                vec![I64(0), I64(1000), Str("b".into()), I64(1), F64(2.0)],
                vec![I64(0), I64(1000), Str("c".into()), I64(0), OwnedCell::Null],
            ],
            "rows in the order keys first appeared"
        );
    }

    /// (start, count, final, revision) of each row, sorted.
    fn revised(out: &Rows) -> Vec<(i64, i64, bool, i64)> {
        let mut v: Vec<_> = out
            .to_vec()
            .into_iter()
            .map(|r| match (&r[0], &r[3], &r[5], &r[6]) {
                (I64(s), I64(n), OwnedCell::Bool(f), I64(rev)) => (*s, *n, *f, *rev),
                other => panic!("{other:?}"),
            })
            .collect();
        v.sort_unstable();
        v
    }

    fn revision_rows() -> Rows {
        use ColumnType::*;
        Rows::new(vec![
            BigInt, BigInt, Varchar, BigInt, Double, Boolean, BigInt, Boolean,
        ])
    }

    #[test]
    fn running_rows_cover_every_open_window_of_a_changed_pane() {
        let shape = Shape::new(1, &aggs(), true);
        let mut w = PaneStore::new(2000, 1000, shape, i64::MIN).tracking(true, None);
        let mut out = revision_rows();
        add(&mut w, 1500, "a", 1.0);
        assert_eq!(w.emit_updates(i64::MIN, &mut out), 2);
        assert_eq!(revised(&out), vec![(0, 1, false, 1), (1000, 1, false, 1)]);
        out.clear();
        assert_eq!(w.emit_updates(i64::MIN, &mut out), 0, "nothing changed");
        assert_eq!(w.close_through(2000, &mut out), 1);
        add(&mut w, 2500, "a", 1.0);
        w.emit_updates(2000, &mut out);
        assert_eq!(
            revised(&out),
            vec![(0, 1, true, 2), (1000, 2, false, 2), (2000, 1, false, 1)]
        );
    }

    #[test]
    fn late_updates_correct_a_closed_window_until_its_end_plus_the_bound() {
        let shape = Shape::new(1, &aggs(), true);
        let mut w = PaneStore::new(1000, 1000, shape.clone(), i64::MIN).tracking(false, Some(500));
        let mut out = revision_rows();
        add(&mut w, 100, "a", 1.0);
        assert_eq!(
            w.emit_updates(0, &mut out),
            0,
            "emit := 'close' writes no running rows"
        );
        assert_eq!(w.close_through(1200, &mut out), 1);
        let late = |w: &mut PaneStore, t: i64, wm: i64| {
            w.add_late(t, b"a", &[Input::Present, Input::Num(1.0)], &aggs(), wm)
        };
        assert!(late(&mut w, 200, 1200));
        w.emit_updates(1200, &mut out);
        assert_eq!(revised(&out), vec![(0, 1, true, 1), (0, 2, true, 2)]);
        // The kept state survives the checkpoint (taken once a cycle's rows are written).
        let mut saved = Vec::new();
        w.encode(&mut Writer(&mut saved));
        let fresh = PaneStore::new(1000, 1000, shape, i64::MIN).tracking(false, Some(500));
        let mut w = PaneStore::decode(fresh, &aggs(), &mut Reader { b: &saved, i: 0 }).unwrap();
        out.clear();
        assert!(late(&mut w, 250, 1200));
        w.emit_updates(1200, &mut out);
        assert_eq!(revised(&out), vec![(0, 3, true, 3)]);
        w.close_through(1500, &mut out);
        assert!(
            !late(&mut w, 300, 1500),
            "1000 + 500 is not after the watermark"
        );
        assert_eq!(w.track.as_ref().map(|t| t.retained.len()), Some(0));
        assert_eq!(w.track.as_ref().map(|t| t.revisions.len()), Some(0));
    }

    #[test]
    fn a_correction_is_written_before_the_watermark_puts_it_out_of_reach() {
        // Hopping 2 s every 1 s, corrections kept 2 s: [-1 s, 1 s) closes at 1.5 s; an event at
        // 200 ms still counts in the open [0, 2 s) and corrects the closed one; the watermark
        // then jumps to 5 s within the same cycle, past the closed window's reach (3 s).
        let shape = Shape::new(1, &aggs(), true);
        let mut w = PaneStore::new(2000, 1000, shape, i64::MIN).tracking(false, Some(2000));
        let mut out = revision_rows();
        add(&mut w, 100, "a", 1.0);
        add(&mut w, 1500, "a", 1.0);
        w.close_through(1500, &mut out);
        w.emit_updates(1500, &mut out);
        assert_eq!(revised(&out), vec![(-1000, 1, true, 1)]);
        out.clear();
        add(&mut w, 200, "a", 1.0);
        w.close_through(5000, &mut out);
        assert_eq!(
            w.emit_updates(5000, &mut out),
            0,
            "written already, nothing left"
        );
        assert_eq!(
            revised(&out),
            vec![(-1000, 2, true, 2), (0, 3, true, 1), (1000, 1, true, 1)]
        );
    }
}
