#!/usr/bin/env python3
"""`make demo`: the main job on the embedded file source, in the DuckDB CLI.

Generates a few hundred thousand events into NDJSON partitions (some late, a few malformed),
runs the job twice (the first run stops part-way, the second resumes from the checkpoint and
flushes), and prints the stats rows and a summary of what landed in the tables.
"""
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import duckdb  # noqa: E402

from datagen import generate_sql  # noqa: E402
from democli import cli as run_cli  # noqa: E402

DEMO = os.path.join(ROOT, "demo")
EVENTS = 400_000


def cli(sql, title):
    run_cli(os.path.join(DEMO, "demo.duckdb"), sql, title)


def main():
    shutil.rmtree(DEMO, ignore_errors=True)
    os.makedirs(DEMO)
    generate_sql(duckdb.connect(), os.path.join(DEMO, "data"), EVENTS, partitions=4, keys=50,
                 late_pct=5, bad_permille=1, skew_ms=3000, skew_partition=3)
    print(f"generated {EVENTS} events in {DEMO}/data/part-{{0..3}}.ndjson "
          "(5% late, 0.1% malformed, partition 3 runs 3 s behind)")
    load = f"LOAD streaming_etl; SET streaming_etl_checkpoint = '{DEMO}/demo.ckpt';"
    run = "SELECT * FROM streaming_etl_run('file:demo/data/*.ndjson', 1000, 200{})"
    cli(f"{load}\n{run.format(', max_messages := 250000')};", "first run: stops after 250,000 messages")
    cli(f"{load}\n{run.format(', flush := true')};", "second run: resumes from the checkpoint, flushes the last windows")
    with open(os.path.join(ROOT, "sql", "demo_report.sql")) as f:
        cli(f"{load}\n{f.read()}", "what landed in the tables (sql/demo_report.sql)")


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
