//! The extension built with its test hooks (`STREAMING_ETL_CRASH_AT`, `STREAMING_ETL_PANIC_AT`),
//! for `make reliability` and the tests that need them. A separate cdylib, so that the artifact
//! users load (`build/release`) is built without the `fault-injection` feature and contains none
//! of the hooks. Make installs it as `build/fault/streaming_etl.duckdb_extension`.

pub use streaming_etl::streaming_etl_init_c_api;
