//! Decoding one message: the fields a job reads (given as dotted paths) are found in a JSON
//! object in a single pass, without building a JSON tree and without allocating, while the rest
//! of the message is still checked to be valid JSON (a message a JSON parser rejects is a dead
//! letter). What each field means (a time, a key, a number) is decided by `record`.
//!
//! Long on purpose: a complete validating JSON scanner (strings, escapes, numbers, nesting)
//! whose invariants are best read together; its tests are at the end.

/// Deeper nesting than this is refused rather than recursed into.
pub(crate) const MAX_DEPTH: usize = 128;

/// At most this many distinct paths are read from a message (a bit each in a mask).
pub(crate) const MAX_PATHS: usize = 64;

/// A dotted path to a field, e.g. `payload.value`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath {
    text: String,
    segments: Vec<Box<[u8]>>,
    /// Each segment's first 8 bytes (see [`prefix8`]), compared before the segment itself.
    prefixes: Vec<u64>,
    /// Each segment's last 8 bytes, for segments of 9 to 16 bytes (the two words are the whole
    /// segment); 0 for the others.
    suffixes: Vec<u64>,
}

/// The first 8 bytes of `s` as a number (zeros past its end): two names of one length whose
/// numbers differ differ, without a call to compare them.
#[inline]
fn prefix8(s: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = s.len().min(8);
    a[..n].copy_from_slice(&s[..n]);
    u64::from_le_bytes(a)
}

/// The 8 bytes of `b` from `at` as a number.
#[inline]
fn word_at(b: &[u8], at: usize) -> u64 {
    let w = &b[at..at + 8];
    u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
}

/// [`prefix8`] of `b[start..start + len]`, read as one word of the message where it has 8
/// bytes from `start` (a member name is followed by at least `":` and a value): copying a
/// name's bytes one length at a time was a third of the decoder's object scan.
#[inline]
fn prefix8_at(b: &[u8], start: usize, len: usize) -> u64 {
    if start + 8 <= b.len() {
        let w = word_at(b, start);
        if len >= 8 {
            w
        } else {
            w & ((1u64 << (8 * len)) - 1)
        }
    } else {
        prefix8(&b[start..start + len])
    }
}

impl FieldPath {
    /// `None` when the path is empty or has an empty segment (`a..b`, `.a`).
    pub fn parse(text: &str) -> Option<FieldPath> {
        if text.is_empty() || text.split('.').any(str::is_empty) {
            return None;
        }
        let segments: Vec<Box<[u8]>> = text.split('.').map(|s| s.as_bytes().into()).collect();
        Some(FieldPath {
            text: text.to_string(),
            prefixes: segments.iter().map(|s| prefix8(s)).collect(),
            suffixes: segments
                .iter()
                .map(|s| match s.len() {
                    9..=16 => word_at(s, s.len() - 8),
                    _ => 0,
                })
                .collect(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The last segment (`value` for `payload.value`): the default name of an output column.
    pub(crate) fn segments(&self) -> &[Box<[u8]>] {
        &self.segments
    }

    pub fn last_segment(&self) -> &str {
        self.text.rsplit('.').next().unwrap_or(&self.text)
    }
}

/// Why a message is not JSON (or not a JSON object). Cheap to build; the text is only made for
/// dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    InvalidUtf8,
    NotJson(&'static str),
    NotObject,
    TooDeep,
    /// Avro or Protobuf: the first byte is not the wire format's magic byte 0.
    NoMagicByte(u8),
    /// Shorter than the wire format's 5-byte header.
    NoHeader,
    /// The registry has no schema with this id.
    UnknownSchema(u32),
    /// The schema with this id is not of the job's format.
    OtherFormat(u32, &'static str),
    /// The record does not decode with its schema (the format's name, why).
    Undecodable(&'static str, &'static str),
    /// Protobuf: the message indexes name no message of schema `id`.
    NoSuchMessage(u32),
    /// Protobuf: the record is another message than the job's `message`.
    OtherMessage(u32),
}

impl DecodeError {
    pub fn describe(self) -> String {
        match self {
            DecodeError::Empty => "empty message".to_string(),
            DecodeError::InvalidUtf8 => "not JSON: invalid UTF-8".to_string(),
            DecodeError::NotJson(why) => format!("not JSON: {why}"),
            DecodeError::NotObject => "not a JSON object".to_string(),
            DecodeError::TooDeep => {
                format!("not accepted: nested deeper than {MAX_DEPTH} levels")
            }
            DecodeError::NoMagicByte(b) => format!(
                "not in the schema registry's wire format: the first byte is 0x{b:02x}, not the magic byte 0"
            ),
            DecodeError::NoHeader => {
                "not in the schema registry's wire format: shorter than its 5-byte header".into()
            }
            DecodeError::UnknownSchema(id) => {
                format!("schema id {id} is not in the schema registry")
            }
            DecodeError::OtherFormat(id, t) => {
                format!("schema id {id} is a {t} schema, not the job's format")
            }
            DecodeError::Undecodable(f, why) => format!("not {f}: {why}"),
            DecodeError::NoSuchMessage(id) => {
                format!("not Protobuf: the message indexes name no message of schema id {id}")
            }
            DecodeError::OtherMessage(id) => format!(
                "the record is another message of schema id {id} than the job's 'message'"
            ),
        }
    }
}

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    Null,
    Bool,
    Number,
    String,
    Object,
    Array,
    /// Avro or Protobuf bytes that are not UTF-8 text.
    Bytes,
}

impl Kind {
    /// How a value of this kind is described in a dead-letter reason.
    pub fn shown(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::Bytes => "binary data",
        }
    }
}

/// Where a field's value is: a span of the message, or of the decoder's scratch buffer (a
/// string with escapes, unescaped).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    kind: Kind,
    start: usize,
    end: usize,
    in_scratch: bool,
    /// A number written without fraction or exponent.
    integer: bool,
    /// Epoch milliseconds of an Avro or Protobuf timestamp type.
    pub(crate) timestamp: bool,
    /// A binary format's floating-point value, as decoded (its text may be left unwritten).
    pub(crate) number: Option<f64>,
}

impl Span {
    pub(crate) const fn new(
        kind: Kind,
        start: usize,
        end: usize,
        in_scratch: bool,
        integer: bool,
    ) -> Span {
        Span {
            kind,
            start,
            end,
            in_scratch,
            integer,
            timestamp: false,
            number: None,
        }
    }
}

const MISSING: Span = Span::new(Kind::Missing, 0, 0, false, false);

/// One field of a decoded message.
#[derive(Debug, Clone, Copy)]
pub struct Field<'a> {
    pub kind: Kind,
    /// A string's content (unescaped), a number's literal, `true`/`false`, or an object's or
    /// array's JSON text; empty when missing or null.
    pub bytes: &'a [u8],
    /// A number written without fraction or exponent.
    pub integer: bool,
    /// The field appears more than once in the message.
    pub duplicate: bool,
    /// Epoch milliseconds of an Avro or Protobuf timestamp type (an event time whatever
    /// `time_format` says).
    pub timestamp: bool,
    /// An Avro or Protobuf float or double as decoded; `bytes` is then empty when only numeric
    /// aggregates read the field.
    pub number: Option<f64>,
}

impl<'a> Field<'a> {
    /// The value as text (it is UTF-8: the message was checked while decoding).
    #[inline]
    pub fn text(&self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes).ok()
    }
}

/// The fields of a decoded message, by path index.
pub struct Fields<'a> {
    raw: &'a [u8],
    scratch: &'a [u8],
    spans: &'a [Span],
    duplicates: u64,
}

impl<'a> Fields<'a> {
    #[inline]
    pub fn get(&self, i: usize) -> Field<'a> {
        let s = self.spans.get(i).copied().unwrap_or(MISSING);
        let src = if s.in_scratch { self.scratch } else { self.raw };
        Field {
            kind: s.kind,
            bytes: src.get(s.start..s.end).unwrap_or(&[]),
            integer: s.integer,
            duplicate: 1u64
                .checked_shl(i as u32)
                .is_some_and(|b| self.duplicates & b != 0),
            timestamp: s.timestamp,
            number: s.number,
        }
    }
}

/// Reads a fixed set of paths out of messages.
pub struct Decoder {
    paths: Vec<FieldPath>,
    spans: Vec<Span>,
    /// Unescaped strings of the current message.
    scratch: Vec<u8>,
    /// Unescaped member names that had to be compared with a path segment.
    name_buf: Vec<u8>,
}

impl Decoder {
    /// A decoder for `paths` (at most [`MAX_PATHS`], each once).
    pub fn new(paths: Vec<FieldPath>) -> Decoder {
        let n = paths.len().min(MAX_PATHS);
        Decoder {
            spans: vec![MISSING; n],
            paths: paths.into_iter().take(n).collect(),
            scratch: Vec::new(),
            name_buf: Vec::new(),
        }
    }

    pub fn path(&self, i: usize) -> &FieldPath {
        &self.paths[i]
    }

    /// Decodes one message. Fails with the first syntax problem found.
    pub fn decode<'a>(&'a mut self, raw: &'a [u8]) -> Result<Fields<'a>, DecodeError> {
        self.scan(raw)
    }

    /// Fields found by another format's reader (`fill` sets the spans of the paths it finds,
    /// into `raw` or the scratch buffer).
    pub(crate) fn decode_with<'a>(
        &'a mut self,
        raw: &'a [u8],
        fill: impl FnOnce(&mut [Span], &mut Vec<u8>) -> Result<(), DecodeError>,
    ) -> Result<Fields<'a>, DecodeError> {
        self.spans.fill(MISSING);
        self.scratch.clear();
        fill(&mut self.spans, &mut self.scratch)?;
        Ok(Fields {
            raw,
            scratch: &self.scratch,
            spans: &self.spans,
            duplicates: 0,
        })
    }

    fn scan<'a>(&'a mut self, raw: &'a [u8]) -> Result<Fields<'a>, DecodeError> {
        // Outside strings, valid JSON is ASCII (anything else is a syntax error); inside
        // strings, the scanner checks UTF-8 where a byte is not ASCII. So the message is UTF-8
        // once it has parsed.
        self.spans.fill(MISSING);
        self.scratch.clear();
        let mut seen = 0u64;
        let mut duplicates = 0u64;
        {
            let mut p = Parser {
                b: raw,
                i: 0,
                paths: &self.paths,
                name_buf: &mut self.name_buf,
                scratch: &mut self.scratch,
                spans: &mut self.spans,
                seen: &mut seen,
                duplicates: &mut duplicates,
            };
            p.ws();
            match p.peek() {
                None => return Err(DecodeError::Empty),
                Some(b'{') => {}
                Some(_) => {
                    // Still tell "not JSON at all" from "JSON, but not an object".
                    p.skip_value(0)?;
                    p.ws();
                    return Err(if p.i == p.b.len() {
                        DecodeError::NotObject
                    } else {
                        DecodeError::NotJson("unexpected characters after the JSON value")
                    });
                }
            }
            let all = if self.paths.len() == 64 {
                u64::MAX
            } else {
                (1u64 << self.paths.len()) - 1
            };
            p.object(0, all)?;
            p.ws();
            if p.i != p.b.len() {
                return Err(DecodeError::NotJson(
                    "unexpected characters after the JSON object",
                ));
            }
        }
        Ok(Fields {
            raw,
            scratch: &self.scratch,
            spans: &self.spans,
            duplicates,
        })
    }
}

struct Parser<'a, 'b> {
    b: &'a [u8],
    i: usize,
    paths: &'b [FieldPath],
    name_buf: &'b mut Vec<u8>,
    scratch: &'b mut Vec<u8>,
    spans: &'b mut [Span],
    seen: &'b mut u64,
    duplicates: &'b mut u64,
}

/// A scanned JSON string: its content span (without quotes) and whether it has escapes.
#[derive(Clone, Copy)]
struct Str {
    start: usize,
    end: usize,
    escaped: bool,
}

const NOT_JSON_EOF: DecodeError = DecodeError::NotJson("unexpected end of message");
const UNPAIRED_SURROGATE: DecodeError =
    DecodeError::NotJson("invalid \\u escape in a string (unpaired surrogate)");

impl Parser<'_, '_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if c == b' ' || c == b'\n' || c == b'\t' || c == b'\r' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    fn expect(&mut self, c: u8, what: &'static str) -> Result<(), DecodeError> {
        match self.peek() {
            Some(x) if x == c => {
                self.i += 1;
                Ok(())
            }
            Some(_) => Err(DecodeError::NotJson(what)),
            None => Err(NOT_JSON_EOF),
        }
    }

    /// Parses an object whose members may hold the fields in `active` (a bit per path that
    /// matched every enclosing member name so far).
    fn object(&mut self, depth: usize, active: u64) -> Result<(), DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        self.expect(b'{', "expected '{'")?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(if self.peek().is_none() {
                    NOT_JSON_EOF
                } else {
                    DecodeError::NotJson("expected a member name in double quotes")
                });
            }
            let name = self.string()?;
            self.ws();
            self.expect(b':', "expected ':' after a member name")?;
            self.ws();
            let (leaf, deeper) = if active == 0 {
                (0, 0)
            } else {
                self.match_name(name, depth, active)
            };
            if leaf != 0 {
                self.target(leaf, deeper, depth)?;
            } else if deeper != 0 && self.peek() == Some(b'{') {
                self.object(depth + 1, deeper)?;
            } else {
                self.skip_value(depth + 1)?;
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(_) => return Err(DecodeError::NotJson("expected ',' or '}' in an object")),
                None => return Err(NOT_JSON_EOF),
            }
        }
    }

    /// Which active paths end at this member (`leaf`) or continue below it (`deeper`).
    fn match_name(&mut self, name: Str, depth: usize, active: u64) -> (u64, u64) {
        let (raw, prefix): (&[u8], u64) = if name.escaped {
            self.name_buf.clear();
            if unescape_into(&self.b[name.start..name.end], self.name_buf).is_err() {
                return (0, 0);
            }
            (self.name_buf, prefix8(self.name_buf))
        } else {
            let len = name.end - name.start;
            (
                &self.b[name.start..name.end],
                prefix8_at(self.b, name.start, len),
            )
        };
        let (mut leaf, mut deeper) = (0u64, 0u64);
        let mut bits = active;
        while bits != 0 {
            let f = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let path = &self.paths[f];
            let same = path.segments.get(depth).is_some_and(|s| {
                s.len() == raw.len()
                    && path.prefixes[depth] == prefix
                    && match s.len() {
                        0..=8 => true,
                        9..=16 => path.suffixes[depth] == word_at(raw, raw.len() - 8),
                        _ => s[8..] == raw[8..],
                    }
            });
            if same {
                if depth + 1 == path.segments.len() {
                    leaf |= 1 << f;
                } else {
                    deeper |= 1 << f;
                }
            }
        }
        (leaf, deeper)
    }

    /// Reads the value of a member that ends the paths in `leaf` (and may continue those in
    /// `deeper`, when it is an object), recording where the value is.
    fn target(&mut self, leaf: u64, deeper: u64, depth: usize) -> Result<(), DecodeError> {
        let start = self.i;
        let span = match self.peek() {
            Some(b'"') => {
                let s = self.string()?;
                if s.escaped {
                    let from = self.scratch.len();
                    unescape_into(&self.b[s.start..s.end], self.scratch)
                        .map_err(|()| DecodeError::NotJson("invalid escape in a string"))?;
                    Span::new(Kind::String, from, self.scratch.len(), true, false)
                } else {
                    Span::new(Kind::String, s.start, s.end, false, false)
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let (s, e, integer) = self.number()?;
                Span::new(Kind::Number, s, e, false, integer)
            }
            Some(c) => {
                let kind = match c {
                    b't' | b'f' => Kind::Bool,
                    b'n' => Kind::Null,
                    b'{' => Kind::Object,
                    b'[' => Kind::Array,
                    _ => return Err(DecodeError::NotJson("expected a value")),
                };
                if kind == Kind::Object && deeper != 0 {
                    self.object(depth + 1, deeper)?;
                } else {
                    self.skip_value(depth + 1)?;
                }
                Span::new(kind, start, self.i, false, false)
            }
            None => return Err(NOT_JSON_EOF),
        };
        *self.duplicates |= leaf & *self.seen;
        *self.seen |= leaf;
        let mut bits = leaf;
        while bits != 0 {
            let f = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            self.spans[f] = span;
        }
        Ok(())
    }

    /// Skips one value, checking its syntax.
    fn skip_value(&mut self, depth: usize) -> Result<(), DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        match self.peek() {
            Some(b'{') => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.ws();
                    if self.peek() != Some(b'"') {
                        return Err(if self.peek().is_none() {
                            NOT_JSON_EOF
                        } else {
                            DecodeError::NotJson("expected a member name in double quotes")
                        });
                    }
                    self.string()?;
                    self.ws();
                    self.expect(b':', "expected ':' after a member name")?;
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(());
                        }
                        Some(_) => {
                            return Err(DecodeError::NotJson("expected ',' or '}' in an object"))
                        }
                        None => return Err(NOT_JSON_EOF),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(());
                        }
                        Some(_) => {
                            return Err(DecodeError::NotJson("expected ',' or ']' in an array"))
                        }
                        None => return Err(NOT_JSON_EOF),
                    }
                }
            }
            Some(b'"') => self.string().map(|_| ()),
            Some(b'-' | b'0'..=b'9') => self.number().map(|_| ()),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(_) => Err(DecodeError::NotJson("expected a value")),
            None => Err(NOT_JSON_EOF),
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), DecodeError> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(DecodeError::NotJson("expected a value"))
        }
    }

    /// Scans a string starting at its opening quote, checking escapes, control characters and
    /// (for strings that are not plain ASCII) UTF-8.
    fn string(&mut self) -> Result<Str, DecodeError> {
        self.i += 1;
        let start = self.i;
        let mut escaped = false;
        let mut ascii = true;
        loop {
            // Skip plain bytes 8 at a time (none is '"', '\\', a control character or
            // non-ASCII), and straight to the first special one of a word: most strings (member
            // names, keys) end inside their first word.
            while let Some(chunk) = self.b.get(self.i..self.i + 8) {
                let w = u64::from_le_bytes([
                    chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
                ]);
                let special = special_bytes(w);
                if special != 0 {
                    self.i += (special.trailing_zeros() / 8) as usize;
                    break;
                }
                self.i += 8;
            }
            let Some(&c) = self.b.get(self.i) else {
                return Err(DecodeError::NotJson("unterminated string"));
            };
            match c {
                b'"' => {
                    let end = self.i;
                    self.i += 1;
                    if !ascii && std::str::from_utf8(&self.b[start..end]).is_err() {
                        return Err(DecodeError::InvalidUtf8);
                    }
                    return Ok(Str {
                        start,
                        end,
                        escaped,
                    });
                }
                b'\\' => {
                    escaped = true;
                    match self.b.get(self.i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 2,
                        Some(b'u') => {
                            // A surrogate must come as a high-low pair: a lone one is no
                            // character at all (strict JSON parsers refuse it too).
                            let unit = self.hex_unit(self.i + 2)?;
                            if (0xDC00..0xE000).contains(&unit) {
                                return Err(UNPAIRED_SURROGATE);
                            }
                            if (0xD800..0xDC00).contains(&unit) {
                                let low = if self.b.get(self.i + 6..self.i + 8) == Some(b"\\u") {
                                    self.hex_unit(self.i + 8)?
                                } else {
                                    0
                                };
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(UNPAIRED_SURROGATE);
                                }
                                self.i += 6;
                            }
                            self.i += 6;
                        }
                        _ => return Err(DecodeError::NotJson("invalid escape in a string")),
                    }
                }
                0..=0x1f => {
                    return Err(DecodeError::NotJson(
                        "unescaped control character in a string",
                    ))
                }
                0x80.. => {
                    ascii = false;
                    self.i += 1;
                }
                _ => self.i += 1,
            }
        }
    }

    /// The UTF-16 code unit of the four hex digits at `at`.
    fn hex_unit(&self, at: usize) -> Result<u32, DecodeError> {
        let hex = self
            .b
            .get(at..at + 4)
            .ok_or(DecodeError::NotJson("invalid \\u escape in a string"))?;
        hex.iter().try_fold(0u32, |v, &c| {
            (c as char)
                .to_digit(16)
                .map(|d| v * 16 + d)
                .ok_or(DecodeError::NotJson("invalid \\u escape in a string"))
        })
    }

    /// Scans a number; returns its span and whether it is written as an integer.
    fn number(&mut self) -> Result<(usize, usize, bool), DecodeError> {
        let start = self.i;
        let b = self.b;
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i - s
        };
        let mut i = self.i;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return Err(DecodeError::NotJson("invalid number")),
        }
        let mut integer = true;
        if b.get(i) == Some(&b'.') {
            i += 1;
            integer = false;
            if digits(&mut i) == 0 {
                return Err(DecodeError::NotJson("invalid number"));
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            integer = false;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if digits(&mut i) == 0 {
                return Err(DecodeError::NotJson("invalid number"));
            }
        }
        self.i = i;
        Ok((start, i, integer))
    }
}

/// The bytes of `w` (little-endian) that need a look inside a string: '"', '\\', a control
/// character (< 0x20) or a non-ASCII byte, as the high bit of each. Bits above the lowest set
/// one may be spurious (a borrow carries into the next byte), so only the lowest is exact: the
/// first special byte.
#[inline]
fn special_bytes(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let quote = has_zero(w ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(w ^ (ONES * u64::from(b'\\')));
    // A byte below 0x20 borrows when 0x20 is subtracted (for bytes without the high bit).
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    quote | backslash | control | (w & HIGH)
}

/// Appends `s` as a JSON string literal (quoted, with `"`, `\\` and control characters escaped).
pub(crate) fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses a JSON integer literal; `None` when it does not fit in an i64.
#[inline]
pub fn parse_i64(text: &[u8]) -> Option<i64> {
    let (neg, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.len() <= 18 {
        // Cannot overflow: no checks per digit. The last eight digits (an epoch-milliseconds
        // time has 13) are read at once, beside the chain of the ones before them.
        let fold = |d: &[u8]| d.iter().fold(0i64, |v, &d| v * 10 + i64::from(d - b'0'));
        let v = match digits.len().checked_sub(8) {
            Some(split) => fold(&digits[..split]) * 100_000_000 + eight_digits(&digits[split..]),
            None => fold(digits),
        };
        return Some(if neg { -v } else { v });
    }
    let mut v: i64 = 0;
    for &d in digits {
        let d = i64::from(d - b'0');
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub(d)?
        } else {
            v.checked_add(d)?
        };
    }
    Some(v)
}

/// The value of eight ASCII digits (validated by the caller), with three multiplications: pairs
/// of digits, then pairs of those, then the two halves.
#[inline]
fn eight_digits(d: &[u8]) -> i64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&d[..8]);
    let mut v = u64::from_le_bytes(w) & 0x0F0F_0F0F_0F0F_0F0F;
    v = v.wrapping_mul(2561) >> 8;
    v = (v & 0x00FF_00FF_00FF_00FF).wrapping_mul(6_553_601) >> 16;
    ((v & 0x0000_FFFF_0000_FFFF).wrapping_mul(42_949_672_960_001) >> 32) as i64
}

/// Exact powers of ten as doubles.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Whether `s` is a decimal number as JSON writes one (what numeric_strings accepts).
pub(crate) fn json_number(s: &[u8]) -> bool {
    let mut i = usize::from(s.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let start = *i;
        while s.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    match s.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == s.len()
}

/// Parses a validated JSON number. Short decimals (at most 15 digits, no exponent) take the
/// exact fast path: an integer below 2^53 divided by an exact power of ten is correctly rounded.
#[inline]
pub fn parse_f64(text: &[u8]) -> Option<f64> {
    let (neg, body) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if body.len() <= 16 && !body.iter().any(|&c| c == b'e' || c == b'E') {
        let mut mantissa: u64 = 0;
        let mut digits = 0usize;
        let mut frac = 0usize;
        let mut seen_dot = false;
        for &c in body {
            if c == b'.' {
                seen_dot = true;
                continue;
            }
            mantissa = mantissa * 10 + u64::from(c - b'0');
            digits += 1;
            if seen_dot {
                frac += 1;
            }
        }
        if digits <= 15 {
            let v = mantissa as f64 / POW10[frac];
            return Some(if neg { -v } else { v });
        }
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Unescapes the content of a JSON string (already syntax-checked) into `out`.
fn unescape_into(s: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let e = *s.get(i + 1).ok_or(())?;
        i += 2;
        let simple = match e {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 8,
            b'f' => 12,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => 0,
            _ => return Err(()),
        };
        if e != b'u' {
            out.push(simple);
            continue;
        }
        let hi = hex4(s.get(i..i + 4).ok_or(())?)?;
        i += 4;
        let cp = if (0xD800..0xDC00).contains(&hi) {
            // A high surrogate must be followed by an escaped low surrogate.
            if s.get(i) != Some(&b'\\') || s.get(i + 1) != Some(&b'u') {
                return Err(());
            }
            let lo = hex4(s.get(i + 2..i + 6).ok_or(())?)?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(());
            }
            i += 6;
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        let ch = char::from_u32(cp).ok_or(())?;
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    Ok(())
}

fn hex4(h: &[u8]) -> Result<u32, ()> {
    let mut v = 0u32;
    for &c in h {
        let d = (c as char).to_digit(16).ok_or(())?;
        v = v * 16 + d;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder(paths: &[&str]) -> Decoder {
        Decoder::new(paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect())
    }

    #[test]
    fn member_names_of_every_length_match_exactly_their_path() {
        for n in 1..=20usize {
            let name: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            let mut d = decoder(&[&format!("p.{name}")]);
            let mut others: Vec<String> = (0..n)
                .map(|i| {
                    let mut b = name.clone().into_bytes();
                    b[i] ^= 1;
                    String::from_utf8(b).unwrap()
                })
                .collect();
            others.push(name[..n - 1].to_string());
            others.push(format!("{name}a"));
            // Near the end of the message (fewer than 8 bytes after a name) and far from it,
            // and escaped.
            for (member, found) in others.iter().map(|o| (o.clone(), false)).chain([
                (name.clone(), true),
                (format!("\\u0061{}", &name[1..]), true),
            ]) {
                for line in [
                    format!(r#"{{"p":{{"{member}":1}}}}"#),
                    format!(r#"{{"p":{{"{member}":1,"zzzzzzzzzzzzzzzz":2}},"q":3}}"#),
                ] {
                    let f = d.decode(line.as_bytes()).unwrap();
                    assert_eq!(f.get(0).kind == Kind::Number, found, "{line}");
                }
            }
        }
    }

    /// The next number of a xorshift sequence (the tests' random digits, the same every run).
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn random_digits(x: &mut u64, len: usize) -> String {
        (0..len)
            .map(|_| char::from(b'0' + (xorshift(x) % 10) as u8))
            .collect()
    }

    #[test]
    fn integers_of_every_length_parse_as_the_standard_library_does() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 1..=20usize {
            for round in 0..200 {
                // Runs of 9s and a leading 0 at the edges, then random digits.
                let text = match round {
                    0 => "9".repeat(len),
                    1 => format!("0{}", "9".repeat(len - 1)),
                    _ => random_digits(&mut x, len),
                };
                for t in [text.clone(), format!("-{text}")] {
                    assert_eq!(parse_i64(t.as_bytes()), t.parse::<i64>().ok(), "{t}");
                }
            }
        }
    }

    #[test]
    fn decimals_parse_as_the_standard_library_does() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for len in 1..=18usize {
            for round in 0..300 {
                let mut text = random_digits(&mut x, len);
                let dot = xorshift(&mut x) as usize % (len + 1);
                if dot > 0 && dot < len {
                    text.insert(dot, '.');
                }
                if round % 7 == 0 {
                    text.push_str("e-3");
                }
                for t in [text.clone(), format!("-{text}")] {
                    assert_eq!(parse_f64(t.as_bytes()), t.parse::<f64>().ok(), "{t}");
                }
            }
        }
    }

    #[test]
    fn finds_each_path_once_with_its_kind_and_text() {
        let mut d = decoder(&["a", "b.c", "b", "e", "n", "arr", "s"]);
        let f = d
            .decode(br#"{"a":-1.5e3,"b":{"c":"x\ty","z":[1]},"e":true,"n":null,"arr":[1,{"q":2}],"s":"\u00e9"}"#)
            .unwrap();
        let k = |i| (f.get(i).kind, f.get(i).text().unwrap().to_string());
        assert_eq!(k(0), (Kind::Number, "-1.5e3".into()));
        assert!(!f.get(0).integer);
        assert_eq!(k(1), (Kind::String, "x\ty".into()));
        assert_eq!(k(2), (Kind::Object, r#"{"c":"x\ty","z":[1]}"#.into()));
        assert_eq!(k(3), (Kind::Bool, "true".into()));
        assert_eq!(k(4), (Kind::Null, "null".into()));
        assert_eq!(k(5), (Kind::Array, r#"[1,{"q":2}]"#.into()));
        assert_eq!(k(6), (Kind::String, "é".into()));
        let f = d.decode(br#"{"a":1,"a":2}"#).unwrap();
        assert!(f.get(0).duplicate && f.get(0).integer);
        assert_eq!(f.get(1).kind, Kind::Missing);
    }

    #[test]
    fn surrogates_must_come_in_pairs_anywhere() {
        let mut d = decoder(&["key"]);
        assert!(d.decode(br#"{"key":"a","x":"\ud83d\ude00"}"#).is_ok());
        let unpaired: Result<(), DecodeError> = Err(UNPAIRED_SURROGATE);
        assert_eq!(
            d.decode(br#"{"key":"a","x":"\ud800"}"#).err(),
            unpaired.err()
        );
        assert_eq!(
            d.decode(br#"{"key":"a","x":"\udc00"}"#).err(),
            unpaired.err()
        );
        assert_eq!(d.decode(br#"{"key":"\ud800x"}"#).err(), unpaired.err());
        assert_eq!(d.decode(br#"{"key":"\ud800\u0041"}"#).err(), unpaired.err());
    }

    #[test]
    fn the_lowest_special_bit_is_the_first_byte_a_string_must_look_at() {
        let special = |b: u8| b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b);
        // Bytes next to every class boundary, so borrows between neighbours are covered.
        let edge = [
            0x00, 0x01, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7f, 0x80, 0x9f, 0xa0,
            0xff, b'a',
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..400_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Half the words from the edge bytes only, half with random bytes.
            let w = if n % 2 == 0 {
                u64::from_le_bytes(std::array::from_fn(|i| {
                    edge[((x >> (i * 4)) & 15) as usize]
                }))
            } else {
                x
            };
            let first = w.to_le_bytes().iter().position(|&b| special(b));
            let got = special_bytes(w);
            match first {
                None => assert_eq!(got, 0, "{w:#018x}"),
                Some(p) => assert_eq!(got.trailing_zeros() / 8, p as u32, "{w:#018x}"),
            }
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_recursing_forever() {
        let mut d = decoder(&["key"]);
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(d.decode(deep.as_bytes()).err(), Some(DecodeError::TooDeep));
        let fine = format!(
            "{{\"a\":{}1{},\"key\":\"k\"}}",
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(d.decode(fine.as_bytes()).unwrap().get(0).bytes, b"k");
    }

    #[test]
    fn agrees_with_serde_json_on_what_is_json() {
        let cases: &[&[u8]] = &[
            br#"{"key":"a","event_time_ms":1,"x":[1,2,{"y":-0.5e-3}],"z":"\u0041"}"#,
            br#"{"key":"a","event_time_ms":1,"x":[1,2,]}"#,
            br#"{"key":"a","event_time_ms":1,"x":-}"#,
            br#"{"key":"a","event_time_ms":1,"x":1.}"#,
            br#"{"key":"a","event_time_ms":1,"x":"\x"}"#,
            br#"{"key":"a","event_time_ms":1,}"#,
            br#"{"key":"a","event_time_ms":1,"x":tru}"#,
            br#"{"key":"a" "event_time_ms":1}"#,
            br#"{"key":{"a":[}}"#,
        ];
        let mut d = decoder(&["key", "event_time_ms", "key.a"]);
        for c in cases {
            let serde_ok = serde_json::from_slice::<serde_json::Value>(c).is_ok();
            let ours = d.decode(c).is_ok();
            assert_eq!(serde_ok, ours, "{}", String::from_utf8_lossy(c));
        }
    }

    #[test]
    fn field_paths() {
        assert!(FieldPath::parse("").is_none());
        assert!(FieldPath::parse("a..b").is_none());
        assert!(FieldPath::parse(".a").is_none());
        assert_eq!(FieldPath::parse("a.b").unwrap().segments.len(), 2);
        assert_eq!(FieldPath::parse("a.b").unwrap().last_segment(), "b");
    }
}
