"""Installed as DuckDB users install extensions (SPEC section 22): `make dist`'s repository,
served over HTTP on 127.0.0.1, read by `INSTALL streaming_etl FROM '<url>'` and `LOAD
streaming_etl` in a venv that has nothing but `duckdb==<version>`, for each DuckDB version
scripts/dist_versions.txt marks `tested`; the other line's file refused with DuckDB's own message;
the shipped files stripped and footed; description.yml as the build is, its `hello_world` run as
written; and the database released within the documented bound once the user closes it."""
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import duckdb
import pytest

from conftest import EXT, ROOT, connect

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from dist import versions  # noqa: E402

REPO = os.path.join(ROOT, "dist", "repository")
PLATFORM = "linux_amd64"
# How long after the user's last connection closes the database stays open (docs/semantics.md#the-database-is-not-pinned).
RELEASE_BOUND_S = 0.5


@pytest.fixture(scope="module")
def served():
    """`make dist`'s repository over HTTP on 127.0.0.1: its URL."""
    assert os.path.isdir(REPO), "make dist first"
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=REPO)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def bare_venv(version):
    """A venv with nothing but duckdb==<version> (kept in .venv/bare/ between runs)."""
    d = os.path.join(ROOT, ".venv", "bare", version)
    py = os.path.join(d, "bin", "python")
    if not os.path.exists(os.path.join(d, ".ready")):
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", d], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", f"duckdb=={version}"], check=True)
        open(os.path.join(d, ".ready"), "w").close()
    return py


INSTALL_AND_RUN = """
import duckdb, sys
url, ext_dir, data = sys.argv[1:4]
con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
con.execute(f"SET extension_directory = '{ext_dir}'")
con.execute(f"INSTALL streaming_etl FROM '{url}'")
con.execute("LOAD streaming_etl")
print(con.execute(f"SELECT events_consumed, windows_emitted FROM streaming_etl_run('file:{data}', 1000, 200)").fetchall()[-1])
print(con.execute("SELECT count(*), sum(count) FROM windows").fetchall()[0])
print(con.execute("SELECT extension_version, install_mode, installed_from FROM duckdb_extensions() WHERE extension_name = 'streaming_etl'").fetchall())
"""


@pytest.mark.parametrize("version", [v.lstrip("v") for v, _, tested in versions() if tested])
def test_a_bare_duckdb_installs_from_the_repository_and_runs_a_job(tmp_path, served, version):
    py = bare_venv(version)
    out = subprocess.run([py, "-c", INSTALL_AND_RUN, served, str(tmp_path / "ext"),
                          os.path.join(ROOT, "test/data/basic/*.ndjson")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "(10, 5)" and lines[1] == "(5, 7)", lines
    assert "'REPOSITORY'" in lines[2] and served in lines[2], lines[2]
    installed = list((tmp_path / "ext").rglob("streaming_etl.duckdb_extension"))
    assert [p.parent.name for p in installed] == [PLATFORM] and installed[0].parent.parent.name == f"v{version}"


def test_the_other_lines_file_is_refused_with_duckdbs_message(tmp_path, served):
    """DuckDB 1.4.4 given the main line's file (C API v1.5.6) refuses it as it installs it, with
    its own message, and stays up."""
    repo = tmp_path / "wrong"
    (repo / "v1.4.4" / PLATFORM).mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "v2.0.1", PLATFORM, "streaming_etl.duckdb_extension.gz"),
                repo / "v1.4.4" / PLATFORM / "streaming_etl.duckdb_extension.gz")
    script = """
import duckdb, sys
con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
con.execute(f"SET extension_directory = '{sys.argv[2]}'")
try:
    con.execute(f"INSTALL streaming_etl FROM '{sys.argv[1]}'")
    con.execute("LOAD streaming_etl")
    print("loaded")
except duckdb.Error as e:
    print("refused:", e)
print(con.execute("SELECT 42").fetchall())
"""
    out = subprocess.run([bare_venv("1.4.4"), "-c", script, str(repo), str(tmp_path / "ext")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:"), out.stdout
    assert "built for DuckDB C API version 'v1.5.6'" in out.stdout and "[(42,)]" in out.stdout, out.stdout


def test_the_shipped_files_are_stripped_with_the_footer_and_small():
    for line in ("main", "lts"):
        f = os.path.join(ROOT, "build", "dist", line, "streaming_etl.duckdb_extension")
        data = open(f, "rb").read()
        assert len(data) < 20_000_000, (line, len(data))
        fields = [data[-512:][i * 32:(i + 1) * 32].rstrip(b"\0") for i in range(8)]
        assert fields[3] == b"C_STRUCT" and fields[6] == PLATFORM.encode() and fields[7] == b"4"
        assert fields[5] == (b"v1.5.6" if line == "main" else b"v1.2.0")
        sections = subprocess.run(["objdump", "-h", f], capture_output=True, text=True).stdout
        assert ".debug_info" not in sections and ".gnu_debuglink" in sections, line
        assert os.path.getsize(os.path.join(ROOT, "build", "dist", line, "streaming_etl.debug")) > 10_000_000


def cargo_version():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def test_description_yml_is_the_build_and_its_hello_world_runs_as_written(tmp_path):
    text = open(os.path.join(ROOT, "description.yml")).read()
    assert re.search(r"^  name: streaming_etl$", text, re.M)
    assert re.search(rf"^  version: {re.escape(cargo_version())}$", text, re.M)
    excluded = re.search(r'^  excluded_platforms: "([^"]+)"', text, re.M).group(1).split(";")
    assert PLATFORM not in excluded and "windows_amd64" in excluded
    hello = re.search(r"^  hello_world: \|\n((?:    .*\n)+)", text, re.M).group(1)
    sql = "\n".join(line[4:] for line in hello.splitlines())
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        con = connect()
        for statement in [s for s in sql.split(";") if s.strip()]:
            last = con.execute(statement).fetchall()
    finally:
        os.chdir(cwd)
    assert len(last) == 5 and all(r[3] > 0 for r in last), last


def test_the_database_is_released_within_the_bound_after_close(tmp_path):
    """After the user's last close(), another connection of this process (ATTACH) and another
    process open the file within RELEASE_BOUND_S."""
    db = str(tmp_path / "r.duckdb")
    for idle in (0, 2.5):
        con = connect(db)
        con.execute("SELECT * FROM streaming_etl_run('file:test/data/basic/*.ndjson', 1000, 200)").fetchall()
        time.sleep(idle)
        con.close()
        t0 = time.perf_counter()
        other = duckdb.connect()
        while True:
            try:
                other.execute(f"ATTACH '{db}' AS x (READ_ONLY)")
                break
            except duckdb.Error as e:
                assert "Unique file handle conflict" in str(e) or "lock" in str(e), e
                assert time.perf_counter() - t0 < RELEASE_BOUND_S, f"still held after {RELEASE_BOUND_S} s"
                time.sleep(0.002)
        assert other.execute("SELECT count(*) FROM x.windows").fetchone()[0] == 5
        other.close()
