#!/usr/bin/env python3
"""`make bench` (the upsert path of running results): CPU per event of a job that revises its
window rows every cycle, `write_mode := 'upsert'` (the default) with `emit := 'update'` and
`late_updates_ms`, 200 keys, 1 s windows, 5 ms cycles (each cycle rewrites the windows it
changed), over 3M events in 4 files with 2% of them 2-5 s late. Fresh processes, alternating, the
best of three each; `--extension` compares another build (e.g. one made before a change).

Prints a table and writes it into docs/benchmarks.md (section 'upsert path') unless --quick.

usage: bench_upsert.py [--quick] [--extension NAME=PATH ...]
"""
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

EXT = os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension")
KEYS = 200


def data(events, directory):
    """`events` orders over KEYS keys in 4 files, event time rising 1 ms an event, 2% late."""
    if os.path.exists(os.path.join(directory, "done")):
        return directory
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(5)
    files = [open(os.path.join(directory, f"p{p}.ndjson"), "w") for p in range(4)]
    for i in range(events):
        t = 1_700_000_000_000 + i // 30
        if rng.random() < 0.02:
            t -= rng.randint(2000, 5000)
        files[i % 4].write(f'{{"key":"k{i % KEYS}","event_time_ms":{t},"payload":{{"value":{i % 100}}}}}\n')
    for f in files:
        f.close()
    open(os.path.join(directory, "done"), "w").close()
    return directory


CHILD = """
import duckdb, json, resource, sys, time
ext, pattern = sys.argv[1], sys.argv[2]
con = duckdb.connect(config={'allow_unsigned_extensions': 'true'})
con.execute(f"LOAD '{ext}'")
con.execute("SET threads = 1")
before = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.time()
rows = con.execute(f"SELECT * FROM streaming_etl_run('file:{pattern}', 1000, 200, emit := 'update', "
                   "late_updates_ms := 5000, checkpoint_interval_ms := 5)").fetchall()
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
last = rows[-1]
print(json.dumps({"events": last[1], "cycles": last[10], "cpu_s": cpu, "wall_s": time.time() - t0}))
"""


def one(ext, pattern):
    out = subprocess.run([sys.executable, "-c", CHILD, ext, pattern], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    builds = [("this build", EXT)]
    for a in args:
        if "=" in a and not a.startswith("--"):
            name, path = a.split("=", 1)
            builds.append((name, path))
    events = 600_000 if quick else 3_000_000
    directory = data(events, os.path.join(ROOT, "bench-out", f"upsert-{events}"))
    pattern = f"{directory}/*.ndjson"
    best = {}
    for _ in range(1 if quick else 3):
        for name, path in builds:
            r = one(path, pattern)
            if name not in best or r["cpu_s"] < best[name]["cpu_s"]:
                best[name] = r
    rows = ["| build | events | cycles | CPU s | CPU µs per event | wall s |", "|---|---|---|---|---|---|"]
    for name, _ in builds:
        r = best[name]
        rows.append(f"| {name} | {r['events']:,} | {r['cycles']} | {r['cpu_s']:.2f} | "
                    f"{1e6 * r['cpu_s'] / max(r['events'], 1):.2f} | {r['wall_s']:.2f} |")
    table = "\n".join(rows)
    print(table)
    print(json.dumps(best))
    if not quick:
        from docs_section import write_section
        write_section("docs/benchmarks.md", "upsert path", "make bench (scripts/bench_upsert.py)", table)


if __name__ == "__main__":
    main()
