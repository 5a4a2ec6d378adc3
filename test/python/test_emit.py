"""Running results, late corrections and the newer aggregates (SPEC section 17): a job killed at
random instants and resumed writes the same rows, revisions included, as one straight run; its
final rows are the ones `emit := 'close'` writes; approx_quantile stays within 1% of DuckDB's
quantile_cont; filtered aggregates and arg_max/arg_min equal DuckDB's own over the same events."""
import json
import math
import random

import pytest

from conftest import connect, kill_once
from test_windows import random_orders, write_parts

AGGS = ["count(*) AS orders", "sum(amount) AS revenue", "approx_quantile(amount, [0.5, 0.9]) AS q",
        "count(*) FILTER (WHERE status = 'paid' OR coupon IS NULL) AS paid_or_plain",
        "arg_max(customer.id, amount) AS top", "approx_count_distinct(customer.id) AS customers"]


def quote(v):
    if isinstance(v, dict):
        return "{" + ", ".join(f"{quote(k)}: {quote(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(quote(x) for x in v) + "]"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return str(v).lower() if isinstance(v, bool) else str(v)


def named_sql(args):
    return "".join(f", {k} := {quote(v)}" for k, v in args.items())


def table_rows(con, table):
    return sorted(con.execute(f"SELECT * FROM {table}").fetchall(), key=repr)


def run_pieces(db, topic, args, step, kill_rng=None):
    """Runs the job in pieces of `step` messages (each piece one cycle), then a flush run. With
    `kill_rng`, each piece runs in its own process, SIGKILLed at a random instant of its first
    attempt (a piece takes a few milliseconds once loaded) and run again until it finishes.
    Returns the kills that landed."""
    kills = 0
    retry = False
    pieces = {**args, "max_messages": step, "checkpoint_interval_ms": 600_000}
    for _ in range(10_000):
        if kill_rng is None:
            con = connect(db)
            status = con.execute(f"SELECT status FROM streaming_etl_run('{topic}', 1000, 300{named_sql(pieces)})").fetchall()[-1][0]
            con.close()
        else:
            named = [f"{k}={quote(v)}" for k, v in pieces.items()]
            retry, out = kill_once([db, topic, 1000, 300, *named], kill_rng, 0.03, kill=not retry)
            if retry:
                kills += 1
                continue
            status = json.loads(out.decode().strip().splitlines()[-1])["status"]
        if status == "caught_up":
            break
    con = connect(db)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 300, flush := true{named_sql(args)})").fetchall()
    con.close()
    return kills


@pytest.mark.parametrize("mode,kind", [("append", "tumbling"), ("upsert", "hopping"), ("append", "session"),
                                       ("upsert", "session")])
def test_killed_runs_write_the_straight_runs_rows_revisions_included(tmp_path, mode, kind):
    rng = random.Random(f"{mode}-{kind}")
    topic = write_parts(tmp_path / "in", random_orders(rng, 3, per_part=1500))
    args = {"time_field": "ts", "group_by": ["region"], "aggregates": AGGS, "emit": "update", "write_mode": mode}
    if kind == "hopping":
        args.update(window_kind="hopping", hop_ms=250, late_updates_ms=1500)
    elif kind == "session":
        args.update(window_kind="session")
    else:
        args.update(late_updates_ms=2000)
    straight, killed = tmp_path / "straight.duckdb", tmp_path / "killed.duckdb"
    run_pieces(straight, topic, args, 211)
    kills = run_pieces(killed, topic, args, 211, kill_rng=random.Random(5))
    assert kills >= 3, kills
    a, b = connect(straight), connect(killed)
    for table in ("windows", "late_events", "dead_letters"):
        cols = "*" if table == "windows" else "* EXCLUDE (ingest_time_ms)"
        q = f"SELECT {cols} FROM {table}"
        assert sorted(a.execute(q).fetchall(), key=repr) == sorted(b.execute(q).fetchall(), key=repr), table
    # Running rows were written, and the latest revision of each window is emit := 'close''s row.
    assert a.execute("SELECT count(*) FROM windows WHERE NOT final").fetchone()[0] > 0 or mode == "upsert"
    close = connect(tmp_path / "close.duckdb")
    close_args = {k: v for k, v in args.items() if k not in ("emit", "late_updates_ms")}
    close.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 300, flush := true{named_sql(close_args)})").fetchall()
    cols = "window_start_ms, window_end_ms, region, orders, revenue, q, paid_or_plain, top, customers"
    latest = a.execute(f"SELECT {cols} FROM windows QUALIFY revision = max(revision) OVER "
                       "(PARTITION BY region, window_start_ms) AND NOT retracted").fetchall()
    if "late_updates_ms" not in args:
        assert sorted(latest, key=repr) == sorted(close.execute(f"SELECT {cols} FROM windows").fetchall(), key=repr)
    else:
        # Corrections only add: every close row's window is there, with at least its count.
        got = {(r[0], r[2]): r[3] for r in latest}
        for r in close.execute(f"SELECT {cols} FROM windows").fetchall():
            assert got[(r[0], r[2])] >= r[3]
        applied = a.execute("SELECT count(*) FROM late_events WHERE applied").fetchone()[0]
        assert applied > 0
        if kind == "tumbling":
            total = sum(got.values())
            late = a.execute("SELECT count(*) FROM late_events WHERE NOT applied").fetchone()[0]
            dead = a.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
            events = sum(1 for f in (tmp_path / "in").iterdir() for _ in open(f))
            assert total + late + dead == events


def test_quantiles_stay_within_one_percent_of_quantile_cont(tmp_path):
    rng = random.Random(3)
    d = tmp_path / "lat"
    d.mkdir()
    with open(d / "p0.ndjson", "w") as f:
        for i in range(200_000):
            ms = round(math.exp(rng.uniform(0, 9)), 3) if i % 10 else rng.randint(1, 50)
            f.write(json.dumps({"ts": i * 5, "endpoint": f"/e{i % 4}", "ms": ms}) + "\n")
    qs = [0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1]
    con = connect()
    for kind, extra in [("tumbling", ""), ("hopping", ", window_kind := 'hopping', hop_ms := 20000")]:
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 60000, 0, time_field := 'ts', flush := true, "
                    f"group_by := ['endpoint'], aggregates := ['approx_quantile(ms, {qs}) AS q', 'approx_quantile(ms, 0.99) AS p99']"
                    f"{extra}, job := '{kind}', windows_table := 'w_{kind}', late_table := 'l_{kind}', "
                    f"dead_letter_table := 'd_{kind}')").fetchall()
        exact = {}
        for s, e, endpoint, *vals in con.execute(
                f"SELECT w.window_start_ms, w.window_end_ms, w.endpoint, "
                + ", ".join(f"quantile_cont(ms, {q})" for q in qs)
                + f" FROM w_{kind} w JOIN read_json('{d}/*.ndjson') r ON r.endpoint = w.endpoint "
                  "AND r.ts >= w.window_start_ms AND r.ts < w.window_end_ms GROUP BY ALL").fetchall():
            exact[(s, endpoint)] = vals
        rows = con.execute(f"SELECT window_start_ms, endpoint, q, p99 FROM w_{kind}").fetchall()
        assert len(rows) == len(exact) > 20
        for s, endpoint, got, p99 in rows:
            want = exact[(s, endpoint)]
            for q, g, w in zip(qs, got, want):
                assert abs(g - w) <= 0.01 * abs(w), (kind, s, endpoint, q, g, w)
            assert p99 == got[qs.index(0.99)]


def test_filters_and_arg_max_equal_duckdbs_own_aggregates(tmp_path):
    rng = random.Random(9)
    d = tmp_path / "ev"
    d.mkdir()
    with open(d / "p0.ndjson", "w") as f:
        for i in range(20_000):
            e = {"ts": i * 3, "route": rng.choice(["a", "b", "c"]), "user": f"u{rng.randint(0, 300)}",
                 "latency": i * 0.5 + rng.random() * 0.1}
            if rng.random() < 0.9:
                e["status"] = rng.choice([200, 200, 201, 404, 500, 503])
            if rng.random() < 0.5:
                e["cached"] = rng.random() < 0.5
            if rng.random() < 0.3:
                e["tier"] = rng.choice(["free", "pro", None])
            f.write(json.dumps(e) + "\n")
    aggs = ["count(*) FILTER (WHERE status >= 500) AS errors",
            "count(*) FILTER (WHERE status < 300 AND (cached = true OR tier IS NOT NULL)) AS ok_cached",
            "sum(latency) FILTER (WHERE tier = 'pro' OR status <> 200) AS slow_sum",
            "count(status) FILTER (WHERE tier IS NULL) AS untiered",
            "arg_max(user, latency) AS slowest", "arg_min(user, latency) AS fastest",
            "max(latency) FILTER (WHERE cached = false) AS max_uncached"]
    con = connect()
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 5000, 0, time_field := 'ts', flush := true, "
                f"group_by := ['route'], aggregates := {quote(aggs)})").fetchall()
    got = sorted(con.execute("SELECT * EXCLUDE (window_end_ms) FROM windows").fetchall())
    want = sorted(con.execute(f"""
        SELECT (ts // 5000) * 5000, route,
               count(*) FILTER (WHERE status >= 500),
               count(*) FILTER (WHERE status < 300 AND (cached = true OR tier IS NOT NULL)),
               sum(latency) FILTER (WHERE tier = 'pro' OR status <> 200),
               count(status) FILTER (WHERE tier IS NULL),
               arg_max("user", latency), arg_min("user", latency),
               max(latency) FILTER (WHERE cached = false)
        FROM read_json('{d}/*.ndjson', columns = {{ts: 'BIGINT', route: 'VARCHAR', "user": 'VARCHAR',
             latency: 'DOUBLE', status: 'BIGINT', cached: 'BOOLEAN', tier: 'VARCHAR'}})
        GROUP BY ALL""").fetchall())
    assert len(got) == len(want) > 30
    for g, w in zip(got, want):
        assert g[:4] == w[:4] and g[5:8] == w[5:8], (g, w)
        for a, b in ((g[4], w[4]), (g[8], w[8])):
            assert (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9), (g, w)


@pytest.mark.parametrize("keys", [50, 1500, 3000])
def test_running_rows_of_few_and_many_keys_end_as_the_close_run(tmp_path, keys):
    """Each cycle's revisions go into the keyed table matched by a list lookup (a few windows a
    cycle), by list lookups in bands of window starts (1,500 keys: more than 2,048 rows a cycle,
    fewer a window) or by a join (a window of more than 2,048 rows): either way the table ends
    with the rows `emit := 'close'` writes, every window once, and running rows of open windows
    in between. Only the join leaves partitioned hash tables' blocks in DuckDB's eviction queues
    (queues 2-6 of `duckdb_eviction_queues()`, where the host has it)."""
    d = tmp_path / "data"
    d.mkdir()
    rng = random.Random(keys)
    parts = [[] for _ in range(2)]
    for i in range(40_000):
        t = 1_000_000 + i // 4 - (rng.randint(1500, 3000) if rng.random() < 0.03 else 0)
        parts[i % 2].append(json.dumps({"key": f"k{i % keys}", "event_time_ms": t, "payload": {"value": i % 7}}))
    for p, lines in enumerate(parts):
        (d / f"p{p}.ndjson").write_text("\n".join(lines) + "\n")
    topic = f"file:{d}/*.ndjson"
    con = connect(tmp_path / "u.duckdb")
    # Cycles of 2,500 messages, running rows and late corrections every cycle.
    while True:
        rows = con.execute(f"SELECT status FROM streaming_etl_run('{topic}', 1000, 200, emit := 'update', "
                           "late_updates_ms := 2000, max_messages := 2500)").fetchall()
        running = con.execute("SELECT count(*) FROM windows WHERE NOT final").fetchall()[0][0]
        if rows[-1][0] == "caught_up":
            break
        assert running > 0
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 200, emit := 'update', late_updates_ms := 2000, "
                "flush := true)").fetchall()
    got = sorted(con.execute("SELECT window_start_ms, key, count, sum_value FROM windows").fetchall())
    assert con.execute("SELECT count(*) FROM windows WHERE NOT final").fetchall() == [(0,)]
    if con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = 'duckdb_eviction_queues'").fetchall()[0][0]:
        partitioned = con.execute("SELECT sum(approximate_size) FROM duckdb_eviction_queues() "
                                  "WHERE queue_index BETWEEN 2 AND 6").fetchall()[0][0]
        assert (partitioned == 0) == (keys < 2048), partitioned
    # emit := 'close' with the late events applied: DuckDB's own count per window over every event
    # but those later than late_updates_ms allows (the close run's late events).
    ref = connect(tmp_path / "c.duckdb")
    ref.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1000, 200, late_updates_ms := 2000, flush := true)").fetchall()
    want = sorted(ref.execute("SELECT window_start_ms, key, count, sum_value FROM windows").fetchall())
    assert got == want
