"""Hopping and session windows, composite keys and every aggregate, against the reference model
(test/python/reference.py, written from the SPEC) on random data with skewed partitions; and the
same jobs stopped and resumed every few messages, or killed at random instants, ending exactly
like a straight run."""
import datetime
import json
import math
import random

import pytest

from conftest import connect, kill_once
from reference import Job, run

AGGS = ["count(*) AS orders", "count(coupon)", "sum(amount) AS revenue", "avg(amount)", "min(amount)",
        "max(amount)", "approx_count_distinct(customer.id) AS customers", "first(status)", "last(status)"]
GROUP = ["region", "item.sku AS sku"]


def random_orders(rng, n_parts, per_part=200, skew=True, pad=0):
    """Random order events per partition (bad lines among them); `pad`: a filler field of about
    that many bytes, for wide messages (which runs parse ahead of the merge)."""
    parts = []
    for p in range(n_parts):
        t = 1_000_000 + rng.randint(-3000, 3000) - (4000 if skew and p == n_parts - 1 else 0)
        lines = []
        for _ in range(rng.randint(0, per_part)):
            t += rng.randint(0, 300)
            r = rng.random()
            if r < 0.03:
                lines.append(rng.choice(['{"ts":', "nope", '{"ts":"1","region":"eu"}',
                                         '{"ts":5,"region":"eu","item":{"sku":"A"},"amount":"9.5"}']))
                continue
            et = t - rng.randint(0, 4000) if r < 0.2 else t
            d = {"ts": et, "region": rng.choice(["eu", "us", "apac"]),
                 "item": {"sku": rng.choice(["A", "B", 7, True])},
                 "customer": {"id": f"c{rng.randint(0, 12)}"}, "status": rng.choice(["new", "paid", "sent"])}
            if rng.random() < 0.85:
                d["amount"] = rng.choice([rng.randint(-50, 500), round(rng.uniform(0, 99), 2), None])
            if rng.random() < 0.3:
                d["coupon"] = rng.choice(["X", "Y", None])
            if pad:
                d["note"] = "x" * rng.randint(pad // 2, pad * 3 // 2)
            lines.append(json.dumps(d))
        parts.append(lines)
    return parts


def write_parts(d, parts):
    d.mkdir(parents=True, exist_ok=True)
    for i, lines in enumerate(parts):
        (d / f"p{i}.ndjson").write_text("".join(line + "\n" for line in lines))
    return f"file:{d}/*.ndjson"


def extension_windows(con, key_names, agg_names):
    cols = ", ".join(["window_start_ms", "window_end_ms"] + [f'"{k}"' for k in key_names] + [f'"{a}"' for a in agg_names])
    out = {}
    for row in con.execute(f"SELECT {cols} FROM windows").fetchall():
        nk = len(key_names)
        out[(row[0], row[1], tuple(row[2:2 + nk]))] = dict(zip(agg_names, row[2 + nk:]))
    return out


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def assert_windows_equal(got, want):
    assert set(got) == set(want), (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5])
    for k in want:
        for name, v in want[k].items():
            assert same(got[k][name], v), (k, name, got[k][name], v)


def named(job_args):
    """The key and aggregate column names of a job."""
    keys = [g.split(" AS ")[-1].split(".")[-1] for g in job_args.get("group_by", ["key"])]
    return keys, [name for _, _, name in Job(1, 0, aggregates=job_args.get("aggregates")).aggs]


def sql_args(job_args):
    out = []
    for k, v in job_args.items():
        if isinstance(v, list):
            out.append(f"{k} := [{', '.join(repr(x) for x in v)}]")
        elif isinstance(v, str):
            out.append(f"{k} := '{v}'")
        else:
            out.append(f"{k} := {v}")
    return "".join(", " + a for a in out)


def check_against_reference(tmp_path, parts, window, lateness, job_args, flush=True):
    topic = write_parts(tmp_path / "in", parts)
    job = Job(window, lateness, hop_ms=job_args.get("hop_ms"), session=job_args.get("window_kind") == "session",
              group_by=job_args.get("group_by"), aggregates=job_args.get("aggregates"), time_field="ts",
              time_format=job_args.get("time_format"))
    closed, open_w, late, dead, wm = run(parts, job, flush=flush)
    con = connect()
    stats = con.execute(f"SELECT events_consumed, windows_emitted, late_events, dead_letters FROM streaming_etl_run("
                        f"'{topic}', {window}, {lateness}, time_field := 'ts', flush := {str(flush).lower()}"
                        f"{sql_args(job_args)})").fetchall()[-1]
    assert stats == (sum(map(len, parts)), len(closed), len(late), len(dead))
    keys, aggs = named(job_args)
    assert_windows_equal(extension_windows(con, keys, aggs), {k: v for k, v in closed.items()})
    got_late = sorted(con.execute('SELECT partition, "offset", event_time_ms, watermark_ms FROM late_events').fetchall())
    assert got_late == sorted((p, o, t, w) for p, o, t, w in late)
    assert sorted(con.execute('SELECT partition, "offset" FROM dead_letters').fetchall()) == sorted(dead)
    return con


@pytest.mark.parametrize("seed", range(12))
def test_hopping_windows_match_the_reference(tmp_path, seed):
    rng = random.Random(seed)
    window = rng.choice([1000, 3000, 6000])
    hop = rng.choice([d for d in (100, 500, 1000, 1500, 2000) if window % d == 0 and d < window])
    check_against_reference(tmp_path, random_orders(rng, rng.randint(1, 4)), window, rng.choice([0, 300]),
                            {"hop_ms": hop, "group_by": GROUP, "aggregates": AGGS}, flush=rng.random() < 0.5)


@pytest.mark.parametrize("seed", range(12))
def test_session_windows_match_the_reference(tmp_path, seed):
    rng = random.Random(100 + seed)
    gap = rng.choice([200, 700, 2000])
    check_against_reference(tmp_path, random_orders(rng, rng.randint(1, 4)), gap, rng.choice([0, 500]),
                            {"window_kind": "session", "group_by": rng.choice([GROUP, ["region"], []]),
                             "aggregates": AGGS}, flush=rng.random() < 0.5)


@pytest.mark.parametrize("seed", range(8))
def test_tumbling_with_keys_and_aggregates_matches_the_reference(tmp_path, seed):
    rng = random.Random(200 + seed)
    check_against_reference(tmp_path, random_orders(rng, rng.randint(1, 4)), rng.choice([500, 1000]), 200,
                            {"group_by": rng.choice([GROUP, [], ["customer.id AS customer"]]), "aggregates": AGGS},
                            flush=True)


@pytest.mark.parametrize("seed", range(4))
def test_wide_messages_in_many_chunks_match_the_reference(tmp_path, seed):
    """Wide messages (about 250 bytes), many chunks of them per file: the answer stays the
    reference model's."""
    rng = random.Random(300 + seed)
    job = [{"group_by": GROUP, "aggregates": AGGS},
           {"hop_ms": 500, "group_by": GROUP, "aggregates": AGGS},
           {"window_kind": "session", "group_by": ["region"], "aggregates": AGGS}][seed % 3]
    check_against_reference(tmp_path, random_orders(rng, 4, per_part=4000, pad=250), 1000, 200, job,
                            flush=seed % 2 == 0)


@pytest.mark.parametrize("kind", ["hopping", "session"])
def test_stopping_anywhere_gives_the_straight_runs_tables(tmp_path, kind):
    rng = random.Random(7)
    parts = random_orders(rng, 3, per_part=300)
    topic = write_parts(tmp_path / "in", parts)
    extra = {"hopping": {"hop_ms": 500}, "session": {"window_kind": "session"}}[kind]
    args = sql_args({**extra, "group_by": GROUP, "aggregates": AGGS})
    straight = connect()
    straight.execute(f"SELECT * FROM streaming_etl_run('{topic}', 2000, 300, time_field := 'ts', flush := true{args})").fetchall()
    for step in (1, 37, 250):
        con = connect()
        while True:
            status = con.execute(f"SELECT status FROM streaming_etl_run('{topic}', 2000, 300, time_field := 'ts', "
                                 f"max_messages := {step}{args})").fetchall()[-1][0]
            if status == "caught_up":
                break
        con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 2000, 300, time_field := 'ts', flush := true{args})").fetchall()
        keys, aggs = named({"group_by": GROUP, "aggregates": AGGS})
        assert_windows_equal(extension_windows(con, keys, aggs), extension_windows(straight, keys, aggs))
        for table in ("late_events", "dead_letters"):
            q = f'SELECT partition, "offset" FROM {table} ORDER BY 1, 2'
            assert con.execute(q).fetchall() == straight.execute(q).fetchall()


@pytest.mark.parametrize("pad", [0, 250])
def test_killed_runs_resume_exactly(tmp_path, pad):
    """SIGKILL a session job with sketches and first/last at random instants; resume; compare.
    With `pad`, the messages are wide: the runs parse ahead of the merge after their first ones."""
    rng = random.Random(11)
    parts = random_orders(rng, 4, per_part=20_000, pad=pad)
    topic = write_parts(tmp_path / "in", parts)
    args = ["window_kind='session'", f"group_by={GROUP!r}", f"aggregates={AGGS!r}", "time_field='ts'"]
    sql = sql_args({"window_kind": "session", "group_by": GROUP, "aggregates": AGGS})
    ref = connect(tmp_path / "straight.duckdb")
    ref.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1500, 300, time_field := 'ts', flush := true{sql})").fetchall()
    db = tmp_path / "killed.duckdb"
    kills = 0
    for _ in range(40):
        # Within the first tenths of a run: a whole run can take less than 0.15 s on a fast machine.
        killed, out = kill_once([db, topic, 1500, 300, *args, "checkpoint_interval_ms=5"], rng, 0.06)
        kills += killed
        if not killed and b"caught_up" in out:
            break
    assert kills >= 3, kills
    con = connect(db)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', 1500, 300, time_field := 'ts', flush := true{sql})").fetchall()
    keys, aggs = named({"group_by": GROUP, "aggregates": AGGS})
    assert_windows_equal(extension_windows(con, keys, aggs), extension_windows(ref, keys, aggs))
    total = con.execute('SELECT sum(orders) FROM windows').fetchone()[0] + \
        con.execute("SELECT count(*) FROM late_events").fetchone()[0] + con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    assert total == sum(map(len, parts))


def as_iso(parts, rng):
    """The same orders with their times written as RFC 3339 text in assorted offsets and styles."""
    out = []
    for lines in parts:
        conv = []
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                conv.append(line)
                continue
            if not isinstance(d, dict) or not isinstance(d.get("ts"), int):
                conv.append(line)
                continue
            off = datetime.timedelta(minutes=rng.choice([0, 0, 60, -300, 345, -570]))
            dt = datetime.datetime.fromtimestamp(d["ts"] / 1000, datetime.timezone(off))
            digits = rng.choice([0, 1, 3, 6])
            frac = dt.strftime("%f")[:digits]
            text = dt.strftime("%Y-%m-%d") + rng.choice(["T", " "]) + dt.strftime("%H:%M:%S") + \
                (("." + frac) if digits else "") + ("Z" if off.total_seconds() == 0 and rng.random() < 0.5 else dt.strftime("%z")[:3] + ":" + dt.strftime("%z")[3:])
            d["ts"] = text
            conv.append(json.dumps(d))
        out.append(conv)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_iso_times_match_the_reference(tmp_path, seed):
    rng = random.Random(300 + seed)
    parts = as_iso(random_orders(rng, rng.randint(1, 4)), rng)
    check_against_reference(tmp_path, parts, 1000, 200, {"time_format": "iso8601", "group_by": GROUP, "aggregates": AGGS},
                            flush=True)


def test_approx_count_distinct_stays_within_two_percent(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    with open(d / "p0.ndjson", "w") as f:
        for i in range(200_000):
            f.write(json.dumps({"ts": 1000 + i // 100, "region": f"r{i % 3}", "customer": {"id": f"user-{(i * 7919) % 90_000}"}}) + "\n")
    con = connect()
    con.execute(f"SELECT * FROM streaming_etl_run('file:{d}/*.ndjson', 1000000, 0, time_field := 'ts', flush := true, "
                "group_by := ['region'], aggregates := ['approx_count_distinct(customer.id) AS c', 'count(*) AS n'])").fetchall()
    for region, est in con.execute("SELECT region, c FROM windows").fetchall():
        exact = len({(i * 7919) % 90_000 for i in range(200_000) if f"r{i % 3}" == region})
        assert abs(est - exact) / exact < 0.02, (region, est, exact)
