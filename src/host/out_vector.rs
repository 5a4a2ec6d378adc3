//! Writing a table function's output vectors: the one safe way this extension fills DuckDB's
//! columns of primitive values, checked against each column's logical type.

use std::marker::PhantomData;

use duckdb::core::{FlatVector, Inserter, LogicalTypeId};

/// duckdb-rs 1.4 (the DuckDB 1.4 build) has no lifetime on `FlatVector`; later versions tie it
/// to the chunk.
#[cfg(not(feature = "capi-v1-2"))]
type Vector<'a> = FlatVector<'a>;
#[cfg(feature = "capi-v1-2")]
type Vector<'a> = FlatVector;

/// The primitive column types the extension writes by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    BigInt,
    Integer,
    Double,
    Boolean,
    /// Strings, blobs and everything written through `insert_bytes`.
    Other,
}

impl Prim {
    fn of(id: &LogicalTypeId) -> Prim {
        match id {
            LogicalTypeId::Bigint => Prim::BigInt,
            LogicalTypeId::Integer => Prim::Integer,
            LogicalTypeId::Double => Prim::Double,
            LogicalTypeId::Boolean => Prim::Boolean,
            _ => Prim::Other,
        }
    }
}

/// A column of an output chunk and its logical type, read once when the column is taken: the
/// type is what makes writing a primitive value sound, and reading it allocates in DuckDB, too
/// much to do per value. Missing in `duckdb`: a safe way to write primitive values
/// (`FlatVector::as_mut_slice` is unsafe because it trusts the type).
pub struct OutVector<'a> {
    vector: Vector<'a>,
    ty: Prim,
    chunk: PhantomData<&'a ()>,
}

impl<'a> OutVector<'a> {
    pub fn new(vector: Vector<'a>) -> OutVector<'a> {
        let ty = Prim::of(&vector.logical_type().id());
        OutVector {
            vector,
            ty,
            chunk: PhantomData,
        }
    }

    pub fn capacity(&self) -> usize {
        self.vector.capacity()
    }

    pub fn type_id(&self) -> Prim {
        self.ty
    }

    fn write_fixed<V: Copy>(&mut self, ty: Prim, row: usize, v: V) -> bool {
        if self.ty != ty || row >= self.vector.capacity() {
            return false;
        }
        // SAFETY: the column's logical type (read from the vector itself in `new`; a vector's
        // type does not change) was checked to store `V` (i64 for BIGINT, i32 for INTEGER, f64
        // for DOUBLE, bool for BOOLEAN) and `row` is within the vector's capacity.
        // (duckdb-rs 1.4 declares `as_mut_slice` safe.)
        #[cfg_attr(feature = "capi-v1-2", allow(unused_unsafe))]
        unsafe {
            self.vector.as_mut_slice::<V>()[row] = v
        };
        true
    }

    pub fn write_i64(&mut self, row: usize, v: i64) -> bool {
        self.write_fixed(Prim::BigInt, row, v)
    }

    pub fn write_i32(&mut self, row: usize, v: i32) -> bool {
        self.write_fixed(Prim::Integer, row, v)
    }

    pub fn write_f64(&mut self, row: usize, v: f64) -> bool {
        self.write_fixed(Prim::Double, row, v)
    }

    pub fn write_bool(&mut self, row: usize, v: bool) -> bool {
        self.write_fixed(Prim::Boolean, row, v)
    }

    pub fn set_null(&mut self, row: usize) {
        self.vector.set_null(row);
    }

    /// A string's or a blob's bytes (the vector copies them).
    pub fn insert_bytes(&mut self, row: usize, value: &[u8]) {
        self.vector.insert(row, value);
    }
}
