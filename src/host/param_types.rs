//! The DuckDB types of the SQL functions' parameters, from their declaration in
//! [`params`](crate::params).

use duckdb::core::{LogicalTypeHandle, LogicalTypeId};

use crate::params::{Param, ParamType};

/// The DuckDB types of a function's named parameters.
pub(crate) fn named_parameters(params: &[Param]) -> Vec<(String, LogicalTypeHandle)> {
    params
        .iter()
        .map(|p| (p.name.to_string(), logical_type(p.ty)))
        .collect()
}

/// The DuckDB type of a parameter.
pub(crate) fn logical_type(ty: ParamType) -> LogicalTypeHandle {
    let t = LogicalTypeHandle::from;
    match ty {
        ParamType::Varchar => t(LogicalTypeId::Varchar),
        ParamType::BigInt => t(LogicalTypeId::Bigint),
        ParamType::Boolean => t(LogicalTypeId::Boolean),
        ParamType::IntegerList => LogicalTypeHandle::list(&t(LogicalTypeId::Integer)),
        ParamType::VarcharList => LogicalTypeHandle::list(&t(LogicalTypeId::Varchar)),
        ParamType::VarcharMap => {
            LogicalTypeHandle::map(&t(LogicalTypeId::Varchar), &t(LogicalTypeId::Varchar))
        }
        ParamType::Interval => t(LogicalTypeId::Interval),
    }
}
