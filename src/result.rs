//! The result columns of the SQL functions, each declared once with its type and how its value
//! is read from the row it shows; registering the columns and writing the output chunk both
//! follow from that declaration, and a value of the wrong type is an error, never dropped.

use duckdb::core::{DataChunkHandle, FlatVector, Inserter, LogicalTypeHandle, LogicalTypeId};
use duckdb::vtab::BindInfo;
use streaming_etl_core::error::{EtlError, Result};
use streaming_etl_core::rows::{Cell, ColumnType};

use crate::sys;

/// One result column of a function whose rows are `R`s.
pub struct ResultColumn<R> {
    pub name: &'static str,
    pub ty: ColumnType,
    pub get: fn(&R) -> Cell<'_>,
}

pub fn logical_type(ty: ColumnType) -> LogicalTypeHandle {
    LogicalTypeHandle::from(match ty {
        ColumnType::Boolean => LogicalTypeId::Boolean,
        ColumnType::Integer => LogicalTypeId::Integer,
        ColumnType::BigInt => LogicalTypeId::Bigint,
        ColumnType::Double => LogicalTypeId::Double,
        ColumnType::Varchar => LogicalTypeId::Varchar,
        ColumnType::Blob => LogicalTypeId::Blob,
    })
}

/// Declares the columns as the function's result.
pub fn add_columns<R>(bind: &BindInfo, columns: &[ResultColumn<R>]) {
    for c in columns {
        bind.add_result_column(c.name, logical_type(c.ty));
    }
}

/// Writes `r` as row `row` of the output chunk.
pub fn write_row<R>(
    chunk: &mut DataChunkHandle,
    row: usize,
    columns: &[ResultColumn<R>],
    r: &R,
) -> Result<()> {
    for (i, c) in columns.iter().enumerate() {
        let cell = (c.get)(r);
        let mut v = OutVector::new(chunk.flat_vector(i));
        let ok = cell.fits(c.ty) && v.write(row, cell);
        if !ok {
            return Err(EtlError::Internal(format!(
                "result column '{}' ({:?}) cannot hold {cell:?}",
                c.name, c.ty
            )));
        }
    }
    Ok(())
}

/// A column of an output chunk with its logical type, read once: DuckDB allocates a type
/// object for every read, which cost more than the value written when done per cell.
pub struct OutVector<'a> {
    vector: FlatVector<'a>,
    ty: LogicalTypeId,
}

impl<'a> OutVector<'a> {
    pub fn new(vector: FlatVector<'a>) -> OutVector<'a> {
        let ty = vector.logical_type().id();
        OutVector { vector, ty }
    }

    pub fn capacity(&self) -> usize {
        self.vector.capacity()
    }

    pub fn type_id(&self) -> LogicalTypeId {
        self.ty
    }

    /// Writes one cell into row `row`; false when the column's type cannot hold it (a string
    /// or bytes must only be given to a VARCHAR or BLOB column: `Cell::fits` says so).
    pub fn write(&mut self, row: usize, cell: Cell<'_>) -> bool {
        let v = &mut self.vector;
        match cell {
            Cell::Null => {
                v.set_null(row);
                true
            }
            Cell::Bool(b) => sys::write_bool(v, self.ty, row, b),
            Cell::I32(x) => sys::write_i32(v, self.ty, row, x),
            Cell::I64(x) => sys::write_i64(v, self.ty, row, x),
            Cell::F64(x) => sys::write_f64(v, self.ty, row, x),
            Cell::Str(s) => {
                v.insert(row, s);
                true
            }
            Cell::Bytes(b) => {
                v.insert(row, b);
                true
            }
        }
    }
}
