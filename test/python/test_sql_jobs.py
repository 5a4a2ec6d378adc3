"""Jobs written as SQL (SPEC section 21, `streaming_etl_sql`): each windowed statement's rows equal
DuckDB's batch query over the events the engine placed in each window (lookup joins, WHERE,
computed and joined keys, DuckDB's aggregates), late events that pass the statement in
`late_events` with its target, running rows and late corrections, a lookup table updated between
cycles, the parameter job's fast path, the same rows under any thread count, and a transform's
rows exactly once under SIGKILL. Runs on every host `make test` uses (2.0.1, 1.5.6 and 1.4.4)."""
import json
import os
import random

import pytest

from conftest import connect, kill_until_caught_up
from test_emit import named_sql

W, LATENESS = 1000, 150

COLUMNS = {"order_id": "BIGINT", "customer.id AS customer": "BIGINT", "amount": "DECIMAL(10,2)",
           "status": "VARCHAR", "sku": "VARCHAR", "region": "VARCHAR"}

CUSTOMERS = "CREATE OR REPLACE TABLE customers AS SELECT range AS id, CASE WHEN range % 7 = 0 THEN NULL ELSE ['north', 'south', 'east'][range % 3 + 1] END AS area FROM range(1, 40)"

ENRICH = """INSERT INTO by_area
SELECT c.area, lower(o.sku) AS sku, window_start, window_end, count(*) AS orders, sum(o.amount) AS revenue,
       median(o.amount) AS med, count(DISTINCT o.customer) AS customers
FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o JOIN customers AS c ON c.id = o.customer
WHERE o.status = 'paid'
GROUP BY ALL"""


def events(rng, n, start=0):
    """Orders; about 4% arrive 0.3-1.5 s behind; customers 40-44 have no row in `customers`."""
    out, t = [], start
    for i in range(n):
        t += rng.randint(0, 12)
        ts = t - rng.randint(300, 1500) if rng.random() < 0.04 else t
        e = {"ts": ts, "order_id": i, "customer": {"id": rng.randint(1, 44)},
             "amount": round(rng.uniform(0.5, 99.0), 2), "status": rng.choices(["paid", "new"], [7, 3])[0],
             "sku": rng.choice(["a", "A", "b", "B", "c"])}
        if rng.random() < 0.9:
            e["region"] = rng.choice(["eu", "us"])
        out.append(e)
    return out


def write_parts(d, parts):
    d.mkdir(parents=True, exist_ok=True)
    offsets = []
    for p, evs in enumerate(parts):
        at = 0
        with open(d / f"p{p}.ndjson", "a") as f:
            for e in evs:
                line = json.dumps(e)
                f.write(line + "\n")
                offsets.append((p, at, e))
                at += len(line) + 1
    return f"file:{d}/*.ndjson", offsets


def run_sql(con, topic, sql, **named):
    args = {"time_field": "ts", "columns": COLUMNS, **named}
    text = sql.replace("'", "''")
    return con.execute(f"SELECT * FROM streaming_etl_sql('{topic}', '{text}'{named_sql(args)})").fetchall()


def fates(offsets, lateness=LATENESS, size=W, hop=None):
    """One partition, read in order: each event's watermark (the largest time before it, minus
    the lateness) and whether it is late (every window it belongs to ended by then)."""
    seen, out = None, []
    for p, o, e in offsets:
        wm = seen - lateness if seen is not None else -(2 ** 62)
        t = e["ts"]
        last_end = (t // (hop or size)) * (hop or size) + size
        out.append((p, o, e, wm, last_end <= wm))
        seen = t if seen is None else max(seen, t)
    return out


def load_events(con, name, rows):
    """`rows`: (window start ms, partition, offset, event) as a table typed as the job's columns."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name}_raw (ws BIGINT, p INTEGER, o BIGINT, j VARCHAR)")
    con.executemany(f"INSERT INTO {name}_raw VALUES (?, ?, ?, ?)", [(ws, p, o, json.dumps(e)) for ws, p, o, e in rows])
    conv = []
    for path, ty in COLUMNS.items():
        field, col = path.split(" AS ")[0], path.split(" AS ")[-1]
        json_path = "->".join(f"'{seg}'" for seg in field.split("."))
        conv.append(f"json_transform_strict(j->{json_path}, '\"{ty}\"') AS \"{col}\"")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT ws, p AS partition, o AS \"offset\", (j->>'ts')::BIGINT AS event_time_ms, {', '.join(conv)} FROM {name}_raw")


BATCH = """SELECT c.area, lower(o.sku) AS sku, epoch_ms(make_timestamptz(ws * 1000)) AS ws, count(*) AS orders,
       sum(o.amount) AS revenue, median(o.amount) AS med, count(DISTINCT o.customer) AS customers
FROM placed AS o JOIN customers AS c ON c.id = o.customer WHERE o.status = 'paid' GROUP BY ALL ORDER BY ALL"""

GOT = "SELECT area, sku, epoch_ms(window_start), orders, revenue, med, customers FROM by_area ORDER BY ALL"


def test_a_windowed_statement_equals_duckdbs_batch_query_over_each_windows_events(tmp_path):
    rng = random.Random(46)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 3000)])
    con = connect()
    con.execute(CUSTOMERS)
    # In pieces: each run resumes the last one's staged rows and windows.
    while run_sql(con, topic, ENRICH, lateness_ms=LATENESS, max_messages=700)[-1][-1] != "caught_up":
        pass
    run_sql(con, topic, ENRICH, lateness_ms=LATENESS, flush=True)
    marked = fates(offsets)
    load_events(con, "placed", [(e["ts"] // W * W, p, o, e) for p, o, e, _, late in marked if not late])
    assert con.execute(GOT).fetchall() == con.execute(BATCH).fetchall()
    assert con.execute("SELECT count(*) FROM by_area WHERE area IS NULL").fetchone()[0] > 0
    # Late events: only those the statement keeps (paid, with a customer row), naming it.
    load_events(con, "late_all", [(0, p, o, e) for p, o, e, _, late in marked if late])
    want = con.execute("SELECT o.partition, o.\"offset\" FROM late_all o JOIN customers c ON c.id = o.customer "
                       "WHERE o.status = 'paid' ORDER BY ALL").fetchall()
    got = con.execute("SELECT partition, \"offset\" FROM late_events ORDER BY ALL").fetchall()
    assert got == want and len(got) > 10
    assert con.execute("SELECT DISTINCT output FROM late_events").fetchall() == [("by_area",)]
    assert len(want) < sum(1 for m in marked if m[4]), "some late events were dropped by the WHERE or the join"
    # The run's staged rows are gone with their windows.
    assert con.execute("SELECT count(*) FROM streaming_etl_staged_by_area").fetchone()[0] == 0


def test_hopping_rows_take_each_windows_placed_events(tmp_path):
    rng = random.Random(47)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 2000)])
    con = connect()
    con.execute(CUSTOMERS)
    sql = ENRICH.replace("TUMBLE(stream, event_time, INTERVAL 1 SECOND)", "HOP(stream, event_time, INTERVAL 250 MILLISECOND, INTERVAL 1 SECOND)")
    run_sql(con, topic, sql, lateness_ms=LATENESS, flush=True)
    rows = []
    for p, o, e, wm, late in fates(offsets, hop=250):
        if late:
            continue
        t = e["ts"]
        for ws in range(t // 250 * 250 - W + 250, t // 250 * 250 + 1, 250):
            if ws + W > wm:
                rows.append((ws, p, o, e))
    load_events(con, "placed", rows)
    assert con.execute(GOT).fetchall() == con.execute(BATCH).fetchall()


def test_running_rows_end_as_the_close_rows_and_late_corrections_apply(tmp_path):
    rng = random.Random(48)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 1500)])
    closed = connect()
    closed.execute(CUSTOMERS)
    run_sql(closed, topic, ENRICH, lateness_ms=LATENESS, flush=True)
    want = closed.execute(GOT).fetchall()
    con = connect()
    con.execute(CUSTOMERS)
    while run_sql(con, topic, ENRICH, lateness_ms=LATENESS, emit="update", write_mode="append",
                  max_messages=300)[-1][-1] != "caught_up":
        pass
    run_sql(con, topic, ENRICH, lateness_ms=LATENESS, emit="update", write_mode="append", flush=True)
    finals = con.execute(GOT.replace("FROM by_area", "FROM by_area WHERE final")).fetchall()
    assert finals == want
    assert con.execute("SELECT count(*) FROM by_area WHERE NOT final").fetchone()[0] > 0
    # Late corrections: a late event up to 2 s past its window's end updates the window's row.
    fixed = connect()
    fixed.execute(CUSTOMERS)
    run_sql(fixed, topic, ENRICH, lateness_ms=LATENESS, late_updates_ms=2000, flush=True)
    applied = fixed.execute("SELECT count(*) FROM late_events WHERE applied").fetchone()[0]
    assert applied > 0
    latest = fixed.execute("SELECT sum(orders) FROM by_area").fetchone()[0]
    assert latest == closed.execute("SELECT sum(orders) FROM by_area").fetchone()[0] + applied


def test_a_lookup_table_is_read_as_each_event_is(tmp_path):
    """Events read before the lookup table changed keep its old row; later ones see the new one,
    in the same window."""
    con = connect()
    con.execute("CREATE TABLE customers AS SELECT 1 AS id, 'north' AS area")
    d = tmp_path / "in"
    first = [{"ts": t, "order_id": t, "customer": {"id": 1}, "amount": 1, "status": "paid", "sku": "a"} for t in range(0, 400, 100)]
    topic, _ = write_parts(d, [first])
    run_sql(con, topic, ENRICH)
    con.execute("UPDATE customers SET area = 'south'")
    later = [{"ts": t, "order_id": t, "customer": {"id": 1}, "amount": 1, "status": "paid", "sku": "a"} for t in range(400, 900, 100)]
    write_parts(d, [later])
    run_sql(con, topic, ENRICH, flush=True)
    assert con.execute("SELECT area, orders FROM by_area ORDER BY area").fetchall() == [("north", 4), ("south", 5)]


def test_the_parameter_jobs_statement_runs_on_the_engine_and_writes_its_rows(tmp_path):
    rng = random.Random(49)
    topic, _ = write_parts(tmp_path / "in", [events(rng, 2000), events(rng, 2000)])
    con = connect()
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {W}, {LATENESS}, time_field := 'ts', key_field := 'sku', "
                "value_field := 'amount', flush := true)").fetchall()
    sql = """INSERT INTO w SELECT sku, window_start, window_end, count(*) AS n, sum(amount) AS s, min(amount) AS lo, max(amount) AS hi
             FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) GROUP BY ALL"""
    run_sql(con, topic, sql, columns={"sku": "VARCHAR", "amount": "DOUBLE"}, lateness_ms=LATENESS, flush=True, job="sql")
    want = con.execute("SELECT key, window_start_ms, window_end_ms, count, sum_value, min_value, max_value FROM windows ORDER BY 1, 2").fetchall()
    got = con.execute("SELECT sku, epoch_ms(window_start), epoch_ms(window_end), n, s, lo, hi FROM w ORDER BY 1, 2").fetchall()
    assert got == want and len(got) > 50
    # Nothing was staged: the engine computed the rows.
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE 'streaming_etl_staged%'").fetchone()[0] == 0


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_writes_the_same_rows(tmp_path, threads):
    rng = random.Random(50)
    topic, _ = write_parts(tmp_path / "in", [events(rng, 1500) for _ in range(3)])
    rows = []
    for n in (1, threads):
        con = connect()
        con.execute(CUSTOMERS)
        con.execute(f"SET threads = {n}")
        run_sql(con, topic, ENRICH, lateness_ms=LATENESS, flush=True, job=f"t{n}")
        rows.append((con.execute(GOT).fetchall(), con.execute("SELECT partition, \"offset\" FROM late_events ORDER BY ALL").fetchall()))
    assert rows[0] == rows[1]


def test_a_transform_lands_every_row_exactly_once_under_sigkill(tmp_path):
    rng = random.Random(51)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 4000) for _ in range(2)])
    sql = tmp_path / "job.sql"
    sql.write_text("""INSERT INTO paid SELECT o.order_id, o.partition, o."offset", o.amount, c.area, o.event_time
FROM stream AS o JOIN customers AS c ON c.id = o.customer WHERE o.status = 'paid'""")
    db = tmp_path / "kill.duckdb"
    con = connect(db)
    con.execute(CUSTOMERS)
    con.close()
    cols = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"
    args = [db, topic, "sql", sql, "time_field='ts'", f"columns={cols}", "max_messages=1500"]
    kr = random.Random(52)
    assert kill_until_caught_up(args, kr, 0.4) > 0
    con = connect(db)
    load_events(con, "all_events", [(0, p, o, e) for p, o, e in offsets])
    want = con.execute("SELECT o.order_id, o.partition, o.\"offset\", o.amount, c.area FROM all_events o "
                       "JOIN customers c ON c.id = o.customer WHERE o.status = 'paid' ORDER BY 2, 3").fetchall()
    got = con.execute("SELECT order_id, partition, \"offset\", amount, area FROM paid ORDER BY 2, 3").fetchall()
    assert got == want
