//! `streaming_etl_stop(name)` (also `CALL streaming_etl_stop(name)`): ends a background job at a
//! cycle boundary, everything it read committed, and returns its row once it has stopped. It is
//! then not resumed after a restart; a job recorded by an earlier process and not resumed is
//! only taken off the record. An unknown name is an error naming it.

use std::error::Error;
use std::sync::Arc;

use duckdb::core::{DataChunkHandle, LogicalTypeHandle, LogicalTypeId};
use duckdb::vtab::{BindInfo, InitInfo, TableFunctionInfo, VTab};
use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::checkpoint::Checkpoint;

use super::jobs::{Rows, JOB_COLUMNS};
use super::result::add_columns;
use crate::host::args::{shown, Arg, Args};
use crate::host::connections::Host;
use crate::host::entry;
use crate::host::sandbox::Sandbox;
use crate::host::sql_error::contained;
use crate::jobs::call::Call;
use crate::jobs::job::{now_ms, JobRow, JobSpec};
use crate::jobs::registry::Jobs;
use crate::params::{jobs_record, CHECKPOINT_PARAMS};

pub struct StopFunction;

pub struct StopBind {
    name: String,
    /// Where the database's background jobs are recorded.
    record: Option<String>,
}

/// The `name` argument.
fn job_name(args: &dyn Args) -> Result<String> {
    match args.positional(0) {
        Some(Arg::Text(t)) if !t.trim().is_empty() => Ok(t),
        Some(other) => Err(EtlError::invalid(
            "name",
            "must name a background job",
            shown(&other),
        )),
        None => Err(EtlError::invalid("name", "is required", "nothing")),
    }
}

/// Stops the job `name` of this process, or takes a job an earlier process recorded off the
/// record (not on a read-only open, which writes nothing).
fn stop(host: &Arc<Host>, name: &str, record: Option<&str>) -> Result<JobRow> {
    if let Some(row) = host.jobs().stop(name) {
        return Ok(row);
    }
    if let Some(path) = record {
        let recorded = Checkpoint::active_background(path)?
            .into_iter()
            .find(|r| r.job == name);
        if let Some(r) = recorded {
            if host.read_only()? {
                return Err(EtlError::invalid(
                    "name",
                    format!(
                        "names a job an earlier process recorded to be resumed (in '{path}'); the database is open read-only, which writes nothing: take it off the record from a read-write open"
                    ),
                    format!("'{name}'"),
                ));
            }
            Checkpoint::open_file(path)?.deactivate_background(name, now_ms())?;
            let spec = JobSpec {
                name: name.to_string(),
                call_shown: Call::decode(&r.call).map(|c| c.shown()).unwrap_or_default(),
                record: None,
                every_ms: None,
            };
            return Ok(Jobs::stopped_unlisted(spec));
        }
    }
    Err(EtlError::invalid(
        "name",
        "no background job of this name in this database (streaming_etl_jobs() lists them)",
        format!("'{name}'"),
    ))
}

impl VTab for StopFunction {
    type InitData = Rows<JobRow>;
    type BindData = StopBind;

    fn bind(bind: &BindInfo) -> std::result::Result<StopBind, Box<dyn Error>> {
        Ok(contained(|| {
            let host = entry::bind_host(bind).ok_or(EtlError::Detached)?;
            host.touch();
            let name = job_name(bind)?;
            let record = jobs_record(bind, host.db_path(), &Sandbox::read(bind), true)?;
            add_columns(bind, JOB_COLUMNS);
            Ok(StopBind { name, record })
        })?)
    }

    fn init(init: &InitInfo) -> std::result::Result<Rows<JobRow>, Box<dyn Error>> {
        init.set_max_threads(1);
        Ok(Rows::new())
    }

    fn func(
        func: &TableFunctionInfo<Self>,
        output: &mut DataChunkHandle,
    ) -> std::result::Result<(), Box<dyn Error>> {
        Ok(contained(|| {
            func.get_init_data().emit(output, JOB_COLUMNS, || {
                let host = entry::func_host(func).ok_or(EtlError::Detached)?;
                let b = func.get_bind_data();
                Ok(vec![stop(&host, &b.name, b.record.as_deref())?])
            })
        })?)
    }

    fn parameters() -> Option<Vec<LogicalTypeHandle>> {
        Some(vec![LogicalTypeHandle::from(LogicalTypeId::Varchar)])
    }

    fn named_parameters() -> Option<Vec<(String, LogicalTypeHandle)>> {
        Some(crate::host::param_types::named_parameters(
            &CHECKPOINT_PARAMS[..1],
        ))
    }
}
