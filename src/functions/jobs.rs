//! `streaming_etl_jobs()` (also `CALL streaming_etl_jobs()`): one row per background job of
//! this database in this process, with its state, counts, rate, lag and last error. The same
//! row is what starting, stopping and resuming a job return.

use std::error::Error;
use std::sync::{Mutex, PoisonError};

use duckdb::core::DataChunkHandle;
use duckdb::vtab::{BindInfo, InitInfo, TableFunctionInfo, VTab};
use streaming_etl_core::{Cell, ColumnType, EtlError};

use super::result::{add_columns, write_rows, ResultColumn};
use crate::host::entry;
use crate::host::sql_error::contained;
use crate::jobs::job::JobRow;

fn opt(v: Option<i64>) -> Cell<'static> {
    v.map_or(Cell::Null, Cell::I64)
}

fn count(v: u64) -> Cell<'static> {
    Cell::I64(i64::try_from(v).unwrap_or(i64::MAX))
}

/// A background job's row.
pub const JOB_COLUMNS: &[ResultColumn<JobRow>] = &[
    ResultColumn {
        name: "job",
        ty: ColumnType::Varchar,
        get: |r| Cell::Str(&r.job),
    },
    ResultColumn {
        name: "state",
        ty: ColumnType::Varchar,
        get: |r| Cell::Str(r.state.name()),
    },
    ResultColumn {
        name: "call",
        ty: ColumnType::Varchar,
        get: |r| Cell::Str(&r.call),
    },
    ResultColumn {
        name: "started_ms",
        ty: ColumnType::BigInt,
        get: |r| Cell::I64(r.started_ms),
    },
    ResultColumn {
        name: "last_cycle_ms",
        ty: ColumnType::BigInt,
        get: |r| opt(r.last_cycle_ms),
    },
    ResultColumn {
        name: "runs",
        ty: ColumnType::BigInt,
        get: |r| count(r.runs),
    },
    ResultColumn {
        name: "threads",
        ty: ColumnType::BigInt,
        get: |r| count(r.threads),
    },
    ResultColumn {
        name: "cycles",
        ty: ColumnType::BigInt,
        get: |r| count(r.cycles),
    },
    ResultColumn {
        name: "events_consumed",
        ty: ColumnType::BigInt,
        get: |r| count(r.events),
    },
    ResultColumn {
        name: "events_per_sec",
        ty: ColumnType::Double,
        get: |r| Cell::F64(r.events_per_sec),
    },
    ResultColumn {
        name: "lag",
        ty: ColumnType::BigInt,
        get: |r| opt(r.lag),
    },
    ResultColumn {
        name: "windows_emitted",
        ty: ColumnType::BigInt,
        get: |r| count(r.windows_emitted),
    },
    ResultColumn {
        name: "late_events",
        ty: ColumnType::BigInt,
        get: |r| count(r.late_events),
    },
    ResultColumn {
        name: "dead_letters",
        ty: ColumnType::BigInt,
        get: |r| count(r.dead_letters),
    },
    ResultColumn {
        name: "watermark_ms",
        ty: ColumnType::BigInt,
        get: |r| opt(r.watermark_ms),
    },
    ResultColumn {
        name: "last_status",
        ty: ColumnType::Varchar,
        get: |r| r.last_status.map_or(Cell::Null, Cell::Str),
    },
    ResultColumn {
        name: "last_error",
        ty: ColumnType::Varchar,
        get: |r| r.last_error.as_deref().map_or(Cell::Null, Cell::Str),
    },
    ResultColumn {
        name: "retries",
        ty: ColumnType::BigInt,
        get: |r| count(r.retries),
    },
    ResultColumn {
        name: "next_run_ms",
        ty: ColumnType::BigInt,
        get: |r| opt(r.next_run_ms),
    },
    ResultColumn {
        name: "open_windows",
        ty: ColumnType::BigInt,
        get: |r| count(r.open_windows),
    },
    ResultColumn {
        name: "state_bytes",
        ty: ColumnType::BigInt,
        get: |r| count(r.state_bytes),
    },
    ResultColumn {
        name: "wal_bytes",
        ty: ColumnType::BigInt,
        get: |r| opt(r.wal_bytes),
    },
    ResultColumn {
        name: "warning",
        ty: ColumnType::Varchar,
        get: |r| r.warning.as_deref().map_or(Cell::Null, Cell::Str),
    },
];

/// Rows computed on the first call of a function and handed out a chunk at a time.
pub struct Rows<R> {
    rows: Mutex<Option<(Vec<R>, usize)>>,
}

impl<R> Rows<R> {
    pub fn new() -> Rows<R> {
        Rows {
            rows: Mutex::new(None),
        }
    }

    /// Writes the next rows, computing them all with `make` on the first call.
    pub fn emit(
        &self,
        output: &mut DataChunkHandle,
        columns: &[ResultColumn<R>],
        make: impl FnOnce() -> streaming_etl_core::Result<Vec<R>>,
    ) -> streaming_etl_core::Result<()> {
        let mut slot = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some((make()?, 0));
        }
        match slot.as_mut() {
            Some((rows, next)) => write_rows(output, columns, rows, next),
            None => Ok(()),
        }
    }
}

pub struct JobsFunction;

impl VTab for JobsFunction {
    type InitData = Rows<JobRow>;
    type BindData = ();

    fn bind(bind: &BindInfo) -> Result<(), Box<dyn Error>> {
        Ok(contained(|| {
            entry::bind_host(bind).ok_or(EtlError::Detached)?.touch();
            add_columns(bind, JOB_COLUMNS);
            Ok(())
        })?)
    }

    fn init(init: &InitInfo) -> Result<Rows<JobRow>, Box<dyn Error>> {
        init.set_max_threads(1);
        Ok(Rows::new())
    }

    fn func(
        func: &TableFunctionInfo<Self>,
        output: &mut DataChunkHandle,
    ) -> Result<(), Box<dyn Error>> {
        Ok(contained(|| {
            func.get_init_data().emit(output, JOB_COLUMNS, || {
                let host = entry::func_host(func).ok_or(EtlError::Detached)?;
                Ok(host.jobs().rows())
            })
        })?)
    }
}
