//! The result columns of the SQL functions, each declared once with its type and how its value
//! is read from the row it shows; registering the columns and writing the output chunk both
//! follow from that declaration, and a value of the wrong type is an error, never dropped.

use duckdb::core::{DataChunkHandle, LogicalTypeHandle, LogicalTypeId};
use duckdb::vtab::BindInfo;
use streaming_etl_core::{Cell, ColumnType, EtlError, Result};

use crate::host::out_vector::OutVector;

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
        // A list travels as its text; the table's DOUBLE[] column casts it on insert.
        ColumnType::Varchar | ColumnType::DoubleList => LogicalTypeId::Varchar,
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
        let ok = cell.fits(c.ty) && write_cell(&mut v, row, cell);
        if !ok {
            return Err(EtlError::Internal(format!(
                "result column '{}' ({:?}) cannot hold {cell:?}",
                c.name, c.ty
            )));
        }
    }
    Ok(())
}

/// Writes the rows from `*next` on into the chunk, as many as it holds, and moves `next` past
/// them (a function whose rows outnumber a chunk is called again for the rest).
pub fn write_rows<R>(
    chunk: &mut DataChunkHandle,
    columns: &[ResultColumn<R>],
    rows: &[R],
    next: &mut usize,
) -> Result<()> {
    let capacity = chunk.flat_vector(0).capacity();
    let n = rows.len().saturating_sub(*next).min(capacity);
    for (i, r) in rows[*next..*next + n].iter().enumerate() {
        write_row(chunk, i, columns, r)?;
    }
    chunk.set_len(n);
    *next += n;
    Ok(())
}

/// Writes one cell into row `row` of a column; false when the column's type cannot hold it (a
/// string or bytes must only be given to a VARCHAR or BLOB column: `Cell::fits` says so).
pub fn write_cell(v: &mut OutVector<'_>, row: usize, cell: Cell<'_>) -> bool {
    match cell {
        Cell::Null => {
            v.set_null(row);
            true
        }
        Cell::Bool(b) => v.write_bool(row, b),
        Cell::I32(x) => v.write_i32(row, x),
        Cell::I64(x) => v.write_i64(row, x),
        Cell::F64(x) => v.write_f64(row, x),
        Cell::Str(s) => {
            v.insert_bytes(row, s.as_bytes());
            true
        }
        Cell::Bytes(b) => {
            v.insert_bytes(row, b);
            true
        }
    }
}
