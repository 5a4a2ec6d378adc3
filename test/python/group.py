"""Consumer-group runs for the tests and scripts: DuckDB 1.4 processes running one `subscribe`
job into a DuckLake (test/python/run_job.py), the messages they read, and the checks on what
they wrote (test/python/test_group.py, scripts/group_scale.py)."""
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter

import duckdb

import lake
from brokers import produce

HERE = os.path.dirname(os.path.abspath(__file__))
EXT = os.environ.get("STREAMING_ETL_EXTENSION") or os.path.join(
    os.path.dirname(os.path.dirname(HERE)), "build", "release", "v1.4", "streaming_etl.duckdb_extension")
RUN_JOB = os.path.join(HERE, "run_job.py")
PARTITIONS = 12
SESSION_MS = 6000
GROUP_KAFKA = (f"map{{'session.timeout.ms': '{SESSION_MS}', 'heartbeat.interval.ms': '500', "
               f"'max.poll.interval.ms': '{SESSION_MS + 4000}'}}")
WINDOWS = "SELECT window_start_ms, window_end_ms, key, count, sum_value, partition FROM {t}"
LATE = "SELECT key, event_time_ms, window_start_ms, partition, \"offset\" FROM {t}"
DEAD = "SELECT partition, \"offset\", error FROM {t}"


def partition_of(key):
    return zlib.crc32(key.encode()) % PARTITIONS


def messages(start, count, keys=40, seed=0, keyed=True):
    """`count` events keyed by `key`, times mostly rising with some disorder (late events), a bad
    line now and then (dead letters). Keyed: each key in one partition, as a producer's default
    partitioner puts it; otherwise spread over all partitions in turn."""
    out = [[] for _ in range(PARTITIONS)]
    for i in range(start, start + count):
        k = f"k{(i * 7 + seed) % keys}"
        t = 1_000_000 + i * 10 - (1500 if i % 97 == 0 else 0)
        line = json.dumps({"key": k, "event_time_ms": t, "payload": {"value": i % 13}})
        if i % 211 == 0:
            line = "{not json"
        out[partition_of(k) if keyed else i % PARTITIONS].append((k, line))
    return out


def send(bootstrap, topic, parts):
    produce(bootstrap, topic, [[line for _, line in p] for p in parts],
            key_of=None)


def lake_env(catalog, data):
    return dict(os.environ, **lake.child_env(EXT, catalog, data))


def job_args(bootstrap, job, prefix, *extra):
    return [f"brokers='{bootstrap}'", "subscribe=true", f"job='{job}'",
            f"windows_table='lake.{prefix}windows'", f"late_table='lake.{prefix}late_events'",
            f"dead_letter_table='lake.{prefix}dead_letters'", f"kafka={GROUP_KAFKA}", *extra]


class Member:
    """One DuckDB process running the job (follow mode), its output in files."""

    def __init__(self, tmp_path, name, env, topic, args, form=("1000", "200")):
        """`form`: the window and lateness, or ("sql", <file>) for a job written as SQL."""
        self.out = open(tmp_path / f"{name}.out", "w+")
        self.err = open(tmp_path / f"{name}.err", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, RUN_JOB, str(tmp_path / f"{name}.duckdb"), topic, *map(str, form), *args],
            env=env, stdout=self.out, stderr=self.err)

    def signal(self, sig):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self):
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stderr(self):
        self.err.flush()
        return open(self.err.name).read()


def ends(bootstrap, topic):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()


def owned(con, job):
    """Partitions per owner's process id, as the state rows say."""
    try:
        rows = con.execute("SELECT owner, count(*) FROM lake.streaming_etl_partitions WHERE job = ? GROUP BY owner",
                           [job]).fetchall()
    except duckdb.CatalogException:
        return {}    # not created yet
    return {int(o.split(" pid ")[1].split()[0]): n for o, n in rows}


def wait_for(cond, members, what, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.2)
    what = what() if callable(what) else what
    raise AssertionError(f"waited {timeout} s for {what}; " + " | ".join(m.stderr()[-500:] for m in members))


def wait_until_committed(con, job, want, members, timeout=240):
    """Waits until the state rows of `job` say every partition is read to its end."""
    deadline = time.time() + timeout
    got = {}
    while time.time() < deadline:
        try:
            got = dict(con.execute(
                "SELECT partition, next_offset FROM lake.streaming_etl_partitions WHERE job = ?", [job]).fetchall())
        except duckdb.CatalogException:
            pass    # not created yet
        if all(got.get(p) == n for p, n in want.items()):
            return
        for m in members:
            assert m.proc.poll() is None or m.proc.returncode == -signal.SIGKILL, m.stderr()
        time.sleep(0.5)
    raise AssertionError(f"not caught up: {got} vs {want}; " + " | ".join(m.stderr()[-500:] for m in members))


def tables(con, prefix):
    return [sorted(con.execute(q.format(t=f"lake.{prefix}{t}")).fetchall(), key=repr)
            for q, t in ((WINDOWS, "windows"), (LATE, "late_events"), (DEAD, "dead_letters"))]


def assert_same(got, want):
    """The three tables equal, row for row (lost and doubled rows named)."""
    for g, w, name in zip(got, want, ("windows", "late_events", "dead_letters")):
        doubled, lost = Counter(g) - Counter(w), Counter(w) - Counter(g)
        assert not doubled and not lost, (name, len(g), len(w), sorted(doubled)[:4], sorted(lost)[:4])


def bounded_runs(tmp_path, names, env, topic, args, form=("1000", "200")):
    """Bounded runs of the job in processes of their own, at once; the last row of each."""
    runs = [subprocess.Popen([sys.executable, RUN_JOB, str(tmp_path / f"{n}.duckdb"), topic, *map(str, form), *args],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in names]
    last = []
    for r in runs:
        out, err = r.communicate(timeout=300)
        assert r.returncode == 0, err
        last.append(json.loads(out.strip().splitlines()[-1]))
    return last


def straight(tmp_path, env, con, bootstrap, topic):
    """One process, one bounded `subscribe` run over everything produced."""
    [last] = bounded_runs(tmp_path, ["straight"], env, topic, job_args(bootstrap, "straight", "s_"))
    assert last["status"] == "caught_up" and last["partitions"] == PARTITIONS, last
    return tables(con, "s_")


def group_job(tmp_path, postgres, broker, job, *extra):
    """A new 12-partition topic and a new lake for a job: (topic, reader connection, the members'
    environment, the job's arguments)."""
    import uuid
    topic = job[:1] + uuid.uuid4().hex[:8]
    broker.create_topic(topic, PARTITIONS)
    catalog, data, con = new_lake(tmp_path, postgres)
    return topic, con, lake_env(catalog, data), job_args(broker.bootstrap, job, "", *extra)


def new_lake(tmp_path, postgres):
    catalog, data = postgres.new_database(), str(tmp_path / "lakedata")
    con = lake.connect(tmp_path / "reader.duckdb", EXT, catalog, data)
    return catalog, data, con


