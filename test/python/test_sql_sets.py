"""A job of several statements over one read (SPEC section 21): each statement's rows, late events
and staged rows equal what the statement writes run alone (TUMBLE with a lookup join, HOP on the
engine's fast path, SESSION, a transform), under `emit := 'update'`, `late_updates_ms` and any
thread count, in pieces that resume from the checkpoint; an event late for one statement and on
time for another; and every target exactly once under SIGKILL. Runs on every host `make test`
uses (2.0.1, 1.5.6 and 1.4.4); `subscribe` into DuckLake is in test_group.py."""
import random

import pytest

from conftest import connect, kill_once, kill_until_caught_up
from test_sql_jobs import COLUMNS, CUSTOMERS, ENRICH, LATENESS, events, load_events, run_sql, write_parts

TWO_SECONDS = """INSERT INTO by_sku SELECT sku, window_start, count(*) AS n, sum(amount) AS revenue
FROM TUMBLE(stream, event_time, INTERVAL 2 SECOND) GROUP BY ALL"""
FAST = """INSERT INTO per_region SELECT region, window_start, window_end, count(*) AS n, count(order_id) AS ids
FROM HOP(stream, event_time, INTERVAL 500 MILLISECOND, INTERVAL 1 SECOND) GROUP BY ALL"""
SESSIONS = """INSERT INTO sessions SELECT customer, window_start, window_end, count(*) AS n, sum(amount) AS revenue
FROM SESSION(stream, event_time, INTERVAL 200 MILLISECOND) GROUP BY ALL"""
PAID = """INSERT INTO paid SELECT o.order_id, o.partition, o."offset", o.amount, c.area, o.event_time
FROM stream AS o JOIN customers AS c ON c.id = o.customer WHERE o.status = 'paid'"""
STATEMENTS = [ENRICH, TWO_SECONDS, FAST, SESSIONS, PAID]
TARGETS = ["by_area", "by_sku", "per_region", "sessions", "paid"]


def to_the_end(con, topic, sql, job, **named):
    """Runs a job in pieces of 900 messages, each a run of its own, then flushes it."""
    while run_sql(con, topic, sql, lateness_ms=LATENESS, job=job, max_messages=900, **named)[-1][-1] != "caught_up":
        pass
    run_sql(con, topic, sql, lateness_ms=LATENESS, job=job, flush=True, **named)


def rows(con, table, exclude=""):
    """A table's rows as text (timestamps read on every host's Python), sorted."""
    return con.execute(f"SELECT COLUMNS(* {exclude})::VARCHAR FROM {table} ORDER BY ALL").fetchall()


def outputs(con):
    out = {t: rows(con, t) for t in TARGETS}
    out["late"] = rows(con, "late_events", "EXCLUDE (ingest_time_ms, job)")
    return out


@pytest.mark.parametrize("named", [{}, {"emit": "update", "write_mode": "append"}, {"late_updates_ms": 2000}],
                         ids=["close", "update", "late updates"])
def test_each_statement_writes_what_it_writes_alone(tmp_path, named):
    rng = random.Random(60)
    topic, _ = write_parts(tmp_path / "in", [events(rng, 2000), events(rng, 2000), events(rng, 1000)])
    together = connect()
    together.execute(CUSTOMERS)
    together.execute("SET threads = 2")
    to_the_end(together, topic, ";\n".join(STATEMENTS), "set", **named)
    alone = connect()
    alone.execute(CUSTOMERS)
    for i, sql in enumerate(STATEMENTS):
        to_the_end(alone, topic, sql, f"alone{i}", **named)
    got, want = outputs(together), outputs(alone)
    for t in TARGETS:
        assert got[t] == want[t], t
        assert len(got[t]) > 10, t
    assert got["late"] == want["late"]
    # An event can be late for one statement and on time for another.
    late = together.execute("SELECT output, count(*) FROM late_events GROUP BY ALL ORDER BY ALL").fetchall()
    assert {o for o, _ in late} >= {"by_area", "by_sku"}, late
    assert together.execute("SELECT count(*) FROM late_events l WHERE output = 'by_area' AND NOT EXISTS "
                            "(SELECT 1 FROM late_events h WHERE h.output = 'by_sku' AND h.partition = l.partition "
                            "AND h.\"offset\" = l.\"offset\")").fetchone()[0] > 0
    # The statement on the engine's fast path stages nothing.
    staged = together.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'streaming_etl_staged%' "
                              "ORDER BY 1").fetchall()
    assert staged == [("streaming_etl_staged_by_area",), ("streaming_etl_staged_by_sku",),
                      ("streaming_etl_staged_sessions",)]


def test_a_set_lands_every_target_exactly_once_under_sigkill(tmp_path):
    rng = random.Random(61)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 3000) for _ in range(2)])
    sql = tmp_path / "job.sql"
    sql.write_text(";\n".join([ENRICH, TWO_SECONDS, PAID]))
    db = tmp_path / "kill.duckdb"
    con = connect(db)
    con.execute(CUSTOMERS)
    con.close()
    cols = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"
    args = [db, topic, "sql", sql, "time_field='ts'", f"columns={cols}", f"lateness_ms={LATENESS}",
            "max_messages=1200", "checkpoint_interval_ms=50"]
    kr = random.Random(62)
    assert kill_until_caught_up(args, kr, 0.5) > 0
    _, out = kill_once([*args, "flush=true"], kr, 0, kill=False)
    assert b"caught_up" in out
    con = connect(db)
    straight = connect()
    straight.execute(CUSTOMERS)
    run_sql(straight, topic, ";\n".join([ENRICH, TWO_SECONDS, PAID]), lateness_ms=LATENESS, flush=True)
    for t in ["by_area", "by_sku", "paid"]:
        assert rows(con, t) == rows(straight, t), t
    ex = "EXCLUDE (ingest_time_ms)"
    assert rows(con, "late_events", ex) == rows(straight, "late_events", ex)
    # Each paid event once, as DuckDB's own query over the files has it.
    load_events(con, "all_events", [(0, p, o, e) for p, o, e in offsets])
    want = con.execute("SELECT count(*) FROM all_events o JOIN customers c ON c.id = o.customer "
                       "WHERE o.status = 'paid'").fetchone()[0]
    assert con.execute("SELECT count(*), count(DISTINCT (partition, \"offset\")) FROM paid").fetchone() == (want, want)
