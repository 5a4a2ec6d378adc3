//! `columns`: the typed fields a job reads (`{'path [AS name]': 'TYPE', ...}`, as `read_json`'s
//! `columns`; a STRUCT literal or a MAP), and which of a job's aggregates DuckDB computes over
//! them. Checked here as text; DuckDB's own binder checks the types and expressions once the
//! run is bound (`host::binder`).

use streaming_etl_core::{split_alias, AggSpec, EtlError, FieldPath, Result, TypedColumn};

use super::given::Given;
use super::table::*;
use crate::host::args::{shown, Arg};

/// Typed columns a job may declare (each is a field the decoder reads).
pub const MAX_COLUMNS: usize = 48;

/// The name of the event time among the typed columns, always there.
pub const EVENT_TIME: &str = "event_time_ms";

/// Names the staged events' internal columns start with.
pub const INTERNAL_PREFIX: &str = "__se_";

/// `columns`, in the order given (DuckDB's binder normalizes the types later).
pub(super) fn parse_columns(given: &Given<'_>) -> Result<Vec<TypedColumn>> {
    let name = given.name(ParamId::Columns);
    let entries = match given.get(ParamId::Columns) {
        None => return Ok(Vec::new()),
        Some(Arg::Map(entries)) if !entries.is_empty() => entries,
        Some(other) => {
            return Err(EtlError::invalid(
                name,
                "must map fields to DuckDB types, e.g. {'amount': 'DECIMAL(18,2)', 'customer.id AS customer': 'BIGINT'}",
                shown(other),
            ))
        }
    };
    if entries.len() > MAX_COLUMNS {
        return Err(EtlError::invalid(
            name,
            format!("may declare at most {MAX_COLUMNS} columns"),
            entries.len(),
        ));
    }
    let mut out: Vec<TypedColumn> = Vec::new();
    for (k, v) in entries {
        let (Arg::Text(field), Arg::Text(ty)) = (k, v) else {
            return Err(EtlError::invalid(
                name,
                "each entry maps a field (text) to a DuckDB type (text)",
                format!("{}: {}", shown(k), shown(v)),
            ));
        };
        let bad = |why: String| EtlError::invalid(name, why, format!("'{field}': '{ty}'"));
        let (path, alias) = split_alias(field).map_err(bad)?;
        let path = FieldPath::parse(path)
            .filter(|_| !path.contains(char::is_whitespace))
            .ok_or_else(|| {
                bad(format!(
                    "'{path}' is not a field name or dotted path such as customer.id"
                ))
            })?;
        let column = alias.unwrap_or_else(|| path.last_segment().to_string());
        let lower = column.to_ascii_lowercase();
        if lower == EVENT_TIME {
            return Err(bad(format!(
                "column '{column}' is reserved: the event time is always there as {EVENT_TIME} (BIGINT); give the field another name (AS ...)"
            )));
        }
        if lower.starts_with(INTERNAL_PREFIX) {
            return Err(bad(format!(
                "column names starting with {INTERNAL_PREFIX} are reserved"
            )));
        }
        if out.iter().any(|c| c.name.eq_ignore_ascii_case(&column)) {
            return Err(bad(format!(
                "column '{column}' is declared twice; give one field another name (AS ...)"
            )));
        }
        if ty.trim().is_empty() {
            return Err(bad("the type is empty".into()));
        }
        sql_fragment(ty).map_err(|why| bad(format!("the type {why}")))?;
        out.push(TypedColumn::new(path, &column, ty.trim()));
    }
    Ok(out)
}

/// The typed column a `group_by` path names: by its name (`customer` for
/// `'customer.id AS customer'`) or by its path.
pub(super) fn typed_key<'a>(
    columns: &'a [TypedColumn],
    path: &FieldPath,
) -> Option<&'a TypedColumn> {
    columns.iter().find(|c| c.path == *path).or_else(|| {
        columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(path.as_str()))
    })
}

/// One item of `aggregates` in a job with typed columns: the engine's own aggregate where it
/// reads none of them (its fast path), else an expression DuckDB computes.
pub(super) fn parse_aggregate(
    item: &str,
    columns: &[TypedColumn],
) -> std::result::Result<AggSpec, String> {
    // A path names a typed column by its first segment (`s.a` is a field of the column `s`);
    // one that is not a plain dotted name (`len(tags)`) is an expression, DuckDB's to read.
    let typed = |p: &String| {
        let first = p.split('.').next().unwrap_or(p);
        first.eq_ignore_ascii_case(EVENT_TIME)
            || columns.iter().any(|c| c.name.eq_ignore_ascii_case(first))
            || !p
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    };
    if let Ok(spec) = AggSpec::parse(item) {
        if !spec.paths().iter().any(typed) {
            return Ok(spec);
        }
    }
    let (expr, alias) = split_alias(item)?;
    sql_fragment(expr)?;
    let name = match alias.or_else(|| default_name(expr)) {
        Some(n) => n,
        None => {
            return Err(
                "name the expression's column with AS, e.g. 'sum(price * qty) AS revenue'".into(),
            )
        }
    };
    if name.to_ascii_lowercase().starts_with(INTERNAL_PREFIX) {
        return Err(format!(
            "column names starting with {INTERNAL_PREFIX} are reserved"
        ));
    }
    Ok(AggSpec::duckdb(expr, &name))
}

/// The default name of a DuckDB aggregate that is one call: `<function>_<first argument's last
/// segment>` (`median(amount)` is `median_amount`, `count(DISTINCT customer)` is
/// `count_customer`), `<function>` for `f(*)`; None for anything else.
fn default_name(expr: &str) -> Option<String> {
    let expr = expr.trim();
    let open = expr.find('(')?;
    let func = expr[..open].trim().rsplit('.').next()?.to_ascii_lowercase();
    if func.is_empty() || !func.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    // One call, perhaps with FILTER: the call's parenthesis closes before anything else.
    let close = closing(expr, open)?;
    let rest = expr[close..].trim_start();
    if !(rest.is_empty() || rest.to_ascii_lowercase().starts_with("filter")) {
        return None;
    }
    let mut arg = expr[open + 1..close - 1].trim();
    for word in ["distinct ", "all "] {
        if arg.len() > word.len() && arg[..word.len()].eq_ignore_ascii_case(word) {
            arg = arg[word.len()..].trim_start();
        }
    }
    if arg.starts_with('*') {
        return Some(func);
    }
    let path: String = arg
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    let last = path.rsplit('.').next().filter(|s| !s.is_empty())?;
    if last.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Some(format!("{func}_{}", last.to_ascii_lowercase()))
}

/// The index just past the parenthesis that closes the one at `open` (quoted text skipped).
fn closing(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    for (i, c) in text.char_indices().skip_while(|&(i, _)| i < open) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Checks that `text` can stand inside parentheses of a statement of the extension's own:
/// brackets balanced and no `;` or comment outside quotes (so it cannot end the expression
/// early or hide the rest of the statement).
pub(super) fn sql_fragment(text: &str) -> std::result::Result<(), String> {
    let mut stack: Vec<char> = Vec::new();
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => stack.push(c),
            (None, ')' | ']' | '}') => {
                let want = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if stack.pop() != Some(want) {
                    return Err(format!("has an unmatched '{c}'"));
                }
            }
            (None, ';') => return Err("may not contain ';'".into()),
            (None, '-') if prev == '-' => return Err("may not contain a comment (--)".into()),
            (None, '*') if prev == '/' => return Err("may not contain a comment (/*)".into()),
            _ => {}
        }
        prev = c;
    }
    if quote.is_some() {
        return Err("has an unterminated quote".into());
    }
    if let Some(c) = stack.pop() {
        return Err(format!("has an unclosed '{c}'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<TypedColumn> {
        let p = |s: &str| FieldPath::parse(s).unwrap();
        vec![
            TypedColumn::new(p("amount"), "amount", "DECIMAL(18,2)"),
            TypedColumn::new(p("customer.id"), "customer", "BIGINT"),
        ]
    }

    #[test]
    fn aggregates_over_typed_columns_are_duckdbs_and_the_rest_the_engines() {
        let c = cols();
        let engine = |s: &str| !parse_aggregate(s, &c).unwrap().is_duckdb();
        assert!(engine("count(*)"));
        assert!(engine("sum(payload.value)"));
        assert!(engine("approx_count_distinct(customer_id) AS customers"));
        assert!(!engine("sum(amount)"));
        assert!(!engine("count(customer)"));
        assert!(!engine("max(event_time_ms)"));
        assert!(!engine("count(*) FILTER (WHERE amount > 10)"));
        assert!(!engine("max(customer.id)"));
        assert!(!engine("sum(len(tags)) AS n"));
        assert!(!engine("median(amount)"));
        let d = parse_aggregate("quantile_cont(amount, [0.5, 0.99]) AS q", &c).unwrap();
        assert_eq!(d.name, "q");
        assert_eq!(d.duck.unwrap().expr, "quantile_cont(amount, [0.5, 0.99])");
    }

    #[test]
    fn duckdb_expressions_get_default_names_or_must_be_named() {
        let name = |s: &str| parse_aggregate(s, &cols()).map(|a| a.name);
        assert_eq!(name("median(amount)").unwrap(), "median_amount");
        assert_eq!(name("count(DISTINCT customer)").unwrap(), "count_customer");
        assert_eq!(
            name("list(DISTINCT amount ORDER BY amount)").unwrap(),
            "list_amount"
        );
        assert_eq!(
            name("sum(amount) FILTER (WHERE customer > 3)").unwrap(),
            "sum_amount"
        );
        assert_eq!(name("my.schema.f(*)").unwrap(), "f");
        assert!(name("sum(amount) / count(*)").unwrap_err().contains("AS"));
        assert_eq!(
            name("sum(amount) / count(*) AS avg_amount").unwrap(),
            "avg_amount"
        );
        assert!(name("sum(amount) AS __se_x")
            .unwrap_err()
            .contains("reserved"));
    }

    #[test]
    fn fragments_cannot_break_out_of_their_parentheses() {
        assert!(sql_fragment("sum(x) FILTER (WHERE s = 'a;b' AND t = ')')").is_ok());
        assert!(sql_fragment("STRUCT(a INTEGER, \"b c\" VARCHAR[])").is_ok());
        assert!(sql_fragment("sum(x)) FROM t").is_err());
        assert!(sql_fragment("sum(x); DROP TABLE t").is_err());
        assert!(sql_fragment("sum(x) -- ").is_err());
        assert!(sql_fragment("sum(x /* */)").is_err());
        assert!(sql_fragment("sum('x)").is_err());
        assert!(sql_fragment("list(x)[1").is_err());
        assert!(sql_fragment("x - -1").is_ok());
    }
}
