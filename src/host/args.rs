//! The arguments of a table-function call, copied out of DuckDB at bind time into plain values
//! ([`Arg`]) behind a small trait, so that parameter parsing is tested without DuckDB.

#[cfg(not(feature = "capi-v1-2"))]
use duckdb::core::LogicalTypeId;
#[cfg(not(feature = "capi-v1-2"))]
use duckdb::vtab::{BindInfo, Value};

/// An argument value.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Null,
    Bool(bool),
    Int(i64),
    Text(String),
    List(Vec<Arg>),
    Map(Vec<(Arg, Arg)>),
}

/// Arguments of a table-function call, as seen at bind time.
pub trait Args {
    /// The positional argument at `idx` (None when absent).
    fn positional(&self, idx: usize) -> Option<Arg>;
    /// A named argument (None when not given).
    fn named(&self, name: &str) -> Option<Arg>;
    /// A setting of the calling connection (`SET name = ...`); only names that exist may be
    /// asked for (the extension's own and DuckDB's built-in ones).
    fn setting(&self, name: &str) -> Option<Arg>;
}

/// How a value is shown in an error message.
pub fn shown(a: &Arg) -> String {
    match a {
        Arg::Null => "NULL".into(),
        Arg::Bool(b) => b.to_string(),
        Arg::Int(i) => i.to_string(),
        Arg::Text(s) => format!("'{s}'"),
        Arg::List(items) => format!(
            "[{}]",
            items.iter().map(shown).collect::<Vec<_>>().join(", ")
        ),
        Arg::Map(items) => format!(
            "{{{}}}",
            items
                .iter()
                .map(|(k, v)| format!("{}: {}", shown(k), shown(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(not(feature = "capi-v1-2"))]
fn arg_of(v: &Value) -> Arg {
    if v.is_null() {
        return Arg::Null;
    }
    match v.logical_type_id() {
        LogicalTypeId::Boolean => Arg::Bool(v.to_bool()),
        LogicalTypeId::Tinyint
        | LogicalTypeId::Smallint
        | LogicalTypeId::Integer
        | LogicalTypeId::Bigint
        | LogicalTypeId::UTinyint
        | LogicalTypeId::USmallint
        | LogicalTypeId::UInteger => Arg::Int(v.to_int64()),
        LogicalTypeId::List => match v.to_list() {
            Some(items) => Arg::List(items.iter().map(arg_of).collect()),
            None => Arg::Null,
        },
        // The `duckdb` crate cannot walk a MAP value; its text form (DuckDB's cast to VARCHAR)
        // quotes and escapes whatever would be ambiguous, so it is parsed back exactly.
        LogicalTypeId::Map => match parse_map_text(&v.to_string()) {
            Some(entries) => Arg::Map(entries),
            None => Arg::Text(v.to_string()),
        },
        _ => Arg::Text(v.to_string()),
    }
}

/// Parses DuckDB's text form of a `MAP(VARCHAR, VARCHAR)`: `{k=v, k2='v, 2'}`, where a key or
/// value that is empty, has a special character (`,=:{}[]'"\`) or leading/trailing space, or
/// reads `NULL`, is in single quotes with `\` escaping `'` and `\`; an unquoted `NULL` is SQL NULL.
pub fn parse_map_text(text: &str) -> Option<Vec<(Arg, Arg)>> {
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    let chars: Vec<char> = inner.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < chars.len() {
        let k = text_token(&chars, &mut i, &['='])?;
        if chars.get(i) != Some(&'=') {
            return None;
        }
        i += 1;
        let v = text_token(&chars, &mut i, &[','])?;
        out.push((k, v));
        if !next_item(&chars, &mut i)? {
            break;
        }
    }
    Some(out)
}

/// Parses DuckDB's text form of a list (`[a, 'b, c', NULL]`), quoted as a MAP's entries are;
/// the items are text (or NULL), for the caller to read by the list's type.
#[cfg_attr(not(feature = "capi-v1-2"), allow(dead_code))]
pub fn parse_list_text(text: &str) -> Option<Vec<Arg>> {
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    let chars: Vec<char> = inner.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < chars.len() {
        out.push(text_token(&chars, &mut i, &[','])?);
        if !next_item(&chars, &mut i)? {
            break;
        }
    }
    Some(out)
}

/// One key, value or item of DuckDB's text form, up to a `stop` character.
fn text_token(chars: &[char], i: &mut usize, stop: &[char]) -> Option<Arg> {
    if chars.get(*i) == Some(&'\'') {
        *i += 1;
        let mut s = String::new();
        loop {
            match chars.get(*i)? {
                '\\' => {
                    s.push(*chars.get(*i + 1)?);
                    *i += 2;
                }
                '\'' => {
                    *i += 1;
                    return Some(Arg::Text(s));
                }
                c => {
                    s.push(*c);
                    *i += 1;
                }
            }
        }
    }
    let start = *i;
    while *i < chars.len() && !stop.contains(&chars[*i]) {
        *i += 1;
    }
    let s: String = chars[start..*i].iter().collect();
    Some(if s == "NULL" { Arg::Null } else { Arg::Text(s) })
}

/// Steps over the `, ` between items: Some(true) when another follows, Some(false) at the end.
fn next_item(chars: &[char], i: &mut usize) -> Option<bool> {
    match (chars.get(*i), chars.get(*i + 1)) {
        (None, _) => Some(false),
        (Some(','), Some(' ')) => {
            *i += 2;
            Some(true)
        }
        _ => None,
    }
}

/// (DuckDB 1.4 reads arguments its own way: `lts_args.rs`.)
#[cfg(not(feature = "capi-v1-2"))]
impl Args for BindInfo {
    fn positional(&self, idx: usize) -> Option<Arg> {
        if idx as u64 >= self.get_parameter_count() {
            return None;
        }
        Some(arg_of(&self.get_parameter(idx as u64)))
    }

    fn named(&self, name: &str) -> Option<Arg> {
        self.get_named_parameter(name).map(|v| arg_of(&v))
    }

    fn setting(&self, name: &str) -> Option<Arg> {
        self.get_config_option(name).map(|v| arg_of(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Arg {
        Arg::Text(s.into())
    }

    #[test]
    fn map_text_is_parsed_back_exactly() {
        // What DuckDB prints for MAP {'security.protocol': 'SASL_SSL', 'a=b': 'it''s', ...}.
        let got = parse_map_text(
            r"{security.protocol=SASL_SSL, 'a=b'='it\'s', c=NULL, d='NULL', e='', f=sp ace, g='x, y=z', h='back\\'}",
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                (t("security.protocol"), t("SASL_SSL")),
                (t("a=b"), t("it's")),
                (t("c"), Arg::Null),
                (t("d"), t("NULL")),
                (t("e"), t("")),
                (t("f"), t("sp ace")),
                (t("g"), t("x, y=z")),
                (t("h"), t("back\\")),
            ]
        );
        assert_eq!(parse_map_text("{}").unwrap(), vec![]);
        assert!(parse_map_text("{a}").is_none());
        assert!(parse_map_text("{a='x}").is_none());
        assert!(parse_map_text("nope").is_none());
    }

    #[test]
    fn list_text_is_parsed_back_exactly() {
        // What DuckDB 1.4 and 2.0 print for ['a, b', 'c', NULL, 'NULL', '', 'it''s'].
        let got = parse_list_text(r"['a, b', c, NULL, 'NULL', '', 'it\'s']").unwrap();
        assert_eq!(
            got,
            vec![t("a, b"), t("c"), Arg::Null, t("NULL"), t(""), t("it's")]
        );
        assert_eq!(parse_list_text("[1, 2]").unwrap(), vec![t("1"), t("2")]);
        assert_eq!(parse_list_text("[]").unwrap(), vec![]);
        assert!(parse_list_text("[a,b]").is_none());
        assert!(parse_list_text("{a=b}").is_none());
    }
}
