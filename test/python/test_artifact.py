"""The artifact users load: no test hooks in it, the DuckDB footer DuckDB expects, and
INSTALL + LOAD by name working."""
import os

import duckdb

from conftest import EXT, FAULT_EXT

HOOKS = (b"STREAMING_ETL_CRASH_AT", b"STREAMING_ETL_PANIC_AT")


def test_the_release_artifact_has_no_test_hooks():
    data = open(EXT, "rb").read()
    for hook in HOOKS:
        assert hook not in data, hook
    # The fault-injection build (tests only) has them: the check above can fail.
    fault = open(FAULT_EXT, "rb").read()
    assert all(h in fault for h in HOOKS)


def test_footer_declares_c_struct_abi_and_c_api_v1_5_6():
    tail = open(EXT, "rb").read()[-512:]
    fields = [tail[i * 32:(i + 1) * 32].rstrip(b"\0") for i in range(8)]
    # Three unused, ABI type, extension version, C API version, platform, magic; then the
    # 256-byte signature.
    assert fields[7] == b"4"
    assert fields[5] == b"v1.5.6"
    assert fields[3] == b"C_STRUCT"


def test_install_then_load_by_name(tmp_path):
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"SET extension_directory = '{tmp_path}'")
    con.execute(f"INSTALL '{os.path.abspath(EXT)}'")
    con.execute("LOAD streaming_etl")
    rows = con.execute("SELECT events_consumed FROM streaming_etl_run('file:test/data/basic/*.ndjson', 1000, 200)").fetchall()
    assert rows[-1][0] == 10
    installed = [p for p in tmp_path.rglob("streaming_etl.duckdb_extension")]
    assert installed, list(tmp_path.rglob("*"))
