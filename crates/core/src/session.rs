//! Session windows per key (as in Flink and Kafka Streams): events of one key at most `gap` ms
//! apart in event time form one session, `[first event, last event + gap)`. An event that
//! bridges two sessions merges them. A session is written when the global watermark reaches its
//! end, and never again: an event that would join or extend a session of its key that was
//! already written is late, as is one whose session (merged with the open ones it reaches) would
//! end at or before the watermark. So sessions of one key never overlap in the output.
//!
//! Memory: the open sessions, and for a key whose sessions were all written, its last end until
//! the watermark is `gap` past it (after that, no event can reach it without being late anyway).

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasherDefault;

use crate::aggregate::{
    decode_states, encode_states, merge_states, new_states, AggSpec, Input, States,
};
use crate::codec::{CodecError, Reader, Writer};
use crate::emit::{Shape, Tail};
use crate::rows::Rows;
use crate::window::FxHasher;

/// The last running row written for a session (`emit := 'update'`): its bounds and revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Emitted {
    start: i64,
    end: i64,
    revision: i64,
}

struct Session {
    start: i64,
    last: i64,
    states: States,
    /// Changed since its running row was last written.
    dirty: bool,
    emitted: Option<Emitted>,
}

#[derive(Default)]
struct KeySessions {
    /// Open sessions, by start; they never intersect.
    open: Vec<Session>,
    /// The end of the last session written for this key.
    written_end: Option<i64>,
    /// In the store's list of keys with changed sessions.
    listed: bool,
}

pub(crate) struct SessionStore {
    gap_ms: i64,
    shape: Shape,
    /// `emit := 'update'`: each cycle writes the running rows of the sessions it changed.
    running: bool,
    /// Key slots with changed sessions.
    dirty: Vec<usize>,
    /// Running rows of absorbed sessions, to be withdrawn.
    retractions: Vec<(Box<[u8]>, Emitted)>,
    keys: Vec<(Box<[u8]>, KeySessions)>,
    index: HashMap<Box<[u8]>, usize, BuildHasherDefault<FxHasher>>,
    free: Vec<usize>,
    /// Open sessions by (end, key slot, start): the next to close comes first.
    by_end: BTreeSet<(i64, usize, i64)>,
    /// Keys with no open session, by the time their written end stops mattering.
    expiry: BTreeSet<(i64, usize)>,
    open: usize,
}

impl SessionStore {
    pub fn new(gap_ms: i64, shape: Shape) -> SessionStore {
        SessionStore {
            gap_ms,
            shape,
            running: false,
            dirty: Vec::new(),
            retractions: Vec::new(),
            keys: Vec::new(),
            index: HashMap::default(),
            free: Vec::new(),
            by_end: BTreeSet::new(),
            expiry: BTreeSet::new(),
            open: 0,
        }
    }

    /// Writes running rows (`emit := 'update'`).
    pub fn tracking(mut self, running: bool) -> SessionStore {
        self.running = running;
        self
    }

    pub fn open_windows(&self) -> usize {
        self.open
    }

    fn slot(&mut self, key: &[u8]) -> usize {
        if let Some(&s) = self.index.get(key) {
            return s;
        }
        let entry = (Box::<[u8]>::from(key), KeySessions::default());
        let s = match self.free.pop() {
            Some(s) => {
                self.keys[s] = entry;
                s
            }
            None => {
                self.keys.push(entry);
                self.keys.len() - 1
            }
        };
        self.index.insert(key.into(), s);
        s
    }

    /// The sessions of `slot` an event at `t` reaches: a range of the open list.
    fn reached(&self, slot: usize, t: i64) -> std::ops::Range<usize> {
        let open = &self.keys[slot].1.open;
        let lo = open.partition_point(|s| s.last + self.gap_ms < t);
        let hi = open.partition_point(|s| s.start <= t + self.gap_ms);
        lo..hi.max(lo)
    }

    /// Adds an event, or says it is late with the session it would have formed.
    pub fn add(
        &mut self,
        t: i64,
        key: &[u8],
        inputs: &[Input<'_>],
        aggs: &[AggSpec],
        watermark_ms: i64,
    ) -> Result<(), (i64, i64)> {
        let gap = self.gap_ms;
        let existing = self.index.get(key).copied();
        let (start, last, range) = match existing {
            Some(slot) => {
                let range = self.reached(slot, t);
                let open = &self.keys[slot].1.open[range.clone()];
                let start = open.first().map_or(t, |s| s.start.min(t));
                let last = open.last().map_or(t, |s| s.last.max(t));
                (start, last, Some((slot, range)))
            }
            None => (t, t, None),
        };
        let end = last.saturating_add(gap);
        let joins_written = existing
            .and_then(|slot| self.keys[slot].1.written_end)
            .is_some_and(|w| t <= w);
        if end <= watermark_ms || joins_written {
            return Err((start, end));
        }
        let slot = match range {
            Some((slot, _)) => slot,
            None => self.slot(key),
        };
        let range = self.reached(slot, t);
        let open = &mut self.keys[slot].1.open;
        let mut merged: Option<Session> = None;
        for s in open.drain(range.clone()) {
            self.by_end
                .remove(&(s.last.saturating_add(gap), slot, s.start));
            self.open -= 1;
            match &mut merged {
                None => merged = Some(s),
                Some(m) => {
                    merge_states(&mut m.states, &s.states);
                    m.last = m.last.max(s.last);
                    // The absorbed session's running row is withdrawn; the merged session
                    // goes on as the first one (its row, unless its start moved).
                    if let Some(e) = s.emitted {
                        self.retractions.push((key.into(), e));
                    }
                }
            }
        }
        let mut session = merged.unwrap_or_else(|| Session {
            start,
            last,
            states: new_states(aggs),
            dirty: false,
            emitted: None,
        });
        session.start = start;
        session.last = last;
        for (s, input) in session.states.iter_mut().zip(inputs) {
            s.add(t, *input);
        }
        if self.running {
            session.dirty = true;
            let k = &mut self.keys[slot].1;
            if !k.listed {
                k.listed = true;
                self.dirty.push(slot);
            }
        }
        let open = &mut self.keys[slot].1.open;
        self.by_end.insert((end, slot, start));
        open.insert(range.start, session);
        self.open += 1;
        Ok(())
    }

    /// Writes every session whose end is at or before `watermark_ms`. Returns the rows written.
    pub(crate) fn close_through(&mut self, watermark_ms: i64, out: &mut Rows) -> usize {
        let mut written = 0;
        while let Some(&(end, slot, start)) = self.by_end.first() {
            if end > watermark_ms {
                break;
            }
            self.write(end, slot, start, out);
            written += 1;
        }
        // Keys whose last written session is now a gap behind the watermark are forgotten.
        while let Some(&(at, slot)) = self.expiry.first() {
            if at > watermark_ms {
                break;
            }
            self.expiry.remove(&(at, slot));
            let k = &self.keys[slot];
            if k.1.open.is_empty() && k.1.written_end.is_some_and(|w| w + self.gap_ms == at) {
                let key = std::mem::take(&mut self.keys[slot].0);
                self.index.remove(&key);
                self.keys[slot].1 = KeySessions::default();
                self.free.push(slot);
            }
        }
        written
    }

    fn write(&mut self, end: i64, slot: usize, start: i64, out: &mut Rows) {
        self.by_end.remove(&(end, slot, start));
        let (key, k) = &mut self.keys[slot];
        let Some(pos) = k.open.iter().position(|s| s.start == start) else {
            return;
        };
        let s = k.open.remove(pos);
        self.open -= 1;
        let revision = next_revision(&self.shape, out, key, &s);
        self.shape
            .write_final(out, s.start, end, key, &s.states, revision);
        k.written_end = Some(k.written_end.map_or(end, |w| w.max(end)));
        if k.open.is_empty() {
            self.expiry.insert((end.saturating_add(self.gap_ms), slot));
        }
    }

    /// Writes the running row of every open session that changed since the last call, and
    /// withdraws the rows of sessions absorbed since. Returns the rows written.
    pub(crate) fn emit_updates(&mut self, out: &mut Rows) -> usize {
        let mut written = 0;
        let gap = self.gap_ms;
        for slot in std::mem::take(&mut self.dirty) {
            let Some((key, k)) = self.keys.get_mut(slot) else {
                continue;
            };
            k.listed = false;
            for s in k.open.iter_mut().filter(|s| s.dirty) {
                s.dirty = false;
                let end = s.last.saturating_add(gap);
                let revision = next_revision(&self.shape, out, key, s);
                let tail = Tail {
                    closed: false,
                    revision,
                    retracted: false,
                    correction: false,
                };
                self.shape
                    .write(out, s.start, end, key, Some(&s.states), tail);
                s.emitted = Some(Emitted {
                    start: s.start,
                    end,
                    revision,
                });
                written += 1;
            }
        }
        for (key, e) in std::mem::take(&mut self.retractions) {
            retract(&self.shape, out, &key, e);
            written += 1;
        }
        written
    }

    /// Writes every open session (end of bounded input); returns the latest end written.
    pub(crate) fn close_all(&mut self, out: &mut Rows) -> Option<i64> {
        let mut last = None;
        while let Some(&(end, slot, start)) = self.by_end.first() {
            self.write(end, slot, start, out);
            last = Some(end);
        }
        last
    }

    #[cfg(test)]
    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        SessionStore::encode_all(&[self], w);
    }

    /// The sessions of several stores that split a job's keys between them (window shards),
    /// in the form of one store: every live key, in key order.
    pub(crate) fn encode_all(stores: &[&SessionStore], w: &mut Writer<'_>) {
        // Each live key with its sessions, and whether its store writes running rows.
        let mut live: Vec<(&[u8], &KeySessions, bool)> = stores
            .iter()
            .flat_map(|st| {
                st.index
                    .values()
                    .map(|&s| (&st.keys[s].0[..], &st.keys[s].1, st.running))
            })
            .collect();
        live.sort_by(|a, b| a.0.cmp(b.0));
        w.u64(live.len() as u64);
        for (key, k, running) in live {
            w.bytes(key);
            match k.written_end {
                Some(e) => {
                    w.u8(1);
                    w.i64(e);
                }
                None => w.u8(0),
            }
            w.u64(k.open.len() as u64);
            for s in &k.open {
                w.i64(s.start);
                w.i64(s.last);
                encode_states(&s.states, w);
                if running {
                    match s.emitted {
                        Some(e) => {
                            w.u8(1);
                            w.i64(e.start);
                            w.i64(e.end);
                            w.i64(e.revision);
                        }
                        None => w.u8(0),
                    }
                }
            }
        }
    }

    /// Restores a store encoded by [`SessionStore::encode`] into `store` (a new one, tracking
    /// as the job does).
    #[cfg(test)]
    pub(crate) fn decode(
        store: SessionStore,
        aggs: &[AggSpec],
        r: &mut Reader<'_>,
    ) -> Result<SessionStore, CodecError> {
        let mut stores = [store];
        SessionStore::decode_into(&mut stores, &|_| 0, aggs, r)?;
        let [store] = stores;
        Ok(store)
    }

    /// Restores what [`SessionStore::encode_all`] wrote into `stores` (new ones), each key into
    /// the store `route` names.
    pub(crate) fn decode_into(
        stores: &mut [SessionStore],
        route: &dyn Fn(&[u8]) -> usize,
        aggs: &[AggSpec],
        r: &mut Reader<'_>,
    ) -> Result<(), CodecError> {
        for _ in 0..r.count()? {
            let key = r.bytes()?;
            let store = stores
                .get_mut(route(key))
                .ok_or(CodecError("no store for a key"))?;
            let gap_ms = store.gap_ms;
            let slot = store.slot(key);
            let written_end = match r.u8()? {
                0 => None,
                _ => Some(r.i64()?),
            };
            let mut open = Vec::new();
            for _ in 0..r.count()? {
                let start = r.i64()?;
                let last = r.i64()?;
                if last < start
                    || open
                        .last()
                        .is_some_and(|p: &Session| p.last + gap_ms >= start)
                {
                    return Err(CodecError("overlapping sessions"));
                }
                let states = decode_states(aggs, r)?;
                let emitted = if store.running && r.u8()? == 1 {
                    Some(Emitted {
                        start: r.i64()?,
                        end: r.i64()?,
                        revision: r.i64()?,
                    })
                } else {
                    None
                };
                open.push(Session {
                    start,
                    last,
                    states,
                    dirty: false,
                    emitted,
                });
            }
            for s in &open {
                store
                    .by_end
                    .insert((s.last.saturating_add(gap_ms), slot, s.start));
            }
            store.open += open.len();
            if open.is_empty() {
                if let Some(e) = written_end {
                    store.expiry.insert((e.saturating_add(gap_ms), slot));
                }
            }
            store.keys[slot].1 = KeySessions {
                open,
                written_end,
                listed: false,
            };
        }
        Ok(())
    }
}

/// The revision of a session's next row: one more than its last running row's, or 1 when its
/// start moved since (its old row is withdrawn first: the row's identity is its start).
fn next_revision(shape: &Shape, out: &mut Rows, key: &[u8], s: &Session) -> i64 {
    match s.emitted {
        Some(e) if e.start == s.start => e.revision + 1,
        Some(e) => {
            retract(shape, out, key, e);
            1
        }
        None => 1,
    }
}

/// Withdraws a running row: the same window, its aggregates NULL, `retracted` true.
fn retract(shape: &Shape, out: &mut Rows, key: &[u8], e: Emitted) {
    let tail = Tail {
        closed: true,
        revision: e.revision + 1,
        retracted: true,
        correction: false,
    };
    shape.write(out, e.start, e.end, key, None, tail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::OwnedCell::{self, Str, I64};
    use crate::rows::{ColumnType, Rows};
    use crate::watermark::NO_WATERMARK;

    fn shape() -> Shape {
        Shape::new(1, &aggs(), false)
    }

    fn aggs() -> Vec<AggSpec> {
        vec![AggSpec::parse("count(*)").unwrap()]
    }

    fn rows() -> Rows {
        use ColumnType::*;
        Rows::new(vec![BigInt, BigInt, Varchar, BigInt])
    }

    fn add(s: &mut SessionStore, t: i64, key: &str, wm: i64) -> Result<(), (i64, i64)> {
        s.add(t, key.as_bytes(), &[Input::Present], &aggs(), wm)
    }

    fn sorted(out: &Rows) -> Vec<Vec<OwnedCell>> {
        let mut v = out.to_vec();
        v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        v
    }

    #[test]
    fn events_within_the_gap_form_one_session_and_a_bridge_merges_two() {
        let mut s = SessionStore::new(10, shape());
        for t in [0, 5, 15] {
            add(&mut s, t, "a", NO_WATERMARK).unwrap();
        }
        add(&mut s, 40, "a", NO_WATERMARK).unwrap();
        add(&mut s, 100, "b", NO_WATERMARK).unwrap();
        assert_eq!(s.open_windows(), 3);
        // 24 is within 10 of 15 but not of 40: extends the first to [0, 34).
        add(&mut s, 24, "a", NO_WATERMARK).unwrap();
        assert_eq!(s.open_windows(), 3);
        // 30 reaches both (24 + 10 >= 30, 40 - 10 <= 30): they merge into [0, 50).
        add(&mut s, 30, "a", NO_WATERMARK).unwrap();
        assert_eq!(s.open_windows(), 2);
        let mut out = rows();
        assert_eq!(s.close_through(50, &mut out), 1);
        assert_eq!(
            out.to_vec()[0],
            vec![I64(0), I64(50), Str("a".into()), I64(6)]
        );
        out.clear();
        assert_eq!(s.close_all(&mut out), Some(110));
        assert_eq!(
            sorted(&out),
            vec![vec![I64(100), I64(110), Str("b".into()), I64(1)]]
        );
    }

    #[test]
    fn late_rules_never_let_a_written_session_change() {
        let mut s = SessionStore::new(10, shape());
        add(&mut s, 100, "a", NO_WATERMARK).unwrap();
        add(&mut s, 200, "a", NO_WATERMARK).unwrap();
        let mut out = rows();
        s.close_through(115, &mut out);
        assert_eq!(out.len(), 1, "[100, 110) written");
        // Joins the written session: late, even though [105, 115) would end after... no, at 115.
        assert_eq!(add(&mut s, 105, "a", 112), Err((105, 115)));
        // Would extend it (110 <= written end 110): late.
        assert_eq!(add(&mut s, 110, "a", 112), Err((110, 120)));
        // An old event that joins the open session [200, 210) is not late.
        assert_eq!(add(&mut s, 195, "a", 150), Ok(()));
        // A session ending at or before the watermark: late.
        assert_eq!(add(&mut s, 130, "a", 150), Err((130, 140)));
        // Another key is independent.
        assert_eq!(add(&mut s, 105, "b", 112), Ok(()));
    }

    #[test]
    fn keys_are_forgotten_a_gap_after_their_last_session_and_state_round_trips() {
        let mut s = SessionStore::new(10, shape());
        add(&mut s, 0, "a", NO_WATERMARK).unwrap();
        add(&mut s, 0, "b", NO_WATERMARK).unwrap();
        add(&mut s, 50, "b", NO_WATERMARK).unwrap();
        let mut out = rows();
        s.close_through(10, &mut out);
        assert_eq!(s.index.len(), 2);
        let mut saved = Vec::new();
        s.encode(&mut Writer(&mut saved));
        let mut back = SessionStore::decode(
            SessionStore::new(10, shape()),
            &aggs(),
            &mut Reader { b: &saved, i: 0 },
        )
        .unwrap();
        assert_eq!(back.open_windows(), 1);
        assert_eq!(add(&mut back, 5, "a", 10), Err((5, 15)));
        back.close_through(20, &mut out);
        assert_eq!(back.index.len(), 1, "'a' forgotten at 20");
        assert_eq!(add(&mut back, 25, "a", 20), Ok(()));
    }

    #[test]
    fn running_rows_withdraw_what_a_merge_or_an_earlier_start_replaced() {
        use crate::rows::OwnedCell::{Bool, Null};
        let shape = Shape::new(1, &aggs(), true);
        let mut s = SessionStore::new(10, shape.clone()).tracking(true);
        let mut out = Rows::new(vec![
            ColumnType::BigInt,
            ColumnType::BigInt,
            ColumnType::Varchar,
            ColumnType::BigInt,
            ColumnType::Boolean,
            ColumnType::BigInt,
            ColumnType::Boolean,
        ]);
        let a = || Str("a".into());
        for t in [20, 40] {
            add(&mut s, t, "a", NO_WATERMARK).unwrap();
        }
        assert_eq!(s.emit_updates(&mut out), 2);
        assert_eq!(
            sorted(&out),
            vec![
                vec![
                    I64(20),
                    I64(30),
                    a(),
                    I64(1),
                    Bool(false),
                    I64(1),
                    Bool(false)
                ],
                vec![
                    I64(40),
                    I64(50),
                    a(),
                    I64(1),
                    Bool(false),
                    I64(1),
                    Bool(false)
                ],
            ]
        );
        assert_eq!(s.emit_updates(&mut out), 0, "nothing changed");
        out.clear();
        // 30 bridges them: [20, 50) goes on as the first session's row; the second's row is
        // withdrawn.
        add(&mut s, 30, "a", NO_WATERMARK).unwrap();
        s.emit_updates(&mut out);
        assert_eq!(
            sorted(&out),
            vec![
                vec![
                    I64(20),
                    I64(50),
                    a(),
                    I64(3),
                    Bool(false),
                    I64(2),
                    Bool(false)
                ],
                vec![I64(40), I64(50), a(), Null, Bool(true), I64(2), Bool(true)],
            ]
        );
        out.clear();
        // 12 moves the start: the row at 20 is withdrawn and the session's row starts over.
        add(&mut s, 12, "a", NO_WATERMARK).unwrap();
        s.emit_updates(&mut out);
        assert_eq!(
            sorted(&out),
            vec![
                vec![
                    I64(12),
                    I64(50),
                    a(),
                    I64(4),
                    Bool(false),
                    I64(1),
                    Bool(false)
                ],
                vec![I64(20), I64(50), a(), Null, Bool(true), I64(3), Bool(true)],
            ]
        );
        // The running state survives the checkpoint: the close continues the revisions.
        let mut saved = Vec::new();
        s.encode(&mut Writer(&mut saved));
        let mut back = SessionStore::decode(
            SessionStore::new(10, shape).tracking(true),
            &aggs(),
            &mut Reader { b: &saved, i: 0 },
        )
        .unwrap();
        out.clear();
        assert_eq!(back.close_through(50, &mut out), 1);
        assert_eq!(
            out.to_vec(),
            vec![vec![
                I64(12),
                I64(50),
                a(),
                I64(4),
                Bool(true),
                I64(2),
                Bool(false)
            ]]
        );
    }
}
