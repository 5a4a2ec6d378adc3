#!/usr/bin/env python3
"""Nexmark part of `make bench`: five Nexmark-style queries as streaming_etl_run jobs, each checked
against DuckDB's own batch SQL over the same events and timed against it.

Events: bids from the Nexmark generator (`cargo install nexmark --version 0.2.0 --features bin`,
`nexmark -t bid --format json --no-wait`: event time starts at the wall clock and advances
~0.11 ms per bid, in order), written as 4 NDJSON files (round-robin by default: every file spans
the whole time range; `split="quarters"`: each file holds one contiguous quarter). The Kafka path
uses the first `kafka_events` bids (the first quarter of each file), produced with zstd to the
project's mock broker (which keeps 5 MiB per partition: ~300K bids fit).

Queries (lateness 0: no late events are expected, and none may appear):
  q5  hot items: bids per auction, hopping windows of 10 s every 2 s
  q7  highest bid: max price per 10 s tumbling window over all bids (group_by := [])
  q11 user sessions: bids per bidder, sessions with a 10 s gap
  q16 channel statistics: per channel per day: bids, distinct bidders, distinct auctions
  q17 auction statistics: per auction per day: count, min, max, avg, sum of price

Measured per query, every run in a fresh process (Python + DuckDB + the extension), best of
`REPEAT` runs for both sides:
  events_per_sec           events / wall time of the streaming_etl_run statement (files)
  events_per_sec_per_core  events / CPU time of the process during it (user + system, all threads)
  duckdb_batch_events_per_sec  events / wall time of `CREATE TABLE AS <batch SQL over read_ndjson>`
  equal_to_batch           every window row equal to the batch answer, on files and on Kafka:
                           counts, min, max, sum and window bounds exactly, avg to 1e-9 relative;
                           approx_count_distinct equal to count(DISTINCT) up to 1024 distinct
                           values (exact there by design), within 2% beyond (HyperLogLog)
  kafka_events_per_sec     the same job reading the topic from the mock broker
  p99_latency_ms           optional (latency_seconds > 0): a follow := true job reads a topic that a
                           producer fills with bids paced at event time = wall clock (the generator
                           without --no-wait); another cursor polls the windows table every 20 ms;
                           latency of a window row = wall time it was first seen in DuckDB minus
                           (window_end_ms + lateness_ms). Day windows (q16, q17) cannot close
                           within the run: None.

usage: bench_nexmark.py [events [kafka_events [latency_seconds]]] [--split quarters]
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no scripts/__pycache__ from importing benchlib
import benchlib  # noqa: E402  (also puts test/python on sys.path)

ROOT, EXT = benchlib.ROOT, benchlib.EXT
OUT = os.path.join(benchlib.OUT, "nexmark")
NEXMARK = os.environ.get("NEXMARK") or shutil.which("nexmark") or os.path.expanduser("~/.cargo/bin/nexmark")
PARTITIONS, LATENESS, REPEAT, DAY = 4, 0, 3, 86_400_000
HLL_EXACT_UP_TO, HLL_TOLERANCE = 1024, 0.02


def _list(*items):
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _day(t="Bid.date_time"):
    return f"({t} // {DAY}) * {DAY} AS window_start_ms, ({t} // {DAY}) * {DAY} + {DAY} AS window_end_ms"


# Each query: the streaming job (window_ms, named parameters), its batch SQL over {src} (timed),
# optionally an exact reference SQL (untimed; default: the batch SQL), the key columns and how each
# value column is compared ('exact', 'rel' or 'distinct').
QUERIES = [
    {"name": "q5", "title": "q5 hot items (hopping 10 s / 2 s, per auction)", "window": 10_000,
     "named": {"window_kind": "'hopping'", "hop_ms": "2000", "group_by": _list("Bid.auction AS auction"),
               "aggregates": _list("count(*) AS bids")},
     "batch": """SELECT (Bid.date_time // 2000) * 2000 - k AS window_start_ms, (Bid.date_time // 2000) * 2000 - k + 10000 AS window_end_ms,
                        Bid.auction AS auction, count(*) AS bids
                 FROM {src}, range(0, 10000, 2000) hop(k) GROUP BY ALL""",
     "keys": ["auction"], "values": {"window_end_ms": "exact", "bids": "exact"}},
    {"name": "q7", "title": "q7 highest bid (tumbling 10 s, all bids)", "window": 10_000,
     "named": {"group_by": "[]", "aggregates": _list("max(Bid.price) AS max_price", "count(*) AS bids")},
     "batch": """SELECT (Bid.date_time // 10000) * 10000 AS window_start_ms, (Bid.date_time // 10000) * 10000 + 10000 AS window_end_ms,
                        max(Bid.price) AS max_price, count(*) AS bids FROM {src} GROUP BY ALL""",
     "keys": [], "values": {"window_end_ms": "exact", "max_price": "exact", "bids": "exact"}},
    {"name": "q11", "title": "q11 user sessions (10 s gap, per bidder)", "window": 10_000,
     "named": {"window_kind": "'session'", "group_by": _list("Bid.bidder AS bidder"), "aggregates": _list("count(*) AS bids")},
     # gaps and islands: a bid more than the gap after the bidder's previous one starts a session
     "batch": """WITH b AS (SELECT Bid.bidder AS bidder, Bid.date_time AS t FROM {src}),
                 g AS (SELECT bidder, t, CASE WHEN t - lag(t) OVER (PARTITION BY bidder ORDER BY t) <= 10000 THEN 0 ELSE 1 END AS new FROM b),
                 s AS (SELECT bidder, t, sum(new) OVER (PARTITION BY bidder ORDER BY t ROWS UNBOUNDED PRECEDING) AS session FROM g)
                 SELECT min(t) AS window_start_ms, max(t) + 10000 AS window_end_ms, bidder, count(*) AS bids
                 FROM s GROUP BY bidder, session""",
     "keys": ["bidder"], "values": {"window_end_ms": "exact", "bids": "exact"}},
    {"name": "q16", "title": "q16 channel statistics (per channel per day)", "window": DAY,
     "named": {"group_by": _list("Bid.channel AS channel"),
               "aggregates": _list("count(*) AS bids", "approx_count_distinct(Bid.bidder) AS bidders",
                                   "approx_count_distinct(Bid.auction) AS auctions")},
     "batch": f"""SELECT {_day()}, Bid.channel AS channel, count(*) AS bids, approx_count_distinct(Bid.bidder) AS bidders,
                         approx_count_distinct(Bid.auction) AS auctions FROM {{src}} GROUP BY ALL""",
     "exact": f"""SELECT {_day()}, Bid.channel AS channel, count(*) AS bids, count(DISTINCT Bid.bidder) AS bidders,
                         count(DISTINCT Bid.auction) AS auctions FROM {{src}} GROUP BY ALL""",
     "keys": ["channel"], "values": {"window_end_ms": "exact", "bids": "exact", "bidders": "distinct", "auctions": "distinct"}},
    {"name": "q17", "title": "q17 auction statistics (per auction per day)", "window": DAY,
     "named": {"group_by": _list("Bid.auction AS auction"),
               "aggregates": _list("count(*) AS bids", "min(Bid.price) AS min_price", "max(Bid.price) AS max_price",
                                   "avg(Bid.price) AS avg_price", "sum(Bid.price) AS sum_price")},
     "batch": f"""SELECT {_day()}, Bid.auction AS auction, count(*) AS bids, min(Bid.price) AS min_price, max(Bid.price) AS max_price,
                         avg(Bid.price) AS avg_price, sum(Bid.price) AS sum_price FROM {{src}} GROUP BY ALL""",
     "keys": ["auction"], "values": {"window_end_ms": "exact", "bids": "exact", "min_price": "exact", "max_price": "exact",
                                     "avg_price": "rel", "sum_price": "exact"}},
]


# ---------------------------------------------------------------- children (fresh processes)

def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child_stream(spec):
    """One streaming_etl_run job in this fresh process; prints wall and CPU time, totals, peak RSS."""
    import duckdb

    con = duckdb.connect(spec["db"], config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    args = "".join(f", {k} := {v}" for k, v in spec["named"].items())
    c0, t0 = _cpu_s(), time.perf_counter()
    rows = con.execute(f"SELECT * FROM streaming_etl_run('{spec['topic']}', {spec['window']}, {LATENESS}{args})").fetchall()
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    cols = [d[0] for d in con.description]
    con.close()
    time.sleep(0.1)  # let the extension release the database so its file is complete
    print(json.dumps({"stats": dict(zip(cols, rows[-1])), "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": benchlib.peak_rss_mb()}, default=str))


def child_batch(spec):
    """DuckDB's batch query over the same files into a table (timed); then the exact reference."""
    import duckdb

    con = duckdb.connect(spec["db"])
    c0, t0 = _cpu_s(), time.perf_counter()
    con.execute(f"CREATE TABLE answer AS {spec['sql']}")
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    if spec.get("exact"):
        con.execute(f"CREATE TABLE exact AS {spec['exact']}")
    con.close()
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": benchlib.peak_rss_mb()}))


def child_latency(spec):
    """A follow := true job on a Kafka topic that a producer thread fills with bids paced at event
    time = wall clock; the main thread polls the windows table and records when each row appears."""
    import duckdb
    from confluent_kafka import Producer

    q = next(q for q in QUERIES if q["name"] == spec["query"])
    seconds = spec["seconds"]
    con = duckdb.connect(spec["db"], config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    named = {**q["named"], "time_field": "'Bid.date_time'", "brokers": f"'{spec['bootstrap']}'", "follow": "true", "max_runtime_ms": str((seconds + 3) * 1000)}
    args = "".join(f", {k} := {v}" for k, v in named.items())
    result, produced = {}, [0]

    def run():
        try:
            result["rows"] = con.cursor().execute(
                f"SELECT * FROM streaming_etl_run('{spec['topic']}', {q['window']}, {LATENESS}{args})").fetchall()
        except Exception as e:  # reported below
            result["error"] = str(e)

    def produce():
        p = Producer({"bootstrap.servers": spec["bootstrap"], "linger.ms": 5, "compression.type": "zstd",
                      "enable.idempotence": False})
        gen = subprocess.Popen([NEXMARK, "-t", "bid", "--format", "json", "-n", str(int(seconds * 9200))],
                               stdout=subprocess.PIPE)
        for i, line in enumerate(gen.stdout):
            p.produce(spec["topic"], value=line.rstrip(b"\n"), partition=i % PARTITIONS)
            p.poll(0)
            produced[0] += 1
        gen.wait()
        p.flush(30)

    job = threading.Thread(target=run)
    job.start()
    time.sleep(0.5)  # the job is waiting on the (empty) topic before the first bid is produced
    producer = threading.Thread(target=produce)
    producer.start()
    poll, seen, newest = con.cursor(), {}, 0
    cols = ", ".join(["window_start_ms", "window_end_ms"] + q["keys"])
    while job.is_alive():
        try:  # a later commit only holds windows ending after the watermark of an earlier one
            rows = poll.execute(f"SELECT {cols} FROM windows WHERE window_end_ms >= {newest}").fetchall()
        except duckdb.Error:  # the table is created by the job's first write
            rows = []
        now = time.time() * 1000
        for r in rows:
            seen.setdefault(r, now - (r[1] + LATENESS))
            newest = max(newest, r[1])
        time.sleep(0.02)
    producer.join()
    lat = sorted(seen.values())
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
    print(json.dumps({"windows": len(lat), "produced": produced[0], "error": result.get("error"),
                      "p50_ms": round(lat[len(lat) // 2]) if lat else None, "p99_ms": round(p99) if lat else None,
                      "max_ms": round(lat[-1]) if lat else None}))


def spawn(kind, spec):
    """Runs this script as a fresh child process; returns its JSON output."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__), f"--child-{kind}", json.dumps(spec)],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"child {kind} failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- data, comparison

def bids(events, split, kind="bid"):
    """events Nexmark bids (`kind`: or another of the generator's types, `all` of them) as 4 NDJSON
    files (cached): round-robin or contiguous quarters."""
    name = "bids" if kind == "bid" else kind
    d = os.path.join(OUT, f"{name}-{events}-{split}")
    if os.path.exists(os.path.join(d, "done")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    gen = subprocess.Popen([NEXMARK, "-t", kind, "--format", "json", "--no-wait", "-n", str(events)], stdout=subprocess.PIPE)
    files = [open(os.path.join(d, f"{name}-{p}.ndjson"), "wb") for p in range(PARTITIONS)]
    per = -(-events // PARTITIONS)
    for i, line in enumerate(gen.stdout):
        files[i % PARTITIONS if split == "roundrobin" else i // per].write(line)
    for f in files:
        f.close()
    if gen.wait() != 0:
        raise RuntimeError("nexmark generator failed")
    open(os.path.join(d, "done"), "w").close()
    return d


def prefix(d, events):
    """The first events / 4 lines of each file of d, as files of their own (the Kafka part)."""
    k = os.path.join(OUT, f"{os.path.basename(d)}-first-{events}")
    if not os.path.exists(os.path.join(k, "done")):
        shutil.rmtree(k, ignore_errors=True)
        os.makedirs(k)
        for p in range(PARTITIONS):
            with open(os.path.join(d, f"bids-{p}.ndjson"), "rb") as src, open(os.path.join(k, f"bids-{p}.ndjson"), "wb") as dst:
                for _, line in zip(range(events // PARTITIONS), src):
                    dst.write(line)
        open(os.path.join(k, "done"), "w").close()
    return k


def fresh_db(name):
    db = os.path.join(OUT, f"{name}.duckdb")
    for suffix in ("", ".wal", ".streaming_etl.sqlite", ".streaming_etl.sqlite-wal", ".streaming_etl.sqlite-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    return db


def compare(q, stream_db, batch_db):
    """Full outer join of the stream's windows with the batch reference on (keys, window_start_ms);
    returns (number of differing rows, a few of them, the HLL's largest relative error)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"ATTACH '{stream_db}' AS s (READ_ONLY)")
    con.execute(f"ATTACH '{batch_db}' AS b (READ_ONLY)")
    ref = "exact" if q.get("exact") else "answer"
    on = " AND ".join([f"s.{k} = b.{k}::VARCHAR" for k in q["keys"]] + ["s.window_start_ms = b.window_start_ms"])
    ok = []
    for c, how in q["values"].items():
        if how == "exact":
            ok.append(f"s.{c}::DOUBLE IS NOT DISTINCT FROM b.{c}::DOUBLE")
        elif how == "rel":
            ok.append(f"coalesce(abs(s.{c} - b.{c}) <= 1e-9 * abs(b.{c}), false)")
        else:
            ok.append(f"coalesce(CASE WHEN b.{c} <= {HLL_EXACT_UP_TO} THEN s.{c} = b.{c} "
                      f"ELSE abs(s.{c} - b.{c}) <= {HLL_TOLERANCE} * b.{c} END, false)")
    cols = ", ".join(f"s.{c} AS stream_{c}, b.{c} AS batch_{c}" for c in ["window_start_ms", *q["keys"], *q["values"]])
    joined = f"FROM s.windows s FULL OUTER JOIN b.{ref} b ON {on}"
    bad = f"{joined} WHERE s.window_start_ms IS NULL OR b.window_start_ms IS NULL OR NOT ({' AND '.join(ok)})"
    n = con.execute(f"SELECT count(*) {bad}").fetchone()[0]
    cur = con.execute(f"SELECT {cols} {bad} ORDER BY coalesce(s.window_start_ms, b.window_start_ms) LIMIT 5")
    names = [d[0] for d in cur.description]
    samples = [dict(zip(names, r)) for r in cur.fetchall()]
    hll = [f"max(abs(s.{c} - b.{c}) / b.{c}) FILTER (WHERE b.{c} > {HLL_EXACT_UP_TO})"
           for c, how in q["values"].items() if how == "distinct"]
    err = con.execute(f"SELECT greatest({', '.join(hll)}) {joined}").fetchone()[0] if hll else None
    rows = con.execute(f"SELECT (SELECT count(*) FROM s.windows), (SELECT count(*) FROM b.{ref})").fetchone()
    con.close()
    return n, samples, err, rows


def best(kind, spec, name):
    runs = []
    for _ in range(REPEAT):
        runs.append(spawn(kind, {**spec, "db": fresh_db(name)}))
    return min(runs, key=lambda r: r["wall_s"])


# ---------------------------------------------------------------- the benchmark

def nexmark_jobs(events: int, kafka_events: int, latency_seconds: int, split: str = "roundrobin") -> list[dict]:
    from brokers import MockBroker, produce

    os.makedirs(OUT, exist_ok=True)
    d = bids(events, split)
    src = f"read_ndjson('{d}/*.ndjson')"
    k = prefix(d, kafka_events) if kafka_events else None
    broker = MockBroker() if kafka_events or latency_seconds else None
    results = []
    try:
        if kafka_events:
            broker.create_topic("bids", PARTITIONS)
            produce(broker.bootstrap, "bids", [open(os.path.join(k, f"bids-{p}.ndjson"), "rb").read().splitlines()
                                                for p in range(PARTITIONS)], compression="zstd")
        for q in QUERIES:
            load = os.getloadavg()[0]  # the machine may be shared: figures under load are lower
            named = {**q["named"], "time_field": "'Bid.date_time'", "flush": "true"}
            run = best("stream", {"topic": f"file:{d}/*.ndjson", "window": q["window"], "named": named}, f"{q['name']}-stream")
            stream_db = os.path.join(OUT, f"{q['name']}-stream.duckdb")
            batch = best("batch", {"sql": q["batch"].format(src=src), "exact": q.get("exact", "").format(src=src)},
                         f"{q['name']}-batch")
            n, samples, hll_err, (stream_rows, batch_rows) = compare(q, stream_db, os.path.join(OUT, f"{q['name']}-batch.duckdb"))
            s = run["stats"]
            rate = s["events_consumed"] / run["wall_s"]
            brate = events / batch["wall_s"]
            r = {"scenario": q["title"], "events": s["events_consumed"], "events_per_sec": round(rate),
                 "events_per_sec_per_core": round(s["events_consumed"] / run["cpu_s"]), "cores_used": round(run["cpu_s"] / run["wall_s"], 2),
                 "duckdb_batch_events_per_sec": round(brate), "duckdb_batch_cores_used": round(batch["cpu_s"] / batch["wall_s"], 2),
                 "ratio_to_duckdb_batch": round(rate / brate, 3), "window_rows": stream_rows, "batch_rows": batch_rows,
                 "mismatches": n, "mismatch_samples": samples, "hll_max_rel_error": hll_err,
                 "late_events": s["late_events"], "dead_letters": s["dead_letters"], "peak_rss_mb": round(run["peak_rss_mb"], 1),
                 "load_avg_1m_before": round(load, 2)}
            ok = n == 0 and s["late_events"] == 0 and s["dead_letters"] == 0 and s["events_consumed"] == events
            if kafka_events:
                kname = f"{q['name']}-kafka"
                krun = best("stream", {"topic": "bids", "window": q["window"],
                                       "named": {**named, "brokers": f"'{broker.bootstrap}'", "job": f"'{kname}'"}}, kname)
                spawn("batch", {"db": fresh_db(f"{kname}-batch"), "sql": q["batch"].format(src=f"read_ndjson('{k}/*.ndjson')"),
                                "exact": q.get("exact", "").format(src=f"read_ndjson('{k}/*.ndjson')")})
                kn, ksamples, _, _ = compare(q, os.path.join(OUT, f"{kname}.duckdb"), os.path.join(OUT, f"{kname}-batch.duckdb"))
                ks = krun["stats"]
                r.update({"kafka_events": ks["events_consumed"], "kafka_events_per_sec": round(ks["events_consumed"] / krun["wall_s"]),
                          "kafka_mismatches": kn, "kafka_mismatch_samples": ksamples, "kafka_late_events": ks["late_events"],
                          "kafka_dead_letters": ks["dead_letters"]})
                ok = ok and kn == 0 and ks["late_events"] == 0 and ks["dead_letters"] == 0 and ks["events_consumed"] == kafka_events
            else:
                r.update({"kafka_events": 0, "kafka_events_per_sec": None})
            r["p99_latency_ms"] = None
            if latency_seconds and q["window"] < DAY:
                topic = f"latency-{q['name']}"
                broker.create_topic(topic, PARTITIONS)
                lat = spawn("latency", {"db": fresh_db(f"{q['name']}-latency"), "query": q["name"], "topic": topic,
                                        "bootstrap": broker.bootstrap, "seconds": latency_seconds})
                r.update({"p99_latency_ms": lat["p99_ms"], "p50_latency_ms": lat["p50_ms"], "latency_windows": lat["windows"],
                          "latency_error": lat["error"]})
            r["equal_to_batch"] = ok
            print(json.dumps(r, default=str), flush=True)
            results.append(r)
    finally:
        if broker:
            broker.stop()
    return results


def markdown(rows) -> str:
    """The Nexmark table, printed (docs/benchmarks.md shows a selection of its columns)."""
    fmt = lambda v: "" if v is None else f"{v:,}"
    lines = ["| query | events | events/s | events/s per core (cores) | DuckDB batch events/s | ours / batch | "
             "equal to batch | late | Kafka events/s | p99 window latency ms | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eq = "yes" if r["equal_to_batch"] else f"**no** ({r['mismatches']} + {r.get('kafka_mismatches', 0)} rows)"
        lines.append(f"| {r['scenario']} | {r['events']:,} | {r['events_per_sec']:,} | {r['events_per_sec_per_core']:,} ({r['cores_used']}) | "
                     f"{r['duckdb_batch_events_per_sec']:,} | {r['ratio_to_duckdb_batch']} | {eq} | {r['late_events']} | "
                     f"{fmt(r['kafka_events_per_sec'])} | {fmt(r['p99_latency_ms'])} | {r['peak_rss_mb']} |")
    return "\n".join(lines)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    split = sys.argv[sys.argv.index("--split") + 1] if "--split" in sys.argv else "roundrobin"
    args = [a for a in args if a != split]
    events = int(args[0]) if args else 1_000_000
    kafka_events = int(args[1]) if len(args) > 1 else min(events, 250_000)
    latency_seconds = int(args[2]) if len(args) > 2 else 20
    t0 = time.perf_counter()
    rows = nexmark_jobs(events, kafka_events, latency_seconds, split)
    with open(os.path.join(benchlib.OUT, f"nexmark-{split}.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    print()
    print(markdown(rows))
    print(f"\n({split} split, {kafka_events:,} bids on Kafka, {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1].startswith("--child-"):
        {"--child-stream": child_stream, "--child-batch": child_batch, "--child-latency": child_latency}[sys.argv[1]](json.loads(sys.argv[2]))
    else:
        main()
