//! Reading a call's arguments on DuckDB 1.4 (the `capi-v1-2` build): duckdb-rs 1.4's `Value` has
//! no type or NULL test, so each argument is told apart from NULL by its handle and read back
//! from its text by its declared type; DuckDB's own settings are read on the extension's
//! connection.

use duckdb::vtab::{BindInfo, Value};

use crate::host::args::{parse_list_text, parse_map_text, Arg, Args};
use crate::params::ParamType;

/// DuckDB 1.4's `Value` (duckdb-rs 1.4) shows a value only as text (DuckDB's cast to VARCHAR)
/// or as an integer. DuckDB has already cast every argument to its declared type, so the text is
/// read back by that type (NULL was told apart before: see `entry::is_null_value`).
fn arg_of_value(v: &Value, ty: ParamType) -> Arg {
    if crate::host::entry::is_null_value(v) {
        return Arg::Null;
    }
    arg_of_text(v.to_string(), ty)
}

fn arg_of_text(text: String, ty: ParamType) -> Arg {
    match ty {
        ParamType::Varchar | ParamType::Interval => Arg::Text(text),
        ParamType::BigInt => text.parse().map_or(Arg::Text(text), Arg::Int),
        ParamType::Boolean => match text.as_str() {
            "true" => Arg::Bool(true),
            "false" => Arg::Bool(false),
            _ => Arg::Text(text),
        },
        ParamType::IntegerList | ParamType::VarcharList => {
            let item = if ty == ParamType::IntegerList {
                ParamType::BigInt
            } else {
                ParamType::Varchar
            };
            match parse_list_text(&text) {
                Some(items) => Arg::List(
                    items
                        .into_iter()
                        .map(|a| match a {
                            Arg::Text(t) => arg_of_text(t, item),
                            other => other,
                        })
                        .collect(),
                ),
                None => Arg::Text(text),
            }
        }
        ParamType::VarcharMap => match parse_map_text(&text) {
            Some(entries) => Arg::Map(entries),
            None => Arg::Text(text),
        },
    }
}

impl Args for BindInfo {
    fn positional(&self, idx: usize) -> Option<Arg> {
        if idx as u64 >= self.get_parameter_count() {
            return None;
        }
        let ty = *crate::params::RUN_POSITIONAL.get(idx)?;
        Some(arg_of_value(&self.get_parameter(idx as u64), ty))
    }

    fn named(&self, name: &str) -> Option<Arg> {
        let ty = crate::params::param_type(name)?;
        self.get_named_parameter(name).map(|v| arg_of_value(&v, ty))
    }

    /// DuckDB 1.4 has no C API for settings: the extension's own are not registered (their
    /// named parameters stand in), and DuckDB's are read on the extension's own connection,
    /// which shares the database's global settings (the sandbox's are global).
    fn setting(&self, name: &str) -> Option<Arg> {
        if crate::params::SETTINGS.iter().any(|s| s.name == name) {
            return None;
        }
        let host = crate::host::entry::bind_host(self)?;
        let (ty, text) = host.global_setting(name)?;
        let ty = match ty.as_str() {
            "BOOLEAN" => ParamType::Boolean,
            "VARCHAR[]" => ParamType::VarcharList,
            "BIGINT" | "INTEGER" | "UBIGINT" => ParamType::BigInt,
            _ => ParamType::Varchar,
        };
        Some(arg_of_text(text?, ty))
    }
}
