//! Writing a table function's output vectors: the one safe way this extension fills DuckDB's
//! columns of primitive values, checked against each column's logical type.

use duckdb::core::{FlatVector, Inserter, LogicalTypeId};

/// A column of an output chunk and its logical type, read once when the column is taken: the
/// type is what makes writing a primitive value sound, and reading it allocates in DuckDB, too
/// much to do per value. Missing in `duckdb`: a safe way to write primitive values
/// (`FlatVector::as_mut_slice` is unsafe because it trusts the type).
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

    fn write_fixed<V: Copy>(&mut self, ty: LogicalTypeId, row: usize, v: V) -> bool {
        if self.ty != ty || row >= self.vector.capacity() {
            return false;
        }
        // SAFETY: the column's logical type (read from the vector itself in `new`; a vector's
        // type does not change) was checked to store `V` (i64 for BIGINT, i32 for INTEGER, f64
        // for DOUBLE, bool for BOOLEAN) and `row` is within the vector's capacity.
        unsafe { self.vector.as_mut_slice::<V>()[row] = v };
        true
    }

    pub fn write_i64(&mut self, row: usize, v: i64) -> bool {
        self.write_fixed(LogicalTypeId::Bigint, row, v)
    }

    pub fn write_i32(&mut self, row: usize, v: i32) -> bool {
        self.write_fixed(LogicalTypeId::Integer, row, v)
    }

    pub fn write_f64(&mut self, row: usize, v: f64) -> bool {
        self.write_fixed(LogicalTypeId::Double, row, v)
    }

    pub fn write_bool(&mut self, row: usize, v: bool) -> bool {
        self.write_fixed(LogicalTypeId::Boolean, row, v)
    }

    pub fn set_null(&mut self, row: usize) {
        self.vector.set_null(row);
    }

    /// A string's or a blob's bytes (the vector copies them).
    pub fn insert_bytes(&mut self, row: usize, value: &[u8]) {
        self.vector.insert(row, value);
    }
}
