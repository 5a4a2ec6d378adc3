//! `streaming_etl_checkpoint()` (also `CALL streaming_etl_checkpoint()`): one row per job and
//! partition of the checkpoint, read without changing it: next offset, partition and global
//! watermarks, open windows, output not yet confirmed in DuckDB, last update, and the lag where
//! the source knew its end offset (bytes for files, messages for Kafka), and the checkpoint
//! file. Without `checkpoint :=`, the jobs run with a checkpoint of their own show too.

use std::error::Error;
use std::sync::{Arc, Mutex, PoisonError};

use duckdb::core::{DataChunkHandle, LogicalTypeHandle};
use duckdb::vtab::{BindInfo, InitInfo, TableFunctionInfo, VTab};
use streaming_etl_core::{Cell, ColumnType, EtlError};
use streaming_etl_runtime::checkpoint::{inspect, CheckpointRow};
use streaming_etl_runtime::config::CheckpointLocation;

use super::result::{add_columns, write_rows, ResultColumn};
use crate::host::connections::Host;
use crate::host::entry;
use crate::host::sandbox::Sandbox;
use crate::host::sql_error::contained;
use crate::params::{checkpoint_job, checkpoint_location, checkpoint_named, CHECKPOINT_PARAMS};
use crate::sink::owners;
use streaming_etl_core::Result;

fn opt(v: Option<i64>) -> Cell<'static> {
    v.map_or(Cell::Null, Cell::I64)
}

pub const CHECKPOINT_COLUMNS: &[ResultColumn<CheckpointRow>] = &[
    ResultColumn {
        name: "job",
        ty: ColumnType::Varchar,
        get: |r| Cell::Str(&r.job),
    },
    ResultColumn {
        name: "topic",
        ty: ColumnType::Varchar,
        get: |r| Cell::Str(&r.source),
    },
    ResultColumn {
        name: "partition",
        ty: ColumnType::Integer,
        get: |r| r.partition.map_or(Cell::Null, Cell::I32),
    },
    ResultColumn {
        name: "file",
        ty: ColumnType::Varchar,
        get: |r| r.name.as_deref().map_or(Cell::Null, Cell::Str),
    },
    ResultColumn {
        name: "next_offset",
        ty: ColumnType::BigInt,
        get: |r| opt(r.next_offset),
    },
    ResultColumn {
        name: "max_event_time_ms",
        ty: ColumnType::BigInt,
        get: |r| opt(r.max_event_time_ms),
    },
    ResultColumn {
        name: "partition_watermark_ms",
        ty: ColumnType::BigInt,
        get: |r| opt(r.partition_watermark_ms),
    },
    ResultColumn {
        name: "global_watermark_ms",
        ty: ColumnType::BigInt,
        get: |r| opt(r.global_watermark_ms),
    },
    ResultColumn {
        name: "open_windows",
        ty: ColumnType::BigInt,
        get: |r| Cell::I64(r.open_windows),
    },
    ResultColumn {
        name: "pending_batches",
        ty: ColumnType::BigInt,
        get: |r| Cell::I64(r.pending_batches),
    },
    ResultColumn {
        name: "end_offset",
        ty: ColumnType::BigInt,
        get: |r| opt(r.end_offset),
    },
    ResultColumn {
        name: "lag",
        ty: ColumnType::BigInt,
        get: |r| opt(r.lag),
    },
    ResultColumn {
        name: "window_ms",
        ty: ColumnType::BigInt,
        get: |r| Cell::I64(r.window_ms),
    },
    ResultColumn {
        name: "lateness_ms",
        ty: ColumnType::BigInt,
        get: |r| Cell::I64(r.lateness_ms),
    },
    ResultColumn {
        name: "last_update_ms",
        ty: ColumnType::BigInt,
        get: |r| Cell::I64(r.last_update_ms),
    },
    ResultColumn {
        name: "status",
        ty: ColumnType::Varchar,
        get: |r| match r.status.as_deref() {
            None => Cell::Null,
            Some("") => Cell::Str("active"),
            Some(s) => Cell::Str(s),
        },
    },
    ResultColumn {
        name: "checkpoint",
        ty: ColumnType::Varchar,
        get: |r| Cell::Str(&r.checkpoint),
    },
];

pub struct CheckpointFunction;

pub struct Inspect {
    /// The checkpoint asked for (or the database's), then the others its jobs recorded.
    locations: Vec<CheckpointLocation>,
    job: Option<String>,
}

/// The checkpoint asked for; without `checkpoint :=`, also every other checkpoint file the
/// jobs writing into this database recorded beside their tables (`sink::owners`), those the
/// sandbox allows and that still exist.
fn locations(bind: &BindInfo, host: &Arc<Host>) -> Result<Vec<CheckpointLocation>> {
    let sandbox = Sandbox::read(bind);
    let first = checkpoint_location(bind, host.db_path(), &sandbox)?;
    let named = checkpoint_named(bind)?;
    let mut out = vec![first];
    if named {
        return Ok(out);
    }
    let pooled = host.checkout()?;
    for path in owners::recorded_checkpoints(pooled.conn()?)? {
        let location = CheckpointLocation::File(path.clone());
        if out.contains(&location)
            || sandbox.check_checkpoint(&path).is_err()
            || !std::path::Path::new(&path).exists()
        {
            continue;
        }
        out.push(location);
    }
    Ok(out)
}

pub struct CheckpointScan {
    rows: Mutex<Option<(Vec<CheckpointRow>, usize)>>,
}

impl VTab for CheckpointFunction {
    type InitData = CheckpointScan;
    type BindData = Inspect;

    fn bind(bind: &BindInfo) -> Result<Inspect, Box<dyn Error>> {
        Ok(contained(|| {
            streaming_etl_runtime::fault::panic_point("checkpoint-bind");
            let host = entry::bind_host(bind).ok_or(EtlError::Detached)?;
            host.touch();
            let inspect = Inspect {
                locations: locations(bind, &host)?,
                job: checkpoint_job(bind)?,
            };
            add_columns(bind, CHECKPOINT_COLUMNS);
            Ok(inspect)
        })?)
    }

    fn init(init: &InitInfo) -> Result<CheckpointScan, Box<dyn Error>> {
        init.set_max_threads(1);
        Ok(CheckpointScan {
            rows: Mutex::new(None),
        })
    }

    fn func(
        func: &TableFunctionInfo<Self>,
        output: &mut DataChunkHandle,
    ) -> Result<(), Box<dyn Error>> {
        Ok(contained(|| {
            let mut slot = func
                .get_init_data()
                .rows
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                let host = entry::func_host(func).ok_or(EtlError::Detached)?;
                let bind = func.get_bind_data();
                let mut rows = Vec::new();
                for location in &bind.locations {
                    let memory = host.existing_memory_checkpoint();
                    rows.extend(inspect(location, memory, bind.job.as_deref())?);
                }
                *slot = Some((rows, 0));
            }
            let Some((rows, next)) = slot.as_mut() else {
                return Ok(());
            };
            write_rows(output, CHECKPOINT_COLUMNS, rows, next)
        })?)
    }

    fn named_parameters() -> Option<Vec<(String, LogicalTypeHandle)>> {
        Some(crate::host::param_types::named_parameters(
            CHECKPOINT_PARAMS,
        ))
    }
}
