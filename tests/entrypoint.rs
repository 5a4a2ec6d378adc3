//! The library's one public item: the entrypoint DuckDB's extension loader calls for `LOAD
//! streaming_etl` (ABI `C_STRUCT`), by that name and with that C signature. Everything else is
//! tested inside the crate and through real DuckDB hosts (test/sql, test/python).
//!
//! Being an integration test, this also makes `cargo test` build the library as `cargo build`
//! does, so that both share their dependencies' artifacts (docs/development.md#ci-and-its-budget).

use duckdb::ffi::{duckdb_extension_access, duckdb_extension_info};

/// What DuckDB's loader calls: `bool <name>_init_c_api(duckdb_extension_info, duckdb_extension_access *)`.
type Entrypoint =
    unsafe extern "C" fn(duckdb_extension_info, *const duckdb_extension_access) -> bool;

#[test]
fn the_entrypoint_has_the_name_and_c_signature_duckdbs_loader_calls() {
    let entry: Entrypoint = streaming_etl::streaming_etl_init_c_api;
    assert_ne!(entry as usize, 0);
}
