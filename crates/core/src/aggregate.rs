//! Aggregates: what a job computes per window (`count(*)`, `count(x)`, `sum`, `avg`, `min`,
//! `max`, `approx_count_distinct`, `approx_quantile`, `first`, `last`, `arg_max`, `arg_min`, each
//! optionally with `FILTER (WHERE ...)`), their partial states, how two partial states of
//! disjoint parts of a window combine (panes of hopping windows, sessions that meet), and the
//! checkpoint form of the states. Any other aggregate expression over a job's typed columns is
//! DuckDB's to compute (`AggFunc::Duck`): the engine holds no state for it, only its place.

use crate::codec::{CodecError, Reader, Writer};
use crate::decode::FieldPath;
use crate::filter::Filter;
use crate::hll::Hll;
use crate::rows::{Cell, ColumnType, RowWriter};
use crate::sketch::QuantileSketch;

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
    ArgMax,
    ArgMin,
    ApproxQuantile,
    /// An expression DuckDB computes over the window's staged events (its text is in the spec).
    Duck,
}

/// The functions, by the name a user writes.
const NAMES: [(&str, AggFunc); 11] = [
    ("count", AggFunc::Count),
    ("sum", AggFunc::Sum),
    ("avg", AggFunc::Avg),
    ("min", AggFunc::Min),
    ("max", AggFunc::Max),
    ("approx_count_distinct", AggFunc::ApproxCountDistinct),
    ("approx_quantile", AggFunc::ApproxQuantile),
    ("first", AggFunc::First),
    ("last", AggFunc::Last),
    ("arg_max", AggFunc::ArgMax),
    ("arg_min", AggFunc::ArgMin),
];

/// The most quantiles one `approx_quantile` may ask for.
pub(crate) const MAX_QUANTILES: usize = 32;

impl AggFunc {
    fn by_name(name: &str) -> Option<AggFunc> {
        let lower = name.to_ascii_lowercase();
        NAMES.iter().find(|(n, _)| *n == lower).map(|&(_, f)| f)
    }

    pub fn name(self) -> &'static str {
        match self {
            AggFunc::CountStar => "count",
            AggFunc::Duck => "duckdb",
            f => NAMES
                .iter()
                .find(|(_, g)| *g == f)
                .map_or("count", |(n, _)| n),
        }
    }

    /// Whether the input must be a number (a value of another type makes a dead letter).
    pub(crate) fn numeric(self) -> bool {
        matches!(
            self,
            AggFunc::Sum | AggFunc::Avg | AggFunc::Min | AggFunc::Max | AggFunc::ApproxQuantile
        )
    }
}

/// One aggregate of a job: a function, its input field (none for `count(*)`), its other
/// arguments, its filter and its column.
#[derive(Debug, Clone, PartialEq)]
pub struct AggSpec {
    pub(crate) func: AggFunc,
    pub path: Option<FieldPath>,
    /// `arg_max(x, y)` / `arg_min(x, y)`: y, the field whose largest or smallest value picks x.
    pub(crate) by: Option<FieldPath>,
    /// `approx_quantile`: the quantiles asked for, and whether as a list (a `DOUBLE[]` column).
    pub(crate) quantiles: Box<[f64]>,
    pub(crate) list: bool,
    /// `FILTER (WHERE ...)`: only events that pass count in this aggregate.
    pub(crate) filter: Option<Filter>,
    pub name: String,
    /// An aggregate DuckDB computes: its expression and the type DuckDB's binder gave it.
    pub duck: Option<DuckAgg>,
}

/// An aggregate expression of DuckDB's over a job's typed columns (`median(amount)`,
/// `count(DISTINCT customer)`, `sum(price * qty) FILTER (WHERE ...)`, a macro, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuckAgg {
    /// The expression as the user wrote it (without its `AS` name).
    pub expr: String,
    /// Its result type, as DuckDB prints it (empty until DuckDB has bound it).
    pub sql_type: String,
}

// The floats an AggSpec holds are finite (parsing refuses others), so equality is total.
impl Eq for AggSpec {}

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
    // `... FILTER (WHERE s = 'a as b')`: a closing parenthesis ends an expression without alias.
    if t.ends_with(')') {
        return Ok((t, None));
    }
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

/// The index just past the parenthesis that closes the one at `open` (brackets nest inside;
/// quoted text is skipped).
fn closing(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quoted = false;
    for (i, c) in text.char_indices().skip_while(|&(i, _)| i < open) {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits a function's arguments at the commas outside brackets.
fn arguments(inner: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(inner[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(inner[from..].trim());
    out
}

fn field(arg: &str) -> Result<FieldPath, String> {
    FieldPath::parse(arg)
        .filter(|_| !arg.contains(char::is_whitespace))
        .ok_or_else(|| format!("'{arg}' is not a field name or dotted path such as payload.value"))
}

/// A quantile: a number from 0 to 1.
fn quantile(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(q) if (0.0..=1.0).contains(&q) => Ok(q),
        _ => Err(format!(
            "the quantile '{}' must be a number from 0 to 1",
            text.trim()
        )),
    }
}

/// The `FILTER (WHERE ...)` that may follow a call (`rest`: the text after its parenthesis).
fn filter_clause(rest: &str) -> Result<Option<Filter>, String> {
    let rest = rest.trim();
    if rest.is_empty() {
        return Ok(None);
    }
    let bad = || format!("expected FILTER (WHERE condition) after the call, found '{rest}'");
    let lower = rest.to_ascii_lowercase();
    let after = lower.strip_prefix("filter").ok_or_else(bad)?;
    let at = rest.len() - after.len();
    let clause = rest[at..].trim();
    let inner = clause
        .strip_prefix('(')
        .and_then(|c| c.strip_suffix(')'))
        .ok_or_else(bad)?
        .trim();
    let cond = inner
        .get(..5)
        .filter(|w| w.eq_ignore_ascii_case("where"))
        .map(|_| &inner[5..])
        .filter(|c| c.starts_with(|ch: char| ch.is_whitespace() || ch == '('))
        .ok_or_else(|| format!("FILTER needs WHERE: FILTER (WHERE condition), found '{clause}'"))?;
    Filter::parse(cond.trim())
        .map(Some)
        .map_err(|why| format!("bad FILTER condition '{}': {why}", cond.trim()))
}

impl AggSpec {
    fn plain(func: AggFunc, path: Option<FieldPath>, name: &str) -> AggSpec {
        AggSpec {
            func,
            path,
            by: None,
            quantiles: Box::new([]),
            list: false,
            filter: None,
            name: name.to_string(),
            duck: None,
        }
    }

    /// An aggregate DuckDB computes: `expr` named `name` (its type is set once DuckDB bound it).
    pub fn duckdb(expr: &str, name: &str) -> AggSpec {
        let mut spec = AggSpec::plain(AggFunc::Duck, None, name);
        spec.duck = Some(DuckAgg {
            expr: expr.trim().to_string(),
            sql_type: String::new(),
        });
        spec
    }

    /// Whether DuckDB computes this aggregate.
    pub fn is_duckdb(&self) -> bool {
        self.func == AggFunc::Duck
    }

    /// The names an aggregate of the engine reads (its input, arg_max's y, its filter's
    /// fields), as written.
    pub fn paths(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .path
            .iter()
            .chain(&self.by)
            .map(|p| p.as_str().to_string())
            .collect();
        if let Some(f) = &self.filter {
            out.extend(f.paths().iter().map(|p| p.as_str().to_string()));
        }
        out
    }

    /// Parses `func(args) [FILTER (WHERE condition)] [AS alias]`, e.g. `sum(amount) AS revenue`,
    /// `count(*) FILTER (WHERE status >= 500) AS errors`, `approx_quantile(ms, [0.5, 0.99])`,
    /// `arg_max(bidder, price)`. The error says what is wrong.
    pub fn parse(text: &str) -> Result<AggSpec, String> {
        let (expr, alias) = split_alias(text)?;
        let expected = || "expected function(field), e.g. sum(amount)".to_string();
        let open = expr.find('(').ok_or_else(expected)?;
        let close = closing(expr, open).ok_or_else(expected)?;
        let inner = expr[open + 1..close - 1].trim();
        let filter = filter_clause(&expr[close..])?;
        let fname = expr[..open].trim();
        let func = AggFunc::by_name(fname).ok_or_else(|| {
            let known: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
            format!(
                "unknown aggregate function '{fname}' (known: {})",
                known.join(", ")
            )
        })?;
        let args = arguments(inner);
        let wanted = match func {
            AggFunc::ArgMax | AggFunc::ArgMin => "two arguments, e.g. arg_max(bidder, price)",
            AggFunc::ApproxQuantile => {
                "two arguments, e.g. approx_quantile(latency_ms, 0.99) or approx_quantile(latency_ms, [0.5, 0.99])"
            }
            _ => "one argument",
        };
        let two = matches!(
            func,
            AggFunc::ArgMax | AggFunc::ArgMin | AggFunc::ApproxQuantile
        );
        if args.len() != if two { 2 } else { 1 } {
            return Err(format!("{}() takes {wanted}", func.name()));
        }
        let mut spec = if inner == "*" {
            if func != AggFunc::Count {
                return Err(format!(
                    "{}(*) is not an aggregate; only count(*)",
                    func.name()
                ));
            }
            AggSpec::plain(AggFunc::CountStar, None, "count")
        } else {
            let path = field(args[0])?;
            let name = format!("{}_{}", func.name(), path.last_segment());
            AggSpec::plain(func, Some(path), &name)
        };
        match func {
            AggFunc::ArgMax | AggFunc::ArgMin => spec.by = Some(field(args[1])?),
            AggFunc::ApproxQuantile => {
                let q = args[1];
                if let Some(items) = q.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                    let qs = items
                        .split(',')
                        .map(quantile)
                        .collect::<Result<Vec<f64>, String>>()?;
                    if qs.len() > MAX_QUANTILES {
                        return Err(format!("at most {MAX_QUANTILES} quantiles"));
                    }
                    spec.quantiles = qs.into();
                    spec.list = true;
                } else {
                    spec.quantiles = Box::new([quantile(q)?]);
                }
            }
            _ => {}
        }
        spec.filter = filter;
        if let Some(a) = alias {
            spec.name = a;
        }
        Ok(spec)
    }

    /// The aggregates of a job that names none: count of every message, and the sum, minimum
    /// and maximum of `value` (SPEC section 5's columns).
    pub fn defaults(value: &FieldPath) -> Vec<AggSpec> {
        let named = |func, name: &str| AggSpec::plain(func, Some(value.clone()), name);
        vec![
            AggSpec::plain(AggFunc::CountStar, None, "count"),
            named(AggFunc::Sum, "sum_value"),
            named(AggFunc::Min, "min_value"),
            named(AggFunc::Max, "max_value"),
        ]
    }

    /// The column's type.
    pub(crate) fn output_type(&self) -> ColumnType {
        match self.func {
            AggFunc::CountStar | AggFunc::Count | AggFunc::ApproxCountDistinct => {
                ColumnType::BigInt
            }
            AggFunc::ApproxQuantile if self.list => ColumnType::DoubleList,
            AggFunc::Sum | AggFunc::Avg | AggFunc::Min | AggFunc::Max | AggFunc::ApproxQuantile => {
                ColumnType::Double
            }
            // (DuckDB's aggregates: NULL in the rows, the table's column has its own type.)
            AggFunc::First | AggFunc::Last | AggFunc::ArgMax | AggFunc::ArgMin | AggFunc::Duck => {
                ColumnType::Varchar
            }
        }
    }

    /// The expression as the checkpoint's settings keep it.
    pub fn shown(&self) -> String {
        if let Some(d) = &self.duck {
            return format!("{} AS {}", d.expr, self.name);
        }
        let args = match (&self.path, self.func) {
            (None, _) => "*".to_string(),
            (Some(p), AggFunc::ArgMax | AggFunc::ArgMin) => format!(
                "{}, {}",
                p.as_str(),
                self.by.as_ref().map_or("", |b| b.as_str())
            ),
            (Some(p), AggFunc::ApproxQuantile) => {
                let qs: Vec<String> = self.quantiles.iter().map(|q| q.to_string()).collect();
                if self.list {
                    format!("{}, [{}]", p.as_str(), qs.join(", "))
                } else {
                    format!("{}, {}", p.as_str(), qs.join(", "))
                }
            }
            (Some(p), _) => p.as_str().to_string(),
        };
        let filter = self
            .filter
            .as_ref()
            .map_or(String::new(), |f| format!(" FILTER (WHERE {})", f.shown()));
        format!("{}({args}){filter} AS {}", self.func.name(), self.name)
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
    /// arg_max/arg_min: the value of y and the text of x.
    Arg(f64, &'a str),
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

/// The x of arg_max/arg_min with the y that picked it. Ties in y keep the value held: the first
/// read within a pane or session, and where parts of a window merge (hopping panes, sessions that
/// meet), the earlier part's in event time, so the result does not depend on how a run was cut.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ArgBest {
    pub by: f64,
    pub text: String,
}

/// Whether `by` beats the held best for arg_max (`max`) or arg_min.
#[inline]
fn beats(held: Option<&ArgBest>, by: f64, max: bool) -> bool {
    held.is_none_or(|b| if max { by > b.by } else { by < b.by })
}

fn set_best(slot: &mut Option<Box<ArgBest>>, by: f64, text: &str) {
    match slot {
        Some(b) => {
            b.by = by;
            b.text.clear();
            b.text.push_str(text);
        }
        None => {
            *slot = Some(Box::new(ArgBest {
                by,
                text: text.to_string(),
            }))
        }
    }
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
    ArgMax(Option<Box<ArgBest>>),
    ArgMin(Option<Box<ArgBest>>),
    Quantile(Box<QuantileSketch>),
    /// DuckDB computes it: nothing kept here.
    Duck,
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
            AggFunc::ArgMax => AggState::ArgMax(None),
            AggFunc::ArgMin => AggState::ArgMin(None),
            AggFunc::ApproxQuantile => AggState::Quantile(Box::default()),
            AggFunc::Duck => AggState::Duck,
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
            (AggState::ArgMax(b), Input::Arg(by, x)) if beats(b.as_deref(), by, true) => {
                set_best(b, by, x)
            }
            (AggState::ArgMin(b), Input::Arg(by, x)) if beats(b.as_deref(), by, false) => {
                set_best(b, by, x)
            }
            (AggState::Quantile(q), Input::Num(v)) => q.add(v),
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
            (AggState::ArgMax(a), AggState::ArgMax(Some(b))) if beats(a.as_deref(), b.by, true) => {
                *a = Some(b.clone())
            }
            (AggState::ArgMin(a), AggState::ArgMin(Some(b)))
                if beats(a.as_deref(), b.by, false) =>
            {
                *a = Some(b.clone())
            }
            (AggState::Quantile(a), AggState::Quantile(b)) => a.merge(b),
            _ => {}
        }
    }

    /// Writes the aggregate's value into the output row (NULL where SQL's aggregate would be).
    pub(crate) fn write(&self, spec: &AggSpec, row: &mut RowWriter<'_>) {
        match self {
            AggState::Quantile(q) if spec.list => {
                if q.count() == 0 {
                    row.cell(Cell::Null);
                    return;
                }
                let mut text = String::with_capacity(2 + 24 * spec.quantiles.len());
                text.push('[');
                for (i, &p) in spec.quantiles.iter().enumerate() {
                    if i > 0 {
                        text.push_str(", ");
                    }
                    let v = q.quantile(p).unwrap_or(f64::NAN);
                    text.push_str(&v.to_string());
                }
                text.push(']');
                row.str(&text);
            }
            AggState::Quantile(q) => {
                let p = spec.quantiles.first().copied().unwrap_or(0.5);
                row.cell(q.quantile(p).map_or(Cell::Null, Cell::F64));
            }
            _ => {
                row.cell(self.cell());
            }
        }
    }

    /// The aggregate's value for the output row (NULL where SQL's aggregate would be); a
    /// quantile's needs its spec ([`AggState::write`]).
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
            AggState::ArgMax(b) | AggState::ArgMin(b) => {
                b.as_ref().map_or(Cell::Null, |s| Cell::Str(&s.text))
            }
            AggState::Quantile(q) => q.quantile(0.5).map_or(Cell::Null, Cell::F64),
            AggState::Duck => Cell::Null,
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
        let best = |w: &mut Writer<'_>, s: &Option<Box<ArgBest>>| match s {
            Some(s) => {
                w.u8(1);
                w.f64(s.by);
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
            AggState::ArgMax(b) => {
                w.u8(9);
                best(w, b);
            }
            AggState::ArgMin(b) => {
                w.u8(10);
                best(w, b);
            }
            AggState::Quantile(q) => {
                w.u8(11);
                q.encode(w);
            }
            AggState::Duck => w.u8(12),
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
        let best = |r: &mut Reader<'_>| -> Result<Option<Box<ArgBest>>, CodecError> {
            Ok(match r.u8()? {
                0 => None,
                _ => Some(Box::new(ArgBest {
                    by: r.f64()?,
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
            9 => AggState::ArgMax(best(r)?),
            10 => AggState::ArgMin(best(r)?),
            11 => AggState::Quantile(Box::new(QuantileSketch::decode(r)?)),
            12 => AggState::Duck,
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
                | (AggState::ArgMax(_), AggFunc::ArgMax)
                | (AggState::ArgMin(_), AggFunc::ArgMin)
                | (AggState::Quantile(_), AggFunc::ApproxQuantile)
                | (AggState::Duck, AggFunc::Duck)
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
            "arg_max(x, y)",
            "arg_min(x, y)",
            "approx_quantile(x, [0.5, 0.9])",
        ]
        .iter()
        .map(|s| AggSpec::parse(s).unwrap())
        .collect();
        let mut states = new_states(&specs);
        for (i, s) in states.iter_mut().enumerate() {
            let input = match specs[i].func {
                AggFunc::ApproxCountDistinct => Input::Hash(42),
                AggFunc::First | AggFunc::Last => Input::Text("t"),
                AggFunc::ArgMax | AggFunc::ArgMin => Input::Arg(3.0, "t"),
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

    #[test]
    fn quantiles_arg_max_and_filters_parse_and_show_canonically() {
        let p = |s: &str| AggSpec::parse(s).unwrap();
        let q = p("approx_quantile(latency_ms, 0.99) AS p99");
        assert_eq!(
            (q.output_type(), &q.quantiles[..]),
            (ColumnType::Double, &[0.99][..])
        );
        let qs = p("APPROX_QUANTILE( ms , [0.5,0.9, 1] )");
        assert_eq!(qs.output_type(), ColumnType::DoubleList);
        assert_eq!(
            qs.shown(),
            "approx_quantile(ms, [0.5, 0.9, 1]) AS approx_quantile_ms"
        );
        let a = p("arg_max(bidder.name, price) AS top");
        assert_eq!(a.shown(), "arg_max(bidder.name, price) AS top");
        let f = p("count(*) filter ( where status >= 500 and (region = 'a as b' or x is null) ) AS errors");
        assert_eq!(f.name, "errors");
        assert_eq!(
            f.shown(),
            "count(*) FILTER (WHERE status >= 500 AND (region = 'a as b' OR x IS NULL)) AS errors"
        );
        assert_eq!(
            p(&f.shown()),
            f,
            "the shown form parses back to the same aggregate"
        );
        assert_eq!(p("sum(x) FILTER (WHERE ok = true)").name, "sum_x");
        let e = |s: &str| AggSpec::parse(s).unwrap_err();
        assert!(e("approx_quantile(x, 1.5)").contains("'1.5' must be a number from 0 to 1"));
        assert!(e("approx_quantile(x)").contains("takes two arguments"));
        assert!(e("arg_max(x)").contains("takes two arguments"));
        assert!(e("sum(x, y)").contains("takes one argument"));
        assert!(e("count(*) FILTER (x > 1)").contains("FILTER needs WHERE"));
        assert!(e("count(*) WHERE x > 1").contains("expected FILTER (WHERE condition)"));
        assert!(e("count(*) FILTER (WHERE x >> 1)").starts_with("bad FILTER condition 'x >> 1'"));
    }

    #[test]
    fn arg_max_keeps_the_first_read_of_equal_values_and_the_earlier_part_on_a_merge() {
        let mut a = AggState::new(AggFunc::ArgMax);
        let mut b = AggState::new(AggFunc::ArgMax);
        a.add(5, Input::Arg(2.0, "first"));
        a.add(4, Input::Arg(2.0, "read second, earlier event time"));
        a.add(3, Input::Arg(1.0, "smaller"));
        b.add(9, Input::Arg(2.0, "later pane, same value"));
        a.merge(&b);
        assert_eq!(a.cell(), Cell::Str("first"));
        let mut m = AggState::new(AggFunc::ArgMin);
        m.add(1, Input::Arg(-1.0, "lo"));
        m.add(2, Input::Arg(7.0, "hi"));
        m.add(0, Input::Skip);
        assert_eq!(m.cell(), Cell::Str("lo"));
    }
}
