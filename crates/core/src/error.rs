//! Errors a run can end with. Each message names the input it is about (the parameter and its
//! value, the file, the job, the table), because it is what the user reads in the SQL error.

use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum EtlError {
    /// A bad argument to a SQL function, found at bind time.
    #[error("invalid parameter '{name}': {reason} (got {got})")]
    InvalidParameter {
        name: &'static str,
        reason: String,
        got: String,
    },

    /// An expression of a parameter that DuckDB's binder refused, with DuckDB's message.
    #[error("invalid parameter '{name}': '{expr}': {message}")]
    InvalidExpression {
        name: &'static str,
        expr: String,
        message: String,
    },

    /// A statement of a job written as SQL that cannot run, named by its target.
    #[error("invalid parameter 'sql': the statement into {target}: {message}")]
    Statement { target: String, message: String },

    /// The checkpoint file cannot be opened, read or written.
    #[error("checkpoint '{path}': {message}")]
    Checkpoint { path: String, message: String },

    /// The job's checkpoint was written with other settings than this run's.
    #[error("job '{job}' was checkpointed with {setting} = {stored}, but this run has {setting} = {requested}; run it with the same settings, or under another job name (job := '...') or checkpoint")]
    SettingsChanged {
        job: String,
        setting: String,
        stored: String,
        requested: String,
    },

    /// Another run of the same job holds its lock.
    #[error(
        "job '{job}' is already running (checkpoint '{path}'); two runs of one job cannot overlap"
    )]
    JobBusy { job: String, path: String },

    /// The source (files or Kafka) failed.
    #[error("source '{source_name}': {message}")]
    Source {
        source_name: String,
        message: String,
    },

    /// Writing the run's output into DuckDB failed.
    #[error("writing to table {table}: {message}")]
    Sink { table: String, message: String },

    /// DuckDB refused a statement of the extension's own.
    #[error("DuckDB: {0}")]
    Duck(String),

    /// The extension's connection to this database was released (the database was closing).
    #[error("streaming_etl has no connection to this database any more (it was being closed); open it again and LOAD streaming_etl")]
    Detached,

    /// DuckDB's sandbox (`enable_external_access = false`) does not allow what the call asked for.
    #[error("access denied: {0}")]
    Denied(String),

    /// A bug: an internal invariant did not hold. Reported, never a panic into DuckDB.
    #[error("internal error: {0}")]
    Internal(String),
}

impl EtlError {
    pub fn invalid(name: &'static str, reason: impl Into<String>, got: impl fmt::Display) -> Self {
        EtlError::InvalidParameter {
            name,
            reason: reason.into(),
            got: got.to_string(),
        }
    }

    pub fn checkpoint(path: &str, message: impl fmt::Display) -> Self {
        EtlError::Checkpoint {
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    pub fn source(source_name: &str, message: impl fmt::Display) -> Self {
        EtlError::Source {
            source_name: source_name.to_string(),
            message: message.to_string(),
        }
    }
}

pub type Result<T, E = EtlError> = std::result::Result<T, E>;
