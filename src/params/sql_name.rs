//! SQL names: a table name as a user writes it (possibly qualified, possibly quoted), parsed
//! once at bind time, and identifiers quoted for the statements the sink writes.

/// A table name, possibly qualified (`schema.table`, `catalog.schema.table`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub parts: Vec<String>,
}

impl TableName {
    /// Parses `a.b.c`, where each part is an identifier or a double-quoted name.
    pub fn parse(text: &str) -> Option<TableName> {
        let mut parts = Vec::new();
        let mut chars = text.trim().chars().peekable();
        loop {
            let mut part = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next()? {
                        '"' if chars.peek() == Some(&'"') => {
                            chars.next();
                            part.push('"');
                        }
                        '"' => break,
                        c => part.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    if !(c.is_alphanumeric() || c == '_' || c == '$') {
                        return None;
                    }
                    part.push(c);
                    chars.next();
                }
            }
            if part.is_empty() {
                return None;
            }
            parts.push(part);
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(_) => return None,
            }
        }
        (parts.len() <= 3).then_some(TableName { parts })
    }

    /// An unqualified name.
    pub fn bare(name: &str) -> TableName {
        TableName {
            parts: vec![name.to_string()],
        }
    }

    /// The table named `name` in this one's catalog and schema.
    pub fn sibling(&self, name: &str) -> TableName {
        let mut parts = self.parts.clone();
        parts.pop();
        parts.push(name.to_string());
        TableName { parts }
    }

    /// Whether two names may name one table: equal but for case, the one perhaps less
    /// qualified than the other (a job's tables are all in one catalog).
    pub fn same_as(&self, other: &TableName) -> bool {
        let n = self.parts.len().min(other.parts.len());
        self.parts
            .iter()
            .rev()
            .zip(other.parts.iter().rev())
            .take(n)
            .all(|(a, b)| a.eq_ignore_ascii_case(b))
    }

    /// The name quoted for SQL.
    pub fn sql(&self) -> String {
        self.parts
            .iter()
            .map(|p| quote_ident(p))
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// A DuckDB type as the JSON string `json_transform_strict` takes, as an SQL literal.
pub fn transform_spec(sql_type: &str) -> String {
    let json = serde_json::Value::String(sql_type.to_string()).to_string();
    format!("'{}'", json.replace('\'', "''"))
}

/// A string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// An identifier in double quotes.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_one_table_are_the_same() {
        let n = |s: &str| TableName::parse(s).unwrap();
        assert!(n("a").same_as(&n("main.A")));
        assert!(n("lake.main.a").same_as(&n("main.a")));
        assert!(!n("a").same_as(&n("b")));
        assert!(!n("s.a").same_as(&n("main.a")));
    }

    #[test]
    fn table_names() {
        assert_eq!(
            TableName::parse("main.windows").unwrap().sql(),
            "\"main\".\"windows\""
        );
        assert_eq!(
            TableName::parse("\"my table\"").unwrap().sql(),
            "\"my table\""
        );
        assert_eq!(TableName::parse("\"a\"\"b\"").unwrap().sql(), "\"a\"\"b\"");
        assert!(TableName::parse("a.b.c.d").is_none());
        assert!(TableName::parse("a;drop").is_none());
        assert!(TableName::parse("").is_none());
        assert!(TableName::parse("a.").is_none());
        assert_eq!(
            TableName::parse("lake.main.w").unwrap().sibling("m").sql(),
            "\"lake\".\"main\".\"m\""
        );
    }
}
