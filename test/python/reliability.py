"""The reliability scenarios: crashes, broker faults, hostile input and hostile state.

Each scenario takes a `scale` ("short" for `make test`, "long" for `make reliability`) and returns
a row: how many faults were injected, how many messages went in, how many were lost or doubled
(against one straight run over the same input), whether the accounting is exact (every message in
exactly one window count, late_events row or dead_letters row), and the SQLite integrity_check
of the checkpoint. A scenario whose expectations fail raises AssertionError.
"""
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

import duckdb

from brokers import MockBroker, produce
from conftest import EXT, FAULT_EXT, HERE, ROOT, connect, kill_once
from datagen import generate_sql

WINDOW, LATENESS = 1000, 200
CHILD = os.path.join(HERE, "run_job.py")


def integrity(path):
    if not os.path.exists(path):
        return "n/a"
    c = sqlite3.connect(path)
    try:
        return c.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        c.close()


def compare(con, ref, messages):
    """(lost, doubled, exact) of `con`'s tables against the straight run `ref`."""
    def windows(c):
        return {(k, s): (n, sv, mn, mx) for s, k, n, sv, mn, mx in
                c.execute("SELECT window_start_ms, key, count, sum_value, min_value, max_value FROM windows").fetchall()}

    def rows(c, table):
        return set(c.execute(f'SELECT partition, "offset" FROM {table}').fetchall())

    got, want = windows(con), windows(ref)
    lost = doubled = 0
    for k in set(got) | set(want):
        g, w = got.get(k, (0,))[0], want.get(k, (0,))[0]
        lost += max(0, w - g)
        doubled += max(0, g - w)
    for table in ("late_events", "dead_letters"):
        g, w = rows(con, table), rows(ref, table)
        lost += len(w - g)
        doubled += len(g - w)
    # Tables without keys (write_mode 'append') could hold a row twice: count the repeats.
    for table, key in (("windows", "key, window_start_ms"), ("late_events", 'partition, "offset"'),
                       ("dead_letters", 'partition, "offset"')):
        doubled += con.execute(f"SELECT count(*) - (SELECT count(*) FROM (SELECT DISTINCT {key} FROM {table})) FROM {table}").fetchone()[0]
    total = sum(v[0] for v in got.values()) + len(rows(con, "late_events")) + len(rows(con, "dead_letters"))
    exact = lost == 0 and doubled == 0 and got == want and total == messages
    return lost, doubled, exact


def row(scenario, faults, messages, lost, doubled, exact, ckpt, note=""):
    r = {"scenario": scenario, "faults": faults, "messages": messages, "lost": lost, "doubled": doubled,
         "exact": exact, "integrity": integrity(ckpt), "note": note}
    assert exact, r
    assert r["integrity"] in ("ok", "n/a"), r
    return r


def workdir(name):
    return tempfile.mkdtemp(prefix=f"setl-rel-{name}-")


def straight(d, topic, *named):
    """The reference: one uninterrupted run over the same input."""
    con = connect(os.path.join(d, "straight.duckdb"))
    args = "".join(f", {n}" for n in named)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, flush := true{args})").fetchall()
    return con


def finish(db, topic, *named):
    con = connect(db)
    args = "".join(f", {n}" for n in named)
    con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, flush := true{args})").fetchall()
    return con


def kill_loop(db, topic, named, kills_wanted, max_delay_s, rng, env=None, threads=None):
    """Starts the job in a child process again and again, SIGKILLing it at a random instant
    after it has loaded, until it finishes on its own. `threads`: DuckDB's `threads` of each
    start, drawn from these. Returns the number of kills."""
    kills = 0
    for _ in range(kills_wanted * 4 + 20):
        e = dict(env or {})
        if threads:
            e["STREAMING_ETL_THREADS"] = str(rng.choice(threads))
        killed, out = kill_once([db, topic, WINDOW, LATENESS, *named], rng, max_delay_s, env=e)
        kills += killed
        if not killed and b"caught_up" in out:
            return kills, True
    return kills, False


# --- crashes ---------------------------------------------------------------------------------

def kill_rounds(d, topic, named, kills_wanted, max_delay_s, ref, messages, seed, threads=None):
    """Kill loops over fresh databases until `kills_wanted` kills have landed, each round then
    finished and checked exactly against `ref`. Returns (kills, rounds, last checkpoint)."""
    rng = random.Random(seed)
    kills = rounds = 0
    ckpt = ""
    while kills < kills_wanted:
        db = os.path.join(d, f"killed-{rounds}.duckdb")
        landed, _ = kill_loop(db, topic, [n.replace(" := ", "=") for n in named] + ["checkpoint_interval_ms=5"],
                              kills_wanted, max_delay_s, rng, threads=threads)
        lost, doubled, exact = compare(finish(db, topic, *named), ref, messages)
        assert exact, (lost, doubled)
        kills += landed
        rounds += 1
        ckpt = db + ".streaming_etl.sqlite"
    return kills, rounds, ckpt


def kill_files(scale, threads=None):
    """SIGKILLs a job over files at random instants until it has read them all. `threads`: each
    start of the job under a DuckDB `threads` drawn from these (the checkpoint of one thread
    count resumes under any other)."""
    messages, kills_wanted = (200_000, 10) if scale == "short" else (1_000_000, 50)
    d = workdir("killt" if threads else "killf")
    try:
        generate_sql(duckdb.connect(), os.path.join(d, "data"), messages, partitions=4, late_pct=5, bad_permille=2)
        topic = f"file:{d}/data/*.ndjson"
        ref = straight(d, topic)
        kills, rounds, ckpt = kill_rounds(d, topic, [], kills_wanted, 0.06, ref, messages, seed=3 if threads else 1,
                                          threads=threads)
        scenario = ("SIGKILL at random instants, each start under another DuckDB threads (1-4)" if threads
                    else "SIGKILL at random instants (files)")
        return row(scenario, kills, messages, 0, 0, True, ckpt, f"{rounds} job(s) of {messages} messages")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def kill_threads(scale):
    return kill_files(scale, threads=[1, 2, 3, 4])


def kill_kafka(scale):
    messages, kills_wanted = (100_000, 8) if scale == "short" else (1_000_000, 50)
    d = workdir("killk")
    broker = MockBroker()
    try:
        paths = generate_sql(duckdb.connect(), os.path.join(d, "data"), messages, partitions=4, late_pct=5, bad_permille=2)
        broker.create_topic("orders", 4)
        produce(broker.bootstrap, "orders", [open(p, "rb").read().splitlines() for p in paths], compression="zstd")
        b = f"brokers := '{broker.bootstrap}'"
        ref = straight(d, "orders", b)
        kills, rounds, ckpt = kill_rounds(d, "orders", [b], kills_wanted, 0.08, ref, messages, seed=2)
        return row("SIGKILL at random instants (Kafka)", kills, messages, 0, 0, True, ckpt,
                   f"{rounds} job(s) of {messages} messages, mock broker")
    finally:
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


def kill_points(scale):
    """Kills inside the SQLite commit, inside the DuckDB transaction, and right after DuckDB's
    commit (the state in doubt: the next run finds the batch's marker), at several cycles each,
    in both write modes."""
    messages = 60_000 if scale == "short" else 300_000
    cycles = [2, 5] if scale == "short" else [1, 2, 3, 5, 8, 13]
    d = workdir("points")
    try:
        generate_sql(duckdb.connect(), os.path.join(d, "data"), messages, partitions=3, late_pct=5, bad_permille=2)
        topic = f"file:{d}/data/*.ndjson"
        ref = straight(d, topic)
        faults = 0
        for mode in ("upsert", "append"):
            for point in ("checkpoint-before-commit", "sink-before-commit", "after-sink-commit"):
                for n in cycles:
                    db = os.path.join(d, f"{mode}-{point}-{n}.duckdb")
                    r = subprocess.run([sys.executable, CHILD, db, topic, str(WINDOW), str(LATENESS), "checkpoint_interval_ms=1",
                                        f"write_mode='{mode}'"],
                                       capture_output=True, env=dict(os.environ, STREAMING_ETL_CRASH_AT=f"{point}:{n}",
                                                                     STREAMING_ETL_EXTENSION=FAULT_EXT))
                    assert r.returncode in (-signal.SIGKILL, 0), r.stderr.decode()[-2000:]
                    faults += r.returncode == -signal.SIGKILL
                    ckpt = db + ".streaming_etl.sqlite"
                    assert integrity(ckpt) == "ok"
                    con = finish(db, topic, f"write_mode := '{mode}'")
                    lost, doubled, exact = compare(con, ref, messages)
                    assert exact, (mode, point, n, lost, doubled)
        return row("kill in SQLite commit / DuckDB txn / after DuckDB's commit (upsert and append)", faults, messages, 0, 0,
                   True, ckpt, f"points x cycles {cycles} x 2 write modes")
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- broker faults ---------------------------------------------------------------------------

def _kafka_fixture(broker, d, messages, partitions=4):
    paths = generate_sql(duckdb.connect(), os.path.join(d, "data"), messages, partitions=partitions, late_pct=5, bad_permille=1)
    broker.create_topic("orders", partitions)
    produce(broker.bootstrap, "orders", [open(p, "rb").read().splitlines() for p in paths], compression="zstd")


def broker_faults(scale):
    """Broker down mid-run and back; high latency; Fetch, Metadata, ListOffsets and OffsetCommit
    errors; a partition leader move. Each run either rides the fault out or fails clearly; the
    next run resumes with exact accounting."""
    messages = 100_000 if scale == "short" else 1_000_000
    d = workdir("faults")
    broker = MockBroker(3)
    faults = 0
    try:
        _kafka_fixture(broker, d, messages, partitions=3)
        b = f"brokers := '{broker.bootstrap}'"
        ref = straight(d, "orders", b)
        db = os.path.join(d, "faulty.duckdb")
        con = connect(db)
        step = messages // 10

        def run(*extra):
            args = "".join(f", {x}" for x in (b, f"max_messages := {step}", "timeout_ms := 3000", *extra))
            try:
                return con.execute(f"SELECT * FROM streaming_etl_run('orders', {WINDOW}, {LATENESS}{args})").fetchall()[-1]
            except duckdb.Error as e:
                msg = str(e)
                assert "orders" in msg and ("no message from partition" in msg or "cannot reach" in msg), msg
                return None

        for cmd in (["errors Fetch 10 6"], ["errors Metadata 5 7"], ["errors ListOffsets 3 5"],
                    ["errors OffsetCommit 10 16"], ["rtt 1 300", "rtt 2 300", "rtt 3 300"],
                    ["leader orders 0 2", "leader orders 1 3"], ["down 1", "down 2", "down 3"]):
            for c in cmd:
                broker.command(c)
                faults += 1
            run()
            for c in cmd:
                if c.startswith("down"):
                    broker.command("up" + c[4:])
                elif c.startswith("rtt"):
                    broker.command(f"rtt {c.split()[1]} 0")
                elif c.startswith("errors"):
                    broker.command(f"clear {c.split()[1]}")
        con.close()
        con = finish(db, "orders", b)
        lost, doubled, exact = compare(con, ref, messages)
        return row("broker down/up, latency, Fetch/Metadata/ListOffsets/OffsetCommit errors, leader move",
                   faults, messages, lost, doubled, exact, db + ".streaming_etl.sqlite", "mock cluster, 3 brokers")
    finally:
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


# --- hostile input ---------------------------------------------------------------------------

def hostile_corpus():
    """(message, expected reason or None for a good one)."""
    deep = b'{"key":"a","event_time_ms":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"key":"big","event_time_ms":1500,"payload":{"value":1},"blob":"' + b"x" * (10 << 20) + b'"}'
    return [
        (b'{"key":"a","event_time_ms":1000,"payload":{"value":1}}', None),
        (b"", "empty message"),
        (b"   \t", "empty message"),
        (b"not json", "not JSON"),
        (b'{"key":"a","event_time_ms":1000', "not JSON: unexpected end of message"),
        (b'{"key":"a","event_time_ms":10', "not JSON"),
        (b'{"key":"a","event_time_ms":"1000"}', "is a string, not an integer"),
        (b'{"key":"a","event_time_ms":true}', "is a boolean"),
        (b'{"key":"a","event_time_ms":[1]}', "is an array"),
        (b'{"key":"a","event_time_ms":1000,"payload":{"value":"x"}}', "is a string, not a number"),
        (b'{"key":"a","event_time_ms":1000,"payload":{"value":NaN}}', "not JSON"),
        (b'{"key":"a","event_time_ms":1000,"payload":{"value":Infinity}}', "not JSON"),
        (b'{"key":"a","event_time_ms":1000,"payload":{"value":1e999}}', "out of range"),
        (b'{"key":"a","event_time_ms":-1e999}', "not an integer"),
        (b'{"key":"a","event_time_ms":9223372036854775808}', "out of range"),
        (b'{"key":"a","event_time_ms":253402300800000}', "out of range"),
        (b'{"key":"a","event_time_ms":-62135596800001}', "out of range"),
        (b'{"key":null,"event_time_ms":1000}', "key field 'key' is null"),
        (b'{"event_time_ms":1000}', "missing key field 'key'"),
        (b'{"key":"a"}', "missing event time field"),
        (b'{"key":"a","key":"b","event_time_ms":1000}', "appears more than once"),
        (b'{"key":"a","event_time_ms":1000,"event_time_ms":2000}', "appears more than once"),
        (b'{"key":"\xff\xfe","event_time_ms":1000}', "invalid UTF-8"),
        (b'\xef\xbb\xbf{"key":"a","event_time_ms":1000}', "not JSON"),
        (b'{"key":"a\x00b","event_time_ms":1000}', "control character"),
        (b'{"key":"\\ud800","event_time_ms":1000}', "invalid \\u escape"),
        (b'[{"key":"a","event_time_ms":1000}]', "not a JSON object"),
        (b'"just a string"', "not a JSON object"),
        (b'{"key":"a","event_time_ms":1000} {"key":"b"}', "unexpected characters after"),
        (deep, "nested deeper than 128"),
        (huge, None),
        (b'{"key":"\\u00e9t\\u00e9","event_time_ms":1200,"payload":{"value":-0.0}}', None),
        (b'{"key":12345,"event_time_ms":-5,"payload":{"value":1e-300}}', None),
    ]


def hostile_input(scale):
    """The corpus through files and through Kafka: no panic, every bad message in dead_letters
    with its reason, every good one in a window."""
    corpus = hostile_corpus()
    reps = 1 if scale == "short" else 20
    d = workdir("hostile")
    broker = MockBroker()
    try:
        messages = []
        for r in range(reps):
            messages += corpus
        os.makedirs(os.path.join(d, "in"))
        with open(os.path.join(d, "in", "p.ndjson"), "wb") as f:
            offsets = []
            for m, _ in messages:
                offsets.append(f.tell())
                f.write(m + b"\n")
        broker.create_topic("hostile", 1)
        # Kafka messages cannot hold 10 MiB by default: that one goes through files only.
        kafka_msgs = [m for m, _ in messages if len(m) < 900_000]
        produce(broker.bootstrap, "hostile", [kafka_msgs])
        checked = 0
        for topic, named, expect in ((f"file:{d}/in/p.ndjson", "", list(zip(offsets, messages))),
                                     ("hostile", f", brokers := '{broker.bootstrap}'",
                                      list(enumerate([(m, e) for m, e in messages if len(m) < 900_000])))):
            con = connect()
            con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, flush := true{named})").fetchall()
            dead = dict(((o, e) for o, e in con.execute('SELECT "offset", error FROM dead_letters').fetchall()))
            raw = dict(con.execute('SELECT "offset", raw FROM dead_letters').fetchall())
            for off, (m, reason) in expect:
                if reason is None:
                    assert off not in dead, (m[:80], dead.get(off))
                else:
                    assert off in dead, (m[:80], reason)
                    assert reason in dead[off], (m[:80], reason, dead[off])
                    assert raw[off] == m
                checked += 1
            good = sum(1 for _, (m, r) in expect if r is None)
            assert con.execute("SELECT sum(count) FROM windows").fetchone()[0] + con.execute("SELECT count(*) FROM late_events").fetchone()[0] == good
        return row("hostile input corpus (files and Kafka)", len(corpus), checked, 0, 0, True, "",
                   f"{len(corpus)} kinds x {reps}; 10 MiB and 100k-deep messages included")
    finally:
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


TIME_SEEDS = [b"2026-11-30T12:00:01.250Z", b"2026-11-30 12:00:01.999999999+05:45", b"1970-01-01T00:00:00-00:00",
              b"2024-02-29T23:59:59.9999+23:59", b"0001-01-01T00:00:00Z", b"9999-12-31T23:59:59.999Z", b"1700000000",
              b"-1234567890123", b"2026-11-30T12:00Z", b"2026-11-30t12:00:00z",
              b"0000-12-31T23:00:09-22:52"]  # year 0000, an instant in year 1 (found by the fuzzer)


def _fuzz(target, seeds, seconds, max_len):
    corpus = tempfile.mkdtemp(prefix=f"setl-fuzz-{target}-")
    try:
        for i, m in enumerate(seeds):
            with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
                f.write(m)
        r = subprocess.run(["cargo", "fuzz", "run", "--sanitizer", "none", "--release", target, corpus,
                            "--", f"-max_total_time={seconds}", f"-max_len={max_len}", "-print_final_stats=1"],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        runs = [l for l in r.stderr.splitlines() if l.startswith("stat::number_of_executed_units")]
        return int(runs[-1].split(":")[-1]) if runs else 0
    finally:
        shutil.rmtree(corpus, ignore_errors=True)


def fuzz_decoder(scale):
    """cargo-fuzz (libFuzzer) on the decoder and on the time parsers for a fixed time: no panic;
    the decoder accepts only what serde_json accepts and finds the same fields; the time parsers
    agree with chrono's RFC 3339 reading and with exact integer arithmetic."""
    seconds = 20 if scale == "short" else 300
    n = _fuzz("decode", [m for m, _ in hostile_corpus() if len(m) < 4096], seconds, 4096)
    n += _fuzz("time", TIME_SEEDS, seconds // 2, 64)
    return row("coverage-guided fuzzing of the decoder and time parsers (cargo-fuzz)", 0, n, 0, 0, True, "",
               f"{seconds} s + {seconds // 2} s, no panic; serde_json and chrono as oracles")


# --- hostile state ---------------------------------------------------------------------------

def _expect_error(con, sql, *needles):
    try:
        con.execute(sql).fetchall()
    except duckdb.Error as e:
        for n in needles:
            assert n in str(e), (n, str(e))
        return str(e)
    raise AssertionError(f"expected an error from {sql}")


def hostile_state(scale):
    d = workdir("state")
    faults = 0
    try:
        topic = "file:test/data/skew/*.ndjson"
        db = os.path.join(d, "state.duckdb")
        ckpt = os.path.join(d, "jobs.ckpt")
        con = connect(db)
        con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := '{ckpt}', max_messages := 700)").fetchall()
        before = con.execute("SELECT count(*), sum(count) FROM windows").fetchone()

        # A truncated and a corrupted copy of the checkpoint.
        good = open(ckpt, "rb").read()
        for name, data in (("truncated", good[: len(good) // 2]), ("corrupt", good[:100] + os.urandom(len(good) - 100))):
            bad = os.path.join(d, f"{name}.ckpt")
            with open(bad, "wb") as f:
                f.write(data)
            _expect_error(con, f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := '{bad}')", bad)
            faults += 1
        # Another job's checkpoint (other topic under the same job name), other settings.
        _expect_error(con, f"SELECT * FROM streaming_etl_run('file:test/data/basic/*.ndjson', {WINDOW}, {LATENESS}, job := '{topic}', checkpoint := '{ckpt}')",
                      "was checkpointed with topic")
        _expect_error(con, f"SELECT * FROM streaming_etl_run('{topic}', 500, {LATENESS}, checkpoint := '{ckpt}')",
                      "was checkpointed with window_ms = 1000")
        faults += 2
        # A missing directory; a directory where the file should be.
        _expect_error(con, f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := '{d}/no/such/dir/x.ckpt')", "cannot create its lock file")
        _expect_error(con, f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := '{d}')", d)
        faults += 2
        # A read-only directory and a read-only database, as an unprivileged user (root ignores modes).
        ro = read_only_checks(d, topic)
        faults += ro
        # Two concurrent runs of one job (a second process).
        big = os.path.join(d, "big")
        generate_sql(duckdb.connect(), big, 2_000_000, partitions=2)
        first = subprocess.Popen([sys.executable, CHILD, os.path.join(d, "a.duckdb"), f"file:{big}/*.ndjson", "1000", "200",
                                  f"checkpoint='{ckpt}'", "--announce"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first.stdout.readline()
        time.sleep(0.3)
        _expect_error(con, f"SELECT * FROM streaming_etl_run('file:{big}/*.ndjson', {WINDOW}, {LATENESS}, checkpoint := '{ckpt}', windows_table := 'big_windows')", "is already running")
        first.communicate()
        assert first.returncode == 0
        faults += 1
        # Nothing was corrupted: the job resumes from its checkpoint with exact accounting.
        assert con.execute("SELECT count(*), sum(count) FROM windows").fetchone() == before
        con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := '{ckpt}', flush := true)").fetchall()
        ref = straight(d, topic)
        lost, doubled, exact = compare(con, ref, 2000)
        return row("truncated/corrupt/foreign checkpoint, missing or read-only dir, read-only db, concurrent run",
                   faults, 2000, lost, doubled, exact, ckpt, "each a clear error; the job then resumes exactly")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def read_only_checks(d, topic):
    """A checkpoint in a directory nobody can write (/proc: modes would not stop root) and a
    database opened read-only. Returns the number of checks."""
    con = connect()
    bad = "/proc/self/streaming_etl.ckpt"
    _expect_error(con, f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := '{bad}')", bad)
    src = os.path.join(d, "ro.duckdb")
    c = duckdb.connect(src)
    c.execute("CREATE TABLE t AS SELECT 1 AS x")
    c.close()
    ro = duckdb.connect(src, read_only=True, config={"allow_unsigned_extensions": "true"})
    ro.execute(f"LOAD '{EXT}'")
    msg = _expect_error(ro, f"SELECT * FROM streaming_etl_run('{topic}', {WINDOW}, {LATENESS}, checkpoint := ':memory:')")
    assert "read-only" in msg.lower() or "read only" in msg.lower(), msg
    assert ro.execute("SELECT x FROM t").fetchall() == [(1,)]
    ro.close()
    return 2


def forced_panic(scale):
    """A panic forced inside each callback and the commit thread surfaces as an SQL error; the
    database stays usable and the job resumes exactly."""
    d = workdir("panic")
    try:
        topic = "file:test/data/skew/*.ndjson"
        db = os.path.join(d, "p.duckdb")
        points = ["bind", "init", "cycle", "commit", "checkpoint-bind"]
        for point in points:
            script = f"""
import duckdb
con = duckdb.connect({db!r}, config={{'allow_unsigned_extensions': 'true'}})
con.execute("LOAD '{FAULT_EXT}'")
q = "SELECT * FROM streaming_etl_checkpoint()" if '{point}' == 'checkpoint-bind' else "SELECT * FROM streaming_etl_run('{topic}', 1000, 200, max_messages := 500)"
try:
    con.execute(q).fetchall()
    print('no error')
except duckdb.Error as e:
    assert 'panic' in str(e) and '{point}' in str(e), str(e)
assert con.execute('SELECT 42').fetchall() == [(42,)]
con.execute('CREATE TABLE IF NOT EXISTS after_panic AS SELECT 1 AS x')
print('ok')
"""
            r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                               env=dict(os.environ, STREAMING_ETL_PANIC_AT=point, RUST_BACKTRACE="0"))
            assert r.returncode == 0 and r.stdout.strip() == "ok", (point, r.stdout, r.stderr[-2000:])
        con = finish(db, topic)
        ref = straight(d, topic)
        lost, doubled, exact = compare(con, ref, 2000)
        return row("forced panic in bind, init, cycle, commit thread, checkpoint()", len(points), 2000,
                   lost, doubled, exact, db + ".streaming_etl.sqlite", "SQL error each time; database usable")
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- continuous jobs and production file layouts --------------------------------------------

def accounting(con, messages):
    """(lost, doubled, exact) by accounting alone: a continuous run's late/window split depends on
    when data arrived, so there is no straight run to compare with; every message must still be
    in exactly one window count, late_events row or dead_letters row."""
    w = con.execute('SELECT coalesce(sum("count"), 0) FROM windows').fetchone()[0]
    late = con.execute("SELECT count(*) FROM late_events").fetchone()[0]
    dead = con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    total = w + late + dead
    repeats = con.execute("SELECT count(*) - (SELECT count(*) FROM (SELECT DISTINCT key, window_start_ms FROM windows)) FROM windows").fetchone()[0]
    return max(0, messages - total), max(0, total - messages) + repeats, total == messages and repeats == 0


def event(i, rng):
    t = 1_000_000 + i * 10 - (rng.randrange(3000) if rng.random() < 0.05 else 0)
    return json.dumps({"key": f"k{i % 50}", "event_time_ms": t, "payload": {"value": i % 97}})


class Writer(threading.Thread):
    """A producer that keeps writing while jobs are killed: appends to files, starts new hourly
    files, rotates a log by renaming it (the writer finishes its batch on the renamed file, as a
    process that reopens its log on a signal does), or produces to a Kafka topic."""

    def __init__(self, messages, seconds, layout, d=None, broker=None, topic=None, seed=0):
        super().__init__(daemon=True)
        self.messages, self.seconds, self.layout = messages, seconds, layout
        self.d, self.broker, self.topic = d, broker, topic
        self.rng = random.Random(seed)
        self.renames = 0
        self.error = None

    def run(self):
        try:
            self._run()
        except Exception as e:  # reported by the scenario
            self.error = e

    def _run(self):
        batch = 100
        steps = self.messages // batch
        pause = self.seconds / steps
        producer = None
        if self.broker:
            from confluent_kafka import Producer
            producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5, "enable.idempotence": False})
        per_file = max(batch, self.messages // 8)
        for step in range(steps):
            lines = [event(step * batch + j, self.rng) for j in range(batch)]
            if producer:
                for j, line in enumerate(lines):
                    producer.produce(self.topic, value=line, partition=(step * batch + j) % 4)
                producer.poll(0)
            elif self.layout == "append":
                for q in range(4):
                    self._append(f"p{q}.ndjson", lines[q::4])
                if step == steps // 2:
                    self._append("p4-new.ndjson", [])
            elif self.layout == "hourly":
                self._append(f"events-{step * batch // per_file:02d}.ndjson", lines)
            elif self.layout == "rotate":
                app = os.path.join(self.d, "app.ndjson")
                with open(app, "a") as f:
                    if step and step * batch % per_file == 0:
                        self.renames += 1
                        os.rename(app, os.path.join(self.d, f"app.ndjson.{self.renames}"))
                    f.write("".join(line + "\n" for line in lines))
            time.sleep(pause)
        if producer:
            assert producer.flush(60) == 0

    def _append(self, name, lines):
        with open(os.path.join(self.d, name), "a") as f:
            f.write("".join(line + "\n" for line in lines))


def kill_while_writing(name, layout, topic, named, scale, broker=None):
    messages, seconds = (20_000, 6) if scale == "short" else (200_000, 40)
    d = workdir(name)
    data = os.path.join(d, "data")
    os.makedirs(data)
    if layout == "append":
        for q in range(4):
            open(os.path.join(data, f"p{q}.ndjson"), "w").close()
    if layout == "rotate":
        open(os.path.join(data, "app.ndjson"), "w").close()
    if layout == "hourly":
        open(os.path.join(data, "events-00.ndjson"), "w").close()
    topic = topic.replace("{data}", data)
    try:
        w = Writer(messages, seconds, layout, d=data, broker=broker, topic=topic, seed=len(name))
        db = os.path.join(d, "killed.duckdb")
        rng = random.Random(7)
        w.start()
        kills = 0
        while w.is_alive():
            killed, _ = kill_once([db, topic, WINDOW, LATENESS, *named, "checkpoint_interval_ms=50"], rng, (0.05, 0.8))
            kills += killed
        w.join()
        assert w.error is None, w.error
        bounded = [n.replace("=", " := ", 1) for n in named if not n.startswith("follow")]
        con = finish(db, topic, *bounded)
        lost, doubled, exact = accounting(con, messages)
        note = f"{kills} kills while writing for {seconds}s" + (f", {w.renames} renames" if w.renames else "")
        return row(name, kills, messages, lost, doubled, exact, db + ".streaming_etl.sqlite", note)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def kill_follow_files(scale):
    return kill_while_writing("SIGKILL of follow runs while lines and a new file are written (files)", "append",
                              "file:{data}/*.ndjson", ["follow=true"], scale)


def kill_follow_kafka(scale):
    broker = MockBroker()
    try:
        broker.create_topic("live", 4)
        return kill_while_writing("SIGKILL of follow runs while a producer writes (Kafka)", "kafka", "live",
                                  ["follow=true", f"brokers='{broker.bootstrap}'"], scale, broker=broker)
    finally:
        broker.stop()


def kill_rotation(scale):
    return kill_while_writing("SIGKILL during log rotation by rename (follow)", "rotate",
                              "file:{data}/app.ndjson*", ["follow=true"], scale)


def kill_hourly(scale):
    return kill_while_writing("SIGKILL while new hourly files appear (rolling rule)", "hourly",
                              "file:{data}/events-*.ndjson", ["files='rolling'", "follow=true"], scale)


SCENARIOS = [kill_files, kill_threads, kill_kafka, kill_points, kill_follow_files, kill_follow_kafka, kill_rotation, kill_hourly,
             broker_faults, hostile_input, fuzz_decoder, hostile_state, forced_panic]
