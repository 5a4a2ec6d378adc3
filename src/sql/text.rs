//! A job's SQL text as statements: split at the `;` that end them (not those inside quotes,
//! dollar quotes or comments), each an optional `INSERT INTO <table> [(columns)]` head and the
//! query DuckDB's parser reads (its JSON serializer takes a query, not an `INSERT`).
#![forbid(unsafe_code)]

/// One statement of a job: where its rows go and the query that makes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementText {
    /// `INSERT INTO` target as written (None: a bare query, into `windows_table`).
    pub target: Option<String>,
    /// The target's columns, when the `INSERT` names them.
    pub columns: Option<Vec<String>>,
    /// The query (SELECT, WITH ..., FROM ...).
    pub query: String,
    /// `INSERT OR REPLACE INTO`: a row per key (a changelog).
    pub replace: bool,
}

/// Why a job's text does not read as statements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextError(pub String);

/// The statements of a job's text, in order; empty ones (a trailing `;`) are skipped.
pub fn statements(text: &str) -> Result<Vec<StatementText>, TextError> {
    let mut out = Vec::new();
    for piece in split(text)? {
        if is_blank(piece) {
            continue;
        }
        out.push(statement(piece)?);
    }
    if out.is_empty() {
        return Err(TextError("has no statement".into()));
    }
    Ok(out)
}

/// Whether `text` holds nothing but white space and comments.
fn is_blank(text: &str) -> bool {
    skip_space(text, 0) >= text.len()
}

/// The text split at each `;` outside quotes, dollar quotes and comments.
fn split(text: &str) -> Result<Vec<&str>, TextError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' => i = end_of_quote(b, i)?,
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p + 1)
            }
            b'/' if b.get(i + 1) == Some(&b'*') => i = end_of_comment(b, i)?,
            b'$' => i = end_of_dollar(text, i)?,
            b';' => {
                out.push(&text[start..i]);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    out.push(&text[start..]);
    Ok(out)
}

/// The index past a quoted string or identifier starting at `i` (a doubled quote is one).
fn end_of_quote(b: &[u8], i: usize) -> Result<usize, TextError> {
    let q = b[i];
    let mut j = i + 1;
    while j < b.len() {
        if b[j] == q {
            if b.get(j + 1) == Some(&q) {
                j += 2;
                continue;
            }
            return Ok(j + 1);
        }
        j += 1;
    }
    Err(TextError(format!(
        "has an unterminated {}",
        if q == b'\'' { "string" } else { "quoted name" }
    )))
}

/// The index past a `/* ... */` comment starting at `i` (nested ones count, as DuckDB's).
fn end_of_comment(b: &[u8], i: usize) -> Result<usize, TextError> {
    let (mut depth, mut j) = (0usize, i);
    while j + 1 < b.len() {
        match (b[j], b[j + 1]) {
            (b'/', b'*') => {
                depth += 1;
                j += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return Ok(j);
                }
            }
            _ => j += 1,
        }
    }
    Err(TextError("has an unterminated comment (/*)".into()))
}

/// The index past a dollar-quoted string starting at `i` (`$$...$$`, `$tag$...$tag$`); a `$`
/// that starts none (a parameter such as `$1`) is passed over.
fn end_of_dollar(text: &str, i: usize) -> Result<usize, TextError> {
    let b = text.as_bytes();
    let tag_len = b[i + 1..]
        .iter()
        .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
        .unwrap_or(b.len() - i - 1);
    let close = i + 1 + tag_len;
    if b.get(close) != Some(&b'$') || b.get(i + 1).is_some_and(u8::is_ascii_digit) {
        return Ok(i + 1);
    }
    let tag = &text[i..=close];
    match text[close + 1..].find(tag) {
        Some(p) => Ok(close + 1 + p + tag.len()),
        None => Err(TextError(format!("has an unterminated {tag} string"))),
    }
}

/// The index of the first character at or after `i` that is not white space or a comment.
fn skip_space(text: &str, mut i: usize) -> usize {
    let b = text.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b[i..].starts_with(b"--") {
            i = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p + 1);
        } else if b[i..].starts_with(b"/*") {
            match end_of_comment(b, i) {
                Ok(j) => i = j,
                Err(_) => return b.len(),
            }
        } else {
            return i;
        }
    }
}

/// The word (letters, digits, `_`) at `i`, if any.
fn word_at(text: &str, i: usize) -> &str {
    let end = text[i..]
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(text.len(), |p| i + p);
    &text[i..end]
}

/// The first words of statements that are not queries (DuckDB's parser would say only that it
/// serializes SELECT statements).
const NOT_QUERIES: [&str; 31] = [
    "alter",
    "analyze",
    "attach",
    "begin",
    "call",
    "checkpoint",
    "comment",
    "commit",
    "copy",
    "create",
    "deallocate",
    "delete",
    "describe",
    "detach",
    "drop",
    "execute",
    "explain",
    "export",
    "import",
    "install",
    "load",
    "merge",
    "pragma",
    "prepare",
    "reset",
    "rollback",
    "set",
    "show",
    "truncate",
    "update",
    "use",
];

/// Words that go with a statement's first word in its name (`DROP TABLE`, `DELETE FROM`).
const STATEMENT_WORDS: [&str; 16] = [
    "table",
    "view",
    "index",
    "from",
    "into",
    "schema",
    "macro",
    "sequence",
    "function",
    "type",
    "or",
    "replace",
    "temp",
    "temporary",
    "database",
    "secret",
];

/// The statement's kind as its first words say it (`DROP TABLE`, `UPDATE`).
fn statement_kind(text: &str, mut i: usize) -> String {
    let mut words = vec![word_at(text, i).to_ascii_uppercase()];
    i += words[0].len();
    for _ in 0..2 {
        i = skip_space(text, i);
        let w = word_at(text, i);
        if !STATEMENT_WORDS.iter().any(|s| s.eq_ignore_ascii_case(w)) {
            break;
        }
        words.push(w.to_ascii_uppercase());
        i += w.len();
    }
    words.join(" ")
}

/// One statement: an `INSERT INTO` head, if any, and its query.
fn statement(text: &str) -> Result<StatementText, TextError> {
    let i = skip_space(text, 0);
    let first = word_at(text, i);
    if NOT_QUERIES.iter().any(|w| w.eq_ignore_ascii_case(first)) {
        return Err(TextError(format!(
            "holds INSERT INTO <table> SELECT ... statements over the stream (or one bare SELECT, into windows_table), and nothing else; got {}",
            statement_kind(text, i)
        )));
    }
    if !first.eq_ignore_ascii_case("insert") {
        return Ok(StatementText {
            target: None,
            columns: None,
            query: text[i..].trim_end().to_string(),
            replace: false,
        });
    }
    let mut j = skip_space(text, i + "insert".len());
    let mut w = word_at(text, j);
    let mut replace = false;
    if w.eq_ignore_ascii_case("or") {
        j = skip_space(text, j + w.len());
        let what = word_at(text, j);
        if !what.eq_ignore_ascii_case("replace") {
            return Err(TextError(format!(
                "INSERT OR {}: a statement appends (INSERT INTO <table> SELECT ...) or keeps a row per key (INSERT OR REPLACE INTO <table> SELECT ...)",
                what.to_ascii_uppercase()
            )));
        }
        replace = true;
        j = skip_space(text, j + what.len());
        w = word_at(text, j);
    }
    if !w.eq_ignore_ascii_case("into") {
        return Err(TextError("INSERT must be followed by INTO <table>".into()));
    }
    j = skip_space(text, j + w.len());
    let (target, after) = table_name(text, j)?;
    j = skip_space(text, after);
    let mut columns = None;
    if text[j..].starts_with('(') {
        let (names, after) = column_list(text, j)?;
        columns = Some(names);
        j = skip_space(text, after);
    }
    let w = word_at(text, j);
    if w.eq_ignore_ascii_case("by") {
        return Err(TextError(
            "INSERT INTO ... BY NAME / BY POSITION: the statement's columns are matched to the target's by name".into(),
        ));
    }
    if w.eq_ignore_ascii_case("values") || w.eq_ignore_ascii_case("default") {
        return Err(TextError(format!(
            "INSERT INTO {target} {}: a job's statement inserts the rows of a query over the stream (SELECT ... FROM stream)",
            w.to_ascii_uppercase()
        )));
    }
    let query = text[j..].trim_end();
    if query.is_empty() {
        return Err(TextError(format!(
            "INSERT INTO {target} has no query after it"
        )));
    }
    Ok(StatementText {
        target: Some(target),
        columns,
        query: query.to_string(),
        replace,
    })
}

/// A possibly qualified, possibly quoted table name at `i`, as written, and the index past it.
fn table_name(text: &str, mut i: usize) -> Result<(String, usize), TextError> {
    let start = i;
    loop {
        if text[i..].starts_with('"') {
            i = end_of_quote(text.as_bytes(), i)?;
        } else {
            let w = word_at(text, i);
            if w.is_empty() {
                return Err(TextError("INSERT INTO must name a table".into()));
            }
            i += w.len();
        }
        if text[i..].starts_with('.') {
            i += 1;
        } else {
            return Ok((text[start..i].to_string(), i));
        }
    }
}

/// A parenthesized list of column names at `i` (as DuckDB folds them: quoted ones as written,
/// others as written too, DuckDB's names are case-insensitive), and the index past it.
fn column_list(text: &str, i: usize) -> Result<(Vec<String>, usize), TextError> {
    let mut names = Vec::new();
    let mut j = i + 1;
    loop {
        j = skip_space(text, j);
        let name = if text[j..].starts_with('"') {
            let end = end_of_quote(text.as_bytes(), j)?;
            let n = text[j + 1..end - 1].replace("\"\"", "\"");
            j = end;
            n
        } else {
            let w = word_at(text, j);
            if w.is_empty() {
                return Err(TextError(
                    "INSERT INTO's column list must be names, e.g. (region, revenue)".into(),
                ));
            }
            j += w.len();
            w.to_string()
        };
        names.push(name);
        j = skip_space(text, j);
        match text[j..].chars().next() {
            Some(',') => j += 1,
            Some(')') => return Ok((names, j + 1)),
            _ => {
                return Err(TextError(
                    "INSERT INTO's column list must be names separated by commas, in parentheses"
                        .into(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> StatementText {
        let mut all = statements(text).unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    #[test]
    fn statements_split_at_semicolons_outside_quotes_and_comments() {
        let all = statements(
            "INSERT INTO a SELECT ';' AS x, \"y;z\" FROM stream; -- a; comment\n\
             INSERT INTO b SELECT $$;$$, $t$ $$; $t$ FROM stream /* ; */;\n\
             SELECT 1 FROM stream;  ",
        )
        .unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].target.as_deref(), Some("a"));
        assert_eq!(all[0].query, "SELECT ';' AS x, \"y;z\" FROM stream");
        assert_eq!(
            all[1].query,
            "SELECT $$;$$, $t$ $$; $t$ FROM stream /* ; */"
        );
        assert_eq!(all[2].target, None);
        assert_eq!(all[2].query, "SELECT 1 FROM stream");
    }

    #[test]
    fn insert_heads_name_the_target_and_its_columns() {
        let s = one("  insert INTO lake.main.\"Paid Orders\" (id, \"Amount\") WITH x AS (SELECT 1) SELECT * FROM stream");
        assert_eq!(s.target.as_deref(), Some("lake.main.\"Paid Orders\""));
        assert_eq!(
            s.columns,
            Some(vec!["id".to_string(), "Amount".to_string()])
        );
        assert!(s.query.starts_with("WITH x AS"));
        let s = one("/* c */ SELECT a FROM stream");
        assert_eq!(s.query, "SELECT a FROM stream");
    }

    #[test]
    fn texts_that_are_not_statements_say_why() {
        let err = |t: &str| statements(t).unwrap_err().0;
        assert_eq!(err("  ;  -- nothing\n"), "has no statement");
        assert!(err("SELECT 'abc FROM stream").contains("unterminated string"));
        assert!(err("SELECT 1 /* x").contains("unterminated comment"));
        assert!(err("SELECT $$abc").contains("unterminated $$"));
        assert!(err("INSERT OR IGNORE INTO t SELECT 1").starts_with("INSERT OR IGNORE: "));
        let keyed = &statements("insert  or\nreplace into t (a) SELECT 1").unwrap()[0];
        assert!(keyed.replace);
        assert_eq!(keyed.target.as_deref(), Some("t"));
        assert_eq!(keyed.columns.as_deref(), Some(&["a".to_string()][..]));
        assert!(err("INSERT t SELECT 1").contains("INTO"));
        assert!(err("INSERT INTO t VALUES (1)").contains("VALUES"));
        assert!(err("INSERT INTO t BY NAME SELECT 1").contains("BY NAME"));
        assert!(err("INSERT INTO t (a b) SELECT 1").contains("column list"));
        assert!(err("INSERT INTO t").contains("no query"));
        assert!(
            err("INSERT INTO t SELECT 1 FROM stream; DROP TABLE customers")
                .ends_with("and nothing else; got DROP TABLE")
        );
        assert!(err("delete from t").ends_with("got DELETE FROM"));
        assert!(err("UPDATE customers SET x = 1").ends_with("got UPDATE"));
        assert!(err("create or replace table t AS SELECT 1").ends_with("got CREATE OR REPLACE"));
        assert_eq!(one("(SELECT 1 FROM stream)").target, None);
        assert_eq!(one("from stream select 1").target, None);
        // A misspelt query is the parser's to name.
        assert_eq!(one("SELEC 1 FROM stream").target, None);
        // A parameter is not a dollar quote.
        assert_eq!(one("SELECT $1 FROM stream").query, "SELECT $1 FROM stream");
    }
}
