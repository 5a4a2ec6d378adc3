//! The sketch behind `approx_quantile`: DDSketch's logarithmic bins (Masson, Rim & Lee, 2019), at
//! most 2 × 2048 counters, whose estimates of DuckDB's `quantile_cont` are within
//! [`RELATIVE_ERROR`] (1%) of the exact result for data of one sign; sketches merge exactly.
//!
//! The bound in detail. Every value of a rank is estimated within 0.9% of itself (the bins are
//! built for a = 0.009, so rounding in `ln`, `exp` and values right on a bin edge stay clear of
//! 1%); the exact min and max are kept, so q = 0, q = 1 and a single value are exact. Interpolating
//! between two neighbours of one sign keeps the relative bound; between a negative and a positive
//! neighbour the error is within 1% of the larger magnitude of the two, not of the result (which
//! may be near 0). Magnitudes below 1e-300 count as exactly 0. A store (positive values, and
//! negative ones by magnitude) keeps at most 2048 bins, a span of gamma^2048 ≈ 1.0e16 below its
//! largest magnitude; values smaller than that are folded into its lowest bin and lose the bound
//! (they are then reported as about max / 1.0e16, and never below the exact min).
//!
//! The state is a function of the multiset of values only (added or merged in any order, folded
//! or not), so a window's result does not depend on how its panes were combined.

use crate::codec::{CodecError, Reader, Writer};

/// The documented bound on the relative error of a quantile (see the module documentation).
pub(crate) const RELATIVE_ERROR: f64 = 0.01;
/// The accuracy the bins are built for, a margin under [`RELATIVE_ERROR`].
const ALPHA: f64 = 0.009;
const _: () = assert!(ALPHA < RELATIVE_ERROR);
/// ln(gamma) for gamma = (1 + ALPHA) / (1 - ALPHA) (`ln` is not const; the tests check it).
const LN_GAMMA: f64 = 0.018_000_486_023_620_893;
const INV_LN_GAMMA: f64 = 1.0 / LN_GAMMA;
/// ln((1 + gamma) / 2): a bin's value 2 gamma^k / (1 + gamma) is taken as one `exp`, which does
/// not overflow where gamma^k alone would.
const LN_HALF_ONE_PLUS_GAMMA: f64 = 0.009_040_744_652_149_024;
/// Bins per store at most (16 KiB of counts).
pub(crate) const MAX_BINS: usize = 2048;
/// Smaller magnitudes count as 0: there the logarithm would run into subnormals.
const ZERO_THRESHOLD: f64 = 1e-300;
/// Real keys lie within ±39 432 (1e-300 ..= f64::MAX); a decoded key beyond this is damage, and
/// the margin keeps every key computation far from i32 overflow.
const KEY_LIMIT: i32 = 1 << 20;
/// The checkpoint form's first byte, so that a change of gamma or layout is detected.
const FORMAT: u8 = 1;

/// The bin of a magnitude >= ZERO_THRESHOLD: k with gamma^(k-1) < m <= gamma^k.
#[inline]
fn key_of(magnitude: f64) -> i32 {
    // min() keeps an infinity from a careless caller away from i32::MAX (and overflow).
    (magnitude.ln() * INV_LN_GAMMA)
        .ceil()
        .min(f64::from(KEY_LIMIT)) as i32
}

/// The value within ALPHA of every magnitude in the bin: the harmonic mean of its two ends.
#[inline]
fn bin_value(key: i32) -> f64 {
    (f64::from(key) * LN_GAMMA - LN_HALF_ONE_PLUS_GAMMA).exp()
}

/// Counts of consecutive bins. Empty, or its first and last counts are nonzero, so that equal
/// contents compare (and encode) equal whatever the order they were added in.
#[derive(Debug, Clone, PartialEq, Default)]
struct Store {
    /// Key of `counts[0]`.
    offset: i32,
    counts: Vec<u64>,
}

impl Store {
    /// Key of the last bin (the store is not empty).
    #[inline]
    fn hi(&self) -> i32 {
        self.offset + self.counts.len() as i32 - 1
    }

    /// Grows capacity geometrically but never past MAX_BINS, so the heap held stays bounded.
    fn reserve(&mut self, len: usize) {
        let cap = self.counts.capacity();
        if len > cap {
            let want = (2 * cap).clamp(16, MAX_BINS).max(len);
            self.counts.reserve_exact(want - self.counts.len());
        }
    }

    /// Adds `n` to bin `key`. A value more than MAX_BINS - 1 bins below the top goes to the lowest
    /// bin; the top rising folds the bins that fall out of range into the new lowest one. Either
    /// way a value ends in bin max(key, top - (MAX_BINS - 1)), whatever the order.
    #[inline]
    fn add(&mut self, key: i32, n: u64) {
        if self.counts.is_empty() {
            self.reserve(1);
            self.offset = key;
            self.counts.push(n);
            return;
        }
        let hi = self.hi();
        if key > hi {
            self.extend_up(key, n);
            return;
        }
        let key = key.max(hi - (MAX_BINS as i32 - 1));
        if key < self.offset {
            self.extend_down(key);
        }
        let c = &mut self.counts[(key - self.offset) as usize];
        *c = c.saturating_add(n);
    }

    /// Makes `key` (within MAX_BINS of the top) the first bin.
    #[cold]
    fn extend_down(&mut self, key: i32) {
        let shift = (self.offset - key) as usize;
        let old = self.counts.len();
        self.reserve(old + shift);
        self.counts.resize(old + shift, 0);
        self.counts.copy_within(0..old, shift);
        self.counts[..shift].fill(0);
        self.offset = key;
    }

    /// Makes `key` the last bin, with count `n`, folding what falls out of range.
    #[cold]
    fn extend_up(&mut self, key: i32, n: u64) {
        let floor = key - (MAX_BINS as i32 - 1);
        if floor > self.offset {
            let below = (floor - self.offset) as usize;
            if below >= self.counts.len() {
                let total = sum(&self.counts);
                self.counts.clear();
                self.counts.push(total);
            } else {
                let folded = sum(&self.counts[..=below]);
                self.counts.drain(..below);
                self.counts[0] = folded;
            }
            self.offset = floor;
        }
        let len = (key - self.offset) as usize + 1;
        self.reserve(len);
        self.counts.resize(len, 0);
        self.counts[len - 1] = n;
    }

    fn merge(&mut self, other: &Store) {
        let (Some(&first), Some(&last)) = (other.counts.first(), other.counts.last()) else {
            return;
        };
        // The two ends first: the range is then final, and no bin in between moves the others.
        self.add(other.hi(), last);
        let len = other.counts.len();
        if len > 1 {
            self.add(other.offset, first);
            for (i, &c) in other.counts.iter().enumerate().take(len - 1).skip(1) {
                if c != 0 {
                    self.add(other.offset + i as i32, c);
                }
            }
        }
    }

    fn total(&self) -> u64 {
        sum(&self.counts)
    }

    /// Key of the bin holding the value of 0-based `rank`, from the smallest magnitude up.
    fn key_ascending(&self, rank: u64) -> Option<i32> {
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if rank < seen {
                return Some(self.offset + i as i32);
            }
        }
        None
    }

    /// Key of the bin holding the value of 0-based `rank`, from the largest magnitude down.
    fn key_descending(&self, rank: u64) -> Option<i32> {
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate().rev() {
            seen = seen.saturating_add(c);
            if rank < seen {
                return Some(self.offset + i as i32);
            }
        }
        None
    }

    fn encode(&self, w: &mut Writer<'_>) {
        w.i64(i64::from(self.offset));
        w.u64(self.counts.len() as u64);
        for &c in &self.counts {
            w.u64(c);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Store, CodecError> {
        let offset = r.i64()?;
        let len = r.count()?;
        if len > MAX_BINS {
            return Err(CodecError("quantile sketch too large"));
        }
        if len == 0 {
            return if offset == 0 {
                Ok(Store::default())
            } else {
                Err(CodecError("bad quantile sketch"))
            };
        }
        let top = offset.checked_add(len as i64 - 1);
        if offset < -i64::from(KEY_LIMIT) || top.is_none_or(|t| t > i64::from(KEY_LIMIT)) {
            return Err(CodecError("quantile sketch key out of range"));
        }
        let mut counts = Vec::with_capacity(len);
        for _ in 0..len {
            counts.push(r.u64()?);
        }
        if counts.first() == Some(&0) || counts.last() == Some(&0) {
            return Err(CodecError("bad quantile sketch"));
        }
        Ok(Store {
            offset: offset as i32,
            counts,
        })
    }
}

fn sum(counts: &[u64]) -> u64 {
    counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct QuantileSketch {
    count: u64,
    zeros: u64,
    /// Exact extremes (meaningless while `count` is 0, and then kept at 0).
    min: f64,
    max: f64,
    positive: Store,
    /// Negative values by magnitude.
    negative: Store,
}

impl QuantileSketch {
    #[inline]
    pub fn add(&mut self, v: f64) {
        // -0.0 as 0.0, so that min, max and the checkpoint bytes do not depend on the order.
        let v = v + 0.0;
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else if v < self.min {
            self.min = v;
        } else if v > self.max {
            self.max = v;
        }
        self.count = self.count.saturating_add(1);
        if v >= ZERO_THRESHOLD {
            self.positive.add(key_of(v), 1);
        } else if v <= -ZERO_THRESHOLD {
            self.negative.add(key_of(-v), 1);
        } else {
            self.zeros = self.zeros.saturating_add(1);
        }
    }

    pub fn merge(&mut self, other: &QuantileSketch) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            self.clone_from(other);
            return;
        }
        // Saturating: only counts from a crafted checkpoint could get near 2^64.
        self.count = self.count.saturating_add(other.count);
        self.zeros = self.zeros.saturating_add(other.zeros);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.positive.merge(&other.positive);
        self.negative.merge(&other.negative);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Like DuckDB's quantile_cont: h = (n-1)*q, interpolate linearly between the values of rank
    /// floor(h) and ceil(h) (0-based ranks in sorted order). None when empty. q in [0,1] (callers
    /// check).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let last = self.count - 1;
        let h = last as f64 * q;
        let below = h.floor();
        let lo_rank = (below as u64).min(last);
        let hi_rank = (h.ceil() as u64).min(last);
        let lo = self.value_at(lo_rank);
        if hi_rank == lo_rank {
            return Some(lo);
        }
        let hi = self.value_at(hi_rank);
        // DuckDB's own form of the interpolation, so that equal neighbours give exactly them.
        Some(lo + (hi - lo) * (h - below))
    }

    /// The estimate of the value of 0-based `rank` (exact at both ends), within [min, max].
    fn value_at(&self, rank: u64) -> f64 {
        if rank == 0 {
            return self.min;
        }
        if rank >= self.count - 1 {
            return self.max;
        }
        let negatives = self.negative.total();
        let estimate = if rank < negatives {
            self.negative.key_descending(rank).map(|k| -bin_value(k))
        } else if rank - negatives < self.zeros {
            Some(0.0)
        } else {
            self.positive
                .key_ascending(rank - negatives - self.zeros)
                .map(bin_value)
        };
        // Clamping only moves an estimate towards the true value, which lies in [min, max].
        estimate.map_or(self.max, |e| e.max(self.min).min(self.max))
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        w.u8(FORMAT);
        w.u64(self.count);
        w.u64(self.zeros);
        w.f64(self.min);
        w.f64(self.max);
        self.positive.encode(w);
        self.negative.encode(w);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<QuantileSketch, CodecError> {
        if r.u8()? != FORMAT {
            return Err(CodecError("unknown quantile sketch format"));
        }
        let count = r.u64()?;
        let zeros = r.u64()?;
        let min = r.f64()?;
        let max = r.f64()?;
        let positive = Store::decode(r)?;
        let negative = Store::decode(r)?;
        let total = checked_sum(&positive.counts)
            .and_then(|p| checked_sum(&negative.counts).and_then(|n| p.checked_add(n)))
            .and_then(|t| t.checked_add(zeros));
        if total != Some(count) {
            return Err(CodecError("quantile sketch counts disagree"));
        }
        let consistent = if count == 0 {
            min.to_bits() == 0 && max.to_bits() == 0
        } else {
            // Each extreme must have gone where its sign sends it, and the others not past it.
            min.is_finite()
                && max.is_finite()
                && min <= max
                && positive.counts.is_empty() == (max < ZERO_THRESHOLD)
                && negative.counts.is_empty() == (min > -ZERO_THRESHOLD)
                && (zeros == 0 || (min < ZERO_THRESHOLD && max > -ZERO_THRESHOLD))
        };
        if !consistent {
            return Err(CodecError("bad quantile sketch"));
        }
        Ok(QuantileSketch {
            count,
            zeros,
            min,
            max,
            positive,
            negative,
        })
    }

    /// Approximate heap bytes held (for docs).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        (self.positive.counts.capacity() + self.negative.counts.capacity())
            * std::mem::size_of::<u64>()
    }
}

fn checked_sum(counts: &[u64]) -> Option<u64> {
    counts.iter().try_fold(0u64, |a, &c| a.checked_add(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic, no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        /// Uniform in [0, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    const QS: [f64; 10] = [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0];
    const NS: [usize; 5] = [1, 2, 10, 1000, 100_000];

    type Gen = fn(&mut Rng) -> f64;

    /// Distributions of one sign.
    const ONE_SIGN: [(&str, Gen); 8] = [
        ("uniform 0..1000", |r| r.unit() * 1000.0),
        ("heavy tail e^-5..e^15", |r| (r.unit() * 20.0 - 5.0).exp()),
        ("integers 1..=50", |r| (r.below(50) + 1) as f64),
        ("integers 0..=50 (zeros)", |r| r.below(51) as f64),
        ("latency 1ms..10s", |r| 10f64.powf(r.unit() * 4.0)),
        ("constant", |_| 42.125),
        ("negative uniform", |r| -r.unit() * 1000.0),
        ("negative heavy tail", |r| -(r.unit() * 30.0 - 10.0).exp()),
    ];

    const MIXED: [(&str, Gen); 3] = [
        ("uniform -1000..1000", |r| r.unit() * 2000.0 - 1000.0),
        ("mixed heavy tail", |r| {
            let m = (r.unit() * 20.0 - 5.0).exp();
            if r.below(3) == 0 {
                -m
            } else {
                m
            }
        }),
        ("mixed integers with zeros", |r| r.below(21) as f64 - 10.0),
    ];

    fn values(g: Gen, n: usize, seed: u64) -> Vec<f64> {
        let mut r = Rng(seed);
        (0..n).map(|_| g(&mut r)).collect()
    }

    fn sketch_of(vs: &[f64]) -> QuantileSketch {
        let mut s = QuantileSketch::default();
        for &v in vs {
            s.add(v);
        }
        s
    }

    fn sorted(vs: &[f64]) -> Vec<f64> {
        let mut s = vs.to_vec();
        s.sort_by(f64::total_cmp);
        s
    }

    /// DuckDB's quantile_cont on sorted values, with its neighbours.
    fn exact(sorted: &[f64], q: f64) -> (f64, f64, f64) {
        let h = (sorted.len() - 1) as f64 * q;
        let (lo, hi) = (sorted[h.floor() as usize], sorted[h.ceil() as usize]);
        let v = if h.floor() == h.ceil() {
            lo
        } else {
            lo + (hi - lo) * (h - h.floor())
        };
        (v, lo, hi)
    }

    #[test]
    fn the_constants_agree() {
        let gamma = (1.0 + ALPHA) / (1.0 - ALPHA);
        assert!((LN_GAMMA - gamma.ln()).abs() <= 1e-15 * LN_GAMMA);
        assert!(
            (LN_HALF_ONE_PLUS_GAMMA - ((1.0 + gamma) / 2.0).ln()).abs()
                <= 1e-15 * LN_HALF_ONE_PLUS_GAMMA
        );
        let span = (MAX_BINS as f64 * LN_GAMMA).exp();
        assert!(span > 1e16 && span < 1.1e16, "{span:e}");
        assert!(key_of(ZERO_THRESHOLD) > -KEY_LIMIT / 16 && key_of(f64::MAX) < KEY_LIMIT / 16);
    }

    #[test]
    fn every_bin_value_is_within_alpha_over_the_whole_range() {
        let mut r = Rng(1);
        let mut worst = 0f64;
        let mut check = |v: f64| {
            let e = bin_value(key_of(v)).min(f64::MAX);
            worst = worst.max((e - v).abs() / v);
        };
        for _ in 0..200_000 {
            check(10f64.powf(r.unit() * 608.0 - 300.0));
        }
        // Bin edges, where the rounding of ln may pick the neighbouring bin.
        for k in (-38_000..39_000).step_by(7) {
            let edge = (f64::from(k) * LN_GAMMA).exp();
            for v in [edge, edge.next_up(), edge.next_down()] {
                check(v);
            }
        }
        for v in [ZERO_THRESHOLD, 1.0, f64::MAX, f64::MIN_POSITIVE * 1e10] {
            check(v);
        }
        assert!(
            worst <= ALPHA * (1.0 + 1e-9),
            "worst relative error {worst}"
        );
        assert!(worst > ALPHA * 0.999, "the bound is reached: {worst}");
    }

    #[test]
    fn within_one_percent_of_quantile_cont_on_one_sign_data() {
        for (seed, (name, g)) in ONE_SIGN.iter().enumerate() {
            for n in NS {
                let vs = values(*g, n, 17 + seed as u64 * 1000 + n as u64);
                let s = sketch_of(&vs);
                assert_eq!(s.count(), n as u64);
                let sorted = sorted(&vs);
                for q in QS {
                    let (x, _, _) = exact(&sorted, q);
                    let est = s.quantile(q).unwrap();
                    let err = (est - x).abs();
                    assert!(
                        err <= RELATIVE_ERROR * x.abs() && err <= ALPHA * x.abs() * (1.0 + 1e-9),
                        "{name}, n = {n}, q = {q}: estimate {est}, exact {x}"
                    );
                    if q == 0.0 || q == 1.0 || n == 1 || *name == "constant" {
                        assert_eq!(est, x, "{name}, n = {n}, q = {q} is exact");
                    }
                }
            }
        }
    }

    #[test]
    fn mixed_sign_error_is_within_one_percent_of_the_larger_neighbour() {
        for (seed, (name, g)) in MIXED.iter().enumerate() {
            for n in NS {
                let vs = values(*g, n, 99 + seed as u64 * 1000 + n as u64);
                let s = sketch_of(&vs);
                let sorted = sorted(&vs);
                for q in QS {
                    let (x, lo, hi) = exact(&sorted, q);
                    let est = s.quantile(q).unwrap();
                    let bound = RELATIVE_ERROR * lo.abs().max(hi.abs());
                    assert!(
                        (est - x).abs() <= bound,
                        "{name}, n = {n}, q = {q}: estimate {est}, exact {x}"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_and_tiny_values() {
        let s = QuantileSketch::default();
        assert_eq!(s.count(), 0);
        assert_eq!(s.quantile(0.5), None);
        assert_eq!(s.heap_bytes(), 0);
        // Below the zero threshold values count as 0 (the extremes stay exact).
        let s = sketch_of(&[1e-310, -1e-305, 0.0, -0.0, 5e-301]);
        assert_eq!(s.quantile(0.5), Some(0.0));
        assert_eq!(s.quantile(0.0), Some(-1e-305));
        assert_eq!(s.quantile(1.0), Some(5e-301));
        assert_eq!(s.heap_bytes(), 0);
        // -0.0 and 0.0 give the same state and bytes.
        let (a, b) = (sketch_of(&[-0.0, 0.0]), sketch_of(&[0.0, -0.0]));
        assert_eq!(encoded(&a), encoded(&b));
    }

    /// Sketches of random splits (some empty), merged in several orders.
    fn merged_in_pieces(vs: &[f64], seed: u64) -> Vec<QuantileSketch> {
        let mut r = Rng(seed);
        let mut parts = Vec::new();
        let mut i = 0;
        while i < vs.len() {
            let len = (r.below(vs.len() as u64 / 4 + 2) as usize).min(vs.len() - i);
            parts.push(sketch_of(&vs[i..i + len]));
            i += len;
        }
        let mut forward = QuantileSketch::default();
        for p in &parts {
            forward.merge(p);
        }
        let mut backward = QuantileSketch::default();
        for p in parts.iter().rev() {
            backward.merge(p);
        }
        let mut tree = parts;
        while tree.len() > 1 {
            let mut next = Vec::new();
            for pair in tree.chunks(2) {
                let mut a = pair[0].clone();
                if let Some(b) = pair.get(1) {
                    a.merge(b);
                }
                next.push(a);
            }
            tree = next;
        }
        vec![forward, backward, tree.pop().unwrap_or_default()]
    }

    /// Values over e^-30..e^10 (a span of 2.4e17): the positive store must fold.
    fn wide(r: &mut Rng) -> f64 {
        (r.unit() * 40.0 - 30.0).exp()
    }

    #[test]
    fn merging_any_split_equals_one_sketch_of_everything() {
        let cases: Vec<(&str, Vec<f64>)> = ONE_SIGN
            .iter()
            .chain(MIXED.iter())
            .chain([("wide, folded", wide as Gen)].iter())
            .enumerate()
            .map(|(i, (name, g))| (*name, values(*g, 20_000, 500 + i as u64)))
            .collect();
        for (seed, (name, vs)) in cases.iter().enumerate() {
            let whole = sketch_of(vs);
            for (k, m) in merged_in_pieces(vs, seed as u64 + 1).iter().enumerate() {
                assert_eq!(m, &whole, "{name}, merge order {k}");
                for q in QS {
                    let (a, b) = (m.quantile(q).unwrap(), whole.quantile(q).unwrap());
                    assert_eq!(a.to_bits(), b.to_bits(), "{name}, q = {q}");
                }
            }
            // The order of adding does not matter either.
            let mut shuffled = vs.clone();
            let mut r = Rng(seed as u64 + 77);
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, r.below(i as u64 + 1) as usize);
            }
            assert_eq!(sketch_of(&shuffled), whole, "{name}, shuffled");
            let sorted = sorted(vs);
            assert_eq!(sketch_of(&sorted), whole, "{name}, ascending");
            let descending: Vec<f64> = sorted.iter().rev().copied().collect();
            assert_eq!(sketch_of(&descending), whole, "{name}, descending");
        }
    }

    #[test]
    fn folding_bounds_memory_and_keeps_the_bound_above_the_span() {
        let vs = values(wide, 100_000, 3);
        let s = sketch_of(&vs);
        assert_eq!(s.positive.counts.len(), MAX_BINS);
        assert!(s.heap_bytes() <= MAX_BINS * 8, "{}", s.heap_bytes());
        let sorted = sorted(&vs);
        let max = sorted[sorted.len() - 1];
        // The lowest bin holds what was folded; above it the bound holds.
        let unfolded = max * (-((MAX_BINS - 1) as f64) * LN_GAMMA).exp();
        let mut checked = 0;
        for q in QS {
            let (x, lo, _) = exact(&sorted, q);
            let est = s.quantile(q).unwrap();
            assert!(est >= sorted[0] && est <= max);
            if lo > unfolded {
                assert!(
                    (est - x).abs() <= RELATIVE_ERROR * x,
                    "q = {q}: {est} vs {x}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 8, "{checked}");
        assert_eq!(s.quantile(0.0), Some(sorted[0]));
        // The same on the negative side, both sides at most MAX_BINS.
        let neg: Vec<f64> = vs.iter().map(|v| -v).collect();
        let mut both = sketch_of(&neg);
        both.merge(&s);
        assert_eq!(both.negative.counts.len(), MAX_BINS);
        assert!(both.heap_bytes() <= 2 * MAX_BINS * 8);
        assert_eq!(both.quantile(0.0), Some(-max));
        assert_eq!(both.quantile(1.0), Some(max));
    }

    #[test]
    fn memory_for_a_latency_spread() {
        let vs = values(ONE_SIGN[4].1, 100_000, 5);
        let s = sketch_of(&vs);
        let bins = s.positive.counts.len();
        eprintln!(
            "1ms..10s: {bins} bins, {} heap bytes, {} checkpoint bytes",
            s.heap_bytes(),
            encoded(&s).len()
        );
        assert!((505..=514).contains(&bins), "{bins}");
        assert!(s.heap_bytes() <= 2 * bins * 8);
        assert_eq!(encoded(&s).len(), 33 + 16 + bins * 8 + 16);
    }

    fn encoded(s: &QuantileSketch) -> Vec<u8> {
        let mut buf = Vec::new();
        s.encode(&mut Writer(&mut buf));
        buf
    }

    fn decoded(b: &[u8]) -> Result<QuantileSketch, CodecError> {
        let mut r = Reader { b, i: 0 };
        let s = QuantileSketch::decode(&mut r)?;
        r.end()?;
        Ok(s)
    }

    fn samples() -> Vec<QuantileSketch> {
        vec![
            QuantileSketch::default(),
            sketch_of(&[3.5]),
            sketch_of(&values(MIXED[1].1, 5000, 8)),
            sketch_of(&values(MIXED[2].1, 300, 9)),
            sketch_of(&values(wide, 20_000, 10)),
        ]
    }

    #[test]
    fn checkpoint_form_round_trips() {
        for s in samples() {
            let buf = encoded(&s);
            let back = decoded(&buf).unwrap();
            assert_eq!(back, s);
            for q in QS {
                assert_eq!(back.quantile(q), s.quantile(q));
            }
            // The reader stops right after the sketch.
            let mut more = buf.clone();
            Writer(&mut more).u64(7);
            let mut r = Reader { b: &more, i: 0 };
            assert_eq!(QuantileSketch::decode(&mut r).unwrap(), s);
            assert_eq!(r.u64().unwrap(), 7);
        }
    }

    #[test]
    fn truncated_or_damaged_checkpoints_are_errors() {
        for s in samples() {
            let buf = encoded(&s);
            for len in 0..buf.len() {
                assert!(decoded(&buf[..len]).is_err(), "prefix of {len}");
            }
        }
        let good = encoded(&sketch_of(&[-2.0, 0.0, 1.0, 10.0]));
        let damaged = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            decoded(&b)
        };
        assert!(decoded(&good).is_ok());
        assert!(damaged(0, &[2]).is_err(), "format");
        assert!(damaged(1, &5u64.to_le_bytes()).is_err(), "count");
        assert!(damaged(9, &2u64.to_le_bytes()).is_err(), "zeros");
        assert!(
            damaged(17, &f64::NAN.to_bits().to_le_bytes()).is_err(),
            "min NaN"
        );
        assert!(
            damaged(17, &20f64.to_bits().to_le_bytes()).is_err(),
            "min > max"
        );
        assert!(
            damaged(17, &(-1e-301f64).to_bits().to_le_bytes()).is_err(),
            "min's sign"
        );
        assert!(
            damaged(25, &f64::INFINITY.to_bits().to_le_bytes()).is_err(),
            "max"
        );
        assert!(damaged(33, &(1i64 << 40).to_le_bytes()).is_err(), "offset");
        assert!(damaged(33, &(1i64 << 20).to_le_bytes()).is_err(), "top key");
        assert!(damaged(41, &u64::MAX.to_le_bytes()).is_err(), "bin count");
        // A count past the limit is refused before anything is read or allocated.
        let mut big = good[..33].to_vec();
        let mut w = Writer(&mut big);
        w.i64(0);
        w.u64(MAX_BINS as u64 + 1);
        for _ in 0..=MAX_BINS {
            w.u64(1);
        }
        w.i64(0);
        w.u64(0);
        assert_eq!(decoded(&big), Err(CodecError("quantile sketch too large")));
        // An untrimmed store (a zero last bin) is refused: equal contents must have one form.
        let s = sketch_of(&[1.0, 2.0]);
        let mut b = encoded(&s);
        let last_bin = 33 + 16 + (s.positive.counts.len() - 1) * 8;
        b[last_bin..last_bin + 8].copy_from_slice(&0u64.to_le_bytes());
        b[1..9].copy_from_slice(&1u64.to_le_bytes());
        assert!(decoded(&b).is_err());
        // Garbage, with and without a plausible first byte.
        let mut r = Rng(42);
        for i in 0..20_000 {
            let len = r.below(120) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            if i % 2 == 0 && !b.is_empty() {
                b[0] = FORMAT;
            }
            assert!(decoded(&b).is_err(), "garbage {b:?}");
        }
    }
}
