//! How a table function's callback fails: as an SQL error with the message the statement
//! reports, and with panics contained so that a bug is an SQL error saying so.

use std::fmt;

use streaming_etl_core::EtlError;

use crate::host::entry;

/// An error as the SQL statement reports it.
#[derive(Debug)]
pub(crate) struct SqlError(String);

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

/// Runs a callback body with panics contained, so that a bug is an SQL error saying so.
pub(crate) fn contained<R>(f: impl FnOnce() -> Result<R, EtlError>) -> Result<R, SqlError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(SqlError(e.to_string())),
        Err(p) => Err(SqlError(format!(
            "streaming_etl internal error (a bug; please report it): {}",
            entry::panic_message(p)
        ))),
    }
}
