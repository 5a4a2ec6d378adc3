//! The arguments of a table-function call, copied out of DuckDB at bind time into plain values
//! ([`Arg`]) behind a small trait, so that parameter parsing is tested without DuckDB.

use duckdb::core::LogicalTypeId;
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
    let token = |i: &mut usize, stop: &[char]| -> Option<Arg> {
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
    };
    while i < chars.len() {
        let k = token(&mut i, &['='])?;
        if chars.get(i) != Some(&'=') {
            return None;
        }
        i += 1;
        let v = token(&mut i, &[','])?;
        out.push((k, v));
        match (chars.get(i), chars.get(i + 1)) {
            (None, _) => break,
            (Some(','), Some(' ')) => i += 2,
            _ => return None,
        }
    }
    Some(out)
}

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
}
