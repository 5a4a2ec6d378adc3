#!/usr/bin/env python3
"""`make bench`: speed and memory of streaming_etl, side by side with DuckDB's own batch
GROUP BY over the same files and a consume-only loop over the same Kafka topic.

Prints one JSON object per scenario (the predecessor's fields plus false_late_events,
peak_rss_mb and elapsed_s), then a summary table; writes bench-out/results.json (with --only NAME:
bench-out/results-NAME.json).
Every measured run is a fresh process (Python + DuckDB + the extension), so peak_rss_mb is the
whole process's peak resident memory.

Also: many keys and memory in both write modes, Nexmark (scripts/bench_nexmark.py), the
latency and CPU of continuous jobs (scripts/bench_latency.py) and output into a DuckLake
(scripts/bench_lake.py, run by DuckDB 1.4.4's Python: .venv/lts/bin/python).

A full run (no --quick, no --only) writes its tables into docs/benchmarks.md, section
'latest run' (scripts/docs_section.py); the discussion above that section is written by hand.

usage: bench.py [--quick] [--only NAME]
NAME: a scenario (predecessor-files, ..., skewed-kafka) or a section: window-jobs, time-formats,
many-keys, memory, nexmark, latency, lake.
"""
import contextlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

# The measuring helpers the other benchmarks share (it also puts test/python on sys.path).
from benchlib import OUT, ROOT, WINDOW, child_batch, child_run, fresh_db, generate, orders_data, spawn_measured

MOCK = os.path.join(ROOT, "target", "release", "mock-kafka")
LTS_PY = os.environ.get("BENCH_LTS_PYTHON") or os.path.join(ROOT, ".venv", "lts", "bin", "python")
BASE_MS = 1_700_000_000_000


def record(name, source, events, injected, run, rss, extra):
    s = run["stats"]
    wm = s["watermark_ms"]
    result = {
        "scenario": name,
        "source": source,
        "events_produced": events,
        "late_events_injected": injected,
        "events_consumed": s["events_consumed"],
        "windows_emitted": s["windows_emitted"],
        "late_events_observed": s["late_events"],
        "late_recovery_rate": round(s["late_events"] / injected, 4) if injected else None,
        "throughput_events_per_sec": round(s["events_consumed"] / run["wall_s"]),
        "final_watermark_lag_ms": (run["max_event_ms"] - wm) if wm is not None and run["max_event_ms"] else None,
        "db_size_kb": run["db_size_kb"],
        "false_late_events": run["false_late"],
        "peak_rss_mb": round(rss, 1),
        "rss_before_run_mb": round(run["rss_before_run_mb"], 1),
        "elapsed_s": round(run["wall_s"], 3),
    }
    result.update(extra)
    print(json.dumps(result), flush=True)
    return result


def injected_late(d):
    n = 0
    for f in sorted(os.listdir(d)):
        if f.endswith(".ndjson"):
            with open(os.path.join(d, f), "rb") as fh:
                n += fh.read().count(b'"late":1')
    return n


def engine_only(pattern):
    """The event-time core alone (no DuckDB, no SQLite): its speed and its own peak memory."""
    exe = os.path.join(ROOT, "target", "release", "examples", "engine_bench")
    r = subprocess.run(["/usr/bin/time", "-f", "%M", exe, pattern], capture_output=True, text=True)
    if r.returncode != 0:
        return {}
    rate = float(r.stdout.split(" = ")[1].split()[0])
    return {"engine_only_events_per_sec": round(rate), "engine_only_peak_rss_mb": round(int(r.stderr.strip().splitlines()[-1]) / 1024, 1)}


def files_scenario(name, events, **gen):
    d = generate(name, events, **gen)
    pattern = f"{d}/*.ndjson"
    db = os.path.join(OUT, f"{name}.duckdb")
    for p in (db, db + ".wal", db + ".streaming_etl.sqlite"):
        if os.path.exists(p):
            os.remove(p)
    run, rss = spawn_measured(["--child-run", db, f"file:{pattern}", "{}"])
    extra = {}
    if not gen.get("skew_ms"):
        batches = {}
        for explicit in (False, True):
            bdb = os.path.join(OUT, f"{name}-batch.duckdb")
            if os.path.exists(bdb):
                os.remove(bdb)
            b, brss = spawn_measured(["--child-batch", bdb, pattern, "1" if explicit else "0"])
            batches[explicit] = (b, brss)
        auto, _ = batches[False]
        typed, _ = batches[True]
        ours = run["stats"]["events_consumed"] / run["wall_s"]
        extra = {
            "duckdb_batch_events_per_sec": round(auto["events"] / auto["elapsed_s"]),
            "duckdb_batch_typed_events_per_sec": round(typed["events"] / typed["elapsed_s"]),
            "ratio_ours_to_duckdb_batch": round(ours / (auto["events"] / auto["elapsed_s"]), 3),
            "ratio_ours_to_duckdb_batch_typed": round(ours / (typed["events"] / typed["elapsed_s"]), 3),
            "duckdb_batch_peak_rss_mb": round(batches[False][1], 1),
        }
        extra.update(engine_only(pattern))
    return record(name, "files", events, injected_late(d), run, rss, extra)


def kafka_scenario(name, events, partitions=4, **gen):
    from brokers import MockBroker, produce

    d = generate(name, events, partitions=partitions, **gen)
    paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".ndjson"))
    broker = MockBroker()
    try:
        broker.create_topic("bench", partitions)
        # The mock broker keeps 5 MiB per partition: zstd keeps 1M small messages within it.
        produce(broker.bootstrap, "bench", [open(p, "rb").read().splitlines() for p in paths], compression="zstd")
        raw = subprocess.run([MOCK, "consume", broker.bootstrap, "bench"], capture_output=True, text=True, timeout=600)
        if raw.returncode != 0:
            raise RuntimeError(raw.stderr)
        raw = json.loads(raw.stdout)
        db = os.path.join(OUT, f"{name}.duckdb")
        for p in (db, db + ".wal", db + ".streaming_etl.sqlite"):
            if os.path.exists(p):
                os.remove(p)
        run, rss = spawn_measured(["--child-run", db, "bench", json.dumps({"brokers": f"'{broker.bootstrap}'"})])
    finally:
        broker.stop()
    raw_rate = raw["messages"] / raw["elapsed_s"]
    ours = run["stats"]["events_consumed"] / run["wall_s"]
    extra = {"raw_consume_events_per_sec": round(raw_rate), "ratio_ours_to_raw_consume": round(ours / raw_rate, 3)}
    return record(name, "kafka (mock cluster)", events, injected_late(d), run, rss, extra)


def window_jobs(events):
    """Hopping, session and many-aggregate jobs against the tumbling default on the same order
    events (issue 9's goals: hopping and sessions at >= 0.8x the tumbling throughput)."""
    d = orders_data(events)
    aggs = ["count(*) AS orders", "count(coupon)", "sum(amount) AS revenue", "avg(amount)", "min(amount)",
            "max(amount)", "approx_count_distinct(customer.id) AS customers", "first(status)", "last(status)"]
    sql_list = lambda items: "[" + ", ".join("'" + i + "'" for i in items) + "]"
    jobs = [
        ("tumbling 60 s (default key and aggregates)", 60_000, {}),
        ("hopping 60 s every 1 s (60 windows per event)", 60_000, {"hop_ms": 1000}),
        ("sessions, 10 s gap, per customer", 10_000, {"window_kind": "'session'", "group_by": "['customer.id AS customer']",
                                                      "aggregates": "['count(*) AS orders', 'sum(amount) AS revenue']"}),
        ("nine aggregates by (region, sku), 60 s", 60_000, {"group_by": "['region', 'item.sku AS sku']", "aggregates": sql_list(aggs)}),
    ]
    results, base = [], None
    for name, window, named in jobs:
        best = None
        for _ in range(2):
            db = os.path.join(OUT, "jobs.duckdb")
            for p in (db, db + ".wal", db + ".streaming_etl.sqlite"):
                if os.path.exists(p):
                    os.remove(p)
            run, rss = spawn_measured(["--child-run", db, f"file:{d}/*.ndjson", json.dumps({**named, "flush": "true"}),
                                       str(window), "200"])
            if best is None or run["wall_s"] < best[0]["wall_s"]:
                best = (run, rss)
        run, rss = best
        rate = run["stats"]["events_consumed"] / run["wall_s"]
        base = base or rate
        r = {"scenario": name, "events": run["stats"]["events_consumed"], "events_per_sec": round(rate),
             "ratio_to_tumbling": round(rate / base, 3), "window_rows": run["window_rows"], "peak_rss_mb": round(rss, 1)}
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def time_format_jobs(events):
    """The same events with integer epoch-ms times and with ISO 8601 text times (issue 13's goal:
    ISO at >= 0.8x the integer throughput)."""
    import duckdb
    from datagen import generate_sql

    results = []
    base = None
    for iso in (False, True):
        d = os.path.join(OUT, "data", f"times-{'iso' if iso else 'int'}-{events}")
        if not os.path.exists(os.path.join(d, "done")):
            shutil.rmtree(d, ignore_errors=True)
            generate_sql(duckdb.connect(), d, events, partitions=4, keys=50, late_pct=5, iso_times=iso)
            open(os.path.join(d, "done"), "w").close()
        named = {"time_format": "'iso8601'"} if iso else {}
        best = None
        for _ in range(2):
            db = os.path.join(OUT, "times.duckdb")
            for p in (db, db + ".wal", db + ".streaming_etl.sqlite"):
                if os.path.exists(p):
                    os.remove(p)
            run, rss = spawn_measured(["--child-run", db, f"file:{d}/*.ndjson", json.dumps(named)])
            if best is None or run["wall_s"] < best["wall_s"]:
                best = run
        rate = best["stats"]["events_consumed"] / best["wall_s"]
        base = base or rate
        r = {"scenario": "ISO 8601 text times" if iso else "integer epoch-ms times", "events": best["stats"]["events_consumed"],
             "events_per_sec": round(rate), "ratio_to_integer": round(rate / base, 3),
             "late_events": best["stats"]["late_events"], "dead_letters": best["stats"]["dead_letters"]}
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def batch_rate(pattern, window, env=None):
    b, brss = spawn_measured(["--child-batch", fresh_db("wm-batch"), pattern, "0", str(window)], env)
    return b["events"] / b["elapsed_s"], brss


def many_keys_jobs(events):
    """500K keys, 60 s windows (nearly one window row per event: the run is output-bound), in
    both write modes, against DuckDB's batch GROUP BY over the same files."""
    d = generate("many-keys", events, keys=500_000, window_ms=60_000)
    pattern = f"{d}/*.ndjson"
    batch, batch_rss = batch_rate(pattern, 60_000)
    results = []
    for mode in ("upsert", "append"):
        run, rss = spawn_measured(["--child-run", fresh_db("many-keys"), f"file:{pattern}",
                                   json.dumps({"write_mode": f"'{mode}'", "flush": "true"}), "60000", "200"])
        rate = run["stats"]["events_consumed"] / run["wall_s"]
        r = {"scenario": f"500K keys, 60 s windows, write_mode '{mode}'", "events": run["stats"]["events_consumed"],
             "events_per_sec": round(rate), "duckdb_batch_events_per_sec": round(batch),
             "ratio_to_duckdb_batch": round(rate / batch, 3), "window_rows": run["window_rows"],
             "peak_rss_mb": round(rss, 1), "duckdb_batch_peak_rss_mb": round(batch_rss, 1)}
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def memory_jobs(sizes, limit="256MB"):
    """Peak RSS of runs (read as the statement ends) over 1M, 10M and 30M events (50 keys, 1 s windows) with DuckDB's
    memory_limit fixed, in both write modes, beside DuckDB's own batch query; `append` also as a
    later run of a job, whose tables exist (the run that creates them keeps what it writes out of
    DuckDB's checkpoints until it ends: docs/semantics.md, "DuckDB's checkpoints during a run")."""
    env = {"BENCH_MEMORY_LIMIT": limit}
    results = []
    for events in sizes:
        d = generate("memory", events)
        pattern = f"{d}/*.ndjson"
        batch, batch_rss = batch_rate(pattern, WINDOW, env)
        r = {"events": events, "memory_limit": limit, "duckdb_batch_peak_rss_mb": round(batch_rss, 1),
             "duckdb_batch_events_per_sec": round(batch)}
        for mode, tables_exist in (("upsert", False), ("append", False), ("append", True)):
            name = f"{mode}_tables_exist" if tables_exist else mode
            run, rss = spawn_measured(["--child-run", fresh_db("memory"), f"file:{pattern}",
                                       json.dumps({"write_mode": f"'{mode}'", "flush": "true"})],
                                      dict(env, **({"BENCH_TABLES_EXIST": "1"} if tables_exist else {})))
            r[f"{name}_peak_rss_mb"] = round(rss, 1)
            r[f"{name}_events_per_sec"] = round(run["stats"]["events_consumed"] / run["wall_s"])
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def lake_jobs(quick):
    """The DuckLake section: scripts/bench_lake.py under DuckDB 1.4.4 (the only host with the
    DuckLake and postgres extensions), as a child; its JSON lines are passed through and its last
    line ({"lake": ...}) is kept."""
    if not os.path.exists(LTS_PY):
        print(json.dumps({"lake": f"skipped: no {LTS_PY} (make configure)"}), flush=True)
        return {}
    p = subprocess.Popen([LTS_PY, os.path.join(ROOT, "scripts", "bench_lake.py"), *(["--quick"] if quick else [])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    err = []
    t = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    t.start()
    last = None
    for line in p.stdout:
        if line.startswith("{"):
            last = json.loads(line)
            if "lake" not in last:
                print(line, end="", flush=True)
    p.wait()
    t.join()
    if p.returncode != 0 or not last or "lake" not in last:
        raise RuntimeError(f"scripts/bench_lake.py failed ({p.returncode}): {''.join(err)[-3000:]}")
    return last["lake"]


def markdown_table(results):
    """The throughput table, printed (docs/benchmarks.md shows a selection of its columns)."""
    lines = ["| scenario | events | events/s | comparison | ours / it | late injected / observed | false late | watermark lag ms | peak RSS MB | DB KB | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "duckdb_batch_events_per_sec" in r:
            cmp = f"DuckDB batch {r['duckdb_batch_events_per_sec']:,}/s (typed {r['duckdb_batch_typed_events_per_sec']:,}/s)"
            ratio = f"{r['ratio_ours_to_duckdb_batch']} ({r['ratio_ours_to_duckdb_batch_typed']})"
        elif "raw_consume_events_per_sec" in r:
            cmp = f"raw consume {r['raw_consume_events_per_sec']:,}/s"
            ratio = str(r["ratio_ours_to_raw_consume"])
        else:
            cmp, ratio = "", ""
        lines.append(f"| {r['scenario']} ({r['source']}) | {r['events_consumed']:,} | {r['throughput_events_per_sec']:,} | {cmp} | {ratio} | "
                     f"{r['late_events_injected']:,} / {r['late_events_observed']:,} | {r['false_late_events']} | "
                     f"{r['final_watermark_lag_ms']} | {r['peak_rss_mb']} | {r['db_size_kb']:,} | {r['elapsed_s']} |")
    return "\n".join(lines)


def main():
    quick = "--quick" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    os.makedirs(OUT, exist_ok=True)
    scenarios = [
        ("predecessor-files", lambda: files_scenario("predecessor-files", 50_000)),
        ("predecessor-kafka", lambda: kafka_scenario("predecessor-kafka", 50_000)),
        ("files-10M", lambda: files_scenario("files-10M", 1_000_000 if quick else 10_000_000)),
        ("kafka-1M", lambda: kafka_scenario("kafka-1M", 200_000 if quick else 1_000_000)),
        ("skewed-files", lambda: files_scenario("skewed-files", 1_000_000, skew_ms=5000, skew_partition=2, late_pct=0)),
        ("skewed-kafka", lambda: kafka_scenario("skewed-kafka", 200_000, skew_ms=5000, skew_partition=2, late_pct=0)),
    ]
    results = []
    for name, fn in scenarios:
        if only and only != name:
            continue
        results.append(fn())
    jobs = []
    if not only or only == "window-jobs":
        jobs = window_jobs(500_000 if quick else 2_000_000)
    times = []
    if not only or only == "time-formats":
        times = time_format_jobs(500_000 if quick else 2_000_000)
    many = []
    if not only or only == "many-keys":
        many = many_keys_jobs(1_000_000 if quick else 4_000_000)
    memory = []
    if not only or only == "memory":
        memory = memory_jobs([1_000_000, 3_000_000] if quick else [1_000_000, 10_000_000, 30_000_000])
    nexmark = []
    if not only or only == "nexmark":
        import bench_nexmark
        nexmark = bench_nexmark.nexmark_jobs(200_000 if quick else 1_000_000, 100_000 if quick else 250_000,
                                             10 if quick else 20)
    latency = []
    if not only or only == "latency":
        import bench_latency
        latency = bench_latency.latency_jobs(10 if quick else 30, 5 if quick else 10)
    lake = {}
    if not only or only == "lake":
        lake = lake_jobs(quick)
    meta = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
            "date": time.strftime("%Y-%m-%d"), "results": results, "window_jobs": jobs, "time_formats": times,
            "many_keys": many, "memory": memory, "nexmark": nexmark, "latency": latency, "lake": lake}
    # A partial run (--only) leaves the last whole run's results.json alone.
    with open(os.path.join(OUT, f"results-{only}.json" if only else "results.json"), "w") as f:
        json.dump(meta, f, indent=1)
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        print_tables(results, jobs, times, many, memory, nexmark, latency, lake)
    print(report.getvalue(), end="")
    if not quick and not only:
        # A full run is the one docs/benchmarks.md shows.
        import docs_section
        docs_section.write_section("docs/benchmarks.md", "latest run", "make bench",
                                   f"## Latest run\n\n{meta['date']}, {meta['machine']}.\n{report.getvalue()}")
    print()
    print(f"{'scenario':20} {'events':>10} {'ev/s':>10} {'vs batch':>9} {'vs raw':>7} {'false late':>10} {'recovery':>8} {'rss MB':>7}")
    for r in results:
        print(f"{r['scenario']:20} {r['events_consumed']:>10} {r['throughput_events_per_sec']:>10} "
              f"{str(r.get('ratio_ours_to_duckdb_batch', '')):>9} {str(r.get('ratio_ours_to_raw_consume', '')):>7} "
              f"{r['false_late_events']:>10} {str(r['late_recovery_rate']):>8} {r['peak_rss_mb']:>7}")


def print_tables(results, jobs, times, many, memory, nexmark, latency, lake=None):
    """The run's Markdown tables."""
    import bench_latency
    import bench_nexmark
    print()
    print(markdown_table(results))
    if jobs:
        print()
        print("| job (files, same events) | events/s | vs tumbling | window rows | peak RSS MB |")
        print("|---|---|---|---|---|")
        for r in jobs:
            print(f"| {r['scenario']} | {r['events_per_sec']:,} | {r['ratio_to_tumbling']} | {r['window_rows']:,} | {r['peak_rss_mb']} |")
    if times:
        print()
        print("| event times (files, same events) | events/s | vs integer | late | dead |")
        print("|---|---|---|---|---|")
        for r in times:
            print(f"| {r['scenario']} | {r['events_per_sec']:,} | {r['ratio_to_integer']} | {r['late_events']:,} | {r['dead_letters']} |")
    if many:
        print()
        print("| many keys (files, same events) | events/s | DuckDB batch events/s | ours / batch | window rows | peak RSS MB (batch) |")
        print("|---|---|---|---|---|---|")
        for r in many:
            print(f"| {r['scenario']} | {r['events_per_sec']:,} | {r['duckdb_batch_events_per_sec']:,} | {r['ratio_to_duckdb_batch']} | "
                  f"{r['window_rows']:,} | {r['peak_rss_mb']} ({r['duckdb_batch_peak_rss_mb']}) |")
    if memory:
        print()
        print("| events (memory_limit 256MB) | upsert peak RSS MB | append peak RSS MB | append, tables exist | DuckDB batch peak RSS MB | upsert / append / append, tables exist / batch events/s |")
        print("|---|---|---|---|---|---|")
        for r in memory:
            print(f"| {r['events']:,} | {r['upsert_peak_rss_mb']} | {r['append_peak_rss_mb']} | {r['append_tables_exist_peak_rss_mb']} | "
                  f"{r['duckdb_batch_peak_rss_mb']} | {r['upsert_events_per_sec']:,} / {r['append_events_per_sec']:,} / "
                  f"{r['append_tables_exist_events_per_sec']:,} / {r['duckdb_batch_events_per_sec']:,} |")
    if nexmark:
        print()
        print(bench_nexmark.markdown(nexmark))
    if latency:
        print()
        print(bench_latency.markdown(latency))
    if lake:
        import bench_lake
        print()
        print(bench_lake.markdown(lake))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-run":
        child_run(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), *sys.argv[5:7])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-batch":
        child_batch(sys.argv[2], sys.argv[3], sys.argv[4] == "1", *sys.argv[5:6])
    else:
        main()
