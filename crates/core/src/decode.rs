//! Decoding one message: the key, event time and value fields are read out of a JSON object in
//! a single pass, without building a JSON tree and without allocating, while the rest of the
//! message is still checked to be valid JSON (a message a JSON parser rejects is a dead letter).

/// Event times outside years 1..=9999 are rejected: they are almost always unit mistakes
/// (seconds or microseconds), and inside this range window arithmetic cannot overflow.
pub const MIN_EVENT_TIME_MS: i64 = -62_135_596_800_000;
pub const MAX_EVENT_TIME_MS: i64 = 253_402_300_799_999;

/// Deeper nesting than this is refused rather than recursed into.
pub const MAX_DEPTH: usize = 128;

/// A dotted path to a field, e.g. `payload.value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    segments: Vec<Box<[u8]>>,
}

impl FieldPath {
    /// `None` when the path is empty or has an empty segment (`a..b`, `.a`).
    pub fn parse(text: &str) -> Option<FieldPath> {
        if text.is_empty() || text.split('.').any(str::is_empty) {
            return None;
        }
        Some(FieldPath {
            text: text.to_string(),
            segments: text.split('.').map(|s| s.as_bytes().into()).collect(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Which of the three fields an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Key,
    Time,
    Value,
}

const KEY: usize = 0;
const TIME: usize = 1;
const VALUE: usize = 2;

/// Why a message was rejected. Cheap to build; the text is only made for dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    InvalidUtf8,
    NotJson(&'static str),
    NotObject,
    TooDeep,
    Missing(Field),
    Null(Field),
    WrongType(Field, &'static str),
    OutOfRange(Field),
    Duplicate(Field),
    KeyNotUtf8,
}

/// The result of a successful decode. `key` is `None` when the message has no key field (the
/// Kafka source then falls back to the message key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decoded<'a> {
    pub key: Option<&'a str>,
    pub event_time_ms: i64,
    pub value: Option<f64>,
}

pub struct Decoder {
    paths: [FieldPath; 3],
    /// Unescaped key text, reused between messages.
    key_buf: String,
    /// Unescaped member names that had to be compared with a path segment.
    name_buf: Vec<u8>,
}

/// Where the key's text is: inside the message, or unescaped into `key_buf`.
#[derive(Clone, Copy)]
enum KeySpan {
    Raw(usize, usize),
    Unescaped,
}

struct Found {
    seen: u8,
    key: Option<KeySpan>,
    time: i64,
    value: Option<f64>,
}

impl Decoder {
    pub fn new(key: FieldPath, time: FieldPath, value: FieldPath) -> Decoder {
        Decoder {
            paths: [key, time, value],
            key_buf: String::new(),
            name_buf: Vec::new(),
        }
    }

    pub fn field_name(&self, field: Field) -> &str {
        self.paths[field as usize].as_str()
    }

    /// Decodes one message. Fails with the first problem found.
    pub fn decode<'a>(&'a mut self, raw: &'a [u8]) -> Result<Decoded<'a>, DecodeError> {
        // Outside strings, valid JSON is ASCII (anything else is a syntax error); inside
        // strings, the scanner checks UTF-8 where a byte is not ASCII. So the message is UTF-8
        // once it has parsed.
        let mut found = Found {
            seen: 0,
            key: None,
            time: 0,
            value: None,
        };
        {
            let mut p = Parser {
                b: raw,
                i: 0,
                paths: &self.paths,
                key_buf: &mut self.key_buf,
                name_buf: &mut self.name_buf,
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
            p.object(0, 0b111, &mut found)?;
            p.ws();
            if p.i != p.b.len() {
                return Err(DecodeError::NotJson(
                    "unexpected characters after the JSON object",
                ));
            }
        }
        if found.seen & (1 << TIME) == 0 {
            return Err(DecodeError::Missing(Field::Time));
        }
        let key = match found.key {
            // The span was checked to be UTF-8 by the string scanner, or is a number.
            Some(KeySpan::Raw(s, e)) => {
                Some(std::str::from_utf8(&raw[s..e]).map_err(|_| DecodeError::InvalidUtf8)?)
            }
            Some(KeySpan::Unescaped) => Some(self.key_buf.as_str()),
            None => None,
        };
        Ok(Decoded {
            key,
            event_time_ms: found.time,
            value: found.value,
        })
    }

    /// The dead-letter reason for an error, naming the field path it is about.
    pub fn describe(&self, err: DecodeError) -> String {
        let name = |f: Field| self.field_name(f).to_string();
        let what = |f: Field| match f {
            Field::Key => "key",
            Field::Time => "event time",
            Field::Value => "value",
        };
        match err {
            DecodeError::Empty => "empty message".to_string(),
            DecodeError::InvalidUtf8 => "not JSON: invalid UTF-8".to_string(),
            DecodeError::NotJson(why) => format!("not JSON: {why}"),
            DecodeError::NotObject => "not a JSON object".to_string(),
            DecodeError::TooDeep => format!("not accepted: JSON nested deeper than {MAX_DEPTH} levels"),
            DecodeError::Missing(f) => format!("missing {} field '{}'", what(f), name(f)),
            DecodeError::Null(f) => format!("{} field '{}' is null", what(f), name(f)),
            DecodeError::WrongType(f, why) => {
                format!("{} field '{}' {}", what(f), name(f), why)
            }
            DecodeError::OutOfRange(Field::Time) => format!(
                "event time field '{}' is out of range (must be epoch milliseconds between {} and {})",
                name(Field::Time),
                MIN_EVENT_TIME_MS,
                MAX_EVENT_TIME_MS
            ),
            DecodeError::OutOfRange(f) => format!(
                "{} field '{}' is out of range (not a finite double)",
                what(f),
                name(f)
            ),
            DecodeError::Duplicate(f) => {
                format!("{} field '{}' appears more than once", what(f), name(f))
            }
            DecodeError::KeyNotUtf8 => {
                "missing key: no key field and the message key is not valid UTF-8".to_string()
            }
        }
    }
}

struct Parser<'a, 'b> {
    b: &'a [u8],
    i: usize,
    paths: &'b [FieldPath; 3],
    key_buf: &'b mut String,
    name_buf: &'b mut Vec<u8>,
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

    /// Parses an object whose members may hold the fields in `active` (a bit per field whose
    /// path matched every enclosing member name so far).
    fn object(&mut self, depth: usize, active: u8, found: &mut Found) -> Result<(), DecodeError> {
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
                self.target(leaf, found)?;
            } else if deeper != 0 && self.peek() == Some(b'{') {
                self.object(depth + 1, deeper, found)?;
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
    fn match_name(&mut self, name: Str, depth: usize, active: u8) -> (u8, u8) {
        let raw: &[u8] = if name.escaped {
            self.name_buf.clear();
            if unescape_into(&self.b[name.start..name.end], self.name_buf).is_err() {
                return (0, 0);
            }
            self.name_buf
        } else {
            &self.b[name.start..name.end]
        };
        let (mut leaf, mut deeper) = (0u8, 0u8);
        for (f, path) in self.paths.iter().enumerate() {
            if active & (1 << f) == 0 {
                continue;
            }
            if path.segments.get(depth).is_some_and(|s| &s[..] == raw) {
                if depth + 1 == path.segments.len() {
                    leaf |= 1 << f;
                } else {
                    deeper |= 1 << f;
                }
            }
        }
        (leaf, deeper)
    }

    /// Reads the value of a member that is one (or more) of the fields.
    fn target(&mut self, fields: u8, found: &mut Found) -> Result<(), DecodeError> {
        for f in 0..3 {
            if fields & (1 << f) != 0 && found.seen & (1 << f) != 0 {
                return Err(DecodeError::Duplicate(field_of(f)));
            }
        }
        found.seen |= fields;
        match self.peek() {
            Some(b'"') => {
                let s = self.string()?;
                if fields & (1 << TIME) != 0 {
                    return Err(DecodeError::WrongType(
                        Field::Time,
                        "is a string, not an integer",
                    ));
                }
                if fields & (1 << VALUE) != 0 {
                    return Err(DecodeError::WrongType(
                        Field::Value,
                        "is a string, not a number",
                    ));
                }
                found.key = Some(if s.escaped {
                    let mut bytes = std::mem::take(self.key_buf).into_bytes();
                    bytes.clear();
                    unescape_into(&self.b[s.start..s.end], &mut bytes).map_err(|_| {
                        DecodeError::WrongType(Field::Key, "has an invalid \\u escape")
                    })?;
                    *self.key_buf = String::from_utf8(bytes).map_err(|_| {
                        DecodeError::WrongType(Field::Key, "has an invalid \\u escape")
                    })?;
                    KeySpan::Unescaped
                } else {
                    KeySpan::Raw(s.start, s.end)
                });
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => {
                let (start, end, integer) = self.number()?;
                let text = &self.b[start..end];
                if fields & (1 << TIME) != 0 {
                    if !integer {
                        return Err(DecodeError::WrongType(
                            Field::Time,
                            "is not an integer (epoch milliseconds)",
                        ));
                    }
                    let t = parse_i64(text).ok_or(DecodeError::OutOfRange(Field::Time))?;
                    if !(MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&t) {
                        return Err(DecodeError::OutOfRange(Field::Time));
                    }
                    found.time = t;
                }
                if fields & (1 << VALUE) != 0 {
                    let v = parse_f64(text).ok_or(DecodeError::NotJson("invalid number"))?;
                    if !v.is_finite() {
                        return Err(DecodeError::OutOfRange(Field::Value));
                    }
                    found.value = Some(v);
                }
                if fields & (1 << KEY) != 0 {
                    found.key = Some(KeySpan::Raw(start, end));
                }
                Ok(())
            }
            Some(b'n') => {
                self.literal(b"null")?;
                if fields & (1 << KEY) != 0 {
                    return Err(DecodeError::Null(Field::Key));
                }
                if fields & (1 << TIME) != 0 {
                    return Err(DecodeError::Null(Field::Time));
                }
                // A null value is a message without a value: counted, adds nothing.
                Ok(())
            }
            Some(c) => {
                let kind = match c {
                    b't' | b'f' => "is a boolean",
                    b'{' => "is an object",
                    b'[' => "is an array",
                    _ => return Err(DecodeError::NotJson("expected a value")),
                };
                let field = if fields & (1 << TIME) != 0 {
                    Field::Time
                } else if fields & (1 << VALUE) != 0 {
                    Field::Value
                } else {
                    Field::Key
                };
                // The message is rejected either way; a syntax error inside wins, since
                // "not JSON" is the more useful reason.
                self.skip_value(1)?;
                Err(DecodeError::WrongType(field, kind))
            }
            None => Err(NOT_JSON_EOF),
        }
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
            // Skip 8 plain bytes at a time: none is '"', '\\', a control character or non-ASCII.
            while let Some(chunk) = self.b.get(self.i..self.i + 8) {
                let w = u64::from_le_bytes([
                    chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
                ]);
                if special_byte(w) {
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

fn field_of(f: usize) -> Field {
    match f {
        KEY => Field::Key,
        TIME => Field::Time,
        _ => Field::Value,
    }
}

/// Whether any of the 8 bytes in `w` needs a look inside a string: '"', '\\', a control
/// character (< 0x20) or a non-ASCII byte.
#[inline]
fn special_byte(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let quote = has_zero(w ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(w ^ (ONES * u64::from(b'\\')));
    // A byte below 0x20 borrows when 0x20 is subtracted (for bytes without the high bit).
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    (quote | backslash | control | (w & HIGH)) != 0
}

/// Parses a JSON integer literal; `None` when it does not fit in an i64.
fn parse_i64(text: &[u8]) -> Option<i64> {
    let (neg, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.len() <= 18 {
        // Cannot overflow: no checks per digit.
        let v = digits
            .iter()
            .fold(0i64, |v, &d| v * 10 + i64::from(d - b'0'));
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

/// Exact powers of ten as doubles.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Parses a validated JSON number. Short decimals (at most 15 digits, no exponent) take the
/// exact fast path: an integer below 2^53 divided by an exact power of ten is correctly rounded.
fn parse_f64(text: &[u8]) -> Option<f64> {
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

    fn decoder() -> Decoder {
        Decoder::new(
            FieldPath::parse("key").unwrap(),
            FieldPath::parse("event_time_ms").unwrap(),
            FieldPath::parse("payload.value").unwrap(),
        )
    }

    fn ok(line: &str) -> (Option<String>, i64, Option<f64>) {
        let mut d = decoder();
        let r = d.decode(line.as_bytes()).unwrap();
        (r.key.map(str::to_string), r.event_time_ms, r.value)
    }

    fn err(line: &[u8]) -> String {
        let mut d = decoder();
        let e = d.decode(line).unwrap_err();
        d.describe(e)
    }

    #[test]
    fn reads_the_predecessor_format() {
        let (k, t, v) =
            ok(r#"{"key":"k1","event_time_ms":1700000000123,"payload":{"value":42.5}}"#);
        assert_eq!(k.as_deref(), Some("k1"));
        assert_eq!(t, 1_700_000_000_123);
        assert_eq!(v, Some(42.5));
    }

    #[test]
    fn fields_in_any_order_with_other_members_and_whitespace() {
        let (k, t, v) = ok(
            " { \"x\": [1, {\"key\": \"no\"}], \"payload\" : {\"a\":null, \"value\" : -1e2 } ,\r\n \"event_time_ms\" : -5, \"key\" : \"a\\\"b\" } ",
        );
        assert_eq!(k.as_deref(), Some("a\"b"));
        assert_eq!(t, -5);
        assert_eq!(v, Some(-100.0));
    }

    #[test]
    fn missing_or_null_value_is_not_an_error() {
        assert_eq!(ok(r#"{"key":"a","event_time_ms":1}"#).2, None);
        assert_eq!(
            ok(r#"{"key":"a","event_time_ms":1,"payload":{"value":null}}"#).2,
            None
        );
        assert_eq!(ok(r#"{"key":"a","event_time_ms":1,"payload":7}"#).2, None);
    }

    #[test]
    fn numeric_keys_keep_their_text() {
        assert_eq!(
            ok(r#"{"key":42,"event_time_ms":1}"#).0.as_deref(),
            Some("42")
        );
    }

    #[test]
    fn missing_key_is_reported_by_the_caller() {
        assert_eq!(ok(r#"{"event_time_ms":1}"#).0, None);
    }

    #[test]
    fn unicode_escapes_in_keys() {
        assert_eq!(
            ok(r#"{"key":"\u00e9\ud83d\ude00","event_time_ms":1}"#)
                .0
                .as_deref(),
            Some("é😀")
        );
        assert_eq!(
            ok(r#"{"k\u0065y":"x","event_time_ms":1}"#).0.as_deref(),
            Some("x")
        );
    }

    #[test]
    fn rejections_name_the_reason_and_field() {
        assert_eq!(err(b""), "empty message");
        assert_eq!(err(b"   "), "empty message");
        assert_eq!(err(b"not json"), "not JSON: expected a value");
        assert_eq!(err(b"[1,2]"), "not a JSON object");
        assert_eq!(
            err(b"{\"key\":\"a\""),
            "not JSON: unexpected end of message"
        );
        assert_eq!(
            err(b"{\"key\":\"a\",\"event_time_ms\":1} x"),
            "not JSON: unexpected characters after the JSON object"
        );
        assert_eq!(
            err(b"{\"key\":\"\xff\",\"event_time_ms\":1}"),
            "not JSON: invalid UTF-8"
        );
        assert_eq!(
            err(br#"{"key":"a"}"#),
            "missing event time field 'event_time_ms'"
        );
        assert_eq!(
            err(br#"{"key":null,"event_time_ms":1}"#),
            "key field 'key' is null"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":"1"}"#),
            "event time field 'event_time_ms' is a string, not an integer"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1.5}"#),
            "event time field 'event_time_ms' is not an integer (epoch milliseconds)"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1e3}"#),
            "event time field 'event_time_ms' is not an integer (epoch milliseconds)"
        );
        assert!(err(br#"{"key":"a","event_time_ms":99999999999999999999}"#)
            .starts_with("event time field 'event_time_ms' is out of range"));
        assert!(err(br#"{"key":"a","event_time_ms":253402300800000}"#).contains("out of range"));
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1,"payload":{"value":"x"}}"#),
            "value field 'payload.value' is a string, not a number"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1,"payload":{"value":true}}"#),
            "value field 'payload.value' is a boolean"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":1,"payload":{"value":1e999}}"#),
            "value field 'payload.value' is out of range (not a finite double)"
        );
        assert_eq!(
            err(br#"{"key":{"a":1},"event_time_ms":1}"#),
            "key field 'key' is an object"
        );
        assert_eq!(
            err(br#"{"key":"a","key":"b","event_time_ms":1}"#),
            "key field 'key' appears more than once"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":NaN}"#),
            "not JSON: expected a value"
        );
        assert_eq!(
            err(br#"{"key":"a","event_time_ms":01}"#),
            "not JSON: expected ',' or '}' in an object"
        );
        assert_eq!(
            err(b"{\"key\":\"a\tb\",\"event_time_ms\":1}"),
            "not JSON: unescaped control character in a string"
        );
    }

    #[test]
    fn surrogates_must_come_in_pairs_anywhere() {
        assert_eq!(
            ok(r#"{"key":"a","x":"\ud83d\ude00","event_time_ms":1}"#).1,
            1
        );
        let unpaired = "not JSON: invalid \\u escape in a string (unpaired surrogate)";
        assert_eq!(
            err(br#"{"key":"a","x":"\ud800","event_time_ms":1}"#),
            unpaired
        );
        assert_eq!(
            err(br#"{"key":"a","x":"\udc00","event_time_ms":1}"#),
            unpaired
        );
        assert_eq!(err(br#"{"key":"\ud800x","event_time_ms":1}"#), unpaired);
        assert_eq!(
            err(br#"{"key":"\ud800\u0041","event_time_ms":1}"#),
            unpaired
        );
    }

    #[test]
    fn deep_nesting_is_refused_without_recursing_forever() {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(err(deep.as_bytes()).contains("nested deeper"));
        let fine = format!(
            "{{\"a\":{}1{},\"key\":\"k\",\"event_time_ms\":3}}",
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(ok(&fine).1, 3);
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
        ];
        for c in cases {
            let serde_ok = serde_json::from_slice::<serde_json::Value>(c).is_ok();
            let mut d = decoder();
            let ours = d.decode(c);
            assert_eq!(
                serde_ok,
                ours.is_ok(),
                "{}: ours {:?}",
                String::from_utf8_lossy(c),
                ours
            );
        }
    }

    #[test]
    fn field_paths() {
        assert!(FieldPath::parse("").is_none());
        assert!(FieldPath::parse("a..b").is_none());
        assert!(FieldPath::parse(".a").is_none());
        assert_eq!(FieldPath::parse("a.b").unwrap().segments.len(), 2);
    }
}
