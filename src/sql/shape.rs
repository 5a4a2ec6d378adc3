//! What one statement of a job says, read off DuckDB's parse tree of its query: whether it is
//! windowed (which window function, over what) or a transform, the relations it reads, the
//! column references the engine and DuckDB must carry from the moment an event is read to the
//! moment its window closes, and the constructs a job cannot run (each refused with a message
//! that names it).
#![forbid(unsafe_code)]

use std::collections::BTreeSet;

use serde_json::Value;

use super::ast::{self, class, column_names, kind, TableRef};

/// The stream's own columns besides the typed ones.
pub const STREAM_COLUMNS: [(&str, &str); 4] = [
    ("event_time", "TIMESTAMP WITH TIME ZONE"),
    ("event_time_ms", "BIGINT"),
    ("partition", "INTEGER"),
    ("offset", "BIGINT"),
];

/// The window functions a statement reads the stream through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowFn {
    Tumble,
    Hop,
    Session,
}

impl WindowFn {
    fn of(name: &str) -> Option<WindowFn> {
        match name.to_ascii_lowercase().as_str() {
            "tumble" => Some(WindowFn::Tumble),
            "hop" => Some(WindowFn::Hop),
            "session" => Some(WindowFn::Session),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WindowFn::Tumble => "TUMBLE",
            WindowFn::Hop => "HOP",
            WindowFn::Session => "SESSION",
        }
    }

    /// The interval arguments after `stream, event_time`, by name.
    pub fn interval_args(self) -> &'static [&'static str] {
        match self {
            WindowFn::Tumble => &["size"],
            WindowFn::Hop => &["hop", "size"],
            WindowFn::Session => &["gap"],
        }
    }
}

/// A column reference: the relation it names (None: unqualified) and the column, then any
/// struct fields after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ref {
    pub relation: Option<String>,
    pub column: String,
}

/// The window bounds a windowed statement's rows have (supplied as its windows close).
pub const BOUNDS: [&str; 2] = ["window_start", "window_end"];

/// One statement's query, as the job runs it.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The window function and its interval arguments' nodes; None: a transform.
    pub window: Option<(WindowFn, Vec<Value>)>,
    /// The name the stream's columns are qualified by (its alias, or the function's or
    /// `stream`).
    pub stream: String,
    /// The other relations of the FROM clause (lookup tables), by the name they are qualified by.
    pub lookups: Vec<String>,
    /// The FROM clause's joins (INNER, LEFT, ...).
    pub joins: Vec<String>,
    pub has_where: bool,
    /// Column references of the SELECT list, GROUP BY and HAVING (a windowed statement's: what
    /// its window rows are computed from), window bounds excluded.
    pub refs: BTreeSet<Ref>,
    /// The stream columns a statement reads anywhere (what the engine decodes), by name.
    pub stream_columns: BTreeSet<String>,
    /// GROUP BY as written (None: GROUP BY ALL or no GROUP BY), the expression nodes.
    pub group_by: Option<Vec<Value>>,
    /// The SELECT list: each item's alias (empty: none) and node.
    pub select: Vec<(String, Value)>,
    /// A window join: the name the stream's second read is qualified by (the first is
    /// `stream`), both in the same window, joined on their `window_start`.
    pub join: Option<String>,
    /// Its rows are grouped (GROUP BY, or GROUP BY ALL); a window join's may be its joined rows.
    pub grouped: bool,
}

/// Why a statement cannot run as a job: the construct, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

fn refuse<T>(msg: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(msg.into()))
}

/// Whether a node is a reference to the stream: the table `stream`, or a window function over it.
fn reads_stream(m: &serde_json::Map<String, Value>) -> bool {
    let v = Value::Object(m.clone());
    match (kind(&v), class(&v)) {
        ("BASE_TABLE", _) => {
            ast::text(&v, "table_name").eq_ignore_ascii_case("stream")
                && ast::text(&v, "schema_name").is_empty()
                && ast::text(&v, "catalog_name").is_empty()
        }
        (_, "FUNCTION") => {
            WindowFn::of(ast::text(&v, "function_name")).is_some()
                && ast::arguments(&v).first().is_some_and(|(_, a)| {
                    column_names(a)
                        .is_some_and(|n| n.len() == 1 && n[0].eq_ignore_ascii_case("stream"))
                })
        }
        _ => false,
    }
}

/// Reads a statement's query node. `stream_columns`: the stream's columns by name (the typed
/// columns, `event_time`, `event_time_ms`, `partition`, `offset`); `is_aggregate`: whether a
/// function name is one of DuckDB's aggregates.
pub fn shape(
    node: &Value,
    stream_columns: &[String],
    is_aggregate: &dyn Fn(&str) -> bool,
) -> Result<Shape, Refused> {
    if kind(node) == "SET_OPERATION_NODE" {
        return refuse("UNION, EXCEPT and INTERSECT are not supported: a statement reads the stream once; write one INSERT INTO ... SELECT per part");
    }
    if kind(node) != "SELECT_NODE" {
        return refuse(format!(
            "a {} query is not supported: write SELECT ... FROM stream",
            kind(node)
        ));
    }
    let mods = node
        .get("modifiers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for m in &mods {
        match kind(m) {
            "ORDER_MODIFIER" => return refuse("ORDER BY at the top of a statement is not supported: rows land in a table, in no order; order them where you read it"),
            "LIMIT_MODIFIER" | "LIMIT_PERCENT_MODIFIER" => return refuse("LIMIT at the top of a statement is not supported: a job writes every row of the stream; limit where you read the table"),
            "DISTINCT_MODIFIER" => return refuse("SELECT DISTINCT is not supported: a job writes rows as events arrive; GROUP BY in a windowed statement, or DISTINCT where you read the table"),
            _ => {}
        }
    }
    if ast::any(node, &|m| {
        m.get("class").and_then(Value::as_str) == Some("WINDOW")
    }) || node.get("qualify").is_some_and(|q| !q.is_null())
    {
        return refuse("window functions (OVER) are not supported: the stream has no end to order it by; use TUMBLE, HOP or SESSION and GROUP BY window_start");
    }
    if node.get("sample").is_some_and(|s| !s.is_null()) {
        return refuse("USING SAMPLE is not supported: a job counts every event");
    }
    let mut stream_reads = 0usize;
    ast::walk(node, &mut |m| stream_reads += usize::from(reads_stream(m)));
    if stream_reads == 0 {
        return refuse("the statement does not read the stream: FROM stream, or FROM TUMBLE(stream, event_time, INTERVAL ...)");
    }
    let from = node.get("from_table").cloned().unwrap_or(Value::Null);
    if stream_reads > 1 && (stream_reads > 2 || !joins_two_windows(&from)) {
        return refuse("the stream is read more than once (a self-join, or a subquery over it): a statement reads it once, or twice in a window join (FROM TUMBLE(stream, ...) AS a JOIN TUMBLE(stream, ...) AS b ON ... AND a.window_start = b.window_start); join DuckDB tables to it instead");
    }
    let (mut refs, mut joins) = (Vec::new(), Vec::new());
    ast::table_refs(&from, &mut refs, &mut joins);
    let Some(pos) = refs.iter().position(reads_stream_ref) else {
        return refuse("the stream is read in a subquery or a CTE: read it in the statement's own FROM clause (FROM stream, or FROM TUMBLE(stream, ...))");
    };
    let stream = refs.remove(pos);
    let join = match stream_reads {
        2 => {
            let other = refs
                .iter()
                .position(reads_stream_ref)
                .map(|i| refs.remove(i));
            Some(window_join(&from, &stream, other.as_ref())?)
        }
        _ => None,
    };
    if let (Some(_), Some(r)) = (&join, refs.first()) {
        return refuse(format!(
            "a window join with a table ({}) is not yet supported: a window join's rows are made as its window closes, not as each event is read; enrich the rows in another statement",
            r.name
        ));
    }
    if let Some(r) = refs
        .iter()
        .find(|r| r.kind == "TABLE_FUNCTION" && WindowFn::of(&r.object).is_some())
    {
        return refuse(format!(
            "{} reads a relation other than the stream: its first argument must be stream",
            r.object.to_ascii_uppercase()
        ));
    }
    let window = match stream.kind.as_str() {
        "TABLE_FUNCTION" => Some(window_call(&stream.node)?),
        _ => None,
    };
    let lookups: Vec<String> = refs.iter().map(|r| r.name.clone()).collect();
    let select: Vec<(String, Value)> = node
        .get("select_list")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .map(|e| (ast::text(e, "alias").to_string(), e.clone()))
                .collect()
        })
        .unwrap_or_default();
    let group_sets = node
        .get("group_sets")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if group_sets > 1 {
        return refuse("GROUPING SETS, ROLLUP and CUBE are not supported: group a windowed statement by window_start and its keys");
    }
    let exprs: Vec<Value> = node
        .get("group_expressions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let group_all = ast::text(node, "aggregate_handling") == "FORCE_AGGREGATES";
    let having = node.get("having").filter(|h| !h.is_null()).cloned();
    let has_where = node.get("where_clause").is_some_and(|w| !w.is_null());
    let calls_aggregate = |v: &Value| {
        ast::any_outside_subqueries(v, &|m| {
            m.get("class").and_then(Value::as_str) == Some("FUNCTION")
                && m.get("function_name")
                    .and_then(Value::as_str)
                    .is_some_and(|f| f == "count_star" || is_aggregate(f))
        })
    };
    let aggregates = select.iter().any(|(_, e)| calls_aggregate(e));
    let mut all_refs: Vec<Vec<String>> = Vec::new();
    ast::column_refs(node, &[], &mut all_refs);
    let is_stream = |r: &[String]| -> Option<String> {
        let read = |rel: &str| {
            rel.eq_ignore_ascii_case(&stream.name)
                || join.as_ref().is_some_and(|j| rel.eq_ignore_ascii_case(j))
        };
        match r {
            [rel, col, ..] if read(rel) => {
                (!BOUNDS.iter().any(|b| b.eq_ignore_ascii_case(col))).then(|| col.clone())
            }
            [col, ..] if !lookups.iter().any(|l| l.eq_ignore_ascii_case(col)) || r.len() == 1 => {
                stream_columns
                    .iter()
                    .find(|c| c.eq_ignore_ascii_case(col))
                    .cloned()
            }
            _ => None,
        }
    };
    let stream_columns_read: BTreeSet<String> =
        all_refs.iter().filter_map(|r| is_stream(r)).collect();
    let Some((wf, _)) = &window else {
        if !exprs.is_empty() || group_all || having.is_some() || aggregates {
            return refuse("aggregates and GROUP BY need a window: FROM TUMBLE(stream, event_time, INTERVAL ...) ... GROUP BY window_start, ...; a statement over FROM stream writes each event's rows as they arrive");
        }
        return Ok(Shape {
            window: None,
            stream: stream.name,
            lookups,
            joins,
            has_where,
            refs: BTreeSet::new(),
            stream_columns: stream_columns_read,
            group_by: None,
            select,
            join: None,
            grouped: false,
        });
    };
    for (_, e) in &select {
        if class(e) == "STAR" || class(e) == "COLUMNS" {
            return refuse("SELECT * in a windowed statement is not supported: name the keys, window_start, window_end and the aggregates");
        }
    }
    let mut outputs: Vec<&Value> = select.iter().map(|(_, e)| e).collect();
    outputs.extend(exprs.iter());
    outputs.extend(having.iter());
    if outputs.iter().any(|e| {
        ast::any(e, &|m| {
            m.get("class").and_then(Value::as_str) == Some("SUBQUERY")
        })
    }) {
        return refuse("a subquery in a windowed statement's SELECT, GROUP BY or HAVING is not supported: join the table in FROM instead (it is read as each event is)");
    }
    for part in ["where_clause"] {
        if let Some(w) = node.get(part) {
            let mut r = Vec::new();
            ast::column_refs(w, &[], &mut r);
            if r.iter().any(|n| {
                n.last()
                    .is_some_and(|c| BOUNDS.iter().any(|b| b.eq_ignore_ascii_case(c)))
            }) {
                return refuse("WHERE cannot read window_start or window_end (an event's window is placed after WHERE); use HAVING");
            }
        }
    }
    // Grouped by window_start: an explicit GROUP BY names it (or its position in the SELECT
    // list); GROUP BY ALL selects it bare.
    let is_start = |e: &Value| {
        column_names(e).is_some_and(|n| {
            n.last()
                .is_some_and(|c| c.eq_ignore_ascii_case("window_start"))
                && (n.len() == 1
                    || n[0].eq_ignore_ascii_case(&stream.name)
                    || join.as_ref().is_some_and(|j| n[0].eq_ignore_ascii_case(j)))
        })
    };
    let by_position = |e: &Value| -> Option<&Value> {
        if class(e) != "CONSTANT" {
            return None;
        }
        let n: usize = e
            .get("value")
            .and_then(|v| v.get("value"))
            .and_then(Value::as_u64)
            .map(|n| n as usize)
            .or_else(|| {
                e.get("literal")
                    .and_then(|l| ast::text(l, "text").parse().ok())
            })?;
        select.get(n.checked_sub(1)?).map(|(_, s)| s)
    };
    let grouped = if group_all {
        select.iter().any(|(_, e)| is_start(e))
    } else {
        exprs
            .iter()
            .any(|e| is_start(e) || by_position(e).is_some_and(is_start))
    };
    if grouped && !select.iter().any(|(_, e)| is_start(e)) {
        return refuse("a windowed statement selects window_start: its rows are a window's, and with write_mode := 'upsert' window_start is part of their key".to_string());
    }
    // A window join may select its joined rows, each with its window_start.
    let joined_rows = join.is_some()
        && !grouped
        && exprs.is_empty()
        && !group_all
        && having.is_none()
        && !aggregates
        && select.iter().any(|(_, e)| is_start(e));
    if !grouped && !joined_rows {
        return refuse(format!(
            "a windowed statement must be grouped by window_start: ... FROM {}(stream, event_time, ...) GROUP BY window_start, <keys> (or GROUP BY ALL with window_start selected)",
            wf.name()
        ));
    }
    let select_aliases: Vec<&str> = select
        .iter()
        .map(|(a, _)| a.as_str())
        .filter(|a| !a.is_empty())
        .collect();
    let mut out_refs: Vec<Vec<String>> = Vec::new();
    for (_, e) in &select {
        ast::column_refs(e, &[], &mut out_refs);
    }
    let mut late_refs: Vec<Vec<String>> = Vec::new();
    for e in exprs.iter().chain(having.iter()) {
        ast::column_refs(e, &[], &mut late_refs);
    }
    let mut refs = BTreeSet::new();
    let mut add = |names: &[String], may_be_alias: bool| {
        let relations: Vec<&String> = std::iter::once(&stream.name)
            .chain(join.iter())
            .chain(lookups.iter())
            .collect();
        let r = match names {
            [rel, col, ..] if relations.iter().any(|r| r.eq_ignore_ascii_case(rel)) => Ref {
                relation: Some(
                    relations
                        .iter()
                        .find(|r| r.eq_ignore_ascii_case(rel))
                        .map_or(rel.clone(), |r| (*r).clone()),
                ),
                column: col.clone(),
            },
            [col, ..] => {
                if may_be_alias
                    && names.len() == 1
                    && select_aliases.iter().any(|a| a.eq_ignore_ascii_case(col))
                {
                    return;
                }
                Ref {
                    relation: None,
                    column: col.clone(),
                }
            }
            [] => return,
        };
        if !BOUNDS.iter().any(|b| b.eq_ignore_ascii_case(&r.column)) {
            refs.insert(r);
        }
    };
    for r in &out_refs {
        add(r, false);
    }
    for r in &late_refs {
        add(r, true);
    }
    if *wf == WindowFn::Session {
        if has_where {
            return refuse("WHERE in a SESSION statement is not supported: an event the WHERE drops would still extend its key's session; filter with a FILTER (WHERE ...) clause on the aggregates, or window it with TUMBLE or HOP");
        }
        if joins.iter().any(|j| j != "LEFT") {
            return refuse("an inner join in a SESSION statement is not supported: an event it drops would still extend its key's session; use LEFT JOIN");
        }
    }
    Ok(Shape {
        window,
        stream: stream.name,
        lookups,
        joins,
        has_where,
        refs,
        stream_columns: stream_columns_read,
        group_by: if group_all { None } else { Some(exprs) },
        select,
        join,
        grouped: !joined_rows,
    })
}

/// The join of a FROM clause whose two sides are window calls over the stream (the shape of a
/// window join, checked by [`window_join`]), wherever it is among its joins.
fn two_windows(from: &Value) -> Option<&Value> {
    if kind(from) != "JOIN" {
        return None;
    }
    let window = |t: &Value| {
        kind(t) == "TABLE_FUNCTION"
            && t.get("function")
                .and_then(Value::as_object)
                .is_some_and(reads_stream)
    };
    let (l, r) = (from.get("left")?, from.get("right")?);
    if window(l) && window(r) {
        return Some(from);
    }
    two_windows(l).or_else(|| two_windows(r))
}

fn joins_two_windows(from: &Value) -> bool {
    two_windows(from).is_some()
}

/// A window join's second read, checked: both reads the same window (function and intervals),
/// not a session, joined on their `window_start`. Returns the name it is qualified by.
fn window_join(
    from: &Value,
    first: &TableRef,
    other: Option<&TableRef>,
) -> Result<String, Refused> {
    let Some(other) = other else {
        return refuse("the stream is read twice, and not as the two sides of a window join");
    };
    let (a, a_args) = window_call(&first.node)?;
    let (b, b_args) = window_call(&other.node)?;
    let plain = |args: &[Value]| -> Vec<Value> { args.iter().map(without_locations).collect() };
    if a != b || plain(&a_args) != plain(&b_args) {
        return refuse(format!(
            "the two sides of a window join are in different windows ({} and {}): a window join joins the rows of one window, so both read the same window function with the same intervals",
            first.name, other.name
        ));
    }
    if a == WindowFn::Session {
        return refuse("a SESSION window join is not supported: each side's sessions end apart; join TUMBLE or HOP windows");
    }
    let condition = two_windows(from)
        .and_then(|j| j.get("condition"))
        .cloned()
        .unwrap_or(Value::Null);
    let on_start = |e: &Value, rel: &str| {
        column_names(e).is_some_and(|n| {
            n.len() == 2
                && n[0].eq_ignore_ascii_case(rel)
                && n[1].eq_ignore_ascii_case("window_start")
        })
    };
    let mut joined = false;
    let mut conjuncts = vec![condition];
    while let Some(c) = conjuncts.pop() {
        match ast::text(&c, "type") {
            "CONJUNCTION_AND" => {
                if let Some(ch) = c.get("children").and_then(Value::as_array) {
                    conjuncts.extend(ch.iter().cloned());
                }
            }
            "COMPARE_EQUAL" => {
                let (l, r) = (
                    c.get("left").unwrap_or(&Value::Null),
                    c.get("right").unwrap_or(&Value::Null),
                );
                joined |= on_start(l, &first.name) && on_start(r, &other.name)
                    || on_start(l, &other.name) && on_start(r, &first.name);
            }
            _ => {}
        }
    }
    if !joined {
        return refuse(format!(
            "a window join joins the rows of one window: its ON says {a}.window_start = {b}.window_start (without it, the join would keep every window's events)",
            a = first.name,
            b = other.name
        ));
    }
    Ok(other.name.clone())
}

/// A parse tree without DuckDB's positions in the text (two equal expressions compare equal).
fn without_locations(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with("query_location"))
                .map(|(k, x)| (k.clone(), without_locations(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_locations).collect()),
        other => other.clone(),
    }
}

fn reads_stream_ref(r: &TableRef) -> bool {
    match r.node.as_object() {
        Some(m) if r.kind == "BASE_TABLE" => reads_stream(m),
        Some(_) if r.kind == "TABLE_FUNCTION" => r
            .node
            .get("function")
            .and_then(Value::as_object)
            .is_some_and(reads_stream),
        _ => false,
    }
}

/// The window function of the FROM clause: its kind and interval arguments, checked.
fn window_call(table_fn: &Value) -> Result<(WindowFn, Vec<Value>), Refused> {
    let f = table_fn.get("function").cloned().unwrap_or(Value::Null);
    let name = ast::text(&f, "function_name");
    let Some(wf) = WindowFn::of(name) else {
        return refuse(format!(
            "{name} is not a window function: FROM TUMBLE, HOP or SESSION over the stream"
        ));
    };
    let args = ast::arguments(&f);
    let want = 2 + wf.interval_args().len();
    let usage = format!(
        "{}(stream, event_time, {})",
        wf.name(),
        wf.interval_args()
            .iter()
            .map(|a| format!("<{a}>"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if args.len() != want {
        return refuse(format!("{} takes {want} arguments: {usage}", wf.name()));
    }
    if let Some((n, _)) = args.iter().find(|(n, _)| !n.is_empty()) {
        return refuse(format!(
            "{}'s arguments are positional (got {n} := ...): {usage}",
            wf.name()
        ));
    }
    let time = column_names(args[1].1);
    if !time.as_ref().is_some_and(|n| {
        n.last()
            .is_some_and(|c| c.eq_ignore_ascii_case("event_time"))
    }) {
        let shown = time.map_or("an expression".to_string(), |n| n.join("."));
        return refuse(format!(
            "{} over {shown}: a window is over event_time, the stream's event time (time_field, time_format say where it is read from)",
            wf.name()
        ));
    }
    Ok((wf, args[2..].iter().map(|(_, a)| (*a).clone()).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DuckDB's parse tree of a fixture query (test/data/sql_ast), as DuckDB 1.4.4 (`v14`) or
    /// 2.0.1 (`v20`) writes it.
    fn tree(name: &str, version: &str) -> Value {
        let path = format!(
            "{}/test/data/sql_ast/{name}.{version}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        super::super::ast::query_node(&text).unwrap()
    }

    fn columns() -> Vec<String> {
        [
            "amount",
            "customer_id",
            "status",
            "key",
            "a",
            "id",
            "event_time",
            "event_time_ms",
        ]
        .map(String::from)
        .to_vec()
    }

    fn is_aggregate(f: &str) -> bool {
        ["count", "sum", "list", "max"].contains(&f)
    }

    fn shaped(name: &str, version: &str) -> Result<Shape, Refused> {
        shape(&tree(name, version), &columns(), &is_aggregate)
    }

    #[test]
    fn a_windowed_statement_reads_the_same_from_both_versions_trees() {
        for v in ["v14", "v20"] {
            let s = shaped("enrich", v).unwrap();
            let (wf, args) = s.window.as_ref().unwrap();
            assert_eq!((*wf, args.len()), (WindowFn::Tumble, 1), "{v}");
            assert_eq!(s.stream, "o");
            assert_eq!(s.lookups, ["c"]);
            assert_eq!(s.joins, ["INNER"]);
            assert!(s.has_where);
            assert!(s.group_by.is_none(), "GROUP BY ALL");
            let refs: Vec<String> = s
                .refs
                .iter()
                .map(|r| format!("{}.{}", r.relation.as_deref().unwrap_or(""), r.column))
                .collect();
            // The bounds are the engine's, the lambda's x is its own: neither is carried.
            assert_eq!(refs, ["c.region", "o.amount"], "{v}");
            assert_eq!(
                s.stream_columns.iter().cloned().collect::<Vec<_>>(),
                ["amount", "customer_id", "event_time", "status"]
            );
            let h = shaped("hop", v).unwrap();
            assert_eq!(h.window.as_ref().map(|w| w.0), Some(WindowFn::Hop));
            assert_eq!(
                h.group_by.as_ref().map(Vec::len),
                Some(2),
                "GROUP BY key, 2"
            );
        }
    }

    #[test]
    fn a_transform_reads_the_stream_bare() {
        for v in ["v14", "v20"] {
            let s = shaped("transform", v).unwrap();
            assert!(s.window.is_none());
            assert_eq!(
                (s.stream.as_str(), s.lookups.as_slice()),
                ("s", &["d".to_string()][..])
            );
            assert_eq!(s.joins, ["LEFT"]);
        }
    }

    #[test]
    fn a_window_join_reads_the_stream_twice_in_one_window() {
        let mut cols = columns();
        cols.push("kind".into());
        for v in ["v14", "v20"] {
            let s = shape(&tree("windowjoin", v), &cols, &is_aggregate).unwrap();
            assert_eq!(
                (s.stream.as_str(), s.join.as_deref()),
                ("o", Some("p")),
                "{v}"
            );
            assert_eq!(s.joins, ["LEFT"]);
            assert!(s.lookups.is_empty());
            assert_eq!(
                s.stream_columns.iter().cloned().collect::<Vec<_>>(),
                ["customer_id", "event_time", "kind"],
                "{v}"
            );
            let e = shape(&tree("windowjoin_apart", v), &cols, &is_aggregate)
                .unwrap_err()
                .0;
            assert!(
                e.contains("its ON says o.window_start = p.window_start"),
                "{v}: {e}"
            );
        }
    }

    #[test]
    fn what_a_job_cannot_run_is_refused_naming_it() {
        let cases = [
            ("order", "ORDER BY at the top"),
            ("limit", "LIMIT at the top"),
            ("over", "window functions (OVER)"),
            ("selfjoin", "the stream is read more than once"),
            ("subquery", "the stream is read more than once"),
            ("union", "UNION, EXCEPT and INTERSECT"),
            ("ungrouped", "must be grouped by window_start"),
            ("othercol", "TUMBLE over ts"),
            ("aggnowindow", "aggregates and GROUP BY need a window"),
            ("nostream", "does not read the stream"),
        ];
        for v in ["v14", "v20"] {
            for (name, says) in cases {
                let e = shaped(name, v).unwrap_err().0;
                assert!(e.contains(says), "{name} ({v}): {e}");
            }
        }
    }
}
