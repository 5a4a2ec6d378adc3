"""Runs one streaming_etl job in its own process (for kill and concurrency tests).

usage: run_job.py <db> <topic> <window_ms> <lateness_ms> [name=sql-value ...] [--announce]
       run_job.py <db> <topic> sql <file> [name=sql-value ...] [--announce]   (a job written as SQL:
       streaming_etl_sql(topic, <the file's text>, ...))
(--announce prints "loaded" once the extension is loaded, so a test can time a kill.)
Prints each result row as a JSON line; the last one is the run's totals.

Environment: STREAMING_ETL_EXTENSION (the file to load), STREAMING_ETL_EXTENSION_DIRECTORY
(DuckDB's extension_directory, where LOAD ducklake finds DuckLake), STREAMING_ETL_SETUP (SQL run
after loading, e.g. LOAD ducklake; ATTACH ...), STREAMING_ETL_THREADS (DuckDB's `threads`).
"""
import json
import os
import sys

import duckdb

EXT = os.environ.get("STREAMING_ETL_EXTENSION") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "build", "release", "streaming_etl.duckdb_extension")


def main():
    args = sys.argv[1:]
    announce = "--announce" in args
    args = [a for a in args if a != "--announce"]
    db, topic, window, lateness, *named = args
    config = {"allow_unsigned_extensions": "true"}
    if os.environ.get("STREAMING_ETL_EXTENSION_DIRECTORY"):
        config["extension_directory"] = os.environ["STREAMING_ETL_EXTENSION_DIRECTORY"]
    con = duckdb.connect(db, config=config)
    con.execute(f"LOAD '{EXT}'")
    if os.environ.get("STREAMING_ETL_THREADS"):
        con.execute(f"SET threads = {int(os.environ['STREAMING_ETL_THREADS'])}")
    if os.environ.get("STREAMING_ETL_SETUP"):
        con.execute(os.environ["STREAMING_ETL_SETUP"])
    if announce:
        print("loaded", flush=True)
    args = "".join(f", {n.split('=', 1)[0]} := {n.split('=', 1)[1]}" for n in named)
    if window == "sql":
        with open(lateness) as f:
            text = f.read().replace("'", "''")
        cur = con.execute(f"SELECT * FROM streaming_etl_sql('{topic}', '{text}'{args})")
    else:
        cur = con.execute(f"SELECT * FROM streaming_etl_run('{topic}', {window}, {lateness}{args})")
    cols = [d[0] for d in cur.description]
    for row in cur.fetchall():
        print(json.dumps(dict(zip(cols, row))), flush=True)
    con.close()


if __name__ == "__main__":
    main()
