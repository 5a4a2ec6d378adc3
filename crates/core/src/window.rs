//! Tumbling event-time windows per key: `[window_start_ms, window_start_ms + window_ms)`, with
//! count/sum/min/max partial aggregates, kept so that the windows a watermark closes are found
//! in watermark order without scanning the open ones.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::rows::{ColumnType, Rows, TableSchema};
use crate::state::{CodecError, Reader, Writer};

/// The windows table of a job with the default key and aggregates (SPEC section 5).
pub fn default_windows_schema() -> TableSchema {
    use ColumnType::*;
    TableSchema::new(
        &[
            ("window_start_ms", BigInt),
            ("window_end_ms", BigInt),
            ("key", Varchar),
            ("count", BigInt),
            ("sum_value", Double),
            ("min_value", Double),
            ("max_value", Double),
        ],
        &["key", "window_start_ms"],
    )
}

/// `floor(event_time_ms / window_ms) * window_ms`, flooring also for negative times.
#[inline]
pub fn window_start_ms(event_time_ms: i64, window_ms: i64) -> i64 {
    event_time_ms.div_euclid(window_ms) * window_ms
}

/// The exclusive end of the window that starts at `start_ms`.
#[inline]
pub fn window_end_ms(start_ms: i64, window_ms: i64) -> i64 {
    start_ms.saturating_add(window_ms)
}

/// A window's partial aggregate. The sum is compensated (Neumaier), so that it does not
/// depend, in practice, on the order events were added in: a run that was stopped and resumed
/// gets the same sums as a straight one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate {
    pub count: i64,
    pub values: i64,
    pub sum: f64,
    pub compensation: f64,
    pub min: f64,
    pub max: f64,
}

impl Default for Aggregate {
    fn default() -> Self {
        Aggregate {
            count: 0,
            values: 0,
            sum: 0.0,
            compensation: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl Aggregate {
    #[inline]
    pub fn add(&mut self, value: Option<f64>) {
        self.count += 1;
        let Some(v) = value else { return };
        self.values += 1;
        let t = self.sum + v;
        if t.is_finite() {
            if self.sum.abs() >= v.abs() {
                self.compensation += (self.sum - t) + v;
            } else {
                self.compensation += (v - t) + self.sum;
            }
        } else {
            self.compensation = 0.0;
        }
        self.sum = t;
        if v < self.min {
            self.min = v;
        }
        if v > self.max {
            self.max = v;
        }
    }

    /// NULL (None) when no event of the window had a value, as SQL's SUM.
    pub fn sum_value(&self) -> Option<f64> {
        (self.values > 0).then(|| {
            if self.sum.is_finite() {
                self.sum + self.compensation
            } else {
                self.sum
            }
        })
    }

    pub fn min_value(&self) -> Option<f64> {
        (self.values > 0).then_some(self.min)
    }

    pub fn max_value(&self) -> Option<f64> {
        (self.values > 0).then_some(self.max)
    }
}

/// FxHash: keys are short strings hashed once per event, where SipHash would cost more than the
/// rest of the window update.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            h = (h.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
        self.0 = h;
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(i)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type Bucket = HashMap<Box<str>, Aggregate, BuildHasherDefault<FxHasher>>;

/// The open windows of a job, grouped by window start.
pub struct WindowStore {
    window_ms: i64,
    buckets: BTreeMap<i64, Bucket>,
    open: usize,
    /// Emptied buckets kept for reuse, so a new window period does not allocate a table.
    spare: Vec<Bucket>,
}

impl WindowStore {
    pub fn new(window_ms: i64) -> WindowStore {
        WindowStore {
            window_ms,
            buckets: BTreeMap::new(),
            open: 0,
            spare: Vec::new(),
        }
    }

    /// Adds an event to the window starting at `start_ms` for `key`. Allocates only when the
    /// (key, window) pair is new.
    #[inline]
    pub fn add(&mut self, start_ms: i64, key: &str, value: Option<f64>) {
        let spare = &mut self.spare;
        let bucket = self
            .buckets
            .entry(start_ms)
            .or_insert_with(|| spare.pop().unwrap_or_default());
        if let Some(agg) = bucket.get_mut(key) {
            agg.add(value);
        } else {
            let mut agg = Aggregate::default();
            agg.add(value);
            bucket.insert(key.into(), agg);
            self.open += 1;
        }
    }

    /// Restores a window from a checkpoint.
    pub fn insert(&mut self, start_ms: i64, key: Box<str>, agg: Aggregate) {
        if self
            .buckets
            .entry(start_ms)
            .or_default()
            .insert(key, agg)
            .is_none()
        {
            self.open += 1;
        }
    }

    /// Writes every window whose end is at or before `watermark_ms` to `out` (rows of the
    /// windows table) and forgets it.
    pub fn close_through(&mut self, watermark_ms: i64, out: &mut Rows) {
        while let Some(entry) = self.buckets.first_entry() {
            let start = *entry.key();
            let end = window_end_ms(start, self.window_ms);
            if end > watermark_ms {
                break;
            }
            let bucket = entry.remove();
            self.drain_bucket(start, end, bucket, out);
        }
    }

    /// Closes every open window (end of bounded input); returns the latest end closed.
    pub fn close_all(&mut self, out: &mut Rows) -> Option<i64> {
        let mut last_end = None;
        while let Some((start, bucket)) = self.buckets.pop_first() {
            let end = window_end_ms(start, self.window_ms);
            if !bucket.is_empty() {
                last_end = Some(end);
            }
            self.drain_bucket(start, end, bucket, out);
        }
        last_end
    }

    fn drain_bucket(&mut self, start: i64, end: i64, mut bucket: Bucket, out: &mut Rows) {
        self.open -= bucket.len();
        for (key, agg) in bucket.drain() {
            out.row()
                .i64(start)
                .i64(end)
                .str(&key)
                .i64(agg.count)
                .opt_f64(agg.sum_value())
                .opt_f64(agg.min_value())
                .opt_f64(agg.max_value())
                .finish();
        }
        if self.spare.len() < 64 {
            self.spare.push(bucket);
        }
    }

    pub fn open_windows(&self) -> usize {
        self.open
    }

    /// Every open window, in window-start order (for checkpoints).
    pub fn iter(&self) -> impl Iterator<Item = (i64, &str, &Aggregate)> {
        self.buckets
            .iter()
            .flat_map(|(&s, b)| b.iter().map(move |(k, a)| (s, &**k, a)))
    }

    /// The open windows in their checkpoint form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u8(1);
        w.u64(self.open as u64);
        for (start, key, a) in self.iter() {
            w.i64(start);
            w.bytes(key.as_bytes());
            w.i64(a.count);
            w.i64(a.values);
            w.f64(a.sum);
            w.f64(a.compensation);
            w.f64(a.min);
            w.f64(a.max);
        }
    }

    /// Restores the open windows written by [`WindowStore::encode`].
    pub fn decode(window_ms: i64, data: &[u8]) -> Result<WindowStore, CodecError> {
        let mut store = WindowStore::new(window_ms);
        let mut r = Reader { b: data, i: 0 };
        if r.u8()? != 1 {
            return Err(CodecError("unknown format version"));
        }
        for _ in 0..r.count()? {
            let start = r.i64()?;
            let key = r.string()?.into_boxed_str();
            let agg = Aggregate {
                count: r.i64()?,
                values: r.i64()?,
                sum: r.f64()?,
                compensation: r.f64()?,
                min: r.f64()?,
                max: r.f64()?,
            };
            store.insert(start, key, agg);
        }
        r.end()?;
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::OwnedCell::{Str, F64, I64};

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
    fn aggregates_with_and_without_values() {
        let mut a = Aggregate::default();
        a.add(None);
        assert_eq!(
            (a.count, a.sum_value(), a.min_value(), a.max_value()),
            (1, None, None, None)
        );
        a.add(Some(3.0));
        a.add(Some(-1.5));
        assert_eq!(a.count, 3);
        assert_eq!(a.sum_value(), Some(1.5));
        assert_eq!(a.min_value(), Some(-1.5));
        assert_eq!(a.max_value(), Some(3.0));
    }

    #[test]
    fn compensated_sum_does_not_depend_on_order() {
        let vals: Vec<f64> = (0..1000)
            .map(|i| ((i * 7919) % 10007) as f64 / 100.0 + 0.01)
            .collect();
        let mut fwd = Aggregate::default();
        vals.iter().for_each(|&v| fwd.add(Some(v)));
        let mut rev = Aggregate::default();
        vals.iter().rev().for_each(|&v| rev.add(Some(v)));
        assert_eq!(fwd.sum_value(), rev.sum_value());
    }

    #[test]
    fn closes_in_watermark_order_only_what_the_watermark_passed() {
        let mut w = WindowStore::new(1000);
        w.add(0, "a", Some(1.0));
        w.add(0, "b", Some(2.0));
        w.add(1000, "a", Some(3.0));
        w.add(-1000, "a", None);
        w.add(0, "a", Some(5.0));
        assert_eq!(w.open_windows(), 4);
        let mut out = Rows::new(default_windows_schema().types());
        w.close_through(999, &mut out);
        let rows = out.to_vec();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0][..4], [I64(-1000), I64(0), Str("a".into()), I64(1)]);
        out.clear();
        w.close_through(1000, &mut out);
        let mut rows = out.to_vec();
        rows.sort_by(|x, y| format!("{:?}", x[2]).cmp(&format!("{:?}", y[2])));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][2..5], [Str("a".into()), I64(2), F64(6.0)]);
        assert_eq!(w.open_windows(), 1);
        let mut saved = Vec::new();
        w.encode(&mut saved);
        let mut back = WindowStore::decode(1000, &saved).unwrap();
        assert_eq!(back.open_windows(), 1);
        out.clear();
        assert_eq!(back.close_all(&mut out), Some(2000));
        assert_eq!(back.open_windows(), 0);
        assert!(WindowStore::decode(1000, &saved[..saved.len() - 1]).is_err());
    }
}
