//! The condition of an aggregate's `FILTER (WHERE ...)` clause: comparisons of a field (a dotted
//! path) with a literal (number, single-quoted string, boolean), `IS [NOT] NULL`, combined with
//! `AND`, `OR` and parentheses. Parsed once per job; evaluated per event without allocating.
//!
//! What `passes` means, in SQL's three-valued logic (only TRUE passes):
//! - a missing or null field makes a comparison unknown; `IS NULL` is true for missing or null;
//! - a field of another type than the literal makes the comparison unknown, never a dead
//!   letter: a number literal needs a number (or, with `numeric_strings`, a string holding a
//!   decimal number as JSON writes one), a string literal a string (compared bytewise, as
//!   DuckDB compares VARCHAR), a boolean literal a boolean (`false < true`);
//! - `AND` and `OR` are Kleene's: FALSE AND unknown is FALSE, TRUE OR unknown is TRUE.

use std::cmp::Ordering;

use crate::decode::{json_number, parse_f64, Field, FieldPath, Fields, Kind, MAX_PATHS};

/// Parentheses nest at most this deep: the parser, the evaluator and `shown` recurse once per
/// level, and a hostile condition must not exhaust the stack.
const MAX_NESTING: usize = 64;

/// Errors show at most this many characters of the condition before the problem.
const CONTEXT_CHARS: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn by_text(s: &str) -> Option<Op> {
        Some(match s {
            "=" => Op::Eq,
            "<>" | "!=" => Op::Ne,
            "<" => Op::Lt,
            "<=" => Op::Le,
            ">" => Op::Gt,
            ">=" => Op::Ge,
            _ => return None,
        })
    }

    /// The operator that means the same with its operands swapped (`500 <= x` is `x >= 500`).
    fn flipped(self) -> Op {
        match self {
            Op::Lt => Op::Gt,
            Op::Le => Op::Ge,
            Op::Gt => Op::Lt,
            Op::Ge => Op::Le,
            same => same,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "<>",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }

    /// Whether `field <op> literal` holds, given how the field compares with the literal.
    #[inline]
    fn holds(self, o: Ordering) -> bool {
        match self {
            Op::Eq => o == Ordering::Equal,
            Op::Ne => o != Ordering::Equal,
            Op::Lt => o == Ordering::Less,
            Op::Le => o != Ordering::Greater,
            Op::Gt => o == Ordering::Greater,
            Op::Ge => o != Ordering::Less,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Lit {
    /// Always finite (an infinite literal is refused when parsing).
    Num(f64),
    Str(Box<[u8]>),
    Bool(bool),
}

/// One node of the flat tree. `path` indexes `Filter::paths`; `And`/`Or` name a run of
/// `Filter::kids`. Children of an `And` are never `And` (nor of an `Or` an `Or`): nested ones are
/// spliced in while parsing, so that one condition has one tree however it is parenthesised.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Cmp { path: usize, op: Op, lit: Lit },
    IsNull { path: usize, negated: bool },
    And { start: usize, len: usize },
    Or { start: usize, len: usize },
}

/// A parsed `FILTER (WHERE ...)` condition.
///
/// Nodes are stored children first, so the root is the last node; the tree is laid out from
/// its structure alone, which makes the derived equality structural.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filter {
    nodes: Vec<Node>,
    kids: Vec<usize>,
    paths: Vec<FieldPath>,
    /// Each path's index among the decoded fields; until `bind`, its place in `paths` (so a
    /// decoder built from `paths()` works unbound).
    slots: Vec<usize>,
}

impl Filter {
    /// Parses a condition. The error says what is wrong and where; the caller prefixes it
    /// with the aggregate expression.
    pub fn parse(text: &str) -> Result<Filter, String> {
        if text.trim().is_empty() {
            return Err("empty condition".to_string());
        }
        let toks = lex(text)?;
        let mut p = Parser {
            text,
            toks,
            pos: 0,
            paths: Vec::new(),
        };
        let expr = p.or(0)?;
        if let Some(t) = p.toks.get(p.pos) {
            return Err(if t.kind == T::Close {
                format!("unbalanced parentheses {}", at(text, t.end))
            } else {
                format!("expected AND or OR {}", at(text, t.end))
            });
        }
        let mut f = Filter {
            nodes: Vec::new(),
            kids: Vec::new(),
            slots: (0..p.paths.len()).collect(),
            paths: p.paths,
        };
        f.lower(expr);
        Ok(f)
    }

    /// Every field path the condition reads (each once, in order of first appearance).
    pub fn paths(&self) -> Vec<FieldPath> {
        self.paths.clone()
    }

    /// Resolves each path to its index among the job's decoded fields.
    pub fn bind(&mut self, index: &mut dyn FnMut(&FieldPath) -> usize) {
        for (slot, path) in self.slots.iter_mut().zip(&self.paths) {
            *slot = index(path);
        }
    }

    /// Whether the condition is TRUE for this message (unknown does not pass).
    #[inline]
    pub fn passes(&self, f: &Fields<'_>, numeric_strings: bool) -> bool {
        self.value(f, numeric_strings) == Some(true)
    }

    /// The condition's three-valued value (`None` is unknown).
    fn value(&self, f: &Fields<'_>, numeric_strings: bool) -> Option<bool> {
        let root = self.nodes.len().checked_sub(1)?;
        self.eval(root, f, numeric_strings)
    }

    /// The condition in one canonical form: keywords upper case, single spaces, strings
    /// re-quoted, numbers as f64 Display writes them, parentheses only around an OR inside an
    /// AND. Parsing it gives back an equal filter.
    pub fn shown(&self) -> String {
        let mut out = String::new();
        if let Some(root) = self.nodes.len().checked_sub(1) {
            self.show(root, &mut out);
        }
        out
    }

    fn kids_of(&self, start: usize, len: usize) -> &[usize] {
        self.kids
            .get(start..start.saturating_add(len))
            .unwrap_or(&[])
    }

    /// The field of path `path`; `None` when it is not among the decoded ones (a `bind` that
    /// gave an index the decoder cannot have), which reads as missing.
    #[inline]
    fn field<'a>(&self, f: &Fields<'a>, path: usize) -> Option<Field<'a>> {
        let slot = *self.slots.get(path)?;
        // Fields::get shifts a 64-bit mask by the index.
        (slot < MAX_PATHS).then(|| f.get(slot))
    }

    fn eval(&self, i: usize, f: &Fields<'_>, numeric_strings: bool) -> Option<bool> {
        match self.nodes.get(i)? {
            Node::Cmp { path, op, lit } => {
                compare(self.field(f, *path)?, *op, lit, numeric_strings)
            }
            Node::IsNull { path, negated } => {
                let null = self
                    .field(f, *path)
                    .is_none_or(|v| matches!(v.kind, Kind::Missing | Kind::Null));
                Some(null != *negated)
            }
            Node::And { start, len } => {
                let mut unknown = false;
                for &k in self.kids_of(*start, *len) {
                    match self.eval(k, f, numeric_strings) {
                        Some(false) => return Some(false),
                        None => unknown = true,
                        Some(true) => {}
                    }
                }
                (!unknown).then_some(true)
            }
            Node::Or { start, len } => {
                let mut unknown = false;
                for &k in self.kids_of(*start, *len) {
                    match self.eval(k, f, numeric_strings) {
                        Some(true) => return Some(true),
                        None => unknown = true,
                        Some(false) => {}
                    }
                }
                (!unknown).then_some(false)
            }
        }
    }

    fn show(&self, i: usize, out: &mut String) {
        let path = |p: usize| self.paths.get(p).map_or("", FieldPath::as_str);
        match self.nodes.get(i) {
            None => {}
            Some(Node::Cmp { path: p, op, lit }) => {
                out.push_str(path(*p));
                out.push(' ');
                out.push_str(op.text());
                out.push(' ');
                match lit {
                    Lit::Num(x) => out.push_str(&x.to_string()),
                    Lit::Str(s) => {
                        out.push('\'');
                        out.push_str(&String::from_utf8_lossy(s).replace('\'', "''"));
                        out.push('\'');
                    }
                    Lit::Bool(b) => out.push_str(if *b { "TRUE" } else { "FALSE" }),
                }
            }
            Some(Node::IsNull { path: p, negated }) => {
                out.push_str(path(*p));
                out.push_str(if *negated { " IS NOT NULL" } else { " IS NULL" });
            }
            Some(Node::And { start, len }) => {
                for (n, &k) in self.kids_of(*start, *len).iter().enumerate() {
                    if n > 0 {
                        out.push_str(" AND ");
                    }
                    let or = matches!(self.nodes.get(k), Some(Node::Or { .. }));
                    if or {
                        out.push('(');
                    }
                    self.show(k, out);
                    if or {
                        out.push(')');
                    }
                }
            }
            Some(Node::Or { start, len }) => {
                for (n, &k) in self.kids_of(*start, *len).iter().enumerate() {
                    if n > 0 {
                        out.push_str(" OR ");
                    }
                    self.show(k, out);
                }
            }
        }
    }

    /// Appends `e` children first; returns its node's index.
    fn lower(&mut self, e: Expr) -> usize {
        let node = match e {
            Expr::Leaf(n) => n,
            Expr::And(items) => {
                let (start, len) = self.lower_all(items);
                Node::And { start, len }
            }
            Expr::Or(items) => {
                let (start, len) = self.lower_all(items);
                Node::Or { start, len }
            }
        };
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn lower_all(&mut self, items: Vec<Expr>) -> (usize, usize) {
        let ids: Vec<usize> = items.into_iter().map(|e| self.lower(e)).collect();
        let start = self.kids.len();
        self.kids.extend_from_slice(&ids);
        (start, ids.len())
    }
}

/// `field <op> lit`, or `None` when unknown (the field is missing, null or of another type).
#[inline]
fn compare(v: Field<'_>, op: Op, lit: &Lit, numeric_strings: bool) -> Option<bool> {
    let order = match lit {
        Lit::Num(x) => {
            let n = match v.kind {
                Kind::Number => match v.number {
                    Some(n) => n,
                    None => parse_f64(v.bytes)?,
                },
                Kind::String if numeric_strings && json_number(v.bytes) => parse_f64(v.bytes)?,
                _ => return None,
            };
            // A NaN field (a binary format's float) compares with nothing.
            n.partial_cmp(x)?
        }
        Lit::Str(s) => match v.kind {
            Kind::String => v.bytes.cmp(s),
            _ => return None,
        },
        Lit::Bool(b) => match (v.kind, v.bytes) {
            (Kind::Bool, b"true") => true.cmp(b),
            (Kind::Bool, b"false") => false.cmp(b),
            _ => return None,
        },
    };
    Some(op.holds(order))
}

/// "at '<the condition up to the end of the problem>'", shortened from the left when long.
fn at(text: &str, end: usize) -> String {
    let before = text.get(..end).unwrap_or(text);
    if before.is_empty() {
        return "at the start".to_string();
    }
    let n = before.chars().count();
    if n <= CONTEXT_CHARS {
        return format!("at '{before}'");
    }
    let tail: String = before.chars().skip(n - CONTEXT_CHARS).collect();
    format!("at '…{tail}'")
}

#[derive(Debug, Clone, PartialEq)]
enum T {
    Open,
    Close,
    Op(Op),
    Num(f64),
    Str(Box<[u8]>),
    And,
    Or,
    Not,
    Is,
    Null,
    True,
    False,
    /// A path; its text is the token's span.
    Path,
}

#[derive(Debug)]
struct Tok {
    kind: T,
    start: usize,
    end: usize,
}

fn path_start(c: char) -> bool {
    c.is_alphabetic() || matches!(c, '_' | '$' | '@')
}

fn path_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '$' | '@' | '.' | '-')
}

fn lex(text: &str) -> Result<Vec<Tok>, String> {
    let b = text.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while let Some(c) = text.get(i..).and_then(|r| r.chars().next()) {
        let start = i;
        if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        }
        let kind = match c {
            '(' => {
                i += 1;
                T::Open
            }
            ')' => {
                i += 1;
                T::Close
            }
            '=' | '<' | '>' | '!' => {
                while matches!(b.get(i), Some(b'=' | b'<' | b'>' | b'!')) {
                    i += 1;
                }
                let op = &text[start..i];
                T::Op(Op::by_text(op).ok_or_else(|| {
                    format!(
                        "unknown operator '{op}' (known: =, <>, !=, <, <=, >, >=) {}",
                        at(text, i)
                    )
                })?)
            }
            '\'' => {
                i += 1;
                let mut s = Vec::new();
                loop {
                    match b.get(i) {
                        None => return Err(format!("unterminated string {}", at(text, i))),
                        Some(b'\'') if b.get(i + 1) == Some(&b'\'') => {
                            s.push(b'\'');
                            i += 2;
                        }
                        Some(b'\'') => {
                            i += 1;
                            break;
                        }
                        Some(&x) => {
                            s.push(x);
                            i += 1;
                        }
                    }
                }
                T::Str(s.into())
            }
            '"' => {
                return Err(format!(
                    "double quotes are not supported: strings go in single quotes, field paths \
                     are written plainly {}",
                    at(text, i + 1)
                ))
            }
            '0'..='9' | '.' | '-' | '+' => {
                i = number_end(b, i);
                let digits = b[start..i].iter().any(u8::is_ascii_digit);
                // A number glued to a word (`5abc`, `1.2.3`) is one bad token, not two.
                let glued = text
                    .get(i..)
                    .and_then(|r| r.chars().next())
                    .is_some_and(path_char);
                if !digits || glued {
                    while let Some(c) = text.get(i..).and_then(|r| r.chars().next()) {
                        if !(path_char(c) || c == '+') {
                            break;
                        }
                        i += c.len_utf8();
                    }
                    let word = &text[start..i];
                    return Err(if digits || word.len() > 1 {
                        format!("invalid number '{word}' {}", at(text, i))
                    } else {
                        format!("unexpected character '{word}' {}", at(text, i))
                    });
                }
                match text[start..i].parse::<f64>() {
                    Ok(x) if x.is_finite() => T::Num(x),
                    Ok(_) => return Err(format!("number out of range {}", at(text, i))),
                    Err(_) => {
                        return Err(format!(
                            "invalid number '{}' {}",
                            &text[start..i],
                            at(text, i)
                        ))
                    }
                }
            }
            c if path_start(c) => {
                while let Some(c) = text.get(i..).and_then(|r| r.chars().next()) {
                    if !path_char(c) {
                        break;
                    }
                    i += c.len_utf8();
                }
                let word = &text[start..i];
                let is = |k: &str| word.eq_ignore_ascii_case(k);
                if is("and") {
                    T::And
                } else if is("or") {
                    T::Or
                } else if is("not") {
                    T::Not
                } else if is("is") {
                    T::Is
                } else if is("null") {
                    T::Null
                } else if is("true") {
                    T::True
                } else if is("false") {
                    T::False
                } else {
                    T::Path
                }
            }
            other => {
                i += other.len_utf8();
                return Err(format!("unexpected character '{other}' {}", at(text, i)));
            }
        };
        toks.push(Tok {
            kind,
            start,
            end: i,
        });
    }
    Ok(toks)
}

/// The end of the number starting at `i`: sign, digits with at most one '.', an exponent only
/// when digits follow it. Whether it has digits at all is checked by the caller.
fn number_end(b: &[u8], mut i: usize) -> usize {
    if matches!(b.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'-' | b'+')) {
            j += 1;
        }
        if b.get(j).is_some_and(u8::is_ascii_digit) {
            i = j;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
    }
    i
}

/// The tree while parsing, before it is laid out flat.
enum Expr {
    Leaf(Node),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

enum Operand {
    Field(usize),
    Lit(Lit),
}

struct Parser<'a> {
    text: &'a str,
    toks: Vec<Tok>,
    pos: usize,
    paths: Vec<FieldPath>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&T> {
        self.toks.get(self.pos).map(|t| &t.kind)
    }

    /// Where the current token ends (the end of the text when there is none).
    fn here(&self) -> String {
        let end = self.toks.get(self.pos).map_or(self.text.len(), |t| t.end);
        at(self.text, end)
    }

    fn or(&mut self, depth: usize) -> Result<Expr, String> {
        let mut items = Vec::new();
        loop {
            match self.and(depth)? {
                Expr::Or(inner) => items.extend(inner),
                e => items.push(e),
            }
            if self.peek() != Some(&T::Or) {
                break;
            }
            self.pos += 1;
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Expr::Or(items)
        })
    }

    fn and(&mut self, depth: usize) -> Result<Expr, String> {
        let mut items = Vec::new();
        loop {
            match self.primary(depth)? {
                Expr::And(inner) => items.extend(inner),
                e => items.push(e),
            }
            if self.peek() != Some(&T::And) {
                break;
            }
            self.pos += 1;
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Expr::And(items)
        })
    }

    fn primary(&mut self, depth: usize) -> Result<Expr, String> {
        match self.peek() {
            Some(T::Open) => {
                if depth >= MAX_NESTING {
                    return Err(format!(
                        "parentheses nested deeper than {MAX_NESTING} levels {}",
                        self.here()
                    ));
                }
                self.pos += 1;
                let e = self.or(depth + 1)?;
                match self.peek() {
                    Some(T::Close) => {
                        self.pos += 1;
                        Ok(e)
                    }
                    None => Err(format!("unbalanced parentheses {}", self.here())),
                    Some(_) => Err(format!("expected AND, OR or ')' {}", self.here())),
                }
            }
            Some(T::Not) => Err(not_supported(&self.here())),
            _ => self.comparison(),
        }
    }

    /// The operand at the current token, consumed; `None` (nothing consumed) when there is
    /// none.
    fn operand(&mut self) -> Result<Option<Operand>, String> {
        let Some(t) = self.toks.get(self.pos) else {
            return Ok(None);
        };
        let o = match &t.kind {
            T::Path => {
                let text = &self.text[t.start..t.end];
                let path = FieldPath::parse(text).ok_or_else(|| {
                    format!(
                        "'{text}' is not a field name or dotted path such as payload.value {}",
                        at(self.text, t.end)
                    )
                })?;
                let id = match self.paths.iter().position(|p| *p == path) {
                    Some(id) => id,
                    None => {
                        self.paths.push(path);
                        self.paths.len() - 1
                    }
                };
                Operand::Field(id)
            }
            T::Num(x) => Operand::Lit(Lit::Num(*x)),
            T::Str(s) => Operand::Lit(Lit::Str(s.clone())),
            T::True => Operand::Lit(Lit::Bool(true)),
            T::False => Operand::Lit(Lit::Bool(false)),
            T::Null => {
                return Err(format!(
                    "NULL is not a value to compare with; write 'path IS NULL' or 'path IS NOT \
                     NULL' {}",
                    self.here()
                ))
            }
            _ => return Ok(None),
        };
        self.pos += 1;
        Ok(Some(o))
    }

    fn comparison(&mut self) -> Result<Expr, String> {
        let Some(left) = self.operand()? else {
            return Err(format!(
                "expected a comparison such as status >= 500 {}",
                self.here()
            ));
        };
        let Some(t) = self.toks.get(self.pos) else {
            return Err(format!(
                "expected a comparison operator (=, <>, <, <=, >, >=) or IS [NOT] NULL {}",
                self.here()
            ));
        };
        match t.kind {
            T::Op(op) => {
                let written = &self.text[t.start..t.end];
                self.pos += 1;
                let right = self.operand()?;
                let (path, op, lit) = match (left, right) {
                    (Operand::Field(p), Some(Operand::Lit(l))) => (p, op, l),
                    (Operand::Lit(l), Some(Operand::Field(p))) => (p, op.flipped(), l),
                    (Operand::Field(_), None) => {
                        return Err(format!(
                            "expected a literal after '{written}' {}",
                            self.here()
                        ))
                    }
                    (Operand::Lit(_), None) => {
                        return Err(format!(
                            "expected a field after '{written}' {}",
                            self.here()
                        ))
                    }
                    _ => {
                        return Err(format!(
                            "a comparison needs a field and a literal {}",
                            at(self.text, self.toks[self.pos - 1].end)
                        ))
                    }
                };
                Ok(Expr::Leaf(Node::Cmp { path, op, lit }))
            }
            T::Is => {
                self.pos += 1;
                let negated = self.peek() == Some(&T::Not);
                if negated {
                    self.pos += 1;
                }
                if self.peek() != Some(&T::Null) {
                    let is = if negated { "IS NOT" } else { "IS" };
                    return Err(format!("expected NULL after {is} {}", self.here()));
                }
                self.pos += 1;
                match left {
                    Operand::Field(path) => Ok(Expr::Leaf(Node::IsNull { path, negated })),
                    Operand::Lit(_) => Err(format!(
                        "IS NULL needs a field, not a literal {}",
                        at(self.text, self.toks[self.pos - 1].end)
                    )),
                }
            }
            T::Not => Err(not_supported(&self.here())),
            _ => Err(format!(
                "expected a comparison operator (=, <>, <, <=, >, >=) or IS [NOT] NULL {}",
                self.here()
            )),
        }
    }
}

fn not_supported(at: &str) -> String {
    format!(
        "NOT is not supported (write the opposite comparison, e.g. <> for =, or IS NOT NULL) {at}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Decoder;

    fn p(s: &str) -> Filter {
        Filter::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> String {
        match Filter::parse(s) {
            Ok(f) => panic!("{s} parsed as {}", f.shown()),
            Err(e) => e,
        }
    }

    /// The condition's value for one JSON message, decoded with exactly its paths.
    fn value(cond: &str, json: &str, numeric_strings: bool) -> Option<bool> {
        let f = p(cond);
        let mut d = Decoder::new(f.paths());
        let fields = d.decode(json.as_bytes()).unwrap();
        let v = f.value(&fields, numeric_strings);
        assert_eq!(f.passes(&fields, numeric_strings), v == Some(true));
        v
    }

    fn passes(cond: &str, json: &str) -> bool {
        value(cond, json, false) == Some(true)
    }

    #[test]
    fn and_binds_tighter_than_or_and_parentheses_regroup() {
        let f = p("a = 1 OR b = 2 AND c = 3");
        assert_eq!(f.shown(), "a = 1 OR b = 2 AND c = 3");
        assert!(matches!(f.nodes.last(), Some(Node::Or { len: 2, .. })));
        assert_eq!(f, p("a = 1 OR (b = 2 AND c = 3)"));
        let g = p("(a = 1 OR b = 2) AND c = 3");
        assert_eq!(g.shown(), "(a = 1 OR b = 2) AND c = 3");
        assert!(matches!(g.nodes.last(), Some(Node::And { len: 2, .. })));
        assert_ne!(f, g);
        // Redundant parentheses and regrouped chains are the same condition.
        assert_eq!(
            p("((a = 1) AND (b = 2)) AND ((c = 3))"),
            p("a = 1 AND b = 2 AND c = 3")
        );
        assert_eq!(
            p("a = 1 OR (b = 2 OR (c = 3 OR d = 4))"),
            p("a = 1 OR b = 2 OR c = 3 OR d = 4")
        );
        assert_eq!(p("((((x IS NULL))))"), p("x IS NULL"));
        // Semantics follow the grouping: a=1 alone satisfies the first, not the second.
        assert!(passes("a = 1 OR b = 2 AND c = 3", r#"{"a":1,"b":0,"c":0}"#));
        assert!(!passes(
            "(a = 1 OR b = 2) AND c = 3",
            r#"{"a":1,"b":0,"c":0}"#
        ));
    }

    #[test]
    fn a_literal_on_the_left_flips_the_operator() {
        for (flipped, plain) in [
            ("500 <= status", "status >= 500"),
            ("500 < status", "status > 500"),
            ("500 >= status", "status <= 500"),
            ("500 > status", "status < 500"),
            ("500 = status", "status = 500"),
            ("500 <> status", "status <> 500"),
            ("'eu' = region", "region = 'eu'"),
            ("TRUE = ok", "ok = TRUE"),
        ] {
            assert_eq!(p(flipped), p(plain), "{flipped}");
        }
        assert!(passes("500 <= status", r#"{"status":503}"#));
        assert!(!passes("500 <= status", r#"{"status":404}"#));
    }

    #[test]
    fn keywords_are_case_insensitive_paths_are_not() {
        let f = p("x is not null and Y = TRUE or z Is Null AnD w = fAlSe");
        assert_eq!(
            f.shown(),
            "x IS NOT NULL AND Y = TRUE OR z IS NULL AND w = FALSE"
        );
        assert_ne!(p("Status = 1"), p("status = 1"));
        assert_eq!(
            p("a.And = 1 AND b.or IS NULL").shown(),
            "a.And = 1 AND b.or IS NULL"
        );
    }

    #[test]
    fn strings_unescape_doubled_quotes_and_keep_unicode() {
        let f = p("name = 'it''s' OR name = '' OR name = ''''");
        assert_eq!(f.shown(), "name = 'it''s' OR name = '' OR name = ''''");
        assert!(passes("name = 'it''s'", r#"{"name":"it's"}"#));
        assert!(passes("name = ''''", r#"{"name":"'"}"#));
        assert!(passes("name = ''", r#"{"name":""}"#));
        assert!(passes("ville = 'Zürich'", r#"{"ville":"Z\u00fcrich"}"#));
        assert!(passes("città = 'Zürich'", r#"{"città":"Zürich"}"#));
        // Keywords and operators inside a string are text.
        assert!(passes("q = 'a = 1 AND (b'", r#"{"q":"a = 1 AND (b"}"#));
    }

    #[test]
    fn every_error_says_what_and_where() {
        let cases = [
            (
                "status >= ",
                "expected a literal after '>=' at 'status >= '",
            ),
            (
                "status >= AND x = 1",
                "expected a literal after '>=' at 'status >= AND'",
            ),
            ("500 <= ", "expected a field after '<=' at '500 <= '"),
            (
                "a == 1",
                "unknown operator '==' (known: =, <>, !=, <, <=, >, >=) at 'a =='",
            ),
            ("a =< 1", "unknown operator '=<'"),
            ("a ! 1", "unknown operator '!'"),
            (
                "a = b",
                "a comparison needs a field and a literal at 'a = b'",
            ),
            ("1 = 2", "a comparison needs a field and a literal"),
            ("'x' = 'y'", "a comparison needs a field and a literal"),
            ("(a = 1", "unbalanced parentheses at '(a = 1'"),
            ("a = 1)", "unbalanced parentheses at 'a = 1)'"),
            ("((a = 1) OR b = 2", "unbalanced parentheses"),
            ("NOT a = 1", "NOT is not supported"),
            ("a = 1 AND NOT b = 2", "NOT is not supported"),
            ("(NOT a = 1)", "NOT is not supported"),
            ("a NOT IN (1)", "NOT is not supported"),
            ("", "empty condition"),
            ("   ", "empty condition"),
            ("a >= 1e999", "number out of range at 'a >= 1e999'"),
            ("a >= -1e999", "number out of range"),
            ("a = 'x", "unterminated string at 'a = 'x'"),
            ("a = 'it''", "unterminated string"),
            ("a IS 1", "expected NULL after IS at 'a IS 1'"),
            ("a IS NOT", "expected NULL after IS NOT at 'a IS NOT'"),
            ("1 IS NULL", "IS NULL needs a field, not a literal"),
            ("a = NULL", "NULL is not a value to compare with"),
            ("a", "expected a comparison operator"),
            ("a LIKE 'x%'", "expected a comparison operator"),
            ("a = 1 b = 2", "expected AND or OR at 'a = 1 b'"),
            ("(a = 1 b = 2)", "expected AND, OR or ')' at '(a = 1 b'"),
            ("()", "expected a comparison such as status >= 500 at '()'"),
            (
                "a = 1 AND",
                "expected a comparison such as status >= 500 at 'a = 1 AND'",
            ),
            (
                "AND a = 1",
                "expected a comparison such as status >= 500 at 'AND'",
            ),
            ("a = 1 OR OR b = 2", "expected a comparison"),
            ("\"a\" = 1", "double quotes are not supported"),
            ("a = 5abc", "invalid number '5abc'"),
            ("a = 1.2.3", "invalid number '1.2.3'"),
            ("a = 1e", "invalid number '1e'"),
            ("a = -", "unexpected character '-'"),
            ("a = .", "unexpected character '.'"),
            ("a = #", "unexpected character '#' at 'a = #'"),
            ("a..b = 1", "'a..b' is not a field name or dotted path"),
            ("a. = 1", "'a.' is not a field name or dotted path"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn long_conditions_show_only_the_end_before_the_problem() {
        let text = format!(
            "{} AND b ==",
            "a = 1 AND ".repeat(20).trim_end_matches(" AND ")
        );
        let e = err(&text);
        assert!(e.ends_with("1 AND b =='"), "{e}");
        assert!(e.contains("at '…"), "{e}");
        assert!(e.chars().count() < 120, "{e}");
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!(
            "{}a = 1{}",
            "(".repeat(MAX_NESTING),
            ")".repeat(MAX_NESTING)
        );
        assert_eq!(p(&ok), p("a = 1"));
        let deep = format!(
            "{}a = 1{}",
            "(".repeat(MAX_NESTING + 1),
            ")".repeat(MAX_NESTING + 1)
        );
        assert!(err(&deep).contains("nested deeper than 64"));
        let hostile = "(".repeat(1_000_000);
        assert!(err(&hostile).contains("nested deeper"));
        // Alternating AND/OR as deep as allowed still evaluates and shows.
        let mut s = "x = 1".to_string();
        for i in 0..MAX_NESTING {
            s = if i % 2 == 0 {
                format!("x = {i} OR ({s})")
            } else {
                format!("x = 1 AND ({s})")
            };
        }
        let f = p(&s);
        assert_eq!(p(&f.shown()), f);
        assert!(passes(&s, r#"{"x":1}"#));
        // Long flat chains are no deeper than one level.
        let chain = vec!["x = 1"; 10_000].join(" AND ");
        assert!(passes(&chain, r#"{"x":1}"#));
    }

    #[test]
    fn odd_input_is_an_error_never_a_panic() {
        for text in [
            "",
            "(",
            ")",
            "a = '",
            "'",
            "''",
            "=",
            "<>",
            "a",
            "1",
            "TRUE",
            "NULL",
            "IS NULL",
            "a IS",
            "a.",
            ".a = 1",
            "a = 1 AND",
            "a = 1 OR (",
            "ü",
            "名前 =",
            "a = '名前",
            "😀 = 1",
            "a = 1 😀",
            "a >= 1e999",
            "\0",
            "a\u{0} = 1",
            "a = +",
            "a = +-1",
            "a = --1",
            "a = 1e+",
            "a\t=\n1\r\n)",
            "a = 'x' AND",
            ")(",
        ] {
            assert!(Filter::parse(text).is_err(), "{text:?}");
        }
        assert_eq!(err("a >= 1e999"), "number out of range at 'a >= 1e999'");
        // Unicode paths and whitespace other than spaces are fine.
        assert_eq!(p("名前\t=\n'値'").shown(), "名前 = '値'");
        assert_eq!(p("a = +1").shown(), "a = 1");
        assert_eq!(p("a = .5").shown(), "a = 0.5");
        assert_eq!(p("@timestamp > 0 AND user-agent IS NULL").paths().len(), 2);
    }

    #[test]
    fn random_conditions_round_trip_and_mangled_ones_never_panic() {
        struct Rng(u64);
        impl Rng {
            fn next(&mut self, n: usize) -> usize {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (self.0 % n as u64) as usize
            }
        }
        // A random valid condition, spelled with random case, spacing and extra parentheses.
        fn gen(r: &mut Rng, depth: usize, out: &mut String) {
            let sp = |r: &mut Rng| [" ", "  ", "\t", " \n "][r.next(4)];
            let kw = |r: &mut Rng, k: &str| match r.next(3) {
                0 => k.to_ascii_lowercase(),
                1 => k.to_string(),
                _ => k[..1].to_string() + &k[1..].to_ascii_lowercase(),
            };
            let choice = if depth == 0 { r.next(2) } else { r.next(5) };
            match choice {
                0 | 1 => {
                    let path = ["a", "b.c", "名前", "@ts", "x.y.z"][r.next(5)];
                    let lit =
                        ["1", "-2.5", "2e3", "0.1", "'x'", "'it''s'", "''", "true"][r.next(8)];
                    let op = ["=", "<>", "!=", "<", "<=", ">", ">="][r.next(7)];
                    match r.next(4) {
                        0 => *out += &format!("{lit}{}{op}{}{path}", sp(r), sp(r)),
                        1 => *out += &format!("{path}{}{}", sp(r), kw(r, "IS NULL")),
                        2 => *out += &format!("{path} {} {}", kw(r, "is"), kw(r, "NOT NULL")),
                        _ => *out += &format!("{path}{}{op}{}{lit}", sp(r), sp(r)),
                    }
                }
                2 => {
                    out.push('(');
                    gen(r, depth - 1, out);
                    out.push(')');
                }
                _ => {
                    let op = if choice == 3 { "AND" } else { "OR" };
                    for i in 0..2 + r.next(3) {
                        if i > 0 {
                            let k = kw(r, op);
                            *out += &format!("{}{k}{}", sp(r), sp(r));
                        }
                        gen(r, depth - 1, out);
                    }
                }
            }
        }
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        let junk = [
            "(", ")", "'", "=", "NOT", "AND", "IS", "1e999", "ü", "\"", " ", "-", ".",
        ];
        for _ in 0..5_000 {
            let mut text = String::new();
            gen(&mut r, 6, &mut text);
            let f = p(&text);
            let shown = f.shown();
            assert_eq!(p(&shown), f, "{text:?} → {shown:?}");
            assert_eq!(p(&shown).shown(), shown);
            // Cut it anywhere or splice junk in: an error or another valid condition.
            let cuts: Vec<usize> = (0..=text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            let at = cuts[r.next(cuts.len())];
            for mangled in [
                text[..at].to_string(),
                format!("{}{}{}", &text[..at], junk[r.next(junk.len())], &text[at..]),
            ] {
                if let Ok(g) = Filter::parse(&mangled) {
                    assert_eq!(p(&g.shown()), g, "{mangled:?}");
                }
            }
        }
    }

    #[test]
    fn shown_is_canonical_and_parses_back_equal() {
        for (text, want) in [
            ("status>=500", "status >= 500"),
            (
                "status >= 500 and (region = 'eu' or coupon is null)",
                "status >= 500 AND (region = 'eu' OR coupon IS NULL)",
            ),
            ("x = 500.0", "x = 500"),
            ("x = 1.50", "x = 1.5"),
            ("x = 2e3", "x = 2000"),
            ("x = 2E-3", "x = 0.002"),
            ("x = -0", "x = -0"),
            ("x != 1", "x <> 1"),
            ("x<>1", "x <> 1"),
            ("  (  a   =   true )  ", "a = TRUE"),
            (
                "a = 1 or b = 2 and (c = 3 or d = 4)",
                "a = 1 OR b = 2 AND (c = 3 OR d = 4)",
            ),
            (
                "(a = 1 and b = 2) or (c = 3 and d = 4)",
                "a = 1 AND b = 2 OR c = 3 AND d = 4",
            ),
            (
                "(a = 1 or b = 2) and (c = 3 or d = 4) and e is not null",
                "(a = 1 OR b = 2) AND (c = 3 OR d = 4) AND e IS NOT NULL",
            ),
            ("1.5 > payload.value", "payload.value < 1.5"),
        ] {
            let f = p(text);
            assert_eq!(f.shown(), want, "{text}");
            assert_eq!(p(&f.shown()), f, "{text}");
            assert_eq!(p(want).shown(), want);
        }
        // Numbers too big or small for short decimals still round-trip exactly.
        for text in [
            "x = 1e300",
            "x = 1.7976931348623157e308",
            "x = 5e-324",
            "x = 0.1",
        ] {
            let f = p(text);
            assert_eq!(p(&f.shown()), f, "{text}");
        }
    }

    #[test]
    fn paths_are_listed_once_in_order_and_bind_redirects_them() {
        let mut f = p("b = 1 AND a.x IS NULL OR b > 2 AND c = 'z' OR a.x = 3");
        let names: Vec<_> = f.paths().iter().map(|p| p.as_str().to_string()).collect();
        assert_eq!(names, ["b", "a.x", "c"]);
        // The job decodes more fields, in another order.
        let job: Vec<FieldPath> = ["key", "c", "a.x", "b"]
            .iter()
            .map(|s| FieldPath::parse(s).unwrap())
            .collect();
        let mut d = Decoder::new(job.clone());
        f.bind(&mut |path| job.iter().position(|j| j == path).unwrap());
        let msg = br#"{"key":"k","b":5,"a":{"x":3},"c":"q"}"#;
        assert!(f.passes(&d.decode(msg).unwrap(), false));
        let msg = br#"{"key":"k","b":5,"a":{"x":4},"c":"q"}"#;
        assert!(!f.passes(&d.decode(msg).unwrap(), false));
        let msg = br#"{"key":"k","b":5,"a":{"x":4},"c":"z"}"#;
        assert!(f.passes(&d.decode(msg).unwrap(), false));
        // An index no decoder can have reads as missing rather than panicking.
        f.bind(&mut |_| usize::MAX);
        let fields = d.decode(msg).unwrap();
        assert_eq!(f.value(&fields, false), None);
        assert!(!f.passes(&fields, false));
    }

    #[test]
    fn missing_null_and_wrong_types_are_unknown() {
        let cases = [
            ("status >= 500", r#"{"status":503}"#, Some(true)),
            ("status >= 500", r#"{"status":404}"#, Some(false)),
            ("status >= 500", r#"{}"#, None),
            ("status >= 500", r#"{"status":null}"#, None),
            ("status >= 500", r#"{"status":"503"}"#, None),
            ("status >= 500", r#"{"status":true}"#, None),
            ("status >= 500", r#"{"status":[503]}"#, None),
            ("status >= 500", r#"{"status":{"code":503}}"#, None),
            ("status <> 500", r#"{}"#, None),
            ("region = 'eu'", r#"{"region":"eu"}"#, Some(true)),
            ("region = 'eu'", r#"{"region":"us"}"#, Some(false)),
            ("region = 'eu'", r#"{"region":1}"#, None),
            ("region = '1'", r#"{"region":1}"#, None),
            ("region = 'true'", r#"{"region":true}"#, None),
            ("ok = true", r#"{"ok":true}"#, Some(true)),
            ("ok = true", r#"{"ok":false}"#, Some(false)),
            ("ok <> true", r#"{"ok":false}"#, Some(true)),
            ("ok < true", r#"{"ok":false}"#, Some(true)),
            ("ok = true", r#"{"ok":"true"}"#, None),
            ("ok = true", r#"{"ok":1}"#, None),
            ("x IS NULL", r#"{}"#, Some(true)),
            ("x IS NULL", r#"{"x":null}"#, Some(true)),
            ("x IS NULL", r#"{"x":0}"#, Some(false)),
            ("x IS NULL", r#"{"x":""}"#, Some(false)),
            ("x IS NOT NULL", r#"{"x":{}}"#, Some(true)),
            ("x IS NOT NULL", r#"{"x":null}"#, Some(false)),
            ("x IS NOT NULL", r#"{}"#, Some(false)),
        ];
        for (cond, json, want) in cases {
            assert_eq!(value(cond, json, false), want, "{cond} on {json}");
        }
    }

    #[test]
    fn numbers_compare_as_doubles_and_strings_bytewise() {
        assert!(passes("x = 500", r#"{"x":500.0}"#));
        assert!(passes("x = 500", r#"{"x":5e2}"#));
        assert!(passes("x = 0", r#"{"x":-0}"#));
        assert!(passes("x < -1.5", r#"{"x":-2}"#));
        assert!(passes("x > 1e308", r#"{"x":1e309}"#));
        assert!(passes("x <= 9007199254740993", r#"{"x":9007199254740992}"#));
        // Bytewise: upper case sorts before lower case, and a prefix before its extensions.
        assert!(passes("s < 'a'", r#"{"s":"Z"}"#));
        assert!(passes("s < 'ab'", r#"{"s":"a"}"#));
        assert!(passes("s > 'z'", r#"{"s":"é"}"#));
        assert!(!passes("s = 'A'", r#"{"s":"a"}"#));
        assert!(passes("s = 'a\"b'", r#"{"s":"a\"b"}"#));
        assert!(passes("s = 'tab\there'", r#"{"s":"tab\there"}"#));
    }

    #[test]
    fn numeric_strings_only_when_asked_and_only_decimal_numbers() {
        let n = |cond: &str, json: &str| value(cond, json, true);
        assert_eq!(value("x >= 500", r#"{"x":"503"}"#, false), None);
        assert_eq!(n("x >= 500", r#"{"x":"503"}"#), Some(true));
        assert_eq!(n("x >= 500", r#"{"x":"-1.5e2"}"#), Some(false));
        assert_eq!(n("x = 500", r#"{"x":"500.0"}"#), Some(true));
        for bad in [
            " 500", "500 ", "0x1F4", "+500", "500.", ".5", "1e", "", "abc", "NaN",
        ] {
            let json = format!(r#"{{"x":"{bad}"}}"#);
            assert_eq!(n("x >= 0", &json), None, "{bad:?}");
        }
        // A string literal still compares a numeric string as text.
        assert_eq!(n("x = '0500'", r#"{"x":"0500"}"#), Some(true));
        assert_eq!(n("x = '500'", r#"{"x":500}"#), None);
    }

    #[test]
    fn nested_paths_and_duplicates_read_the_decoded_field() {
        let json = r#"{"req":{"http":{"status":502,"method":"GET"}},"region":"eu"}"#;
        assert!(passes(
            "req.http.status >= 500 AND req.http.method = 'GET'",
            json
        ));
        assert_eq!(value("req.http.missing = 1", json, false), None);
        assert!(passes("req.http.missing IS NULL", json));
        assert_eq!(value("req.http = 1", json, false), None);
        assert!(passes("req.http IS NOT NULL", json));
        assert_eq!(value("region.x = 'eu'", json, false), None);
    }

    #[test]
    fn and_or_follow_kleene_logic_with_unknowns() {
        let json = r#"{"t":1,"f":0}"#;
        // t = 1 is TRUE, f = 1 is FALSE, m = 1 is unknown (m is missing).
        for (cond, want) in [
            ("t = 1 AND m = 1", None),
            ("f = 1 AND m = 1", Some(false)),
            ("m = 1 AND f = 1", Some(false)),
            ("t = 1 AND t = 1", Some(true)),
            ("t = 1 OR m = 1", Some(true)),
            ("m = 1 OR t = 1", Some(true)),
            ("f = 1 OR m = 1", None),
            ("f = 1 OR f = 1", Some(false)),
            ("m = 1 OR m = 1", None),
            ("(m = 1 OR t = 1) AND t = 1", Some(true)),
            ("(m = 1 OR f = 1) AND t = 1", None),
            ("(m = 1 OR f = 1) AND f = 1", Some(false)),
            ("m = 1 AND f = 1 OR t = 1", Some(true)),
            ("m = 1 AND t = 1 OR f = 1", None),
            ("m IS NULL AND t = 1", Some(true)),
        ] {
            assert_eq!(value(cond, json, false), want, "{cond}");
        }
    }
}
