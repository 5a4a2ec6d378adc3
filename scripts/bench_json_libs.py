#!/usr/bin/env python3
"""`make bench` (JSON libraries, issue 48's first step): the job's JSON decoder against the
field's maintained parsers, sonic-rs and simd-json (and serde_json), on the first file of the
formats workload (1M events of the 50-key workload), for the fields a job reads (key,
event_time_ms, payload.value). `bench/json_libs` (a workspace of its own, so the tests never build
these crates) runs each reader over every line, the readers alternating, the best of 5 rounds; all
must read the same fields (a checksum). Prints a table and writes it into docs/benchmarks.md
(section 'json libraries') unless --quick.

usage: bench_json_libs.py [--quick]
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchlib  # noqa: E402
from docs_section import write_section  # noqa: E402

EXE = os.path.join(ROOT, "target", "release", "json_libs_bench")


def main():
    quick = "--quick" in sys.argv
    records = 100_000 if quick else 1_000_000
    d = benchlib.generate("formats", records * 4)
    path = os.path.join(d, "part-0.ndjson")
    p = subprocess.run([EXE, path, str(records), "2" if quick else "5"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"json_libs_bench: {p.stderr.strip()}")
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    ours = rows[0]["records_per_sec"]
    lines = [f"| reader ({rows[0]['records']:,} events, {rows[0]['bytes'] / 1e6:.0f} MB) | records/s | GB/s | vs the job's decoder | same fields |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['reader']} | {r['records_per_sec']:,} | {r['gb_per_sec']:.3f} | "
                     f"{r['records_per_sec'] / ours:.2f}x | {'yes' if r['same_fields'] else 'NO'} |")
    text = "\n".join(lines)
    print(text)
    if not all(r["same_fields"] for r in rows):
        raise SystemExit("a reader read other fields than the job's decoder")
    if not quick:
        write_section("docs/benchmarks.md", "json libraries", "make bench (scripts/bench_json_libs.py)", text)


if __name__ == "__main__":
    main()
