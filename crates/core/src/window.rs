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
use crate::record::key_parts;
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

/// Writes one window row: start, end, the key columns, the aggregates.
pub(crate) fn write_window(
    out: &mut Rows,
    start: i64,
    end: i64,
    key: &[u8],
    nkeys: usize,
    s: &[crate::aggregate::AggState],
) {
    let mut row = out.row();
    row.i64(start).i64(end);
    for part in key_parts(key, nkeys) {
        row.str(part);
    }
    for a in s {
        row.cell(a.cell());
    }
    row.finish();
}

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
}

fn hash_key(key: &[u8]) -> u64 {
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

    /// The states of `key`, new ones (for `aggs`) when the pane has no entry for it; whether
    /// the entry is new.
    #[inline]
    fn states_for(&mut self, key: &[u8], aggs: &[AggSpec]) -> (&mut [AggState], bool) {
        let hash = hash_key(key);
        let (i, new) = match self.find(hash, key) {
            Some(i) => (i, false),
            None => (self.push(hash, key, fresh_states(aggs)), true),
        };
        let w = self.width;
        (&mut self.states[i * w..(i + 1) * w], new)
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
    }
}

/// Emptied panes kept for reuse.
const SPARE_PANES: usize = 4;

/// The open panes of a tumbling or hopping job.
pub(crate) struct PaneStore {
    size_ms: i64,
    hop_ms: i64,
    nkeys: usize,
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
}

impl PaneStore {
    pub fn new(size_ms: i64, hop_ms: i64, nkeys: usize, closed_ms: i64) -> PaneStore {
        PaneStore {
            size_ms,
            hop_ms,
            nkeys,
            panes: BTreeMap::new(),
            entries: 0,
            closed_ms,
            spare: Vec::new(),
            scratch: KeyMap::default(),
            generation: 0,
        }
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
    #[inline]
    pub fn add(&mut self, t: i64, key: &[u8], inputs: &[Input<'_>], aggs: &[AggSpec]) {
        let pane = window_start_ms(t, self.hop_ms);
        let spare = &mut self.spare;
        let (states, new) = self
            .panes
            .entry(pane)
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .states_for(key, aggs);
        for (s, input) in states.iter_mut().zip(inputs) {
            s.add(t, *input);
        }
        self.entries += usize::from(new);
    }

    pub fn open_windows(&self) -> usize {
        self.entries
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

    /// Writes the window `[start, end)` and drops the panes no later window needs. Rows come in
    /// the order their keys first appeared in the window.
    fn emit(&mut self, start: i64, end: i64, out: &mut Rows) -> usize {
        let mut written = 0;
        if self.hop_ms == self.size_ms {
            // Tumbling: the pane is the window.
            if let Some(pane) = self.panes.remove(&start) {
                for i in 0..pane.len() {
                    write_window(out, start, end, pane.key(i), self.nkeys, pane.states(i));
                }
                written = pane.len();
                self.recycle(pane);
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
            for (key, (g, states)) in merged.iter() {
                if *g == generation {
                    write_window(out, start, end, key, self.nkeys, states);
                    written += 1;
                }
            }
            if merged.len() > 2 * written + 64 {
                merged.retain(|_, (g, _)| *g == generation);
            }
            // Later windows start at start + hop or after: panes before that are done.
            while let Some(entry) = self.panes.first_entry() {
                if *entry.key() > start {
                    break;
                }
                let pane = entry.remove();
                self.recycle(pane);
            }
        }
        self.closed_ms = self.closed_ms.max(end);
        written
    }

    /// Panes in start order, each pane's entries in the order their keys first appeared (as
    /// kept in memory, so a resumed run holds its windows exactly as the straight run did).
    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        w.i64(self.closed_ms);
        w.u64(self.panes.len() as u64);
        for (&start, pane) in &self.panes {
            w.i64(start);
            w.u64(pane.len() as u64);
            for i in 0..pane.len() {
                w.bytes(pane.key(i));
                encode_states(pane.states(i), w);
            }
        }
    }

    pub(crate) fn decode(
        size_ms: i64,
        hop_ms: i64,
        nkeys: usize,
        aggs: &[AggSpec],
        r: &mut Reader<'_>,
    ) -> Result<PaneStore, CodecError> {
        let mut store = PaneStore::new(size_ms, hop_ms, nkeys, r.i64()?);
        for _ in 0..r.count()? {
            let start = r.i64()?;
            for _ in 0..r.count()? {
                let key = r.bytes()?;
                store.insert_states(start, key, decode_states(aggs, r)?);
            }
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::AggSpec;
    use crate::rows::OwnedCell::{self, Str, F64, I64};
    use crate::rows::{ColumnType, Rows};

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
        let mut w = PaneStore::new(1000, 1000, 1, i64::MIN);
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
        let mut back =
            PaneStore::decode(1000, 1000, 1, &aggs(), &mut Reader { b: &saved, i: 0 }).unwrap();
        assert_eq!(back.open_windows(), 1);
        out.clear();
        assert_eq!(back.close_all(&mut out), Some(2000));
        assert_eq!(back.open_windows(), 0);
    }

    #[test]
    fn hopping_windows_combine_their_panes() {
        // Windows of 3 s every 1 s: an event at 2.5 s is in [0,3), [1,4) and [2,5).
        let mut w = PaneStore::new(3000, 1000, 1, i64::MIN);
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
        let mut w = PaneStore::new(2000, 1000, 1, i64::MIN);
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
        let mut back =
            PaneStore::decode(2000, 1000, 1, &aggs(), &mut Reader { b: &saved, i: 0 }).unwrap();
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
            let mut w = PaneStore::new(size, hop, 1, i64::MIN);
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
                    w = PaneStore::decode(size, hop, 1, &aggs(), &mut Reader { b: &saved, i: 0 })
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
        let mut w = PaneStore::new(1000, 1000, 1, i64::MIN);
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
}
