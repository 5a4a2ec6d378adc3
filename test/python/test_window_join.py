"""Window joins (SPEC section 24): the stream read twice, both reads in one TUMBLE or HOP window
joined on window_start. Over orders and payments in one stream (5% of events 2-4 s late), each
join kind's rows equal DuckDB's batch join over the events each window kept (the late ones are in
late_events, once); a job killed at random instants, or run in pieces with running rows
(`emit := 'update'`), ends with the rows of one straight run; late corrections apply late events
to closed windows as either side. Runs on every host `make test` uses."""
import json
import random

import pytest

from conftest import connect, kill_until_caught_up

COLUMNS = "{'kind': 'VARCHAR', 'id': 'BIGINT', 'order_id': 'BIGINT', 'customer': 'VARCHAR', 'paid': 'BIGINT'}"
JOINS = {
    "inner": """SELECT o.customer, o.window_start, count(*) AS pairs, sum(p.paid) AS paid
        FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o JOIN TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS p
          ON o.customer = p.customer AND o.window_start = p.window_start
        WHERE o.kind = 'order' AND p.kind = 'payment' GROUP BY ALL""",
    "left": """SELECT o.window_start, o.customer, count(p.order_id) AS matched, count(*) AS n
        FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o LEFT JOIN TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS p
          ON p.kind = 'payment' AND p.order_id = o.id AND o.window_start = p.window_start
        WHERE o.kind = 'order' GROUP BY ALL""",
    "full": """SELECT o.window_start AS o_start, p.window_start AS p_start, count(*) AS n, count(o.id) AS orders
        FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o FULL JOIN TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS p
          ON o.kind = 'order' AND p.kind = 'payment' AND p.order_id = o.id AND o.window_start = p.window_start
        GROUP BY ALL""",
    "anti": """SELECT o.window_start, count(*) AS unpaid
        FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o ANTI JOIN TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS p
          ON p.kind = 'payment' AND p.customer = o.customer AND o.window_start = p.window_start
        WHERE o.kind = 'order' GROUP BY ALL""",
    "rows": """SELECT o.id, o.customer, p.paid, o.window_start
        FROM TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS o JOIN TUMBLE(stream, event_time, INTERVAL 1 SECOND) AS p
          ON p.order_id = o.id AND o.window_start = p.window_start
        WHERE o.kind = 'order' AND p.kind = 'payment'""",
    "hop": """SELECT o.customer, o.window_start, count(*) AS pairs
        FROM HOP(stream, event_time, INTERVAL 500 MILLISECOND, INTERVAL 2 SECOND) AS o
        JOIN HOP(stream, event_time, INTERVAL 500 MILLISECOND, INTERVAL 2 SECOND) AS p
          ON o.customer = p.customer AND o.window_start = p.window_start
        WHERE o.kind = 'order' AND p.kind = 'payment' GROUP BY ALL""",
}


def events(tmp_path, n=6000, seed=1):
    """Orders and payments in 3 files, times rising 4 ms an event, 5% of them 2-4 s late."""
    rng = random.Random(seed)
    d = tmp_path / "in"
    d.mkdir()
    parts = [[] for _ in range(3)]
    for i in range(n):
        t = 1_700_000_000_000 + i * 4 - (rng.randint(2000, 4000) if rng.random() < 0.05 else 0)
        if rng.random() < 0.5:
            e = {"kind": "order", "id": i, "customer": f"c{rng.randrange(30)}", "ts": t}
        else:
            e = {"kind": "payment", "order_id": max(0, i - rng.randrange(200)), "customer": f"c{rng.randrange(30)}",
                 "paid": rng.randint(1, 100), "ts": t}
        parts[i % 3].append(json.dumps(e))
    for p, lines in enumerate(parts):
        (d / f"p{p}.ndjson").write_text("\n".join(lines) + "\n")
    return f"file:{d}/*.ndjson", [line for p in parts for line in p]


def run(con, topic, sql, **named):
    named = {"lateness_ms": 500, **named}
    extra = "".join(f", {k} := {v}" for k, v in named.items())
    return con.execute(f"SELECT * FROM streaming_etl_sql('{topic}', $$INSERT INTO joined {sql}$$, time_field := 'ts', "
                       f"columns := {COLUMNS}{extra})").fetchall()


def rows(con, query="SELECT * FROM joined"):
    """As text (hosts without pytz read no TIMESTAMPTZ into Python)."""
    return sorted(con.execute(f"SELECT COLUMNS(*)::VARCHAR FROM ({query})").fetchall(), key=repr)


@pytest.mark.parametrize("kind", sorted(JOINS))
def test_each_join_kind_equals_duckdbs_batch_join_over_each_windows_events(tmp_path, kind):
    topic, lines = events(tmp_path)
    con = connect(tmp_path / "j.duckdb")
    # (An event late for some of its HOP windows counts in the others: which ones, the watermark
    # it was read under says, which no table keeps; the HOP case keeps every event.)
    lateness = 5000 if kind == "hop" else 500
    last = run(con, topic, JOINS[kind], flush="true", lateness_ms=lateness)[-1]
    # An event late for its window is in late_events: the batch query reads each event in the
    # windows that kept it.
    late = [(json.dumps(json.loads(p), sort_keys=True), w)
            for p, w in con.execute("SELECT payload_json, window_start_ms FROM late_events").fetchall()]
    assert last[3] == len(late) and (len(late) > 100 or kind == "hop" and not late), last
    con.execute("CREATE TEMP TABLE late_pairs (k VARCHAR, w BIGINT)")
    if late:
        con.executemany("INSERT INTO late_pairs VALUES (?, ?)", late)
    con.execute("CREATE TEMP TABLE placed (k VARCHAR, kind VARCHAR, id BIGINT, order_id BIGINT, customer VARCHAR, "
                "paid BIGINT, event_time TIMESTAMPTZ)")
    con.executemany("INSERT INTO placed VALUES (?, ?, ?, ?, ?, ?, make_timestamptz(? * 1000))",
                    [(json.dumps(e, sort_keys=True), e["kind"], e.get("id"), e.get("order_id"), e["customer"],
                      e.get("paid"), e["ts"]) for e in map(json.loads, lines)])
    # The batch query: the same statement over a table of the events, windowed by DuckDB.
    batch = JOINS[kind].replace("stream", "placed")
    con.execute("""CREATE TEMP MACRO tumble(t, ts, size) AS TABLE
        SELECT * EXCLUDE (k) FROM (SELECT *, time_bucket(size, event_time) AS window_start,
            time_bucket(size, event_time) + size AS window_end FROM query_table(t))
        WHERE (k, epoch_ms(window_start)) NOT IN (SELECT (k, w) FROM late_pairs)""")
    con.execute("""CREATE TEMP MACRO hop(t, ts, hop, size) AS TABLE
        SELECT * EXCLUDE (k, w), w AS window_start, w + size AS window_end FROM (SELECT *, unnest(range(
            time_bucket(hop, event_time) - size + hop, time_bucket(hop, event_time) + hop, hop)) AS w FROM query_table(t))
        WHERE (k, epoch_ms(w)) NOT IN (SELECT (k, w) FROM late_pairs)""")
    want = rows(con, batch)
    got = rows(con)
    assert len(got) >= 5 and got == want, (kind, len(got), len(want))


def test_a_window_join_killed_or_run_in_pieces_with_running_rows_ends_as_a_straight_run(tmp_path):
    topic, _ = events(tmp_path, n=8000, seed=2)
    con = connect(tmp_path / "straight.duckdb")
    run(con, topic, JOINS["inner"], flush="true")
    want = rows(con)
    con.close()
    sql = tmp_path / "job.sql"
    sql.write_text("INSERT INTO joined " + JOINS["inner"])
    db = tmp_path / "killed.duckdb"
    args = [db, topic, "sql", sql, "time_field='ts'", "lateness_ms=500", f"columns={COLUMNS}", "max_messages=900",
            "checkpoint_interval_ms=20"]
    assert kill_until_caught_up(args, random.Random(3), 0.4) > 0
    con = connect(db)
    run(con, topic, JOINS["inner"], flush="true")
    assert rows(con) == want
    con.close()
    # Running rows every cycle, in pieces: the final rows are the straight run's.
    con = connect(tmp_path / "pieces.duckdb")
    while run(con, topic, JOINS["inner"], emit="'update'", max_messages=700)[-1][-1] != "caught_up":
        pass
    run(con, topic, JOINS["inner"], emit="'update'", flush="true")
    assert rows(con, "SELECT customer, window_start, pairs, paid FROM joined") == want


def test_late_corrections_apply_late_events_to_both_sides_of_closed_windows(tmp_path):
    """`late_updates_ms` longer than any event is late: every late event is applied to its closed
    window (as either side), and the final rows are DuckDB's batch join over every event."""
    topic, lines = events(tmp_path, seed=4)
    con = connect(tmp_path / "c.duckdb")
    named = {"emit": "'update'", "late_updates_ms": 5000}
    while run(con, topic, JOINS["inner"], max_messages=700, **named)[-1][-1] != "caught_up":
        pass
    run(con, topic, JOINS["inner"], flush="true", **named)
    assert con.execute("SELECT count(*), count(*) FILTER (WHERE applied) FROM late_events").fetchone()[1] > 100
    con.execute("CREATE TEMP TABLE placed (kind VARCHAR, id BIGINT, order_id BIGINT, customer VARCHAR, paid BIGINT, "
                "event_time TIMESTAMPTZ)")
    con.executemany("INSERT INTO placed VALUES (?, ?, ?, ?, ?, make_timestamptz(? * 1000))",
                    [(e["kind"], e.get("id"), e.get("order_id"), e["customer"], e.get("paid"), e["ts"])
                     for e in map(json.loads, lines)])
    con.execute("CREATE TEMP MACRO tumble(t, ts, size) AS TABLE "
                "SELECT *, time_bucket(size, event_time) AS window_start FROM query_table(t)")
    want = rows(con, JOINS["inner"].replace("stream", "placed"))
    assert rows(con, "SELECT customer, window_start, pairs, paid FROM joined") == want


@pytest.mark.parametrize("kind", ["inner", "left", "anti"])
def test_events_neither_side_reads_are_neither_staged_nor_late(tmp_path, kind):
    """Events no side of the join can read (refunds, which both sides' kind tests drop, and pings
    without a customer, which `o.customer = p.customer` cannot match) are not staged and not late,
    as a WHERE drops them; the rows and late events are those of the feed without them. They
    repeat a time of their file, so the watermarks move as without them; a third of them are late."""
    topic, _ = events(tmp_path)
    rng = random.Random(5)
    more = tmp_path / "more"
    more.mkdir()
    for p in (tmp_path / "in").iterdir():
        out = []
        for line in p.read_text().splitlines():
            out.append(line)
            if rng.random() < 0.3:
                e = json.loads(line)
                t = e["ts"] - (3000 if rng.random() < 0.3 else 0)
                extra = {"kind": "refund", "customer": e["customer"], "paid": 1, "ts": t} if rng.random() < 0.5 \
                    else {"kind": "ping", "ts": t}
                out.append(json.dumps(extra))
        (more / p.name).write_text("\n".join(out) + "\n")
    sql = JOINS[kind]
    if kind == "left":
        # (Its ON matches on the order id: the pings, without one, cannot match either.)
        sql = sql.replace("p.order_id = o.id", "p.customer = o.customer AND p.order_id = o.id")
    got = {}
    for name, source in (("without", topic), ("with", f"file:{more}/*.ndjson")):
        con = connect(tmp_path / f"{name}.duckdb")
        run(con, source, sql, max_messages=3000)
        kinds = con.execute("SELECT DISTINCT kind FROM streaming_etl_staged_joined ORDER BY ALL").fetchall()
        assert kinds and set(kinds) <= {("order",), ("payment",)}, kinds
        run(con, source, sql, flush="true")
        late = sorted(con.execute("SELECT payload_json, window_start_ms FROM late_events").fetchall())
        got[name] = (rows(con), late)
        con.close()
    assert got["with"] == got["without"] and len(got["with"][1]) > 50
