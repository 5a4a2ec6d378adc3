//! Every call into DuckDB's C extension API, and the only `unsafe` code of the extension. The
//! rest of the crate sees safe types: a connection, a query appender, table-function
//! arguments and output chunks; nothing here lets a Rust panic unwind into DuckDB.

use std::any::Any;
use std::ffi::{c_char, c_void, CStr, CString};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc;

use libduckdb_sys as sys;

use crate::host::Host;

/// The C API version the extension asks DuckDB for (see the README: it loads in 1.5.6+).
pub const C_API_VERSION: &str = "v1.5.6";

/// Turns a panic payload into text for an error message.
pub fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "unknown panic".to_string(),
        },
    }
}

fn c_string(s: &str) -> CString {
    // Interior NULs cannot cross into C; they only appear if a user put one in an argument.
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Entrypoint
// ---------------------------------------------------------------------------------------------

/// The entrypoint DuckDB calls on `LOAD streaming_etl` (C_STRUCT ABI).
///
/// # Safety
/// Called by DuckDB with the `info` and `access` of an extension load.
#[no_mangle]
pub unsafe extern "C" fn streaming_etl_init_c_api(
    info: sys::duckdb_extension_info,
    access: *const sys::duckdb_extension_access,
) -> bool {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: DuckDB passes a valid `access` for the duration of this call.
        unsafe { init(info, access) }
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
    info: sys::duckdb_extension_info,
    access: *const sys::duckdb_extension_access,
) -> Result<bool, String> {
    // SAFETY: fills libduckdb-sys's function table from the struct DuckDB hands out for this
    // C API version; `access` is valid during the load.
    let have_api = unsafe { sys::duckdb_rs_extension_api_init(info, access, C_API_VERSION) }
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
    // SAFETY: non-null, valid until the entrypoint returns; `LoadingDatabase` cannot outlive
    // this call (it is only lent to `crate::load`).
    let db = LoadingDatabase {
        db: unsafe { *db_ptr },
        _not_send: PhantomData,
    };
    crate::load(&db).map(|()| true)
}

/// The database being loaded into; valid only during the entrypoint.
pub struct LoadingDatabase {
    db: sys::duckdb_database,
    _not_send: PhantomData<*const ()>,
}

impl LoadingDatabase {
    /// Opens a connection of the extension's own. It stays valid after the load.
    pub fn connect(&self) -> Result<DuckConn, String> {
        let mut con: sys::duckdb_connection = ptr::null_mut();
        // SAFETY: `self.db` is valid during the load; `con` is an out-parameter.
        let state = unsafe { sys::duckdb_connect(self.db, &mut con) };
        if state != sys::DuckDBSuccess || con.is_null() {
            return Err("streaming_etl: could not open a connection to the database".into());
        }
        Ok(DuckConn {
            con,
            count_probe: ptr::null_mut(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------------------------

/// A connection of the extension's own to the host database.
pub struct DuckConn {
    con: sys::duckdb_connection,
    /// `SELECT count FROM duckdb_connection_count()`, prepared once: the watcher asks often.
    count_probe: sys::duckdb_prepared_statement,
}

// SAFETY: a DuckDB connection may be used from any thread, one at a time; `DuckConn` is only
// reached through `&mut` or a mutex-guarded pool.
unsafe impl Send for DuckConn {}

impl Drop for DuckConn {
    fn drop(&mut self) {
        // SAFETY: the statement (if any) belongs to `con` and is destroyed before it; `con`
        // came from duckdb_connect and is disconnected exactly once.
        unsafe {
            if !self.count_probe.is_null() {
                sys::duckdb_destroy_prepare(&mut self.count_probe);
            }
            sys::duckdb_disconnect(&mut self.con);
        }
    }
}

/// The result of one query, destroyed on drop.
struct QueryResult {
    res: sys::duckdb_result,
}

impl Drop for QueryResult {
    fn drop(&mut self) {
        // SAFETY: `res` was filled by duckdb_query and is destroyed once.
        unsafe { sys::duckdb_destroy_result(&mut self.res) };
    }
}

impl DuckConn {
    fn query(&self, sql: &str) -> Result<QueryResult, String> {
        let c = c_string(sql);
        // SAFETY: a zeroed duckdb_result is the documented initial state for duckdb_query.
        let mut out = QueryResult {
            res: unsafe { std::mem::zeroed() },
        };
        // SAFETY: `con` is open; `c` outlives the call; `out.res` is an out-parameter.
        let state = unsafe { sys::duckdb_query(self.con, c.as_ptr(), &mut out.res) };
        if state != sys::DuckDBSuccess {
            // SAFETY: the error string belongs to the result, which is alive here.
            let msg = unsafe { opt_cstr(sys::duckdb_result_error(&mut out.res)) };
            return Err(msg.unwrap_or_else(|| "unknown DuckDB error".to_string()));
        }
        Ok(out)
    }

    /// Runs one or more statements, discarding results.
    pub fn execute(&self, sql: &str) -> Result<(), String> {
        self.query(sql).map(|_| ())
    }

    /// How many connections the database has open (its users' and the extension's own).
    pub fn connection_count(&mut self) -> Result<i64, String> {
        if self.count_probe.is_null() {
            let sql = c_string("SELECT count FROM duckdb_connection_count()");
            // SAFETY: `con` is open; the statement is stored and destroyed in Drop.
            let state =
                unsafe { sys::duckdb_prepare(self.con, sql.as_ptr(), &mut self.count_probe) };
            if state != sys::DuckDBSuccess {
                // SAFETY: a failed prepare still returns a statement holding the error.
                let msg = unsafe { opt_cstr(sys::duckdb_prepare_error(self.count_probe)) };
                // SAFETY: destroyed once; reset to null so Drop skips it.
                unsafe { sys::duckdb_destroy_prepare(&mut self.count_probe) };
                self.count_probe = ptr::null_mut();
                return Err(msg.unwrap_or_else(|| "cannot prepare the connection count".into()));
            }
        }
        // SAFETY: zeroed is the documented initial state of an out-parameter result.
        let mut r = QueryResult {
            res: unsafe { std::mem::zeroed() },
        };
        // SAFETY: the prepared statement is valid; the result is destroyed by QueryResult.
        unsafe {
            if sys::duckdb_execute_prepared(self.count_probe, &mut r.res) != sys::DuckDBSuccess {
                return Err(opt_cstr(sys::duckdb_result_error(&mut r.res)).unwrap_or_default());
            }
            if sys::duckdb_row_count(&mut r.res) == 0 {
                return Err("no connection count".into());
            }
            Ok(sys::duckdb_value_int64(&mut r.res, 0, 0))
        }
    }

    /// The first column of the first row as text (None: no row or NULL).
    pub fn query_string(&self, sql: &str) -> Result<Option<String>, String> {
        let mut r = self.query(sql)?;
        // SAFETY: `r.res` is a valid result; row 0 / column 0 are checked against its size; the
        // varchar is freed with duckdb_free.
        unsafe {
            if sys::duckdb_row_count(&mut r.res) == 0 || sys::duckdb_column_count(&mut r.res) == 0 {
                return Ok(None);
            }
            if sys::duckdb_value_is_null(&mut r.res, 0, 0) {
                return Ok(None);
            }
            Ok(take_duck_string(sys::duckdb_value_varchar(
                &mut r.res, 0, 0,
            )))
        }
    }

    /// An appender that feeds `query` (which reads the table `appended_data` with `columns`).
    pub fn appender(
        &self,
        query: &str,
        columns: &[(&str, ColType)],
    ) -> Result<Appender<'_>, String> {
        let q = c_string(query);
        let table = c_string("appended_data");
        let names: Vec<CString> = columns.iter().map(|(n, _)| c_string(n)).collect();
        let mut name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let mut types: Vec<LogicalType> =
            columns.iter().map(|(_, t)| LogicalType::new(*t)).collect();
        let mut raw_types: Vec<sys::duckdb_logical_type> = types.iter_mut().map(|t| t.0).collect();
        let mut app: sys::duckdb_appender = ptr::null_mut();
        // SAFETY: all arrays have `columns.len()` entries and outlive the call, which copies them.
        let state = unsafe {
            sys::duckdb_appender_create_query(
                self.con,
                q.as_ptr(),
                columns.len() as sys::idx_t,
                raw_types.as_mut_ptr(),
                table.as_ptr(),
                name_ptrs.as_mut_ptr(),
                &mut app,
            )
        };
        let appender = Appender {
            app,
            _con: PhantomData,
        };
        if state != sys::DuckDBSuccess {
            return Err(appender.error());
        }
        Ok(appender)
    }

    /// Registers a VARCHAR setting (`SET name = '...'`) with a default.
    pub fn register_setting(
        &self,
        name: &str,
        description: &str,
        default: &str,
    ) -> Result<(), String> {
        let n = c_string(name);
        let d = c_string(description);
        let v = c_string(default);
        let ty = LogicalType::new(ColType::Varchar);
        // SAFETY: the option and value are created, handed to DuckDB (which copies them) and
        // destroyed here; `con` is open.
        unsafe {
            let mut opt = sys::duckdb_create_config_option();
            sys::duckdb_config_option_set_name(opt, n.as_ptr());
            sys::duckdb_config_option_set_type(opt, ty.0);
            sys::duckdb_config_option_set_description(opt, d.as_ptr());
            let mut val = sys::duckdb_create_varchar(v.as_ptr());
            sys::duckdb_config_option_set_default_value(opt, val);
            let state = sys::duckdb_register_config_option(self.con, opt);
            sys::duckdb_destroy_value(&mut val);
            sys::duckdb_destroy_config_option(&mut opt);
            if state != sys::DuckDBSuccess {
                return Err(format!(
                    "streaming_etl: could not register the setting {name}"
                ));
            }
        }
        Ok(())
    }

    /// Registers the table function `T`, sharing `host` with its callbacks.
    pub fn register_table_function<T: TableFunction>(&self, host: Arc<Host>) -> Result<(), String> {
        let name = c_string(T::NAME);
        // SAFETY: the function object is configured, registered (DuckDB copies it) and
        // destroyed; the extra info is a leaked Box<Arc<Host>> that DuckDB frees through
        // `drop_box::<Arc<Host>>` when the function's catalog entry goes away.
        unsafe {
            let mut f = sys::duckdb_create_table_function();
            sys::duckdb_table_function_set_name(f, name.as_ptr());
            for ty in T::PARAMETERS {
                let t = LogicalType::new(*ty);
                sys::duckdb_table_function_add_parameter(f, t.0);
            }
            for (pname, ty) in T::NAMED_PARAMETERS {
                let t = LogicalType::new(*ty);
                let n = c_string(pname);
                sys::duckdb_table_function_add_named_parameter(f, n.as_ptr(), t.0);
            }
            let extra = Box::into_raw(Box::new(host)) as *mut c_void;
            sys::duckdb_table_function_set_extra_info(f, extra, Some(drop_box::<Arc<Host>>));
            sys::duckdb_table_function_set_bind(f, Some(bind_callback::<T>));
            sys::duckdb_table_function_set_init(f, Some(init_callback::<T>));
            sys::duckdb_table_function_set_function(f, Some(function_callback::<T>));
            let state = sys::duckdb_register_table_function(self.con, f);
            sys::duckdb_destroy_table_function(&mut f);
            if state != sys::DuckDBSuccess {
                return Err(format!("streaming_etl: could not register {}", T::NAME));
            }
        }
        Ok(())
    }
}

/// Copies a DuckDB-allocated string and frees it.
unsafe fn take_duck_string(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: DuckDB returns a NUL-terminated string it allocated; freed once with duckdb_free.
    unsafe {
        let s = CStr::from_ptr(p).to_string_lossy().into_owned();
        sys::duckdb_free(p as *mut c_void);
        Some(s)
    }
}

unsafe fn opt_cstr(p: *const c_char) -> Option<String> {
    // SAFETY: the caller passes NULL or a NUL-terminated string that is alive for this call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

unsafe extern "C" fn drop_box<T>(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // A destructor cannot report an error; a panicking Drop must still not unwind into C.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `p` came from Box::<T>::into_raw and DuckDB frees it exactly once.
        drop(unsafe { Box::from_raw(p as *mut T) });
    }));
}

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

/// The column and parameter types the extension uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    Boolean,
    Integer,
    BigInt,
    Double,
    Varchar,
    Blob,
    /// INTEGER[]
    IntegerList,
    /// MAP(VARCHAR, VARCHAR)
    VarcharMap,
}

struct LogicalType(sys::duckdb_logical_type);

impl LogicalType {
    fn new(t: ColType) -> LogicalType {
        let simple = |id| {
            // SAFETY: creating a logical type from a valid type id has no preconditions.
            unsafe { sys::duckdb_create_logical_type(id) }
        };
        let raw = match t {
            ColType::Boolean => simple(sys::DUCKDB_TYPE_DUCKDB_TYPE_BOOLEAN),
            ColType::Integer => simple(sys::DUCKDB_TYPE_DUCKDB_TYPE_INTEGER),
            ColType::BigInt => simple(sys::DUCKDB_TYPE_DUCKDB_TYPE_BIGINT),
            ColType::Double => simple(sys::DUCKDB_TYPE_DUCKDB_TYPE_DOUBLE),
            ColType::Varchar => simple(sys::DUCKDB_TYPE_DUCKDB_TYPE_VARCHAR),
            ColType::Blob => simple(sys::DUCKDB_TYPE_DUCKDB_TYPE_BLOB),
            ColType::IntegerList => {
                let child = LogicalType::new(ColType::Integer);
                // SAFETY: `child` is valid; the list type copies it.
                unsafe { sys::duckdb_create_list_type(child.0) }
            }
            ColType::VarcharMap => {
                let k = LogicalType::new(ColType::Varchar);
                let v = LogicalType::new(ColType::Varchar);
                // SAFETY: both child types are valid; the map type copies them.
                unsafe { sys::duckdb_create_map_type(k.0, v.0) }
            }
        };
        LogicalType(raw)
    }
}

impl Drop for LogicalType {
    fn drop(&mut self) {
        // SAFETY: created by duckdb_create_*_type and destroyed once.
        unsafe { sys::duckdb_destroy_logical_type(&mut self.0) };
    }
}

// ---------------------------------------------------------------------------------------------
// Appender
// ---------------------------------------------------------------------------------------------

/// A query appender: rows are buffered by DuckDB and fed to its query on flush.
pub struct Appender<'c> {
    app: sys::duckdb_appender,
    _con: PhantomData<&'c DuckConn>,
}

impl Appender<'_> {
    fn error(&self) -> String {
        if self.app.is_null() {
            return "could not create the appender".into();
        }
        // SAFETY: `app` is valid; the error string belongs to it.
        unsafe { opt_cstr(sys::duckdb_appender_error(self.app)) }
            .unwrap_or_else(|| "appender error".into())
    }

    fn check(&self, state: sys::duckdb_state) -> Result<(), String> {
        if state == sys::DuckDBSuccess {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    pub fn i64(&mut self, v: i64) -> Result<(), String> {
        // SAFETY: `app` is a valid appender for the lifetime of self.
        self.check(unsafe { sys::duckdb_append_int64(self.app, v) })
    }

    pub fn i32(&mut self, v: i32) -> Result<(), String> {
        // SAFETY: as above.
        self.check(unsafe { sys::duckdb_append_int32(self.app, v) })
    }

    pub fn opt_f64(&mut self, v: Option<f64>) -> Result<(), String> {
        // SAFETY: as above.
        self.check(unsafe {
            match v {
                Some(v) => sys::duckdb_append_double(self.app, v),
                None => sys::duckdb_append_null(self.app),
            }
        })
    }

    pub fn str(&mut self, s: &str) -> Result<(), String> {
        // SAFETY: as above; the bytes are copied by DuckDB during the call.
        self.check(unsafe {
            sys::duckdb_append_varchar_length(
                self.app,
                s.as_ptr() as *const c_char,
                s.len() as sys::idx_t,
            )
        })
    }

    pub fn blob(&mut self, b: &[u8]) -> Result<(), String> {
        // SAFETY: as above.
        self.check(unsafe {
            sys::duckdb_append_blob(self.app, b.as_ptr() as *const c_void, b.len() as sys::idx_t)
        })
    }

    pub fn end_row(&mut self) -> Result<(), String> {
        // SAFETY: as above.
        self.check(unsafe { sys::duckdb_appender_end_row(self.app) })
    }

    /// Runs the query over the buffered rows.
    pub fn flush(&mut self) -> Result<(), String> {
        // SAFETY: as above.
        self.check(unsafe { sys::duckdb_appender_flush(self.app) })
    }
}

impl Drop for Appender<'_> {
    fn drop(&mut self) {
        if !self.app.is_null() {
            // Buffered rows of a failed batch are dropped with it; the caller rolls back.
            // SAFETY: `app` is valid and destroyed once.
            unsafe {
                sys::duckdb_appender_clear(self.app);
                sys::duckdb_appender_destroy(&mut self.app);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Table functions
// ---------------------------------------------------------------------------------------------

/// An argument value, copied out of DuckDB at bind time.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Null,
    Bool(bool),
    Int(i64),
    Text(String),
    List(Vec<Arg>),
    Map(Vec<(Arg, Arg)>),
}

/// Arguments of a table-function call, as seen at bind time.
pub trait Args {
    /// The positional argument at `idx` (None when absent).
    fn positional(&self, idx: usize) -> Option<Arg>;
    /// A named argument (None when not given).
    fn named(&self, name: &str) -> Option<Arg>;
    /// A setting of the calling connection (`SET name = ...`).
    fn setting(&self, name: &str) -> Option<Arg>;
}

/// A table function implemented in safe Rust; `ffi` registers it and runs its callbacks with
/// panics contained.
pub trait TableFunction: 'static {
    type Bind: Send + 'static;
    type State: Send + 'static;
    const NAME: &'static str;
    const PARAMETERS: &'static [ColType];
    const NAMED_PARAMETERS: &'static [(&'static str, ColType)];
    const COLUMNS: &'static [(&'static str, ColType)];

    fn bind(args: &dyn Args, host: &Arc<Host>) -> Result<Self::Bind, crate::error::EtlError>;
    fn init(bind: &Self::Bind, host: &Arc<Host>) -> Result<Self::State, crate::error::EtlError>;
    /// Fills `out` with the next rows; leaving it empty ends the function.
    fn produce(
        bind: &Self::Bind,
        state: &mut Self::State,
        out: &mut Output<'_>,
    ) -> Result<(), crate::error::EtlError>;
}

struct BindArgs {
    info: sys::duckdb_bind_info,
}

unsafe fn value_to_arg(v: sys::duckdb_value) -> Arg {
    if v.is_null() {
        return Arg::Null;
    }
    // SAFETY: `v` is a valid value owned by the caller; children are destroyed here.
    unsafe {
        if sys::duckdb_is_null_value(v) {
            return Arg::Null;
        }
        let ty = sys::duckdb_get_value_type(v);
        match sys::duckdb_get_type_id(ty) {
            sys::DUCKDB_TYPE_DUCKDB_TYPE_BOOLEAN => Arg::Bool(sys::duckdb_get_bool(v)),
            sys::DUCKDB_TYPE_DUCKDB_TYPE_TINYINT
            | sys::DUCKDB_TYPE_DUCKDB_TYPE_SMALLINT
            | sys::DUCKDB_TYPE_DUCKDB_TYPE_INTEGER
            | sys::DUCKDB_TYPE_DUCKDB_TYPE_BIGINT
            | sys::DUCKDB_TYPE_DUCKDB_TYPE_UTINYINT
            | sys::DUCKDB_TYPE_DUCKDB_TYPE_USMALLINT
            | sys::DUCKDB_TYPE_DUCKDB_TYPE_UINTEGER => Arg::Int(sys::duckdb_get_int64(v)),
            sys::DUCKDB_TYPE_DUCKDB_TYPE_LIST => {
                let n = sys::duckdb_get_list_size(v);
                let mut out = Vec::with_capacity(n as usize);
                for i in 0..n {
                    let mut c = sys::duckdb_get_list_child(v, i);
                    out.push(value_to_arg(c));
                    sys::duckdb_destroy_value(&mut c);
                }
                Arg::List(out)
            }
            sys::DUCKDB_TYPE_DUCKDB_TYPE_MAP => {
                let n = sys::duckdb_get_map_size(v);
                let mut out = Vec::with_capacity(n as usize);
                for i in 0..n {
                    let mut k = sys::duckdb_get_map_key(v, i);
                    let mut val = sys::duckdb_get_map_value(v, i);
                    out.push((value_to_arg(k), value_to_arg(val)));
                    sys::duckdb_destroy_value(&mut k);
                    sys::duckdb_destroy_value(&mut val);
                }
                Arg::Map(out)
            }
            _ => match take_duck_string(sys::duckdb_get_varchar(v)) {
                Some(s) => Arg::Text(s),
                None => Arg::Null,
            },
        }
    }
}

/// Converts and destroys an owned value.
unsafe fn take_value(mut v: sys::duckdb_value) -> Option<Arg> {
    if v.is_null() {
        return None;
    }
    // SAFETY: `v` is owned by us and destroyed once after conversion.
    unsafe {
        let a = value_to_arg(v);
        sys::duckdb_destroy_value(&mut v);
        Some(a)
    }
}

impl Args for BindArgs {
    fn positional(&self, idx: usize) -> Option<Arg> {
        // SAFETY: `info` is the live bind info; the index is checked against the count.
        unsafe {
            if idx as u64 >= sys::duckdb_bind_get_parameter_count(self.info) {
                return None;
            }
            take_value(sys::duckdb_bind_get_parameter(self.info, idx as sys::idx_t))
        }
    }

    fn named(&self, name: &str) -> Option<Arg> {
        let n = c_string(name);
        // SAFETY: `info` is the live bind info; NULL means the parameter was not given.
        unsafe { take_value(sys::duckdb_bind_get_named_parameter(self.info, n.as_ptr())) }
    }

    fn setting(&self, name: &str) -> Option<Arg> {
        let n = c_string(name);
        // SAFETY: the client context is fetched from the live bind info and destroyed here;
        // only settings this extension registered are asked for.
        unsafe {
            let mut ctx: sys::duckdb_client_context = ptr::null_mut();
            sys::duckdb_table_function_get_client_context(self.info, &mut ctx);
            if ctx.is_null() {
                return None;
            }
            let v = sys::duckdb_client_context_get_config_option(ctx, n.as_ptr(), ptr::null_mut());
            sys::duckdb_destroy_client_context(&mut ctx);
            take_value(v)
        }
    }
}

/// Runs a callback body with panics contained; returns the error text if it failed.
fn contained<R>(f: impl FnOnce() -> Result<R, crate::error::EtlError>) -> Result<R, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!(
            "streaming_etl internal error (a bug; please report it): {}",
            panic_message(p)
        )),
    }
}

unsafe fn extra_host(p: *mut c_void) -> Option<Arc<Host>> {
    // SAFETY: the extra info was set at registration to a Box<Arc<Host>> that lives as long as
    // the function; cloning the Arc does not take ownership.
    unsafe { (p as *const Arc<Host>).as_ref().cloned() }
}

unsafe extern "C" fn bind_callback<T: TableFunction>(info: sys::duckdb_bind_info) {
    let result = contained(|| {
        // SAFETY: `info` is valid for this callback.
        let host = unsafe { extra_host(sys::duckdb_bind_get_extra_info(info)) }
            .ok_or_else(|| crate::error::EtlError::Internal("missing extra info".into()))?;
        host.touch();
        let bind = T::bind(&BindArgs { info }, &host)?;
        Ok(bind)
    });
    // SAFETY: `info` is valid for this callback; types and names are copied by DuckDB; the
    // bind data is a leaked Box freed by DuckDB through drop_box.
    unsafe {
        match result {
            Ok(bind) => {
                for (name, ty) in T::COLUMNS {
                    let n = c_string(name);
                    let t = LogicalType::new(*ty);
                    sys::duckdb_bind_add_result_column(info, n.as_ptr(), t.0);
                }
                let data = Box::into_raw(Box::new(bind)) as *mut c_void;
                sys::duckdb_bind_set_bind_data(info, data, Some(drop_box::<T::Bind>));
            }
            Err(e) => {
                let m = c_string(&e);
                sys::duckdb_bind_set_error(info, m.as_ptr());
            }
        }
    }
}

unsafe extern "C" fn init_callback<T: TableFunction>(info: sys::duckdb_init_info) {
    let result = contained(|| {
        // SAFETY: `info` is valid for this callback; the bind data is the Box set in bind,
        // alive until the query ends.
        let (host, bind) = unsafe {
            (
                extra_host(sys::duckdb_init_get_extra_info(info)),
                (sys::duckdb_init_get_bind_data(info) as *const T::Bind).as_ref(),
            )
        };
        let host =
            host.ok_or_else(|| crate::error::EtlError::Internal("missing extra info".into()))?;
        let bind =
            bind.ok_or_else(|| crate::error::EtlError::Internal("missing bind data".into()))?;
        T::init(bind, &host)
    });
    // SAFETY: as in bind; the state is freed by DuckDB through drop_box.
    unsafe {
        match result {
            Ok(state) => {
                let data = Box::into_raw(Box::new(state)) as *mut c_void;
                sys::duckdb_init_set_init_data(info, data, Some(drop_box::<T::State>));
                sys::duckdb_init_set_max_threads(info, 1);
            }
            Err(e) => {
                let m = c_string(&e);
                sys::duckdb_init_set_error(info, m.as_ptr());
            }
        }
    }
}

unsafe extern "C" fn function_callback<T: TableFunction>(
    info: sys::duckdb_function_info,
    chunk: sys::duckdb_data_chunk,
) {
    let result = contained(|| {
        // SAFETY: bind and init data are the Boxes set earlier, alive for the query; the
        // function runs on one thread at a time (max_threads = 1), so `&mut` is exclusive.
        let (bind, state) = unsafe {
            (
                (sys::duckdb_function_get_bind_data(info) as *const T::Bind).as_ref(),
                (sys::duckdb_function_get_init_data(info) as *mut T::State).as_mut(),
            )
        };
        let (Some(bind), Some(state)) = (bind, state) else {
            return Err(crate::error::EtlError::Internal(
                "missing function state".into(),
            ));
        };
        let mut out = Output::new(chunk, T::COLUMNS);
        let r = T::produce(bind, state, &mut out);
        out.finish();
        r
    });
    if let Err(e) = result {
        let m = c_string(&e);
        // SAFETY: `info` is valid for this callback.
        unsafe { sys::duckdb_function_set_error(info, m.as_ptr()) };
    }
}

/// The output chunk of one call, written column by column; types are checked against the
/// function's declared columns so that nothing is written with the wrong layout.
pub struct Output<'a> {
    chunk: sys::duckdb_data_chunk,
    columns: &'a [(&'a str, ColType)],
    capacity: usize,
    len: usize,
}

impl<'a> Output<'a> {
    fn new(chunk: sys::duckdb_data_chunk, columns: &'a [(&'a str, ColType)]) -> Output<'a> {
        // SAFETY: no preconditions.
        let capacity = unsafe { sys::duckdb_vector_size() } as usize;
        Output {
            chunk,
            columns,
            capacity,
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Declares that rows `0..len` are filled.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    fn finish(&mut self) {
        // SAFETY: `chunk` is the live output chunk; len <= capacity.
        unsafe { sys::duckdb_data_chunk_set_size(self.chunk, self.len as sys::idx_t) };
    }

    fn vector(&self, col: usize, row: usize, ty: ColType) -> Option<sys::duckdb_vector> {
        if row >= self.capacity || self.columns.get(col).map(|c| c.1) != Some(ty) {
            debug_assert!(false, "output column {col} row {row} written as {ty:?}");
            return None;
        }
        // SAFETY: `col` is one of the chunk's declared columns.
        Some(unsafe { sys::duckdb_data_chunk_get_vector(self.chunk, col as sys::idx_t) })
    }

    fn set_null(&mut self, v: sys::duckdb_vector, row: usize) {
        // SAFETY: `v` is a column vector of the live chunk; row < capacity.
        unsafe {
            sys::duckdb_vector_ensure_validity_writable(v);
            sys::duckdb_validity_set_row_invalid(
                sys::duckdb_vector_get_validity(v),
                row as sys::idx_t,
            );
        }
    }

    fn set_fixed<V: Copy>(&mut self, col: usize, row: usize, ty: ColType, v: Option<V>) {
        let Some(vec) = self.vector(col, row, ty) else {
            return;
        };
        match v {
            // SAFETY: the column's type was checked to store `V` (i64/i32/f64/bool), and
            // row < capacity is within the vector's data.
            Some(v) => unsafe { *(sys::duckdb_vector_get_data(vec) as *mut V).add(row) = v },
            None => self.set_null(vec, row),
        }
    }

    pub fn set_i64(&mut self, col: usize, row: usize, v: Option<i64>) {
        self.set_fixed(col, row, ColType::BigInt, v);
    }

    pub fn set_i32(&mut self, col: usize, row: usize, v: Option<i32>) {
        self.set_fixed(col, row, ColType::Integer, v);
    }

    pub fn set_f64(&mut self, col: usize, row: usize, v: Option<f64>) {
        self.set_fixed(col, row, ColType::Double, v);
    }

    pub fn set_bool(&mut self, col: usize, row: usize, v: Option<bool>) {
        self.set_fixed(col, row, ColType::Boolean, v);
    }

    pub fn set_str(&mut self, col: usize, row: usize, v: Option<&str>) {
        let Some(vec) = self.vector(col, row, ColType::Varchar) else {
            return;
        };
        match v {
            // SAFETY: VARCHAR column, row < capacity; DuckDB copies the bytes.
            Some(s) => unsafe {
                sys::duckdb_vector_assign_string_element_len(
                    vec,
                    row as sys::idx_t,
                    s.as_ptr() as *const c_char,
                    s.len() as sys::idx_t,
                )
            },
            None => self.set_null(vec, row),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operating system
// ---------------------------------------------------------------------------------------------

/// Takes an exclusive lock on one byte of `file` (an open-file-description lock: it conflicts
/// with every other open of the file, in this process too, and goes away with the process).
/// Returns false when someone else holds it.
pub fn try_lock_byte(file: &std::fs::File, offset: i64) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed flock is a valid value to fill in.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    // SAFETY: `file` is open for the duration of the call; `fl` is a valid flock.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Runs `f` once when the process exits (before static destructors of libraries loaded
/// earlier, such as DuckDB's own).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registering a plain function pointer has no preconditions.
    unsafe {
        libc::atexit(f);
    }
}

/// Ends the process at once with SIGKILL (test hook: a crash with no cleanup at all).
pub fn kill_self() {
    // SAFETY: signalling our own process has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}

// ---------------------------------------------------------------------------------------------
// Kafka: a partition's messages, taken from librdkafka in batches
// ---------------------------------------------------------------------------------------------

use rdkafka::bindings as rk;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

/// librdkafka's "end of partition" event code.
pub const KAFKA_PARTITION_EOF: i32 = -191;

/// One message of a batch, borrowed until the batch advances.
pub struct KafkaMessage<'a> {
    pub offset: i64,
    pub payload: &'a [u8],
    pub key: Option<&'a [u8]>,
    /// A librdkafka error code carried by the message (e.g. KAFKA_PARTITION_EOF), with its text.
    pub error: Option<(i32, String)>,
}

/// A partition's own queue (split off the consumer's, as rdkafka's `split_partition_queue`
/// does), consumed many messages per call: taking messages one by one costs a lock and a clock
/// read each, which was most of the Kafka source's time.
pub struct PartitionBatches<C: ConsumerContext + 'static> {
    queue: *mut rk::rd_kafka_queue_t,
    msgs: Vec<*mut rk::rd_kafka_message_t>,
    len: usize,
    pos: usize,
    /// Keeps the consumer alive as long as the queue and its messages.
    _consumer: Arc<BaseConsumer<C>>,
}

// SAFETY: librdkafka queues and messages may be used from any thread; the struct is only used
// through `&mut` by one thread at a time.
unsafe impl<C: ConsumerContext + 'static> Send for PartitionBatches<C> {}

impl<C: ConsumerContext + 'static> PartitionBatches<C> {
    /// Takes the partition's messages off the consumer's main queue. None when librdkafka does
    /// not know the partition.
    pub fn split(
        consumer: &Arc<BaseConsumer<C>>,
        topic: &str,
        partition: i32,
        capacity: usize,
    ) -> Option<Self> {
        let t = CString::new(topic).ok()?;
        // SAFETY: the client pointer is valid while `consumer` lives (we keep an Arc); the
        // returned queue is ours to destroy.
        let queue = unsafe {
            rk::rd_kafka_queue_get_partition(consumer.client().native_ptr(), t.as_ptr(), partition)
        };
        if queue.is_null() {
            return None;
        }
        // SAFETY: `queue` is valid; forwarding to NULL detaches it from the consumer queue.
        unsafe { rk::rd_kafka_queue_forward(queue, ptr::null_mut()) };
        Some(PartitionBatches {
            queue,
            msgs: vec![ptr::null_mut(); capacity.max(1)],
            len: 0,
            pos: 0,
            _consumer: Arc::clone(consumer),
        })
    }

    fn release(&mut self) {
        for m in &mut self.msgs[..self.len] {
            if !m.is_null() {
                // SAFETY: each message came from rd_kafka_consume_batch_queue and is destroyed once.
                unsafe { rk::rd_kafka_message_destroy(*m) };
                *m = ptr::null_mut();
            }
        }
        self.len = 0;
        self.pos = 0;
    }

    /// Releases the messages handed out so far and takes the next batch, waiting up to
    /// `timeout_ms` when none is there. Returns how many arrived.
    pub fn refill(&mut self, timeout_ms: i32) -> usize {
        self.release();
        // SAFETY: `msgs` has room for `msgs.len()` pointers; `queue` is valid.
        let n = unsafe {
            rk::rd_kafka_consume_batch_queue(
                self.queue,
                timeout_ms,
                self.msgs.as_mut_ptr(),
                self.msgs.len(),
            )
        };
        self.len = usize::try_from(n).unwrap_or(0).min(self.msgs.len());
        self.len
    }

    /// The next message of the current batch.
    pub fn peek(&self) -> Option<KafkaMessage<'_>> {
        if self.pos >= self.len {
            return None;
        }
        let m = self.msgs[self.pos];
        // SAFETY: messages in 0..len are valid until release(); the payload and key buffers
        // belong to the message and live as long as the borrow of `self`.
        unsafe {
            let msg = m.as_ref()?;
            let bytes = |p: *mut c_void, len: usize| -> Option<&[u8]> {
                (!p.is_null()).then(|| std::slice::from_raw_parts(p as *const u8, len))
            };
            let error = (msg.err as i32 != 0).then(|| {
                let text = opt_cstr(rk::rd_kafka_err2str(msg.err)).unwrap_or_default();
                (msg.err as i32, text)
            });
            Some(KafkaMessage {
                offset: msg.offset,
                payload: bytes(msg.payload, msg.len).unwrap_or(&[]),
                key: bytes(msg.key, msg.key_len),
                error,
            })
        }
    }

    pub fn advance(&mut self) {
        self.pos += 1;
    }
}

impl<C: ConsumerContext + 'static> Drop for PartitionBatches<C> {
    fn drop(&mut self) {
        self.release();
        // SAFETY: the queue is ours and destroyed once, before the consumer (held by the Arc).
        unsafe { rk::rd_kafka_queue_destroy(self.queue) };
    }
}
