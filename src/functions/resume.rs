//! `streaming_etl_resume()` (also `CALL streaming_etl_resume()`): starts again, in the
//! background, every job that was running when this database was last closed or its process
//! ended, each from its checkpoint, as it was called (the extension's settings as they were,
//! DuckDB's as they are now). `LOAD` alone starts nothing. Returns a row per job; a job whose
//! broker is not back yet shows `retrying`, one that cannot run any more `failed`.

use std::error::Error;
use std::sync::Arc;

use duckdb::core::{DataChunkHandle, LogicalTypeHandle};
use duckdb::vtab::{BindInfo, InitInfo, TableFunctionInfo, VTab};
use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::checkpoint::Checkpoint;

use super::bound::{bind_run, RunBind};
use super::jobs::{Rows, JOB_COLUMNS};
use super::result::add_columns;
use super::run::{start_background, FirstRun};
use crate::host::args::Args;
use crate::host::connections::Host;
use crate::host::entry;
use crate::host::sandbox::Sandbox;
use crate::host::sql_error::contained;
use crate::jobs::call::Call;
use crate::jobs::job::{JobRow, JobSpec};
use crate::params::{checkpoint_named, jobs_record, CHECKPOINT_PARAMS};

pub struct ResumeFunction;

/// A recorded job, bound again.
enum Resumable {
    Bound(Box<RunBind>),
    /// Already running in this process.
    Running(String),
    /// It cannot be bound again (its call no longer holds: a sandbox, a changed setting).
    Failed {
        spec: JobSpec,
        error: EtlError,
    },
}

pub struct ResumeBind {
    jobs: Vec<Resumable>,
}

/// The recorded jobs of the file at `record`, each bound again with `args`' live settings.
fn bind_recorded(host: &Arc<Host>, args: &dyn Args, record: &str) -> Result<Vec<Resumable>> {
    let mut out = Vec::new();
    for r in Checkpoint::active_background(record)? {
        if host.jobs().check_free(&r.job).is_err() {
            out.push(Resumable::Running(r.job));
            continue;
        }
        let call = Call::decode(&r.call);
        let shown = call.as_ref().map(Call::shown).unwrap_or_default();
        let bound = call.and_then(|c| bind_run(host, &c.replayed(args), &c.function));
        out.push(match bound {
            Ok(b) => Resumable::Bound(Box::new(b)),
            Err(error) => Resumable::Failed {
                spec: JobSpec {
                    name: r.job,
                    call_shown: shown,
                    record: Some(record.to_string()),
                    every_ms: None,
                },
                error,
            },
        });
    }
    Ok(out)
}

/// Starts the jobs bound at bind time; returns their rows.
fn resume(host: &Arc<Host>, jobs: &[Resumable]) -> Vec<JobRow> {
    let registry = host.jobs();
    jobs.iter()
        .filter_map(|j| match j {
            Resumable::Running(name) => registry.get(name).map(|j| j.row()),
            Resumable::Failed { spec, error } => Some(registry.insert_failed(
                JobSpec {
                    name: spec.name.clone(),
                    call_shown: spec.call_shown.clone(),
                    record: spec.record.clone(),
                    every_ms: None,
                },
                error,
            )),
            Resumable::Bound(b) => Some(
                start_background(host, b, FirstRun::MayRetry).unwrap_or_else(|e| {
                    registry.insert_failed(
                        JobSpec {
                            name: b.job().to_string(),
                            call_shown: b.call().map(Call::shown).unwrap_or_default(),
                            record: None,
                            every_ms: None,
                        },
                        &e,
                    )
                }),
            ),
        })
        .collect()
}

impl VTab for ResumeFunction {
    type InitData = Rows<JobRow>;
    type BindData = ResumeBind;

    fn bind(bind: &BindInfo) -> std::result::Result<ResumeBind, Box<dyn Error>> {
        Ok(contained(|| {
            let host = entry::bind_host(bind).ok_or(EtlError::Detached)?;
            host.touch();
            let record = jobs_record(bind, host.db_path(), &Sandbox::read(bind), true)?;
            if let Some(path) = record.as_deref() {
                if checkpoint_named(bind)? && !std::path::Path::new(path).exists() {
                    return Err(EtlError::invalid(
                        "checkpoint",
                        "no such file: it would record the jobs to resume (the database's checkpoint, or the one they were started with)",
                        format!("'{path}'"),
                    ));
                }
            }
            if let Some(path) = record.as_deref() {
                let n = Checkpoint::active_background(path)?.len();
                if n > 0 && host.read_only()? {
                    return Err(EtlError::invalid(
                        "checkpoint",
                        format!("records {n} job(s) to resume, which write this database, and it is open read-only (access_mode = 'read_only'): resume them from a read-write open"),
                        format!("'{path}'"),
                    ));
                }
            }
            let jobs = match record {
                Some(path) => bind_recorded(&host, bind, &path)?,
                None => Vec::new(),
            };
            add_columns(bind, JOB_COLUMNS);
            Ok(ResumeBind { jobs })
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
                Ok(resume(&host, &func.get_bind_data().jobs))
            })
        })?)
    }

    fn named_parameters() -> Option<Vec<(String, LogicalTypeHandle)>> {
        Some(crate::host::param_types::named_parameters(
            &CHECKPOINT_PARAMS[..1],
        ))
    }
}
