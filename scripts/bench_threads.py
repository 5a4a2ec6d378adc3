#!/usr/bin/env python3
"""`make bench` (threads): issue 25's goals.

- The files-10M workload (50 keys, 10M events in 4 files, 1 s windows): runs with DuckDB's
  `threads` = 1 and 2, in both write modes, against DuckDB's own batch query over the same files
  at the same thread counts. Wall time, CPU-seconds of the whole process (getrusage: every
  thread, DuckDB's included) per event, and CPU / wall. Fresh processes, alternating, the best
  of two each (by wall time).
- The event-time core alone (engine_bench: no DuckDB, no SQLite) at 1 and 2 threads.
- The serial fraction from each speedup (Karp-Flatt: e = (1/S - 1/p) / (1 - 1/p)), and the
  throughput Amdahl's law then predicts at 16 and 64 cores.
- Whether every run wrote the same windows (a checksum over every column of every row).

Prints the tables and writes them into docs/benchmarks.md (section 'threads') unless --quick.

usage: bench_threads.py [--quick]
"""
import json
import os
import re
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchlib  # noqa: E402
from docs_section import write_section  # noqa: E402

MODES = ("upsert", "append")
THREADS = (1, 2)


def serial_fraction(speedup, p):
    """Karp-Flatt: the serial fraction a measured speedup on p threads implies."""
    return (1 / speedup - 1 / p) / (1 - 1 / p)


def amdahl(e, p):
    return 1 / (e + (1 - e) / p)


def engine_alone(pattern, threads):
    exe = os.path.join(ROOT, "target", "release", "examples", "engine_bench")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([exe, pattern], capture_output=True, text=True, env=dict(os.environ, STREAMING_ETL_THREADS=str(threads)))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    m = re.match(r"(\d+) events in ([\d.]+) s", r.stdout)
    events, wall = int(m.group(1)), float(m.group(2))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"events": events, "wall_s": wall, "cpu_s": cpu}


def measure(events, rounds=2):
    d = benchlib.generate("files-10M", events)
    pattern = f"{d}/*.ndjson"
    best = {}

    def keep(key, result, wall):
        if key not in best or wall < best[key][1]:
            best[key] = (result, wall)

    for _ in range(rounds):
        for t in THREADS:
            for mode in MODES:
                run, _ = benchlib.spawn_measured(["--child-run", benchlib.fresh_db("threads"), f"file:{pattern}",
                                               json.dumps({"write_mode": f"'{mode}'"})], env={"BENCH_THREADS": str(t)})
                keep((mode, t), run, run["wall_s"])
            b, _ = benchlib.spawn_measured(["--child-batch", benchlib.fresh_db("threads-batch"), pattern, "0"],
                                        env={"BENCH_THREADS": str(t)})
            keep(("batch", t), b, b["elapsed_s"])
            e = engine_alone(pattern, t)
            keep(("engine", t), e, e["wall_s"])
    return best, events


def report(best, events):
    rows = []
    for t in THREADS:
        batch, bwall = best[("batch", t)]
        for name in ("upsert", "append", "engine"):
            r, wall = best[(name, t)]
            n = r["stats"]["events_consumed"] if "stats" in r else r["events"]
            assert n == events, (name, t, n)
            rows.append({"run": name, "threads": t, "wall_s": round(wall, 3), "events_per_sec": round(n / wall),
                         "cpu_s": round(r["cpu_s"], 3), "cpu_per_wall": round(r["cpu_s"] / wall, 2),
                         "vs_batch_wall": round(bwall / wall, 3) if name != "engine" else None,
                         "vs_batch_cpu": round(r["cpu_s"] / batch["cpu_s"], 3) if name != "engine" else None,
                         "checksum": r.get("windows_checksum")})
        rows.append({"run": "batch", "threads": t, "wall_s": round(bwall, 3), "events_per_sec": round(events / bwall),
                     "cpu_s": round(batch["cpu_s"], 3), "cpu_per_wall": round(batch["cpu_s"] / bwall, 2),
                     "vs_batch_wall": 1.0, "vs_batch_cpu": 1.0, "checksum": None})
    for r in rows:
        print(json.dumps(r), flush=True)
    same = len({json.dumps(r["checksum"]) for r in rows if r["checksum"]}) == 1
    model = []
    for name in ("upsert", "append", "engine", "batch"):
        one = next(r for r in rows if r["run"] == name and r["threads"] == 1)
        two = next(r for r in rows if r["run"] == name and r["threads"] == 2)
        s = one["wall_s"] / two["wall_s"]
        e = max(serial_fraction(s, 2), 0.0)
        model.append({"run": name, "speedup": round(s, 2), "serial": round(e, 3),
                      "at16": round(one["events_per_sec"] * amdahl(e, 16)), "at64": round(one["events_per_sec"] * amdahl(e, 64))})
    names = {"upsert": "ours, `upsert` (default)", "append": "ours, `append`", "engine": "event-time core alone",
             "batch": "DuckDB batch `GROUP BY`"}
    lines = [f"| {events:,} events, 50 keys, 4 files | threads | wall s | events/s | CPU s | CPU / wall | batch wall / ours | ours CPU / batch CPU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {names[r['run']]} | {r['threads']} | {r['wall_s']} | {r['events_per_sec']:,} | {r['cpu_s']} | "
                     f"{r['cpu_per_wall']} | {r['vs_batch_wall'] or ''} | {r['vs_batch_cpu'] or ''} |")
    lines += ["", "| run | speedup 2 / 1 thread | serial fraction | predicted events/s at 16 cores | at 64 cores |",
              "|---|---|---|---|---|"]
    for m in model:
        lines.append(f"| {names[m['run']]} | {m['speedup']} | {m['serial']} | {m['at16']:,} | {m['at64']:,} |")
    lines += ["", f"Every run wrote the same windows (checksum of every row): {'yes' if same else 'NO'}."]
    return "\n".join(lines), same


def main():
    quick = "--quick" in sys.argv
    os.makedirs(benchlib.OUT, exist_ok=True)
    best, events = measure(1_000_000 if quick else 10_000_000, rounds=1 if quick else 2)
    table, same = report(best, events)
    print(table)
    if not same:
        sys.exit("runs at different thread counts wrote different windows")
    if not quick:
        write_section("docs/benchmarks.md", "threads", "make bench (scripts/bench_threads.py)", table)


if __name__ == "__main__":
    main()
