"""Typed columns and any DuckDB aggregate (SPEC section 19): a closed window's row equals DuckDB's
own `SELECT <aggregates> ... GROUP BY <keys>` over the events the engine placed in that window,
window by window, for 26 aggregate expressions (holistic, DISTINCT, ORDER BY, FILTER, a macro,
expressions over aggregates, lists, maps, structs and DECIMALs) on tumbling, hopping and session
windows; with running rows and late corrections; exactly once under SIGKILL, resumed under
another thread count, in both write modes; a dead letter for a value of every type that does
not convert. Runs on every host `make test` uses (2.0.1, 1.5.6 and 1.4.4)."""
import json
import math
import random
from decimal import Decimal

import pytest

from conftest import connect, kill_once
from test_emit import named_sql, quote

W, LATENESS, HOP, GAP = 1000, 150, 250, 400

COLUMNS = {"price": "DECIMAL(10,2)", "qty": "INTEGER", "customer.id AS customer": "BIGINT", "status": "VARCHAR",
           "sku": "VARCHAR", "tags": "VARCHAR[]", "dims": "STRUCT(w DOUBLE, h DOUBLE)", "flag": "BOOLEAN",
           "at": "TIMESTAMP"}

# Each expression and a name; all but count(*) are DuckDB's to compute.
AGGREGATES = [
    "count(*) AS n",
    "sum(price) AS revenue",
    "avg(price) AS avg_price",
    "median(price) AS med",
    "quantile_cont(price, [0.1, 0.9]) AS q",
    "quantile_disc(qty, 0.5) AS qty_med",
    "mode(status) AS top_status",
    "count(DISTINCT customer) AS customers",
    "list(DISTINCT sku ORDER BY sku) AS skus",
    "string_agg(sku, ',' ORDER BY event_time_ms, sku) AS sku_trail",
    "histogram(status) AS statuses",
    "regr_slope(qty, price) AS slope",
    "bool_and(flag) AS all_flagged",
    "bool_or(qty > 8) AS any_big",
    "sum(price * qty) FILTER (WHERE status = 'paid') AS paid",
    "sum(price) / count(*) AS per_event",
    "revenue(price, qty) AS macro_rev",
    "list_sort(flatten(list(tags))) AS all_tags",
    "max(dims.w) AS widest",
    "sum(dims.h) FILTER (WHERE dims.w > 1) AS tall",
    "approx_count_distinct(customer) AS approx_customers",
    "max(\"at\") AS last_at",
    "count(tags) AS tagged",
    "min(price) FILTER (WHERE flag) AS min_flagged",
    "stddev_samp(qty) AS qty_sd",
    "first(sku ORDER BY event_time_ms DESC, sku DESC) AS last_sku",
    "{'lo': min(qty), 'hi': max(qty)} AS qty_range",
]


def events(rng, n, start=0, disorder=True):
    """Orders with typed fields: prices as JSON numbers and decimal strings, some events late."""
    out, t = [], start
    for i in range(n):
        t += rng.randint(0, 12)
        ts = t - rng.randint(300, 1500) if disorder and rng.random() < 0.04 else t
        price = round(rng.uniform(0.5, 99.0), rng.choice([0, 1, 2]))
        e = {"ts": ts, "region": rng.choice(["eu", "us", "apac"]),
             "price": f"{price:.2f}" if rng.random() < 0.2 else price,
             "qty": rng.randint(1, 12), "customer": {"id": rng.randint(1, 40)},
             "status": rng.choices(["paid", "new", "sent"], [6, 3, 1])[0], "sku": rng.choice("ABCDEFG"),
             "dims": {"w": round(rng.uniform(0, 3), 3), "h": round(rng.uniform(0, 5), 3)},
             "flag": rng.random() < 0.8, "at": f"2024-05-01T10:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"}
        if rng.random() < 0.9:
            e["tags"] = rng.sample(["x", "y", "z", "w"], rng.randint(0, 3))
        out.append(e)
    return out


def write_parts(d, parts):
    d.mkdir(parents=True, exist_ok=True)
    offsets = []
    for p, evs in enumerate(parts):
        at = 0
        with open(d / f"p{p}.ndjson", "w") as f:
            for e in evs:
                line = json.dumps(e)
                f.write(line + "\n")
                offsets.append((p, at, e))
                at += len(line) + 1
    return f"file:{d}/*.ndjson", offsets


def new_con(path=":memory:"):
    con = connect(path)
    con.execute("CREATE OR REPLACE MACRO revenue(p, q) AS sum(p * q)")
    return con


def load_placed(con, placed):
    """The placed events (window start, end, key, event) as a table typed as the job's columns,
    each value converted by DuckDB's JSON reader, as `read_json`'s columns are."""
    con.execute("CREATE OR REPLACE TEMP TABLE raw (ws BIGINT, we BIGINT, region VARCHAR, j VARCHAR)")
    con.executemany("INSERT INTO raw VALUES (?, ?, ?, ?)", [(a, b, k, json.dumps(e)) for a, b, k, e in placed])
    conv = []
    for path, ty in COLUMNS.items():
        field, name = path.split(" AS ")[0], path.split(" AS ")[-1]
        json_path = "->".join(f"'{seg}'" for seg in field.split("."))
        conv.append(f"json_transform_strict(j->{json_path}, '\"{ty}\"') AS \"{name}\"")
    conv = ", ".join(conv)
    con.execute(f"CREATE OR REPLACE TEMP TABLE placed AS SELECT ws, we, region, (j->>'ts')::BIGINT AS event_time_ms, {conv} FROM raw")


def reference(con, placed):
    """DuckDB's GROUP BY over the placed events; a window whose statuses tie for the mode has
    the tied ones as a set (mode() breaks a tie by the order it reads, which DuckDB leaves open)."""
    load_placed(con, placed)
    rows = con.execute(f"SELECT ws, we, region, {', '.join(AGGREGATES)} FROM placed GROUP BY ALL ORDER BY 1, 3").fetchall()
    tied = dict(((ws, region), set(modes)) for ws, region, modes in con.execute(
        "SELECT ws, region, list(status) FROM (SELECT ws, region, status, count(*) AS c, max(count(*)) OVER "
        "(PARTITION BY ws, region) AS m FROM placed GROUP BY ws, region, status) WHERE c = m GROUP BY ws, region").fetchall())
    at = 3 + [a.rsplit(" AS ", 1)[1] for a in AGGREGATES].index("top_status")
    return [r[:at] + (tied[(r[0], r[2])],) + r[at + 1:] for r in rows]


def same_value(a, b):
    if isinstance(b, set):
        return a in b
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def assert_rows_equal(got, want):
    assert len(got) == len(want), (len(got), len(want))
    names = ["window_start_ms", "window_end_ms", "region"] + [a.rsplit(" AS ", 1)[1] for a in AGGREGATES]
    for g, w in zip(got, want):
        for name, x, y in zip(names, g, w):
            assert same_value(x, y), (g[:3], name, x, y)


def run_in_pieces(con, topic, args, step):
    """The job in runs of `step` messages (each resumes the last one's staged events), then a
    flush run."""
    while True:
        status = con.execute(f"SELECT status FROM streaming_etl_run('{topic}', {W}, {LATENESS}, max_messages := {step}"
                             f"{named_sql(args)})").fetchall()[-1][0]
        if status == "caught_up":
            break
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {W}, {LATENESS}, flush := true{named_sql(args)})").fetchall()


# mode() breaks a tie by the order it reads the events in, which DuckDB does not fix: a killed run
# (whose events come from more batches) may break it otherwise.
ORDER_FREE = [a for a in AGGREGATES if not a.startswith("mode(")]


def job_args(**extra):
    return {"time_field": "ts", "group_by": ["region"], "columns": COLUMNS, "aggregates": AGGREGATES, **extra}


def window_rows(con, table="windows"):
    cols = ", ".join(["window_start_ms", "window_end_ms", "region"] + [a.rsplit(" AS ", 1)[1] for a in AGGREGATES])
    return con.execute(f"SELECT {cols} FROM {table} ORDER BY 1, 3").fetchall()


def not_late(con, offsets, applied_too=False):
    where = "" if not applied_too else " WHERE NOT applied"
    late = set(con.execute(f'SELECT partition, "offset" FROM late_events{where}').fetchall())
    return [(p, o, e) for p, o, e in offsets if (p, o) not in late]


def test_tumbling_rows_equal_duckdbs_group_by_over_each_windows_events(tmp_path):
    rng = random.Random(11)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 1500) for _ in range(3)])
    con = new_con()
    run_in_pieces(con, topic, job_args(), 700)
    placed = [(e["ts"] // W * W, e["ts"] // W * W + W, e["region"], e) for _, _, e in not_late(con, offsets)]
    assert con.execute("SELECT count(*) FROM late_events").fetchone()[0] > 0
    assert_rows_equal(window_rows(con), reference(con, placed))
    # Types are DuckDB's: sum over DECIMAL is DECIMAL, exact.
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'windows'").fetchall())
    assert types["revenue"] == "DECIMAL(38,2)" and types["statuses"].startswith("MAP(VARCHAR")
    assert types["qty_range"] == "STRUCT(lo INTEGER, hi INTEGER)" and types["q"] == "DECIMAL(10,2)[]"
    assert isinstance(window_rows(con)[0][4], Decimal)
    assert con.execute("SELECT count(*) FROM streaming_etl_staged_windows").fetchone()[0] == 0


def test_hopping_rows_take_the_events_placed_before_each_window_closed(tmp_path):
    """Hopping windows: an event late for one window is placed in the later, open ones it belongs
    to. One partition, so the watermark each event was placed under is known here."""
    rng = random.Random(12)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 2500)])
    con = new_con()
    run_in_pieces(con, topic, job_args(hop_ms=HOP), 900)
    placed, seen = [], None
    for _, _, e in offsets:
        stamp = seen - LATENESS if seen is not None else -(2 ** 62)
        t = e["ts"]
        pane = t // HOP * HOP
        for s in range(pane - W + HOP, pane + 1, HOP):
            if s + W > stamp:
                placed.append((s, s + W, e["region"], e))
        seen = t if seen is None else max(seen, t)
    assert_rows_equal(window_rows(con), reference(con, placed))


def test_session_rows_take_their_sessions_events(tmp_path):
    rng = random.Random(13)
    parts = [events(rng, 700, start=p * 37) for p in range(2)]
    for evs in parts:   # gaps between bursts, so that a key has many sessions
        shift = 0
        for i, e in enumerate(evs):
            if i % 90 == 0:
                shift += 2000
            e["ts"] += shift
    topic, offsets = write_parts(tmp_path / "in", parts)
    con = new_con()
    run_in_pieces(con, topic, job_args(window_kind="session"), 500)
    sessions = con.execute("SELECT window_start_ms, window_end_ms, region FROM windows").fetchall()
    assert len(sessions) > 10
    placed = []
    for _, _, e in not_late(con, offsets):
        [s] = [s for s in sessions if s[2] == e["region"] and s[0] <= e["ts"] <= s[1] - W]
        placed.append((s[0], s[1], s[2], e))
    assert_rows_equal(window_rows(con), reference(con, placed))


def test_running_rows_and_late_corrections_recompute_the_window(tmp_path):
    """emit := 'update' with late_updates_ms: each window's latest row equals DuckDB's aggregates
    over every event placed in it, late corrections included; a window's close row, before the
    corrections, equals them over the events placed before it closed."""
    rng = random.Random(14)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 1500) for _ in range(2)])
    for mode in ("upsert", "append"):
        con = new_con(tmp_path / f"{mode}.duckdb")
        run_in_pieces(con, topic, job_args(emit="update", late_updates_ms=3000, write_mode=mode), 400)
        assert con.execute("SELECT count(*) FROM late_events WHERE applied").fetchone()[0] > 0
        placed = [(e["ts"] // W * W, e["ts"] // W * W + W, e["region"], e)
                  for _, _, e in not_late(con, offsets, applied_too=True)]
        con.execute("CREATE OR REPLACE TEMP VIEW latest AS SELECT * FROM windows QUALIFY revision = max(revision) "
                    "OVER (PARTITION BY region, window_start_ms)")
        assert_rows_equal(window_rows(con, "latest"), reference(con, placed))
        if mode == "append":
            # The close rows (the first final revision) hold the events placed before the close.
            con.execute("CREATE OR REPLACE TEMP VIEW closes AS SELECT * FROM windows WHERE final QUALIFY revision = "
                        "min(revision) OVER (PARTITION BY region, window_start_ms)")
            applied = set(con.execute('SELECT partition, "offset" FROM late_events WHERE applied').fetchall())
            on_time = [(e["ts"] // W * W, e["ts"] // W * W + W, e["region"], e)
                       for p, o, e in not_late(con, offsets, applied_too=True) if (p, o) not in applied]
            want = reference(con, on_time)
            # (A window whose every event came late has no close row: its first row corrects.)
            keys = {(r[0], r[2]) for r in want}
            assert_rows_equal([r for r in window_rows(con, "closes") if (r[0], r[2]) in keys], want)


def run_pieces_killed(db, topic, args, step, kill_rng):
    """The job in pieces of `step` messages, each in its own process SIGKILLed at a random instant
    of its first attempt and run again (under a random DuckDB `threads`) until it finishes; then a
    flush run. Returns the kills that landed."""
    kills, retry = 0, False
    pieces = {**args, "max_messages": step, "checkpoint_interval_ms": 600_000}
    named = [f"{k}={quote(v)}" for k, v in pieces.items()]
    setup = {"STREAMING_ETL_SETUP": "CREATE OR REPLACE MACRO revenue(p, q) AS sum(p * q)"}
    for _ in range(10_000):
        env = dict(setup, STREAMING_ETL_THREADS=str(kill_rng.choice([1, 2, 3])))
        retry, out = kill_once([db, topic, W, LATENESS, *named], kill_rng, 0.04, kill=not retry, env=env)
        if retry:
            kills += 1
            continue
        if json.loads(out.decode().strip().splitlines()[-1])["status"] == "caught_up":
            break
    con = new_con(db)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {W}, {LATENESS}, flush := true{named_sql(args)})").fetchall()
    return kills, con


@pytest.mark.parametrize("mode,kind", [("upsert", "tumbling"), ("append", "hopping"), ("append", "session"),
                                       ("upsert", "update")])
def test_killed_runs_write_the_straight_runs_rows(tmp_path, mode, kind):
    rng = random.Random(f"{mode}{kind}")
    topic, _ = write_parts(tmp_path / "in", [events(rng, 1200) for _ in range(3)])
    extra = {"tumbling": {}, "hopping": {"hop_ms": HOP}, "session": {"window_kind": "session"},
             "update": {"emit": "update", "late_updates_ms": 2000}}[kind]
    args = job_args(write_mode=mode, aggregates=ORDER_FREE, **extra)
    straight = new_con(tmp_path / "straight.duckdb")
    step = 257
    while straight.execute(f"SELECT status FROM streaming_etl_run('{topic}', {W}, {LATENESS}, max_messages := {step}, "
                           f"checkpoint_interval_ms := 600000{named_sql(args)})").fetchall()[-1][0] != "caught_up":
        pass
    straight.execute(f"SELECT * FROM streaming_etl_run('{topic}', {W}, {LATENESS}, flush := true{named_sql(args)})").fetchall()
    kills, killed = run_pieces_killed(tmp_path / "killed.duckdb", topic, args, step, random.Random(7))
    assert kills >= 3, kills
    for table in ("windows", "late_events", "dead_letters", "streaming_etl_staged_windows"):
        cols = "* EXCLUDE (ingest_time_ms)" if table in ("late_events", "dead_letters") else "*"
        q = f"SELECT {cols} FROM {table}"
        # (Sorted without the floats: a sum of doubles may differ in its last bit by the order it
        # was summed in, which same_value allows.)
        def order(r):
            return repr(tuple(x for x in r if not isinstance(x, float)))
        a = sorted(straight.execute(q).fetchall(), key=order)
        b = sorted(killed.execute(q).fetchall(), key=order)
        diff = [(x, y) for x, y in zip(a, b) if not same_value(x, y)]
        detail = [(i, x[i], y[i]) for x, y in diff[:1] for i in range(len(x)) if not same_value(x[i], y[i])]
        assert len(a) == len(b) and not diff, f"{table}: {len(a)} vs {len(b)} rows; first difference {detail}"


TYPED = [
    # (type, values that convert, values that do not)
    ("BOOLEAN", [True, False, 1, 0, "true", "f"], ["maybe", [1]]),
    ("TINYINT", [1, -128, "7", 2.5], [128, "x", {"a": 1}]),
    ("INTEGER", [42, "-7", 1e3], [2 ** 40, "1.5", "abc"]),
    ("BIGINT", [2 ** 62, -1, "12"], [2 ** 64, "1e3", "t"]),
    ("UBIGINT", [2 ** 63, 0], [-1, "x"]),
    ("HUGEINT", [2 ** 100, -5], ["1.0.0", [1]]),
    ("DOUBLE", [1.5, "2.25", 1e300, -0.0], ["abc", [1.0]]),
    ("FLOAT", [1.5, "0.25"], ["nope"]),
    ("DECIMAL(6,2)", [12.34, "0.5", 7, "-0.01"], [12345.6, "1x", [1]]),
    ("VARCHAR", ["a\"b", "é", 12, True, {"a": 1}], []),
    ("DATE", ["2024-01-02", "2024-02-29T10:00:00Z"], ["2024-02-30", "soon", 5]),
    ("TIMESTAMP", ["2024-01-02 03:04:05", "2024-01-02T03:04:05.123Z"], ["yesterday", 1700000000]),
    ("TIMESTAMPTZ", ["2024-01-02T03:04:05+02:00"], ["x"]),
    ("TIME", ["10:11:12"], ["25:00:00"]),
    ("INTERVAL", ["1 day", "2 hours"], ["sometimes"]),
    ("UUID", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"], ["not-a-uuid"]),
    ("JSON", [{"a": [1, 2]}, "s", 3], []),
    ("INTEGER[]", [[1, 2], [], [None, 3]], [["x"], "1,2", 5]),
    ("STRUCT(a INTEGER, b VARCHAR)", [{"a": 1, "b": "x"}, {"a": "2", "b": "y", "c": 0}], [{"b": "x"}, [1, 2], "s"]),
    ("MAP(VARCHAR, INTEGER)", [{"k": 1, "j": 2}], [{"k": "v"}, [1]]),
]


def test_every_type_converts_as_duckdbs_json_reader_and_the_rest_are_dead_letters(tmp_path):
    d = tmp_path / "typed"
    d.mkdir()
    lines, want_dead = [], []
    for i, (ty, good, bad) in enumerate(TYPED):
        for v in good:
            lines.append({"ts": len(lines), "col": i, "v": v})
        for v in bad:
            lines.append({"ts": len(lines), "col": i, "v": v})
            want_dead.append((len(lines) - 1, ty))
    with open(d / "p0.ndjson", "w") as f:
        for e in lines:
            f.write(json.dumps(e) + "\n")
    con = new_con()
    for i, (ty, good, bad) in enumerate(TYPED):
        con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000000, 0, time_field := 'ts', "
                    f"job := 'c{i}', group_by := [], columns := {{'v': '{ty}'}}, aggregates := ['count(*) AS n', "
                    f"'list(v ORDER BY event_time_ms) FILTER (WHERE v IS NOT NULL) AS vs'], flush := true, "
                    f"windows_table := 'w{i}', late_table := 'l{i}', dead_letter_table := 'd{i}')").fetchall()
        # Every other column's values are read as this type too: only this column's bad values
        # and the other columns' values this type refuses are dead letters; the ones that
        # convert are DuckDB's own conversions.
        dead = con.execute(f"SELECT \"offset\", error FROM d{i}").fetchall()
        offsets, at = {}, 0
        for n, e in enumerate(lines):
            offsets[at] = n
            at += len(json.dumps(e)) + 1
        dead_lines = {offsets[o] for o, _ in dead}
        for n, t in want_dead:
            if t == ty:
                assert n in dead_lines, (ty, lines[n])
        for o, error in dead:
            assert error.startswith(f"field 'v' does not convert to "), error
            assert json.dumps(lines[offsets[o]]["v"], ensure_ascii=False) in error, error
        expected = []
        for n, e in enumerate(lines):
            if n in dead_lines:
                continue
            try:
                got = con.execute(f"SELECT json_transform_strict(?, '\"{ty}\"')::VARCHAR", [json.dumps(e["v"])]).fetchone()[0]
            except Exception:
                raise AssertionError(f"{ty}: {e['v']!r} was not a dead letter, but DuckDB does not convert it")
            if got is not None:
                expected.append(got)
        for n in dead_lines:
            with pytest.raises(Exception):
                con.execute(f"SELECT json_transform_strict(?, '\"{ty}\"')", [json.dumps(lines[n]["v"])]).fetchone()
        # (As text: the Python client of DuckDB 1.4 and 1.5 needs pytz to fetch a TIMESTAMPTZ.)
        [(count, values)] = con.execute(f"SELECT n, vs::VARCHAR[] FROM w{i}").fetchall()
        assert count == len(lines) - len(dead_lines)
        assert same_value(list(values or []), expected), (ty, values, expected)


def test_staged_events_are_only_those_of_open_windows(tmp_path):
    """Bounded: the staged events are those of the windows still open, whatever the run's length."""
    rng = random.Random(15)
    topic, offsets = write_parts(tmp_path / "in", [events(rng, 3000, disorder=False)])
    con = new_con()
    sizes = []
    for _ in range(6):
        con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {W}, {LATENESS}, max_messages := 500{named_sql(job_args())})").fetchall()
        staged = con.execute("SELECT count(*), min(__se_pane) FROM streaming_etl_staged_windows").fetchone()
        wm = con.execute("SELECT max(global_watermark_ms) FROM streaming_etl_checkpoint()").fetchone()[0]
        consumed = con.execute("SELECT sum(next_offset) FROM streaming_etl_checkpoint()").fetchone()[0]
        # Every staged event belongs to a window the watermark has not closed.
        assert staged[1] is None or staged[1] + W > wm, (staged, wm)
        open_events = sum(1 for _, o, e in offsets if o < consumed and e["ts"] // W * W + W > wm)
        assert staged[0] == open_events, (staged, open_events)
        sizes.append(staged[0])
    assert max(sizes) < 200, sizes


def test_only_the_columns_the_aggregates_read_are_staged_and_an_older_layout_is_migrated(tmp_path):
    """A job that declares every column but reads two (`median(price)`, `count(DISTINCT
    customer)`) stages only those, and writes the rows of the job that declares the two; a
    staged table an earlier version left with every declared column (and open windows' events in
    it) loses the unread columns as the job resumes, and the job ends as a straight run."""
    rng = random.Random(16)
    topic, _ = write_parts(tmp_path / "in", [events(rng, 4000), events(rng, 4000)])
    aggs = ["count(*) AS n", "median(price) AS med", "count(DISTINCT customer) AS customers"]
    two = {"price": COLUMNS["price"], "customer.id AS customer": COLUMNS["customer.id AS customer"]}
    base = {"time_field": "ts", "group_by": ["region"], "aggregates": aggs}

    def cols(con):
        return [r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE streaming_etl_staged_windows)").fetchall()]

    def rows(con):
        return con.execute("SELECT window_start_ms, region, n, med, customers FROM windows ORDER BY 1, 2").fetchall()

    want_con = new_con(str(tmp_path / "two.duckdb"))
    run_in_pieces(want_con, topic, {**base, "columns": two}, 10_000)
    want = rows(want_con)
    assert len(want) > 20
    con = new_con(str(tmp_path / "all.duckdb"))
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {W}, {LATENESS}, max_messages := 3000"
                f"{named_sql({**base, 'columns': COLUMNS})})").fetchall()
    staged = cols(con)
    assert "price" in staged and "customer" in staged and not {"qty", "status", "tags", "dims"} & set(staged), staged
    # The layout of a version that staged every declared column, with open windows' events in it.
    assert con.execute("SELECT count(*) FROM streaming_etl_staged_windows").fetchone()[0] > 0
    for name, ty in (("qty", "INTEGER"), ("status", "VARCHAR"), ("tags", "VARCHAR[]")):
        con.execute(f"ALTER TABLE streaming_etl_staged_windows ADD COLUMN {name} {ty}")
    run_in_pieces(con, topic, {**base, "columns": COLUMNS}, 2500)
    assert cols(con) == staged
    assert rows(con) == want
