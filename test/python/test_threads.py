"""DuckDB's `threads` bounds a run: it starts `threads - 1` helper threads of its own (the
calling thread is the first), and no other thread of its own. And the answer is the same
whatever the thread count: the same windows, late events and dead letters, also when a job is
resumed, or killed with SIGKILL, under another thread count."""
import glob
import os
import random
import threading
import time

import pytest

from conftest import connect, kill_once
from test_windows import AGGS, GROUP, random_orders, sql_args, write_parts

JOBS = {
    "tumbling": {"group_by": ["customer.id AS customer"], "aggregates": ["count(*)", "sum(amount)", "max(amount)"]},
    "hopping": {"hop_ms": 500, "group_by": GROUP, "aggregates": AGGS},
    "session": {"window_kind": "session", "group_by": ["region"], "aggregates": AGGS},
    "update": {"group_by": GROUP, "aggregates": AGGS, "emit": "update", "write_mode": "append"},
    "late_updates": {"hop_ms": 500, "group_by": ["customer.id AS customer"],
                     "aggregates": ["count(*)", "arg_max(status, amount)", "approx_quantile(amount, 0.5)"],
                     "late_updates_ms": 3000},
}


def own_threads(con, topic, threads):
    """Runs a follow job with DuckDB's `threads` set; the most threads of the run seen at once,
    by name (helpers and anything else the run would start)."""
    con.execute(f"SET threads = {threads}")
    result = []
    t = threading.Thread(target=lambda: result.append(con.execute(
        f"SELECT * FROM streaming_etl_run('{topic}', 1000, 200, time_field := 'ts', follow := true, "
        "max_runtime_ms := 1500)").fetchall()))
    t.start()
    most = {}
    while t.is_alive():
        seen = {}
        for comm in glob.glob(f"/proc/{os.getpid()}/task/*/comm"):
            try:
                with open(comm) as f:
                    name = f.read().strip()
            except OSError:
                continue  # the thread ended meanwhile
            # (The watcher, and Kafka consumers of earlier tests still closing, are not the run's.)
            if name.startswith("streaming_etl-") and name not in ("streaming_etl-w", "streaming_etl-k"):
                seen[name] = seen.get(name, 0) + 1
        for name, n in seen.items():
            most[name] = max(most.get(name, 0), n)
        time.sleep(0.01)
    t.join()
    assert result, "the run failed"
    return most


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads are observed through /proc")
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_run_starts_threads_minus_one_helpers_and_nothing_else(tmp_path, threads):
    topic = write_parts(tmp_path / "in", random_orders(random.Random(1), 2, per_part=20_000))
    seen = own_threads(connect(tmp_path / "t.duckdb"), topic, threads)
    # Helpers are named streaming_etl-t<n> (Linux keeps 15 characters of a name).
    assert seen == ({"streaming_etl-t": threads - 1} if threads > 1 else {}), seen


def tables(con):
    """Every output row (without the wall-clock ingest times, which differ from run to run)."""
    return {t: sorted(con.execute(f"SELECT * {drop} FROM {t}").fetchall(), key=repr)
            for t, drop in (("windows", ""), ("late_events", "EXCLUDE (ingest_time_ms)"),
                            ("dead_letters", "EXCLUDE (ingest_time_ms)"))}


def run_in_pieces(db, topic, job, threads_of_piece, step=997):
    """Runs the job in pieces of `step` messages (each piece one cycle, so running rows fall
    alike), piece n with DuckDB's threads = threads_of_piece(n), then a flush."""
    pieces = sql_args({**job, "max_messages": step, "checkpoint_interval_ms": 600_000})
    for n in range(10_000):
        con = connect(db)
        con.execute(f"SET threads = {threads_of_piece(n)}")
        status = con.execute(f"SELECT status FROM streaming_etl_run('{topic}', 1000, 300, time_field := 'ts'"
                             f"{pieces})").fetchall()[-1][0]
        con.close()
        if status == "caught_up":
            break
    con = connect(db)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 300, time_field := 'ts', flush := true"
                f"{sql_args(job)})").fetchall()
    return con


@pytest.mark.parametrize("kind", sorted(JOBS))
def test_every_thread_count_writes_the_same_tables(tmp_path, kind):
    job = JOBS[kind]
    topic = write_parts(tmp_path / "in", random_orders(random.Random(kind), 4, per_part=3000))
    want = tables(run_in_pieces(tmp_path / "t1.duckdb", topic, job, lambda n: 1))
    assert want["windows"] and want["late_events"] and want["dead_letters"]
    for threads in (2, 3, 4):
        got = tables(run_in_pieces(tmp_path / f"t{threads}.duckdb", topic, job, lambda n: threads))
        assert got == want, f"{kind}: {threads} threads"
    # Resumed each time under another thread count.
    got = tables(run_in_pieces(tmp_path / "mixed.duckdb", topic, job, lambda n: [1, 3, 2, 4][n % 4]))
    assert got == want, f"{kind}: thread counts changing between runs"


def test_kills_under_changing_thread_counts_lose_and_double_nothing(tmp_path):
    """SIGKILL at random instants, each restart under another `threads`: the tables equal one
    straight run's."""
    rng = random.Random(11)
    topic = write_parts(tmp_path / "in", random_orders(rng, 4, per_part=60_000))
    job = {"hop_ms": 500, "group_by": GROUP, "aggregates": AGGS}
    straight = connect(tmp_path / "straight.duckdb")
    straight.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 300, time_field := 'ts', flush := true"
                     f"{sql_args(job)})").fetchall()
    db = tmp_path / "killed.duckdb"
    named = [f"{k}={v}" for k, v in (("time_field", "'ts'"), ("hop_ms", 500), ("checkpoint_interval_ms", 5),
                                     ("group_by", "['region', 'item.sku AS sku']"),
                                     ("aggregates", "[" + ", ".join(repr(a) for a in AGGS) + "]"))]
    kills = 0
    for attempt in range(60):
        killed, out = kill_once([db, topic, 1000, 300, *named], rng, (0.02, 0.3),
                                env={"STREAMING_ETL_THREADS": str(rng.choice([1, 2, 3, 4]))})
        kills += killed
        if not killed and b"caught_up" in out:
            break
    assert kills >= 3, "the kills landed mid-run"
    con = connect(db)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 300, time_field := 'ts', flush := true"
                f"{sql_args(job)})").fetchall()
    assert tables(con) == tables(straight)
