//! Tumbling and hopping event-time windows per key. A window is `[start, start + size)`; hopping
//! windows start every `hop` ms (size a multiple of hop; tumbling is hop = size). Events are
//! aggregated into panes of `hop` ms, and a window's row combines the panes it spans when the
//! watermark passes its end, so an event costs the same whatever the number of windows it
//! belongs to. Panes are kept by start, so the windows a watermark closes are found in order
//! without scanning the open ones.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::aggregate::{decode_states, encode_states, merge_states, AggSpec, Input, States};
use crate::record::key_parts;
use crate::rows::Rows;
use crate::state::{CodecError, Reader, Writer};

/// `floor(event_time_ms / size_ms) * size_ms`, flooring also for negative times.
#[inline]
pub fn window_start_ms(event_time_ms: i64, size_ms: i64) -> i64 {
    event_time_ms.div_euclid(size_ms) * size_ms
}

/// The exclusive end of the window that starts at `start_ms`.
#[inline]
pub fn window_end_ms(start_ms: i64, size_ms: i64) -> i64 {
    start_ms.saturating_add(size_ms)
}

/// FxHash: keys are short byte strings hashed once per event, where SipHash would cost more
/// than the rest of the window update.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

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
pub type KeyMap<V> = HashMap<Box<[u8]>, V, BuildHasherDefault<FxHasher>>;

/// Writes one window row: start, end, the key columns, the aggregates.
pub fn write_window(
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

/// The open panes of a tumbling or hopping job.
pub struct PaneStore {
    size_ms: i64,
    hop_ms: i64,
    nkeys: usize,
    panes: BTreeMap<i64, KeyMap<States>>,
    /// (pane, key) entries held.
    entries: usize,
    /// Every window ending at or before this was written.
    closed_ms: i64,
    /// Emptied maps kept for reuse, so a new pane does not allocate a table.
    spare: Vec<KeyMap<States>>,
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
    pub fn late_window(&self, t: i64, watermark_ms: i64) -> Result<(), (i64, i64)> {
        let start = window_start_ms(t, self.hop_ms);
        let end = window_end_ms(start, self.size_ms);
        if end <= watermark_ms {
            Err((start, end))
        } else {
            Ok(())
        }
    }

    /// Adds an event (not late) to its pane. Allocates only when the (key, pane) pair is new.
    #[inline]
    pub fn add(&mut self, t: i64, key: &[u8], inputs: &[Input<'_>], aggs: &[AggSpec]) {
        let pane = window_start_ms(t, self.hop_ms);
        let spare = &mut self.spare;
        let map = self
            .panes
            .entry(pane)
            .or_insert_with(|| spare.pop().unwrap_or_default());
        let states = match map.get_mut(key) {
            Some(s) => s,
            None => {
                self.entries += 1;
                map.entry(key.into())
                    .or_insert_with(|| crate::aggregate::new_states(aggs))
            }
        };
        for (s, input) in states.iter_mut().zip(inputs) {
            s.add(t, *input);
        }
    }

    pub fn open_windows(&self) -> usize {
        self.entries
    }

    /// Restores one (pane, key) entry.
    pub(crate) fn insert_states(&mut self, pane: i64, key: Box<[u8]>, states: States) {
        if self
            .panes
            .entry(pane)
            .or_default()
            .insert(key, states)
            .is_none()
        {
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
    pub fn close_through(&mut self, watermark_ms: i64, out: &mut Rows) -> usize {
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
    pub fn close_all(&mut self, out: &mut Rows) -> Option<i64> {
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

    /// Writes the window `[start, end)` and drops the panes no later window needs.
    fn emit(&mut self, start: i64, end: i64, out: &mut Rows) -> usize {
        let mut written = 0;
        if self.hop_ms == self.size_ms {
            // Tumbling: the pane is the window; its states move to the output.
            if let Some(mut map) = self.panes.remove(&start) {
                self.entries -= map.len();
                for (key, states) in map.drain() {
                    write_window(out, start, end, &key, self.nkeys, &states);
                    written += 1;
                }
                if self.spare.len() < 64 {
                    self.spare.push(map);
                }
            }
        } else {
            // Combine the window's panes per key. The scratch map outlives one window: an entry
            // stamped with an older window is overwritten in place (no new key or state
            // allocation per window), and entries of keys gone quiet are dropped now and then.
            self.generation += 1;
            let generation = self.generation;
            let merged = &mut self.scratch;
            for (_, map) in self.panes.range(start..end) {
                for (key, states) in map {
                    match merged.get_mut(key) {
                        Some((g, m)) if *g == generation => merge_states(m, states),
                        Some((g, m)) => {
                            *g = generation;
                            m.clone_from(states);
                        }
                        None => {
                            merged.insert(key.clone(), (generation, states.clone()));
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
                let mut map = entry.remove();
                self.entries -= map.len();
                map.clear();
                if self.spare.len() < 64 {
                    self.spare.push(map);
                }
            }
        }
        self.closed_ms = self.closed_ms.max(end);
        written
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        w.i64(self.closed_ms);
        w.u64(self.panes.len() as u64);
        for (&pane, map) in &self.panes {
            w.i64(pane);
            w.u64(map.len() as u64);
            let mut keys: Vec<&Box<[u8]>> = map.keys().collect();
            keys.sort();
            for k in keys {
                w.bytes(k);
                encode_states(&map[k], w);
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
            let pane = r.i64()?;
            let mut map = KeyMap::default();
            for _ in 0..r.count()? {
                let key: Box<[u8]> = r.bytes()?.into();
                map.insert(key, decode_states(aggs, r)?);
            }
            store.entries += map.len();
            store.panes.insert(pane, map);
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
}
