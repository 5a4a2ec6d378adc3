//! Aggregates: what a job computes per window (`count(*)`, `count(x)`, `sum`, `avg`, `min`,
//! `max`, `approx_count_distinct`, `first`, `last`), their partial states, how two partial
//! states of disjoint parts of a window combine (panes of hopping windows, sessions that meet),
//! and the checkpoint form of the states.

use crate::codec::{CodecError, Reader, Writer};
use crate::decode::FieldPath;
use crate::hll::Hll;
use crate::rows::{Cell, ColumnType};

/// An aggregate function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AggFunc {
    CountStar,
    Count,
    Sum,
    Avg,
    Min,
    Max,
    ApproxCountDistinct,
    First,
    Last,
}

impl AggFunc {
    fn by_name(name: &str) -> Option<AggFunc> {
        Some(match name.to_ascii_lowercase().as_str() {
            "count" => AggFunc::Count,
            "sum" => AggFunc::Sum,
            "avg" => AggFunc::Avg,
            "min" => AggFunc::Min,
            "max" => AggFunc::Max,
            "approx_count_distinct" => AggFunc::ApproxCountDistinct,
            "first" => AggFunc::First,
            "last" => AggFunc::Last,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            AggFunc::CountStar | AggFunc::Count => "count",
            AggFunc::Sum => "sum",
            AggFunc::Avg => "avg",
            AggFunc::Min => "min",
            AggFunc::Max => "max",
            AggFunc::ApproxCountDistinct => "approx_count_distinct",
            AggFunc::First => "first",
            AggFunc::Last => "last",
        }
    }

    pub(crate) fn output_type(self) -> ColumnType {
        match self {
            AggFunc::CountStar | AggFunc::Count | AggFunc::ApproxCountDistinct => {
                ColumnType::BigInt
            }
            AggFunc::Sum | AggFunc::Avg | AggFunc::Min | AggFunc::Max => ColumnType::Double,
            AggFunc::First | AggFunc::Last => ColumnType::Varchar,
        }
    }

    /// Whether the input must be a number (a value of another type makes a dead letter).
    pub(crate) fn numeric(self) -> bool {
        matches!(
            self,
            AggFunc::Sum | AggFunc::Avg | AggFunc::Min | AggFunc::Max
        )
    }
}

/// One aggregate of a job: a function, its input field (none for `count(*)`) and its column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggSpec {
    pub(crate) func: AggFunc,
    pub path: Option<FieldPath>,
    pub name: String,
}

/// Whether `s` is a plain SQL identifier (letters, digits, `_`; not starting with a digit).
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// Splits `expr AS alias` (case-insensitive `AS`); the alias may be an identifier or a
/// double-quoted name.
pub fn split_alias(text: &str) -> Result<(&str, Option<String>), String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let Some(at) = lower.rfind(" as ") else {
        return Ok((t, None));
    };
    let expr = t[..at].trim();
    let alias = t[at + 4..].trim();
    let alias = if let Some(q) = alias.strip_prefix('"').and_then(|a| a.strip_suffix('"')) {
        if q.is_empty() || q.contains('"') {
            return Err(format!("bad alias {alias}"));
        }
        q.to_string()
    } else if is_identifier(alias) {
        alias.to_string()
    } else {
        return Err(format!(
            "the alias '{alias}' must be a name (letters, digits, _) or in double quotes"
        ));
    };
    Ok((expr, Some(alias)))
}

impl AggSpec {
    /// Parses `func(path) [AS alias]`, e.g. `sum(amount) AS revenue`, `count(*)`,
    /// `approx_count_distinct(customer.id)`. The error says what is wrong.
    pub fn parse(text: &str) -> Result<AggSpec, String> {
        let (expr, alias) = split_alias(text)?;
        let open = expr
            .find('(')
            .ok_or_else(|| "expected function(field), e.g. sum(amount)".to_string())?;
        let inner = expr[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| "expected function(field), e.g. sum(amount)".to_string())?
            .trim();
        let fname = expr[..open].trim();
        let func = AggFunc::by_name(fname).ok_or_else(|| {
            format!("unknown aggregate function '{fname}' (known: count, sum, avg, min, max, approx_count_distinct, first, last)")
        })?;
        let (func, path) = if inner == "*" {
            if func != AggFunc::Count {
                return Err(format!(
                    "{}(*) is not an aggregate; only count(*)",
                    func.name()
                ));
            }
            (AggFunc::CountStar, None)
        } else {
            let path = FieldPath::parse(inner)
                .filter(|_| !inner.contains(char::is_whitespace))
                .ok_or_else(|| {
                    format!("'{inner}' is not a field name or dotted path such as payload.value")
                })?;
            (func, Some(path))
        };
        let name = alias.unwrap_or_else(|| match &path {
            None => "count".to_string(),
            Some(p) => format!("{}_{}", func.name(), p.last_segment()),
        });
        Ok(AggSpec { func, path, name })
    }

    /// The aggregates of a job that names none: count of every message, and the sum, minimum
    /// and maximum of `value` (SPEC section 5's columns).
    pub fn defaults(value: &FieldPath) -> Vec<AggSpec> {
        let named = |func, name: &str| AggSpec {
            func,
            path: Some(value.clone()),
            name: name.to_string(),
        };
        vec![
            AggSpec {
                func: AggFunc::CountStar,
                path: None,
                name: "count".into(),
            },
            named(AggFunc::Sum, "sum_value"),
            named(AggFunc::Min, "min_value"),
            named(AggFunc::Max, "max_value"),
        ]
    }

    /// The expression as the checkpoint's settings keep it.
    pub fn shown(&self) -> String {
        match &self.path {
            None => format!("count(*) AS {}", self.name),
            Some(p) => format!("{}({}) AS {}", self.func.name(), p.as_str(), self.name),
        }
    }
}

/// An event's input to one aggregate, already checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Input<'a> {
    /// The field is missing or null: the aggregate skips it (`count(*)` counts every event).
    Skip,
    Num(f64),
    /// The value's text (first/last) or its hash (approx_count_distinct).
    Text(&'a str),
    Hash(u64),
    /// Present (count(x)).
    Present,
}

/// A compensated (Neumaier) sum, so that sums do not depend, in practice, on the order events
/// arrived in: a run that was stopped and resumed gets the same sums as a straight one.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct SumState {
    pub n: i64,
    pub sum: f64,
    pub comp: f64,
}

impl SumState {
    #[inline]
    fn add(&mut self, v: f64) {
        self.n += 1;
        let t = self.sum + v;
        if t.is_finite() {
            if self.sum.abs() >= v.abs() {
                self.comp += (self.sum - t) + v;
            } else {
                self.comp += (v - t) + self.sum;
            }
        } else {
            self.comp = 0.0;
        }
        self.sum = t;
    }

    fn merge(&mut self, o: &SumState) {
        if o.n == 0 {
            return;
        }
        let n = self.n + o.n;
        self.add(o.sum);
        self.comp += o.comp;
        self.n = n;
    }

    fn value(&self) -> Option<f64> {
        (self.n > 0).then(|| {
            if self.sum.is_finite() {
                self.sum + self.comp
            } else {
                self.sum
            }
        })
    }
}

/// A text value with the event time it came with (first/last).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stamped {
    pub t: i64,
    pub text: String,
}

/// The partial state of one aggregate in one window (or pane, or session).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AggState {
    Count(i64),
    Sum(SumState),
    Avg(SumState),
    Min(Option<f64>),
    Max(Option<f64>),
    Distinct(Box<Hll>),
    First(Option<Box<Stamped>>),
    Last(Option<Box<Stamped>>),
}

impl AggState {
    pub fn new(func: AggFunc) -> AggState {
        match func {
            AggFunc::CountStar | AggFunc::Count => AggState::Count(0),
            AggFunc::Sum => AggState::Sum(SumState::default()),
            AggFunc::Avg => AggState::Avg(SumState::default()),
            AggFunc::Min => AggState::Min(None),
            AggFunc::Max => AggState::Max(None),
            AggFunc::ApproxCountDistinct => AggState::Distinct(Box::default()),
            AggFunc::First => AggState::First(None),
            AggFunc::Last => AggState::Last(None),
        }
    }

    /// Adds one event (at event time `t`). Events arrive in the order read; ties in event time
    /// keep the first read for `first` and the last read for `last`.
    #[inline]
    pub fn add(&mut self, t: i64, input: Input<'_>) {
        match (self, input) {
            (_, Input::Skip) => {}
            (AggState::Count(n), _) => *n += 1,
            (AggState::Sum(s) | AggState::Avg(s), Input::Num(v)) => s.add(v),
            (AggState::Min(m), Input::Num(v)) if m.is_none_or(|x| v < x) => *m = Some(v),
            (AggState::Max(m), Input::Num(v)) if m.is_none_or(|x| v > x) => *m = Some(v),
            (AggState::Distinct(h), Input::Hash(x)) => h.add_hash(x),
            (AggState::First(f), Input::Text(s)) if f.as_ref().is_none_or(|c| t < c.t) => {
                set_stamped(f, t, s)
            }
            (AggState::Last(l), Input::Text(s)) if l.as_ref().is_none_or(|c| t >= c.t) => {
                set_stamped(l, t, s)
            }
            _ => {}
        }
    }

    /// Combines the state of a later part of the same window (panes and sessions are disjoint
    /// in event time, so `other` holds no event before any of `self`'s).
    pub(crate) fn merge(&mut self, other: &AggState) {
        match (self, other) {
            (AggState::Count(a), AggState::Count(b)) => *a += b,
            (AggState::Sum(a), AggState::Sum(b)) | (AggState::Avg(a), AggState::Avg(b)) => {
                a.merge(b)
            }
            (AggState::Min(a), AggState::Min(Some(b))) if a.is_none_or(|x| *b < x) => *a = Some(*b),
            (AggState::Max(a), AggState::Max(Some(b))) if a.is_none_or(|x| *b > x) => *a = Some(*b),
            (AggState::Distinct(a), AggState::Distinct(b)) => a.merge(b),
            (AggState::First(a), AggState::First(Some(b)))
                if a.as_ref().is_none_or(|c| b.t < c.t) =>
            {
                *a = Some(b.clone())
            }
            (AggState::Last(a), AggState::Last(Some(b)))
                if a.as_ref().is_none_or(|c| b.t >= c.t) =>
            {
                *a = Some(b.clone())
            }
            _ => {}
        }
    }

    /// The aggregate's value for the output row (NULL where SQL's aggregate would be).
    pub(crate) fn cell(&self) -> Cell<'_> {
        match self {
            AggState::Count(n) => Cell::I64(*n),
            AggState::Sum(s) => s.value().map_or(Cell::Null, Cell::F64),
            AggState::Avg(s) => s
                .value()
                .map_or(Cell::Null, |sum| Cell::F64(sum / s.n as f64)),
            AggState::Min(m) | AggState::Max(m) => m.map_or(Cell::Null, Cell::F64),
            AggState::Distinct(h) => Cell::I64(h.estimate()),
            AggState::First(f) | AggState::Last(f) => {
                f.as_ref().map_or(Cell::Null, |s| Cell::Str(&s.text))
            }
        }
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        let sum = |w: &mut Writer<'_>, s: &SumState| {
            w.i64(s.n);
            w.f64(s.sum);
            w.f64(s.comp);
        };
        let opt = |w: &mut Writer<'_>, m: &Option<f64>| match m {
            Some(v) => {
                w.u8(1);
                w.f64(*v);
            }
            None => w.u8(0),
        };
        let stamped = |w: &mut Writer<'_>, s: &Option<Box<Stamped>>| match s {
            Some(s) => {
                w.u8(1);
                w.i64(s.t);
                w.bytes(s.text.as_bytes());
            }
            None => w.u8(0),
        };
        match self {
            AggState::Count(n) => {
                w.u8(1);
                w.i64(*n);
            }
            AggState::Sum(s) => {
                w.u8(2);
                sum(w, s);
            }
            AggState::Avg(s) => {
                w.u8(3);
                sum(w, s);
            }
            AggState::Min(m) => {
                w.u8(4);
                opt(w, m);
            }
            AggState::Max(m) => {
                w.u8(5);
                opt(w, m);
            }
            AggState::Distinct(h) => {
                w.u8(6);
                h.encode(w);
            }
            AggState::First(s) => {
                w.u8(7);
                stamped(w, s);
            }
            AggState::Last(s) => {
                w.u8(8);
                stamped(w, s);
            }
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<AggState, CodecError> {
        let sum = |r: &mut Reader<'_>| -> Result<SumState, CodecError> {
            Ok(SumState {
                n: r.i64()?,
                sum: r.f64()?,
                comp: r.f64()?,
            })
        };
        let opt = |r: &mut Reader<'_>| -> Result<Option<f64>, CodecError> {
            Ok(match r.u8()? {
                0 => None,
                _ => Some(r.f64()?),
            })
        };
        let stamped = |r: &mut Reader<'_>| -> Result<Option<Box<Stamped>>, CodecError> {
            Ok(match r.u8()? {
                0 => None,
                _ => Some(Box::new(Stamped {
                    t: r.i64()?,
                    text: r.string()?,
                })),
            })
        };
        Ok(match r.u8()? {
            1 => AggState::Count(r.i64()?),
            2 => AggState::Sum(sum(r)?),
            3 => AggState::Avg(sum(r)?),
            4 => AggState::Min(opt(r)?),
            5 => AggState::Max(opt(r)?),
            6 => AggState::Distinct(Box::new(Hll::decode(r)?)),
            7 => AggState::First(stamped(r)?),
            8 => AggState::Last(stamped(r)?),
            _ => return Err(CodecError("unknown aggregate state")),
        })
    }

    /// Whether this state belongs to `func` (a restored checkpoint must match the job).
    pub(crate) fn is_for(&self, func: AggFunc) -> bool {
        matches!(
            (self, func),
            (AggState::Count(_), AggFunc::CountStar | AggFunc::Count)
                | (AggState::Sum(_), AggFunc::Sum)
                | (AggState::Avg(_), AggFunc::Avg)
                | (AggState::Min(_), AggFunc::Min)
                | (AggState::Max(_), AggFunc::Max)
                | (AggState::Distinct(_), AggFunc::ApproxCountDistinct)
                | (AggState::First(_), AggFunc::First)
                | (AggState::Last(_), AggFunc::Last)
        )
    }
}

fn set_stamped(slot: &mut Option<Box<Stamped>>, t: i64, s: &str) {
    match slot {
        // Reuse the text's buffer: `last` changes on nearly every event.
        Some(b) => {
            b.t = t;
            b.text.clear();
            b.text.push_str(s);
        }
        None => {
            *slot = Some(Box::new(Stamped {
                t,
                text: s.to_string(),
            }))
        }
    }
}

/// The states of one window (one per aggregate of the job, in order).
pub(crate) type States = Box<[AggState]>;

pub(crate) fn new_states(aggs: &[AggSpec]) -> States {
    fresh_states(aggs).collect()
}

/// The empty state of each aggregate, in order.
pub(crate) fn fresh_states(aggs: &[AggSpec]) -> impl Iterator<Item = AggState> + '_ {
    aggs.iter().map(|a| AggState::new(a.func))
}

pub(crate) fn merge_states(into: &mut [AggState], from: &[AggState]) {
    for (a, b) in into.iter_mut().zip(from) {
        a.merge(b);
    }
}

pub(crate) fn encode_states(states: &[AggState], w: &mut Writer<'_>) {
    for s in states {
        s.encode(w);
    }
}

pub(crate) fn decode_states(aggs: &[AggSpec], r: &mut Reader<'_>) -> Result<States, CodecError> {
    aggs.iter()
        .map(|a| {
            let s = AggState::decode(r)?;
            if s.is_for(a.func) {
                Ok(s)
            } else {
                Err(CodecError(
                    "aggregate states do not match the job's aggregates",
                ))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_parse_with_default_names_and_aliases() {
        let p = |s: &str| AggSpec::parse(s).unwrap();
        assert_eq!(p("count(*)").name, "count");
        assert_eq!(p("COUNT(*) AS orders").name, "orders");
        assert_eq!(p("sum(amount) as revenue").func, AggFunc::Sum);
        assert_eq!(p("avg(amount)").name, "avg_amount");
        assert_eq!(
            p("approx_count_distinct(customer.id) AS customers").name,
            "customers"
        );
        assert_eq!(
            p("approx_count_distinct(customer.id)").name,
            "approx_count_distinct_id"
        );
        assert_eq!(p(" first( status ) ").name, "first_status");
        assert_eq!(p("count(coupon)").func, AggFunc::Count);
        assert_eq!(p("max(x) AS \"Max X\"").name, "Max X");
        let e = |s: &str| AggSpec::parse(s).unwrap_err();
        assert!(e("median(x)").starts_with("unknown aggregate function 'median'"));
        assert!(e("sum(*)").contains("only count(*)"));
        assert!(e("sum(a..b)").contains("not a field name"));
        assert!(e("sum x").contains("expected function(field)"));
        assert!(e("sum(x) AS 1bad").contains("must be a name"));
    }

    #[test]
    fn states_add_merge_and_finish_like_sql() {
        let mut a = AggState::new(AggFunc::Avg);
        assert_eq!(a.cell(), Cell::Null);
        a.add(0, Input::Num(1.0));
        a.add(0, Input::Skip);
        let mut b = AggState::new(AggFunc::Avg);
        b.add(5, Input::Num(4.0));
        a.merge(&b);
        assert_eq!(a.cell(), Cell::F64(2.5));

        let mut f = AggState::new(AggFunc::First);
        let mut l = AggState::new(AggFunc::Last);
        for (t, s) in [(5, "b"), (3, "a"), (3, "a2"), (9, "z"), (9, "z2"), (4, "x")] {
            f.add(t, Input::Text(s));
            l.add(t, Input::Text(s));
        }
        assert_eq!(
            f.cell(),
            Cell::Str("a"),
            "earliest time, first read on a tie"
        );
        assert_eq!(l.cell(), Cell::Str("z2"), "latest time, last read on a tie");

        let mut c = AggState::new(AggFunc::Count);
        c.add(0, Input::Present);
        c.add(0, Input::Skip);
        assert_eq!(c.cell(), Cell::I64(1));
    }

    #[test]
    fn every_state_round_trips_through_the_checkpoint_form() {
        let specs: Vec<AggSpec> = [
            "count(*)",
            "count(x)",
            "sum(x)",
            "avg(x)",
            "min(x)",
            "max(x)",
            "approx_count_distinct(x)",
            "first(x)",
            "last(x)",
        ]
        .iter()
        .map(|s| AggSpec::parse(s).unwrap())
        .collect();
        let mut states = new_states(&specs);
        for (i, s) in states.iter_mut().enumerate() {
            let input = match specs[i].func {
                AggFunc::ApproxCountDistinct => Input::Hash(42),
                AggFunc::First | AggFunc::Last => Input::Text("t"),
                AggFunc::Count | AggFunc::CountStar => Input::Present,
                _ => Input::Num(2.5),
            };
            s.add(7, input);
        }
        let mut buf = Vec::new();
        encode_states(&states, &mut Writer(&mut buf));
        let back = decode_states(&specs, &mut Reader { b: &buf, i: 0 }).unwrap();
        assert_eq!(back, states);
        let mut other = specs.clone();
        other.swap(0, 2);
        assert!(decode_states(&other, &mut Reader { b: &buf, i: 0 }).is_err());
    }
}
