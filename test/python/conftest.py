"""Shared fixtures: the built extension, connections with it loaded, the DuckDB CLI binary, the
Kafka brokers (librdkafka's mock cluster and tansu, one of each per test module) and a PostgreSQL
server for DuckLake catalogs (per module)."""
import os
import signal
import subprocess
import sys
import time

import duckdb
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXT = os.environ.get("STREAMING_ETL_EXTENSION", os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension"))
# The same extension built with its fault-injection hooks (make fault), for the tests that use them.
FAULT_EXT = os.environ.get("STREAMING_ETL_FAULT_EXTENSION", os.path.join(ROOT, "build", "fault", "streaming_etl.duckdb_extension"))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lake  # noqa: E402
from brokers import MockBroker, TansuBroker, tansu_binary  # noqa: E402


def connect(db=":memory:"):
    con = duckdb.connect(str(db), config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    return con


def run_child(*args, env=None, timeout=120):
    """Runs test/python/run_job.py in a separate Python (and DuckDB) process."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, os.path.join(HERE, "run_job.py"), *map(str, args)],
                          capture_output=True, text=True, env=e, timeout=timeout)


def kill_once(args, rng, delay_s, env=None, kill=True):
    """Starts run_job.py with `args` and SIGKILLs it at a random instant up to `delay_s` (a
    number, or a (low, high) pair) after it has loaded, unless it finished first or `kill` is
    false. Returns (whether it was killed, its stdout)."""
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "run_job.py"), *map(str, args), "--announce"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, **(env or {})))
    p.stdout.readline()  # "loaded": the process is up, the run is starting
    low, high = delay_s if isinstance(delay_s, tuple) else (0, delay_s)
    time.sleep(rng.uniform(low, high))
    if kill and p.poll() is None:
        p.send_signal(signal.SIGKILL)
    out, err = p.communicate()
    assert p.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    return p.returncode == -signal.SIGKILL, out


def kill_until_caught_up(args, rng, delay_s, tries=40):
    """Runs the job of `args` again and again, each run SIGKILLed at a random instant up to
    `delay_s` after it loads, until a run reads to the end unkilled; returns the kills."""
    kills = 0
    for _ in range(tries):
        killed, out = kill_once(args, rng, delay_s)
        kills += killed
        if not killed and b"caught_up" in out:
            break
    return kills


def cli_binary():
    try:
        import duckdb_cli
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb")
    return path if os.path.exists(path) else None


@pytest.fixture
def ext():
    assert os.path.exists(EXT), f"build the extension first: {EXT}"
    return EXT


@pytest.fixture(scope="module")
def mock():
    b = MockBroker()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def tansu():
    if not os.path.exists(tansu_binary()):
        pytest.skip("tansu is not installed (.ci/run installs it)")
    b = TansuBroker()
    yield b
    b.stop()


@pytest.fixture(params=["mock", "tansu"])
def broker(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    pg = lake.Postgres(tmp_path_factory.mktemp("pg") / "data")
    yield pg
    pg.stop()
