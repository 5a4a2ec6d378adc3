//! The named arguments one call was given, read against its parameter table, with typed
//! accessors whose errors name the parameter and the value.

use streaming_etl_core::{EtlError, FieldPath, Result};

use super::sql_name::TableName;
use super::table::{Param, ParamId};
use crate::host::args::{shown, Arg, Args};

/// The named arguments a call was given (NULL counts as not given).
pub(super) struct Given<'a> {
    table: &'a [Param],
    values: Vec<(ParamId, Arg)>,
}

impl<'a> Given<'a> {
    pub(super) fn read(args: &dyn Args, table: &'a [Param]) -> Given<'a> {
        let values = table
            .iter()
            .filter_map(|p| match args.named(p.name) {
                None | Some(Arg::Null) => None,
                Some(a) => Some((p.id, a)),
            })
            .collect();
        Given { table, values }
    }

    pub(super) fn name(&self, id: ParamId) -> &'static str {
        self.table
            .iter()
            .find(|p| p.id == id)
            .map_or("?", |p| p.name)
    }

    pub(super) fn get(&self, id: ParamId) -> Option<&Arg> {
        self.values.iter().find(|(p, _)| *p == id).map(|(_, a)| a)
    }

    pub(super) fn text(&self, id: ParamId) -> Result<Option<String>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::Text(s)) => Ok(Some(s.clone())),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be text",
                shown(other),
            )),
        }
    }

    pub(super) fn positive(&self, id: ParamId) -> Result<Option<i64>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::Int(i)) if *i > 0 => Ok(Some(*i)),
            Some(Arg::Int(i)) => Err(EtlError::invalid(self.name(id), "must be > 0", i)),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be an integer",
                shown(other),
            )),
        }
    }

    pub(super) fn boolean(&self, id: ParamId) -> Result<Option<bool>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be a BOOLEAN",
                shown(other),
            )),
        }
    }

    /// A list of text items; None when not given.
    pub(super) fn text_list(&self, id: ParamId) -> Result<Option<Vec<String>>> {
        match self.get(id) {
            None => Ok(None),
            Some(Arg::List(items)) => items
                .iter()
                .map(|a| match a {
                    Arg::Text(s) => Ok(s.clone()),
                    other => Err(EtlError::invalid(
                        self.name(id),
                        "must be a list of text",
                        shown(other),
                    )),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(other) => Err(EtlError::invalid(
                self.name(id),
                "must be a list such as ['a', 'b']",
                shown(other),
            )),
        }
    }

    pub(super) fn field(&self, id: ParamId, default: &str) -> Result<FieldPath> {
        let text = self.text(id)?.unwrap_or_else(|| default.to_string());
        FieldPath::parse(&text).ok_or_else(|| {
            EtlError::invalid(
                self.name(id),
                "must be a field name or a dotted path such as payload.value",
                format!("'{text}'"),
            )
        })
    }

    /// A path, or several separated by commas (the first present is read).
    pub(super) fn fields(&self, id: ParamId, default: &str) -> Result<Vec<FieldPath>> {
        let text = self.text(id)?.unwrap_or_else(|| default.to_string());
        text.split(',')
            .map(|one| FieldPath::parse(one.trim()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                EtlError::invalid(
                    self.name(id),
                    "must be a field name or a dotted path such as payload.value, or several separated by commas (the first present is read)",
                    format!("'{text}'"),
                )
            })
    }

    pub(super) fn table(&self, id: ParamId, default: TableName) -> Result<TableName> {
        let Some(text) = self.text(id)? else {
            return Ok(default);
        };
        TableName::parse(&text).ok_or_else(|| {
            EtlError::invalid(
                self.name(id),
                "must be a table name, optionally qualified as schema.table or catalog.schema.table",
                format!("'{text}'"),
            )
        })
    }
}
