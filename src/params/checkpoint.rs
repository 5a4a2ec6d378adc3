//! Where a job's progress is kept: the checkpoint location (`checkpoint`, the
//! `streaming_etl_checkpoint` setting, or beside the database file) and the `job` argument of
//! `streaming_etl_checkpoint`.

use streaming_etl_core::Result;
use streaming_etl_runtime::config::CheckpointLocation;

use super::given::Given;
use super::table::*;
use crate::host::args::{Arg, Args};
use crate::host::sandbox::Sandbox;

/// Resolves the checkpoint location: the `checkpoint` argument, else the
/// `streaming_etl_checkpoint` setting, else next to the database file (in memory for an
/// in-memory database). A file the user named must be allowed by DuckDB's sandbox; the default
/// one is the database's own state.
pub fn checkpoint_location(
    args: &dyn Args,
    db_path: Option<&str>,
    sandbox: &Sandbox,
) -> Result<CheckpointLocation> {
    let named = Given::read(args, CHECKPOINT_PARAMS).text(ParamId::Checkpoint)?;
    resolve(args, named, db_path, sandbox)
}

/// Where a database's background jobs are recorded, to be started again after a restart: the
/// `checkpoint` argument if `named` (streaming_etl_resume and _stop take one; a job's own is
/// where its state is, not its record), else the `streaming_etl_checkpoint` setting, else beside
/// the database file. None for an in-memory database, whose jobs end with it.
pub fn jobs_record(
    args: &dyn Args,
    db_path: Option<&str>,
    sandbox: &Sandbox,
    named: bool,
) -> Result<Option<String>> {
    let given = match named {
        true => Given::read(args, CHECKPOINT_PARAMS).text(ParamId::Checkpoint)?,
        false => None,
    };
    Ok(match resolve(args, given, db_path, sandbox)? {
        CheckpointLocation::File(path) => Some(path),
        CheckpointLocation::Memory => None,
    })
}

fn resolve(
    args: &dyn Args,
    named: Option<String>,
    db_path: Option<&str>,
    sandbox: &Sandbox,
) -> Result<CheckpointLocation> {
    let chosen = match named {
        Some(p) => Some(p),
        None => match args.setting(SETTING_CHECKPOINT) {
            Some(Arg::Text(s)) => Some(s),
            _ => None,
        },
    };
    let default = db_path.map(|db| format!("{db}.streaming_etl.sqlite"));
    Ok(match chosen.filter(|p| !p.trim().is_empty()) {
        Some(p) if p == ":memory:" => CheckpointLocation::Memory,
        Some(p) => {
            if default.as_deref() != Some(p.as_str()) {
                sandbox.check_checkpoint(&p)?;
            }
            CheckpointLocation::File(p)
        }
        None => match default {
            Some(path) => CheckpointLocation::File(path),
            None => CheckpointLocation::Memory,
        },
    })
}

/// Whether a call names its checkpoint (`checkpoint :=`).
pub fn checkpoint_named(args: &dyn Args) -> Result<bool> {
    Ok(Given::read(args, CHECKPOINT_PARAMS)
        .text(ParamId::Checkpoint)?
        .is_some())
}

/// The `job` argument of `streaming_etl_checkpoint`.
pub fn checkpoint_job(args: &dyn Args) -> Result<Option<String>> {
    Given::read(args, CHECKPOINT_PARAMS).text(ParamId::Job)
}
