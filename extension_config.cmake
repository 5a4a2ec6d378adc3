# Extension registration for DuckDB's extension build tooling (the extension template's
# convention). The Makefile here does not need it: the extension is a Rust cdylib built by cargo,
# with DuckDB's metadata footer appended by scripts/append_footer.py.
duckdb_extension_load(streaming_etl
    SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}
    LOAD_TESTS
)
