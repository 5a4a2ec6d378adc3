//! `__streaming_etl_batch(id)`: the rows of one output table of a batch the sink is writing, as
//! a table, so that the sink writes them with one `INSERT ... SELECT` (DuckDB fills the table
//! a vector at a time) instead of appending them value by value. Internal to the sink: an id is
//! only known while its batch is being written, and any other id is an error.

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use duckdb::core::{DataChunkHandle, LogicalTypeHandle, LogicalTypeId};
use duckdb::vtab::{BindInfo, InitInfo, TableFunctionInfo, VTab};
use streaming_etl_core::{EtlError, RowCursor, Rows};

use super::result::{logical_type, write_cell};
use crate::host::out_vector::OutVector;
use crate::host::sql_error::contained;

pub const NAME: &str = "__streaming_etl_batch";

/// Rows lent to the function while the sink writes them, by id.
static LENT: Mutex<Vec<(u64, Arc<Rows>)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Rows readable as `__streaming_etl_batch(id)` until this is dropped.
pub struct Lent {
    pub id: u64,
}

impl Lent {
    pub fn new(rows: Arc<Rows>) -> Lent {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LENT.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, rows));
        Lent { id }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        LENT.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _)| *id != self.id);
    }
}

fn lent(id: u64) -> Option<Arc<Rows>> {
    LENT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, r)| Arc::clone(r))
}

pub struct BatchFunction;

pub struct Scan {
    at: Mutex<RowCursor>,
}

impl VTab for BatchFunction {
    type InitData = Scan;
    type BindData = Arc<Rows>;

    fn bind(bind: &BindInfo) -> Result<Arc<Rows>, Box<dyn Error>> {
        Ok(contained(|| {
            let value = bind.get_parameter(0);
            // (DuckDB 1.4 throws on reading a NULL as an integer.)
            #[cfg(feature = "capi-v1-2")]
            let id = if crate::host::entry::is_null_value(&value) {
                -1
            } else {
                value.to_int64()
            };
            #[cfg(not(feature = "capi-v1-2"))]
            let id = value.to_int64();
            let rows = u64::try_from(id).ok().and_then(lent).ok_or_else(|| {
                EtlError::InvalidParameter {
                    name: "id",
                    reason: format!("no batch with this id is being written ({NAME} is internal to streaming_etl_run)"),
                    got: id.to_string(),
                }
            })?;
            for (i, ty) in rows.types().iter().enumerate() {
                bind.add_result_column(&format!("c{i}"), logical_type(*ty));
            }
            Ok(rows)
        })?)
    }

    fn init(init: &InitInfo) -> Result<Scan, Box<dyn Error>> {
        init.set_max_threads(1);
        Ok(Scan {
            at: Mutex::new(RowCursor::default()),
        })
    }

    fn func(
        func: &TableFunctionInfo<Self>,
        output: &mut DataChunkHandle,
    ) -> Result<(), Box<dyn Error>> {
        Ok(contained(|| {
            let rows = func.get_bind_data();
            let mut at = func
                .get_init_data()
                .at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut vectors: Vec<OutVector<'_>> = (0..rows.types().len())
                .map(|i| OutVector::new(output.flat_vector(i)))
                .collect();
            let capacity = vectors.first().map_or(0, |v| v.capacity());
            let n = rows
                .each_from(&mut at, capacity, |row, cells| {
                    for (v, cell) in vectors.iter_mut().zip(cells) {
                        if !write_cell(v, row, *cell) {
                            return Err(format!(
                                "column of type {:?} cannot hold {cell:?}",
                                v.type_id()
                            ));
                        }
                    }
                    Ok(())
                })
                .map_err(|e| EtlError::Internal(format!("{NAME}: unreadable rows: {e}")))?
                .map_err(|e| EtlError::Internal(format!("{NAME}: {e}")))?;
            output.set_len(n);
            Ok(())
        })?)
    }

    fn parameters() -> Option<Vec<LogicalTypeHandle>> {
        Some(vec![LogicalTypeHandle::from(LogicalTypeId::Bigint)])
    }
}
