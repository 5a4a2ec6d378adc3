//! Typed columns (`columns := {...}`, as `read_json` takes them): the fields a job reads as
//! DuckDB types, each value converted as DuckDB converts that JSON value to the type (its JSON
//! reader's rules: `json_transform_strict`). The plain cases (an integer into an integer type, a
//! number into DOUBLE or a DECIMAL it fits, a string into VARCHAR, ...) are decided here, where
//! every DuckDB version decides them alike; any other value is asked of DuckDB itself (a
//! [`Resolver`]), so a value converts, or makes its message a dead letter, exactly when the host's
//! own reader says so.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::decode::{json_string, parse_f64, parse_i64, Field, FieldPath, Kind};
use crate::rows::ColumnType;
use crate::time::rfc3339_ms;

/// How a column's values travel to DuckDB, and become the column's type there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    Bool,
    /// An integer type within BIGINT, with its bounds.
    Int {
        min: i64,
        max: i64,
    },
    Double,
    /// VARCHAR: the string's content.
    Text,
    /// A DECIMAL: text DuckDB casts exactly.
    Decimal {
        width: u8,
        scale: u8,
    },
    /// HUGEINT, UBIGINT, UHUGEINT: an integer's text.
    WideInt {
        unsigned: bool,
    },
    /// Any other scalar type (dates, times, UUID, INTERVAL, FLOAT, ...): DuckDB's own text of the
    /// converted value, cast back (`CAST(x AS T)`).
    Cast,
    /// JSON, lists, arrays, structs, maps, unions: the value's JSON text, converted by DuckDB's
    /// JSON reader in SQL (`json_transform_strict`). `any`: every JSON value converts (JSON).
    Json {
        any: bool,
    },
}

impl Repr {
    /// The representation of a DuckDB type, given as DuckDB prints it (`typeof`).
    pub fn of(sql_type: &str) -> Repr {
        let t = sql_type.trim().to_ascii_uppercase();
        let int = |min: i64, max: i64| Repr::Int { min, max };
        match t.as_str() {
            "BOOLEAN" => Repr::Bool,
            "TINYINT" => int(i64::from(i8::MIN), i64::from(i8::MAX)),
            "SMALLINT" => int(i64::from(i16::MIN), i64::from(i16::MAX)),
            "INTEGER" => int(i64::from(i32::MIN), i64::from(i32::MAX)),
            "BIGINT" => int(i64::MIN, i64::MAX),
            "UTINYINT" => int(0, i64::from(u8::MAX)),
            "USMALLINT" => int(0, i64::from(u16::MAX)),
            "UINTEGER" => int(0, i64::from(u32::MAX)),
            "UBIGINT" | "UHUGEINT" => Repr::WideInt { unsigned: true },
            "HUGEINT" => Repr::WideInt { unsigned: false },
            "DOUBLE" => Repr::Double,
            "VARCHAR" => Repr::Text,
            "JSON" => Repr::Json { any: true },
            _ if t.ends_with(']')
                || t.starts_with("STRUCT(")
                || t.starts_with("MAP(")
                || t.starts_with("UNION(") =>
            {
                Repr::Json { any: false }
            }
            _ => match decimal(&t) {
                Some((width, scale)) => Repr::Decimal { width, scale },
                None => Repr::Cast,
            },
        }
    }

    /// The type the value has in a staged row.
    pub fn carried(self) -> ColumnType {
        match self {
            Repr::Bool => ColumnType::Boolean,
            Repr::Int { .. } => ColumnType::BigInt,
            Repr::Double => ColumnType::Double,
            _ => ColumnType::Varchar,
        }
    }

    /// Whether values of this representation can be a key (equal values have equal text).
    pub fn keyable(self) -> bool {
        !matches!(self, Repr::Json { .. })
    }
}

/// `DECIMAL(w,s)` → (w, s).
fn decimal(t: &str) -> Option<(u8, u8)> {
    let inner = t.strip_prefix("DECIMAL(")?.strip_suffix(')')?;
    let (w, s) = inner.split_once(',')?;
    let w: u8 = w.trim().parse().ok()?;
    let s: u8 = s.trim().parse().ok()?;
    (s <= w && w <= 38).then_some((w, s))
}

/// One typed column of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedColumn {
    pub path: FieldPath,
    /// Its SQL name (the path's last segment, or the `AS` name).
    pub name: String,
    /// The DuckDB type as DuckDB prints it.
    pub sql_type: String,
    pub repr: Repr,
    /// A missing or null value is the Kafka message key (as the parameter form's key falls
    /// back to it): the stream's `key` of a job written as SQL.
    pub message_key: bool,
}

impl TypedColumn {
    pub fn new(path: FieldPath, name: &str, sql_type: &str) -> TypedColumn {
        TypedColumn {
            path,
            name: name.to_string(),
            sql_type: sql_type.to_string(),
            repr: Repr::of(sql_type),
            message_key: false,
        }
    }

    /// The stream's `key` of a job written as SQL: the field at `path` as text, or the Kafka
    /// message key where the message has no such field (or it is null).
    pub fn message_key(path: FieldPath) -> TypedColumn {
        TypedColumn {
            message_key: true,
            ..TypedColumn::new(path, "key", "VARCHAR")
        }
    }

    /// How the column is shown in a job's settings: `'path AS name': 'TYPE'`.
    pub fn shown(&self) -> String {
        format!(
            "'{} AS {}': '{}'",
            self.path.as_str(),
            self.name,
            self.sql_type
        )
    }
}

/// A typed column's value as parsed, owned by its chunk (text as a range of the chunk's arena).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum OwnedTyped {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Text(u32, u32),
    /// Waiting for DuckDB's answer (the chunk is parsed again with it).
    Pending,
}

impl OwnedTyped {
    /// A value's text as a key column (see `columns::key_text`; text values are their text).
    pub(crate) fn key_text(self) -> String {
        match self {
            OwnedTyped::Bool(b) => b.to_string(),
            OwnedTyped::Int(i) => i.to_string(),
            OwnedTyped::Double(x) => (if x == 0.0 { 0.0 } else { x }).to_string(),
            _ => String::new(),
        }
    }
}

/// A value as converted, or waiting for DuckDB's answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Converted<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Text(Cow<'a, str>),
    /// Only DuckDB can tell: the value's JSON text.
    Ask(String),
    /// Cannot be read as JSON at all (binary data): why.
    Refused(&'static str),
}

/// Converts a field to a column's type where that is certain (see the module's documentation).
pub(crate) fn convert<'a>(repr: Repr, f: &Field<'a>) -> Converted<'a> {
    let text = |b: &'a [u8]| Cow::Borrowed(std::str::from_utf8(b).unwrap_or_default());
    match f.kind {
        Kind::Missing | Kind::Null => return Converted::Null,
        Kind::Bytes => return Converted::Refused("is binary data"),
        _ => {}
    }
    // An Avro or Protobuf timestamp type (epoch milliseconds) into a date or time type is that
    // instant, as DuckDB's reader takes it from RFC 3339 text.
    if f.timestamp && repr == Repr::Cast {
        if let Some(ms) = parse_i64(f.bytes) {
            return Converted::Ask(format!("\"{}\"", rfc3339_ms(ms)));
        }
    }
    let number = f.kind == Kind::Number && !f.bytes.is_empty();
    let plain = number && !f.bytes.iter().any(|&c| c == b'e' || c == b'E');
    match repr {
        Repr::Bool if f.kind == Kind::Bool => return Converted::Bool(f.bytes == b"true"),
        // (An integer beyond 64 bits is a number DuckDB's reader refuses to make a BOOLEAN.)
        Repr::Bool if number && f.integer && parse_i64(f.bytes).is_some() => {
            return Converted::Bool(f.bytes.iter().any(|&c| (b'1'..=b'9').contains(&c)))
        }
        Repr::Int { min, max } if number && f.integer => {
            if let Some(v) = parse_i64(f.bytes).filter(|v| (min..=max).contains(v)) {
                return Converted::Int(v);
            }
        }
        Repr::Double if f.kind == Kind::Number => {
            let v = match f.number {
                Some(x) => Some(x),
                None => parse_f64(f.bytes),
            };
            if let Some(v) = v {
                return Converted::Double(v);
            }
        }
        Repr::Text if f.kind == Kind::String => return Converted::Text(text(f.bytes)),
        // (A record, map or array of a binary format has no JSON text of its own: it is
        // rendered, as for the other JSON-read types.)
        Repr::Json { any: true }
            if matches!(f.kind, Kind::Object | Kind::Array) && f.bytes.is_empty() =>
        {
            return Converted::Ask(String::new())
        }
        Repr::Json { any: true } => return Converted::Text(Cow::Owned(json_text(f))),
        Repr::Decimal { width, scale } if plain => {
            if let Some(d) = decimal_text(f.bytes, width, scale) {
                return Converted::Text(Cow::Owned(d));
            }
        }
        Repr::WideInt { unsigned } if number && f.integer => {
            let t = std::str::from_utf8(f.bytes).unwrap_or_default();
            let fits = if unsigned {
                t.parse::<u64>().is_ok()
            } else {
                t.parse::<i128>().is_ok()
            };
            if fits {
                return Converted::Text(Cow::Owned(if t == "-0" { "0".into() } else { t.into() }));
            }
        }
        _ => {}
    }
    Converted::Ask(json_text(f))
}

/// The field as JSON text (a string is quoted and escaped again); empty for a record, map or
/// array of a binary format, which has no text of its own (see `parse`, which renders it).
pub(crate) fn json_text(f: &Field<'_>) -> String {
    match f.kind {
        Kind::String => {
            let s = std::str::from_utf8(f.bytes).unwrap_or_default();
            let mut out = String::with_capacity(s.len() + 2);
            json_string(s, &mut out);
            out
        }
        Kind::Missing | Kind::Null => "null".into(),
        Kind::Object | Kind::Array if f.bytes.is_empty() => String::new(),
        _ if f.bytes.is_empty() => f.number.map_or_else(|| "null".into(), |x| x.to_string()),
        _ => String::from_utf8_lossy(f.bytes).into_owned(),
    }
}

/// A plain decimal literal as an exact DECIMAL(width, scale) (its digits padded to the scale),
/// when it fits without rounding and is short enough that every DuckDB version reads it alike
/// (1.5 and earlier read a JSON number through a double: 15 significant digits survive that).
fn decimal_text(lit: &[u8], width: u8, scale: u8) -> Option<String> {
    let s = std::str::from_utf8(lit).ok()?;
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let int = int.trim_start_matches('0');
    let frac_digits = frac.trim_end_matches('0');
    if frac_digits.len() > usize::from(scale)
        || int.len() > usize::from(width - scale)
        || int.len() + frac_digits.len() > 15
    {
        return None;
    }
    let zero = int.is_empty() && frac_digits.is_empty();
    let mut out = String::with_capacity(int.len() + usize::from(scale) + 3);
    if neg && !zero {
        out.push('-');
    }
    out.push_str(if int.is_empty() { "0" } else { int });
    if scale > 0 {
        out.push('.');
        out.push_str(frac_digits);
        for _ in frac_digits.len()..usize::from(scale) {
            out.push('0');
        }
    }
    Some(out)
}

/// DuckDB's answer for a value it was asked about, as the value the column carries: its text
/// (DuckDB's `CAST(... AS VARCHAR)` of the converted value) read back, or `None` when the text
/// does not read as the representation says (a bug).
pub(crate) fn from_answer(repr: Repr, json: &str, answer: &str) -> Option<Converted<'static>> {
    Some(match repr {
        Repr::Bool => Converted::Bool(match answer {
            "true" => true,
            "false" => false,
            _ => return None,
        }),
        Repr::Int { .. } => Converted::Int(answer.parse().ok()?),
        Repr::Double => Converted::Double(answer.parse().ok()?),
        // A nested value is converted again in SQL, from its JSON (the same answer).
        Repr::Json { .. } => Converted::Text(Cow::Owned(json.to_string())),
        _ => Converted::Text(Cow::Owned(answer.to_string())),
    })
}

/// DuckDB's conversion of JSON values to a type, for the values this module cannot decide.
pub trait Resolver: Send + Sync {
    /// For each JSON text, the converted value's text (`CAST(... AS VARCHAR)`), or DuckDB's error
    /// message when it does not convert. An `Err` of the whole call fails the run.
    fn resolve(&self, sql_type: &str, json: &[&str])
        -> Result<Vec<Result<String, String>>, String>;
}

/// The resolver a job asks (the adapter's DuckDB connection); equal to any other, so that a
/// configuration compares by its settings alone.
#[derive(Clone, Default)]
pub struct ResolverHandle(pub Option<Arc<dyn Resolver>>);

impl PartialEq for ResolverHandle {
    fn eq(&self, _: &ResolverHandle) -> bool {
        true
    }
}

impl Eq for ResolverHandle {}

impl fmt::Debug for ResolverHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Resolver"
        } else {
            "NoResolver"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(kind: Kind, bytes: &str, integer: bool) -> Field<'_> {
        Field {
            kind,
            bytes: bytes.as_bytes(),
            integer,
            duplicate: false,
            timestamp: false,
            number: None,
        }
    }

    fn num(s: &str) -> Field<'_> {
        let integer = !s.contains(['.', 'e', 'E']);
        field(Kind::Number, s, integer)
    }

    #[test]
    fn types_map_to_their_representation() {
        assert_eq!(
            Repr::of("BIGINT"),
            Repr::Int {
                min: i64::MIN,
                max: i64::MAX
            }
        );
        assert_eq!(Repr::of("utinyint"), Repr::Int { min: 0, max: 255 });
        assert_eq!(
            Repr::of("DECIMAL(18,2)"),
            Repr::Decimal {
                width: 18,
                scale: 2
            }
        );
        assert_eq!(Repr::of("INTEGER[]"), Repr::Json { any: false });
        assert_eq!(
            Repr::of("STRUCT(a INTEGER, b VARCHAR[])"),
            Repr::Json { any: false }
        );
        assert_eq!(Repr::of("MAP(VARCHAR, INTEGER)"), Repr::Json { any: false });
        assert_eq!(Repr::of("JSON"), Repr::Json { any: true });
        assert_eq!(Repr::of("TIMESTAMP WITH TIME ZONE"), Repr::Cast);
        assert_eq!(Repr::of("HUGEINT"), Repr::WideInt { unsigned: false });
        assert_eq!(Repr::of("VARCHAR").carried(), ColumnType::Varchar);
        assert!(!Repr::of("INTEGER[]").keyable());
    }

    #[test]
    fn plain_values_convert_here_and_the_rest_is_asked() {
        let int = Repr::of("INTEGER");
        assert_eq!(convert(int, &num("42")), Converted::Int(42));
        assert_eq!(convert(int, &num("-7")), Converted::Int(-7));
        // Out of range, fractions, strings: DuckDB decides (it rounds 1.5 to 2, reads " 42 ").
        assert_eq!(
            convert(int, &num("2147483648")),
            Converted::Ask("2147483648".into())
        );
        assert_eq!(convert(int, &num("1.5")), Converted::Ask("1.5".into()));
        assert_eq!(
            convert(int, &field(Kind::String, "4\"2", false)),
            Converted::Ask("\"4\\\"2\"".into())
        );
        assert_eq!(convert(int, &field(Kind::Null, "", false)), Converted::Null);
        assert_eq!(
            convert(int, &field(Kind::Missing, "", false)),
            Converted::Null
        );

        let dbl = Repr::Double;
        assert_eq!(convert(dbl, &num("1.25")), Converted::Double(1.25));
        assert_eq!(
            convert(dbl, &num("1e400")),
            Converted::Double(f64::INFINITY)
        );
        assert!(matches!(
            convert(dbl, &field(Kind::String, "1.5", false)),
            Converted::Ask(_)
        ));

        let b = Repr::Bool;
        assert_eq!(
            convert(b, &field(Kind::Bool, "true", false)),
            Converted::Bool(true)
        );
        assert_eq!(convert(b, &num("0")), Converted::Bool(false));
        assert_eq!(convert(b, &num("-0")), Converted::Bool(false));
        assert_eq!(convert(b, &num("3")), Converted::Bool(true));
        assert!(matches!(convert(b, &num("0.5")), Converted::Ask(_)));
        assert!(matches!(
            convert(b, &num("18446744073709551616")),
            Converted::Ask(_)
        ));

        let txt = Repr::Text;
        assert_eq!(
            convert(txt, &field(Kind::String, "ab", false)),
            Converted::Text("ab".into())
        );
        // DuckDB writes a number read as VARCHAR its own way (1e3 is '1000.0').
        assert!(matches!(convert(txt, &num("1e3")), Converted::Ask(_)));

        let json = Repr::of("JSON");
        assert_eq!(
            convert(json, &field(Kind::Object, "{\"a\":1}", false)),
            Converted::Text("{\"a\":1}".into())
        );
        assert!(matches!(
            convert(Repr::of("DATE"), &field(Kind::String, "2024-01-02", false)),
            Converted::Ask(_)
        ));
        assert_eq!(
            convert(int, &field(Kind::Bytes, "\u{1}", false)),
            Converted::Refused("is binary data")
        );
    }

    #[test]
    fn decimals_convert_exactly_when_no_rounding_is_needed() {
        let d = Repr::of("DECIMAL(6,2)");
        let t = |s: &str| match convert(d, &num(s)) {
            Converted::Text(t) => Some(t.into_owned()),
            _ => None,
        };
        assert_eq!(t("19.9").as_deref(), Some("19.90"));
        assert_eq!(t("19.90").as_deref(), Some("19.90"));
        assert_eq!(t("-0.5").as_deref(), Some("-0.50"));
        assert_eq!(t("-0.00").as_deref(), Some("0.00"));
        assert_eq!(t("1234").as_deref(), Some("1234.00"));
        assert_eq!(t("0").as_deref(), Some("0.00"));
        // Rounding, too wide, exponents: DuckDB decides.
        assert_eq!(t("1.005"), None);
        assert_eq!(t("12345"), None);
        assert_eq!(t("1e2"), None);
        let wide = Repr::of("DECIMAL(38,2)");
        assert!(matches!(
            convert(wide, &num("1234567890123456.78")),
            Converted::Ask(_)
        ));
        assert_eq!(decimal_text(b"7", 3, 0).as_deref(), Some("7"));
    }

    #[test]
    fn a_binary_formats_timestamp_is_an_instant_for_a_time_type() {
        let mut f = num("1700000000123");
        f.timestamp = true;
        assert_eq!(
            convert(Repr::Cast, &f),
            Converted::Ask("\"2023-11-14T22:13:20.123Z\"".into())
        );
        assert_eq!(
            convert(Repr::of("BIGINT"), &f),
            Converted::Int(1_700_000_000_123)
        );
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn answers_read_back() {
        assert_eq!(
            from_answer(Repr::Double, "\"1e3\"", "1000.0"),
            Some(Converted::Double(1000.0))
        );
        assert_eq!(
            from_answer(Repr::Double, "\"inf\"", "inf"),
            Some(Converted::Double(f64::INFINITY))
        );
        assert_eq!(
            from_answer(Repr::of("INTEGER[]"), "[1,\"2\"]", "[1, 2]"),
            Some(Converted::Text("[1,\"2\"]".into()))
        );
        assert_eq!(from_answer(Repr::Bool, "1", "yes"), None);
    }
}
