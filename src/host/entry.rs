//! The extension's entry point on the raw DuckDB C API: loading, registering the settings, and
//! finding the host a table function was registered with; the few things the `duckdb` crate
//! has no safe way to do, each item saying what is missing. Everything else goes through
//! `duckdb`'s `Connection`, `VTab`, `FlatVector` and `Value`. (The other unsafe code: writing
//! output vectors in `host/out_vector.rs`, operating-system calls in `host/os.rs`, and the
//! librdkafka batch queue in `source/kafka_batch.rs`.)

use std::any::Any;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use duckdb::ffi;
use duckdb::vtab::{BindInfo, TableFunctionInfo, VTab};
use duckdb::Connection;

use crate::host::connections::Host;
#[cfg(not(feature = "capi-v1-2"))]
use crate::params::Setting;

/// The C API version the extension asks DuckDB for: this build loads in 1.5.6 and later.
#[cfg(not(feature = "capi-v1-2"))]
pub const C_API_VERSION: &str = "v1.5.6";
/// The C API version of the DuckDB 1.4 build (`lts/`), which 1.4.x loads.
#[cfg(feature = "capi-v1-2")]
pub const C_API_VERSION: &str = "v1.2.0";

/// Turns a panic payload into text for an error message.
pub fn panic_message(payload: Box<dyn Any + Send>) -> String {
    streaming_etl_runtime::committer::panic_message(payload)
}

fn c_string(s: &str) -> CString {
    // Interior NULs cannot cross into C; they only appear if a user put one in an argument.
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// Defines the entrypoint DuckDB calls on `LOAD streaming_etl` (ABI `C_STRUCT`),
/// `streaming_etl_init_c_api`, where it is used (the crate root), around `$load`: the function
/// that registers the SQL functions once the settings are. A macro, as
/// `duckdb-loadable-macros`' own entrypoint is, so that this module does not depend on what it
/// loads; its body is [`load_extension`].
macro_rules! entrypoint {
    ($load:path) => {
        /// The entrypoint DuckDB calls on `LOAD streaming_etl` (ABI `C_STRUCT`); see
        /// `host::entry::load_extension`.
        ///
        /// # Safety
        /// Called by DuckDB with the `info` and `access` of an extension load.
        #[no_mangle]
        pub unsafe extern "C" fn streaming_etl_init_c_api(
            info: ::duckdb::ffi::duckdb_extension_info,
            access: *const ::duckdb::ffi::duckdb_extension_access,
        ) -> bool {
            // SAFETY: DuckDB calls this with the `info` and `access` of an extension load.
            unsafe { $crate::host::entry::load_extension(info, access, $load) }
        }
    };
}
pub(crate) use entrypoint;

/// What the entrypoint does: loads the extension, registering the settings and then calling
/// `load` with a connection to the database.
///
/// Missing in `duckdb-loadable-macros`: its `duckdb_entrypoint_c_api` hands the extension a
/// `Connection` only, and the `duckdb` crate can neither register a setting nor give out the
/// raw handle one needs (`duckdb_register_config_option` takes a raw connection). So this does
/// what the macro expands to (API init, database from `get_database`,
/// `Connection::open_from_raw`), plus registering the settings on a raw connection.
///
/// # Safety
/// Called by DuckDB's entrypoint with the `info` and `access` of an extension load.
pub unsafe fn load_extension(
    info: ffi::duckdb_extension_info,
    access: *const ffi::duckdb_extension_access,
    load: fn(Connection) -> Result<(), String>,
) -> bool {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: DuckDB passes a valid `access` for the duration of this call.
        unsafe { init(info, access, load) }
    }));
    let error = match result {
        Ok(Ok(loaded)) => return loaded,
        Ok(Err(e)) => e,
        Err(p) => format!("streaming_etl failed to load: {}", panic_message(p)),
    };
    // SAFETY: `access` is valid during the load; set_error copies the message.
    unsafe {
        if let Some(set_error) = access.as_ref().and_then(|a| a.set_error) {
            let msg = c_string(&error);
            set_error(info, msg.as_ptr());
        }
    }
    false
}

unsafe fn init(
    info: ffi::duckdb_extension_info,
    access: *const ffi::duckdb_extension_access,
    load: fn(Connection) -> Result<(), String>,
) -> Result<bool, String> {
    // SAFETY: fills the C API function table for this version; `access` is valid during the load.
    let have_api = unsafe { ffi::duckdb_rs_extension_api_init(info, access, C_API_VERSION) }
        .map_err(|e| format!("streaming_etl: {e}"))?;
    if !have_api {
        // DuckDB refused the version and has set the reason itself.
        return Ok(false);
    }
    // SAFETY: `access` is valid during the load (checked non-null by the API init above).
    let get_database =
        unsafe { (*access).get_database }.ok_or("streaming_etl: DuckDB gave no get_database")?;
    // SAFETY: `info` is this load's; the returned pointer lives until the entrypoint returns.
    let db_ptr = unsafe { get_database(info) };
    if db_ptr.is_null() {
        return Ok(false);
    }
    // SAFETY: non-null and valid during the load.
    let db = unsafe { *db_ptr };
    // SAFETY: `db` is the live database of this load.
    #[cfg(not(feature = "capi-v1-2"))]
    unsafe {
        register_settings(db, crate::params::SETTINGS)?
    };
    #[cfg(feature = "capi-v1-2")]
    check_value_handles()?;
    // SAFETY: as above; the connection does not close the database when dropped.
    let conn =
        unsafe { Connection::open_from_raw(db) }.map_err(|e| format!("streaming_etl: {e}"))?;
    load(conn).map(|()| true)
}

/// Registers VARCHAR settings (`SET name = '...'`). Missing in `duckdb`: config options. (C API
/// v1.2.0, the DuckDB 1.4 build's, has none: there the named parameters stand in.)
#[cfg(not(feature = "capi-v1-2"))]
unsafe fn register_settings(db: ffi::duckdb_database, settings: &[Setting]) -> Result<(), String> {
    let mut con: ffi::duckdb_connection = std::ptr::null_mut();
    // SAFETY: `db` is valid during the load; `con` is an out-parameter.
    if unsafe { ffi::duckdb_connect(db, &mut con) } != ffi::DuckDBSuccess || con.is_null() {
        return Err("streaming_etl: could not open a connection to the database".into());
    }
    let mut result = Ok(());
    for s in settings {
        let n = c_string(s.name);
        let d = c_string(s.description);
        let v = c_string(s.default);
        // SAFETY: the option, type and value are created here, handed to DuckDB (which copies
        // them) and destroyed here; `con` is open.
        let state = unsafe {
            let mut opt = ffi::duckdb_create_config_option();
            let mut ty = ffi::duckdb_create_logical_type(ffi::DUCKDB_TYPE_DUCKDB_TYPE_VARCHAR);
            ffi::duckdb_config_option_set_name(opt, n.as_ptr());
            ffi::duckdb_config_option_set_type(opt, ty);
            ffi::duckdb_config_option_set_description(opt, d.as_ptr());
            let mut val = ffi::duckdb_create_varchar(v.as_ptr());
            ffi::duckdb_config_option_set_default_value(opt, val);
            let state = ffi::duckdb_register_config_option(con, opt);
            ffi::duckdb_destroy_value(&mut val);
            ffi::duckdb_destroy_logical_type(&mut ty);
            ffi::duckdb_destroy_config_option(&mut opt);
            state
        };
        if state != ffi::DuckDBSuccess {
            result = Err(format!(
                "streaming_etl: could not register the setting {}",
                s.name
            ));
            break;
        }
    }
    // SAFETY: connected above, disconnected once.
    unsafe { ffi::duckdb_disconnect(&mut con) };
    result
}

/// The host registered as the extra info of every table function of the extension.
/// Missing in `duckdb`: `get_extra_info` returns a raw pointer.
pub fn bind_host(bind: &BindInfo) -> Option<Arc<Host>> {
    // SAFETY: every table function of this extension is registered (in the crate's `load`) with
    // an `Arc<Host>` extra info, which lives as long as the function's catalog entry.
    unsafe { bind.get_extra_info::<Arc<Host>>().as_ref().cloned() }
}

/// As [`bind_host`], during execution.
pub fn func_host<T: VTab>(func: &TableFunctionInfo<T>) -> Option<Arc<Host>> {
    // SAFETY: as in `bind_host`.
    unsafe { func.get_extra_info::<Arc<Host>>().as_ref().cloned() }
}

/// The DuckDB 1.4 build's raw handle of a `Value`. Missing in duckdb-rs 1.4: any way to tell a
/// NULL value, whose `to_string` or `to_int64` makes DuckDB throw a C++ exception (which aborts
/// the process). Its derived `Debug` shows the handle, which [`check_value_handles`] proves at
/// load time to read back exactly; nothing assumes the struct's layout.
#[cfg(feature = "capi-v1-2")]
fn raw_value(v: &duckdb::vtab::Value) -> Option<ffi::duckdb_value> {
    let text = format!("{v:?}");
    let hex = text.strip_prefix("Value { ptr: 0x")?.strip_suffix(" }")?;
    let addr = usize::from_str_radix(hex, 16).ok()?;
    Some(std::ptr::with_exposed_provenance_mut(addr))
}

/// Whether an argument is SQL NULL (DuckDB 1.4 build). A handle that cannot be read counts as
/// NULL: a wrong "must not be NULL" is better than reading one.
#[cfg(feature = "capi-v1-2")]
pub fn is_null_value(v: &duckdb::vtab::Value) -> bool {
    match raw_value(v) {
        // SAFETY: the live handle `v` owns (it reads back exactly: checked at load).
        Some(raw) if !raw.is_null() => unsafe { ffi::duckdb_is_null_value(raw) },
        _ => true,
    }
}

/// Proves at load time that [`raw_value`] returns the handle a `Value` was made from.
#[cfg(feature = "capi-v1-2")]
fn check_value_handles() -> Result<(), String> {
    // SAFETY: creates a value that the `Value` below owns and destroys.
    let raw = unsafe { ffi::duckdb_create_int64(7) };
    let value = duckdb::vtab::Value::from(raw);
    if raw_value(&value) == Some(raw) {
        Ok(())
    } else {
        Err("streaming_etl (DuckDB 1.4 build): cannot read argument handles".into())
    }
}
