//! DuckDB's parse tree of a query, as `json_serialize_sql` writes it, read through the fields
//! every supported DuckDB version writes alike: a node's `class` and `type`, a column
//! reference's `column_names`, a table reference's `alias`, `table_name` and `function`, a
//! function's `function_name` and its arguments (DuckDB 1.4 and 1.5 write them as `children`,
//! 2.0 as `arguments[].expression`). Anything else is walked generically, so a field one version
//! adds is never missed. The tree is edited only by replacing whole nodes and `column_names`,
//! and turned back into SQL by the same DuckDB (`json_deserialize_sql`).
#![forbid(unsafe_code)]

use serde_json::{Map, Value};

/// The query node of `json_serialize_sql`'s answer, or DuckDB's parser error.
pub fn query_node(answer: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(answer).map_err(|e| format!("DuckDB's parse tree: {e}"))?;
    if v.get("error").and_then(Value::as_bool) == Some(true) {
        let msg = v
            .get("error_message")
            .and_then(Value::as_str)
            .unwrap_or("it does not parse");
        return Err(msg.to_string());
    }
    let statements = v
        .get("statements")
        .and_then(Value::as_array)
        .ok_or("DuckDB's parse tree has no statements")?;
    match statements.as_slice() {
        [one] => one
            .get("node")
            .cloned()
            .ok_or_else(|| "DuckDB's parse tree has no query node".into()),
        _ => Err(format!(
            "is {} statements where one query was expected",
            statements.len()
        )),
    }
}

/// The whole answer with its query node replaced (what `json_deserialize_sql` reads).
pub fn with_node(answer: &str, node: &Value) -> Result<String, String> {
    let mut v: Value =
        serde_json::from_str(answer).map_err(|e| format!("DuckDB's parse tree: {e}"))?;
    let slot = v
        .get_mut("statements")
        .and_then(Value::as_array_mut)
        .and_then(|s| s.first_mut())
        .and_then(Value::as_object_mut)
        .ok_or("DuckDB's parse tree has no statement")?;
    slot.insert("node".into(), node.clone());
    Ok(v.to_string())
}

pub fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field).and_then(Value::as_str).unwrap_or("")
}

pub fn class(v: &Value) -> &str {
    text(v, "class")
}

pub fn kind(v: &Value) -> &str {
    text(v, "type")
}

/// A column reference's names (`o.amount`: `["o", "amount"]`).
pub fn column_names(v: &Value) -> Option<Vec<String>> {
    if class(v) != "COLUMN_REF" {
        return None;
    }
    let names = v.get("column_names")?.as_array()?;
    names
        .iter()
        .map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// A function node's arguments, in order, with the name a named one was given.
pub fn arguments(f: &Value) -> Vec<(&str, &Value)> {
    if let Some(args) = f.get("arguments").and_then(Value::as_array) {
        return args
            .iter()
            .filter_map(|a| Some((text(a, "name"), a.get("expression")?)))
            .collect();
    }
    f.get("children")
        .and_then(Value::as_array)
        .map(|c| c.iter().map(|e| (text(e, "alias"), e)).collect())
        .unwrap_or_default()
}

/// Every object in `v`, depth first, `v` included.
pub fn walk<'a>(v: &'a Value, visit: &mut dyn FnMut(&'a Map<String, Value>)) {
    match v {
        Value::Object(m) => {
            visit(m);
            for child in m.values() {
                walk(child, visit);
            }
        }
        Value::Array(items) => {
            for child in items {
                walk(child, visit);
            }
        }
        _ => {}
    }
}

/// Whether any node in `v` satisfies `test`.
pub fn any(v: &Value, test: &dyn Fn(&Map<String, Value>) -> bool) -> bool {
    let mut found = false;
    walk(v, &mut |m| found |= test(m));
    found
}

/// Whether any node of `v` outside its subqueries satisfies `test` (an aggregate inside a
/// subquery is the subquery's, not the statement's).
pub fn any_outside_subqueries(v: &Value, test: &dyn Fn(&Map<String, Value>) -> bool) -> bool {
    match v {
        Value::Object(m) => {
            if class(v) == "SUBQUERY" {
                return false;
            }
            test(m) || m.values().any(|c| any_outside_subqueries(c, test))
        }
        Value::Array(items) => items.iter().any(|c| any_outside_subqueries(c, test)),
        _ => false,
    }
}

/// A table reference of a FROM clause, flattened out of its joins.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRef {
    /// BASE_TABLE, TABLE_FUNCTION, SUBQUERY, EXPRESSION_LIST, ...
    pub kind: String,
    /// The name its columns are qualified by: its alias, else the table's or function's name.
    pub name: String,
    /// A base table's schema and catalog as written (empty when not).
    pub qualified: bool,
    /// The table's or function's own name (lowercase for functions).
    pub object: String,
    /// The node itself.
    pub node: Value,
}

/// The table references of a FROM tree, left to right, and its joins' kinds.
pub fn table_refs(from: &Value, out: &mut Vec<TableRef>, joins: &mut Vec<String>) {
    match kind(from) {
        "JOIN" => {
            joins.push(text(from, "join_type").to_string());
            if let Some(l) = from.get("left") {
                table_refs(l, out, joins);
            }
            if let Some(r) = from.get("right") {
                table_refs(r, out, joins);
            }
        }
        "" | "EMPTY" => {}
        k => {
            let alias = text(from, "alias");
            let (object, qualified) = match k {
                "BASE_TABLE" => (
                    text(from, "table_name").to_string(),
                    !text(from, "schema_name").is_empty() || !text(from, "catalog_name").is_empty(),
                ),
                "TABLE_FUNCTION" => (
                    from.get("function")
                        .map(|f| text(f, "function_name").to_ascii_lowercase())
                        .unwrap_or_default(),
                    false,
                ),
                _ => (String::new(), false),
            };
            let name = if alias.is_empty() {
                object.clone()
            } else {
                alias.to_string()
            };
            out.push(TableRef {
                kind: k.to_string(),
                name,
                qualified,
                object,
                node: from.clone(),
            });
        }
    }
}

/// The names a lambda binds (`x -> ...`, `(x, y) -> ...`).
pub fn lambda_params(lambda: &Value) -> Vec<String> {
    let Some(lhs) = lambda.get("lhs") else {
        return Vec::new();
    };
    if let Some(n) = column_names(lhs) {
        return n.into_iter().take(1).collect();
    }
    arguments(lhs)
        .into_iter()
        .filter_map(|(_, a)| column_names(a).and_then(|n| n.into_iter().next()))
        .collect()
}

/// The column references of an expression tree, outside lambdas' own parameters.
pub fn column_refs(v: &Value, bound: &[String], out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            if let Some(names) = column_names(v) {
                let shadowed =
                    names.len() == 1 && bound.iter().any(|b| b.eq_ignore_ascii_case(&names[0]));
                if !shadowed {
                    out.push(names);
                }
                return;
            }
            if class(v) == "LAMBDA" {
                let mut inner = bound.to_vec();
                inner.extend(lambda_params(v));
                if let Some(e) = m.get("expr") {
                    column_refs(e, &inner, out);
                }
                return;
            }
            for child in m.values() {
                column_refs(child, bound, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                column_refs(child, bound, out);
            }
        }
        _ => {}
    }
}

/// Replaces, in an expression tree, each column reference `[first, rest...]` for which `rename`
/// gives new names (lambda parameters are left alone).
pub fn rename_refs(
    v: &mut Value,
    bound: &[String],
    rename: &dyn Fn(&[String]) -> Option<Vec<String>>,
) {
    let is_lambda = class(v) == "LAMBDA";
    match v {
        Value::Object(m) => {
            if m.get("class").and_then(Value::as_str) == Some("COLUMN_REF") {
                let names: Option<Vec<String>> = m
                    .get("column_names")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(|n| n.as_str().map(str::to_string)).collect());
                if let Some(names) = names {
                    let shadowed =
                        names.len() == 1 && bound.iter().any(|b| b.eq_ignore_ascii_case(&names[0]));
                    if let Some(new) = rename(&names).filter(|_| !shadowed) {
                        m.insert(
                            "column_names".into(),
                            Value::Array(new.into_iter().map(Value::String).collect()),
                        );
                    }
                }
                return;
            }
            if is_lambda {
                let mut inner = bound.to_vec();
                inner.extend(lambda_params(&Value::Object(m.clone())));
                if let Some(e) = m.get_mut("expr") {
                    rename_refs(e, &inner, rename);
                }
                return;
            }
            for child in m.values_mut() {
                rename_refs(child, bound, rename);
            }
        }
        Value::Array(items) => {
            for child in items {
                rename_refs(child, bound, rename);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_read_alike_in_both_forms() {
        let v14 = json!({"class": "FUNCTION", "function_name": "tumble", "children": [
            {"class": "COLUMN_REF", "column_names": ["stream"], "alias": ""},
            {"class": "CONSTANT", "alias": "size"}]});
        let v20 = json!({"class": "FUNCTION", "function_name": "tumble", "arguments": [
            {"name": "", "expression": {"class": "COLUMN_REF", "column_names": ["stream"]}},
            {"name": "size", "expression": {"class": "CONSTANT"}}]});
        for f in [v14, v20] {
            let a = arguments(&f);
            assert_eq!(a.len(), 2);
            assert_eq!(column_names(a[0].1), Some(vec!["stream".to_string()]));
            assert_eq!(a[1].0, "size");
        }
    }

    #[test]
    fn column_refs_skip_lambda_parameters_and_renames_keep_them() {
        let e = json!({"class": "FUNCTION", "arguments": [
            {"expression": {"class": "COLUMN_REF", "column_names": ["o", "tags"]}},
            {"expression": {"class": "LAMBDA",
                "lhs": {"class": "COLUMN_REF", "column_names": ["x"]},
                "expr": {"class": "FUNCTION", "arguments": [
                    {"expression": {"class": "COLUMN_REF", "column_names": ["x"]}},
                    {"expression": {"class": "COLUMN_REF", "column_names": ["rate"]}}]}}}]});
        let mut refs = Vec::new();
        column_refs(&e, &[], &mut refs);
        assert_eq!(
            refs,
            vec![vec!["o".to_string(), "tags".into()], vec!["rate".into()]]
        );
        let mut e2 = e.clone();
        rename_refs(&mut e2, &[], &|n| Some(vec![format!("r_{}", n.join("."))]));
        let mut refs = Vec::new();
        column_refs(&e2, &[], &mut refs);
        assert_eq!(
            refs,
            vec![vec!["r_o.tags".to_string()], vec!["r_rate".into()]]
        );
        assert!(
            e2.to_string().contains("[\"x\"]"),
            "a lambda's parameter stays: {e2}"
        );
    }

    #[test]
    fn table_refs_flatten_joins_and_name_each_relation() {
        let from = json!({"type": "JOIN", "join_type": "LEFT",
            "left": {"type": "TABLE_FUNCTION", "alias": "o", "function": {"function_name": "TUMBLE"}},
            "right": {"type": "BASE_TABLE", "alias": "", "table_name": "customers", "schema_name": "", "catalog_name": "lake"}});
        let (mut refs, mut joins) = (Vec::new(), Vec::new());
        table_refs(&from, &mut refs, &mut joins);
        assert_eq!(joins, ["LEFT"]);
        assert_eq!(
            (refs[0].name.as_str(), refs[0].object.as_str()),
            ("o", "tumble")
        );
        assert_eq!(refs[1].name, "customers");
        assert!(refs[1].qualified);
    }

    #[test]
    fn parser_errors_come_back_as_duckdb_wrote_them() {
        let e = query_node(
            r#"{"error":true,"error_type":"parser","error_message":"syntax error at or near \"SELEC\""}"#,
        );
        assert_eq!(e.unwrap_err(), "syntax error at or near \"SELEC\"");
    }
}
