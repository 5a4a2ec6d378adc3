"""A process that runs a database's background jobs until they catch up (for kill tests).

usage: bg_job.py <db>
It loads the extension, resumes the jobs recorded in the database (`streaming_etl_resume()`),
or, when there are none, starts the jobs of the calls in BG_JOB_CALL (one a line); prints "started", waits for
every job to have read everything there is (lag 0), stops them, prints "caught_up" and exits.
"""
import os
import sys
import time

import duckdb

EXT = os.environ.get("STREAMING_ETL_EXTENSION") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "build", "release", "streaming_etl.duckdb_extension")


def main():
    db = sys.argv[1]
    con = duckdb.connect(db, config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    con.execute("SET threads = 1")
    jobs = con.execute("SELECT job FROM streaming_etl_resume()").fetchall()
    if not jobs:
        for call in os.environ["BG_JOB_CALL"].splitlines():
            jobs += con.execute(f"SELECT job FROM {call}").fetchall()
    print("started", flush=True)
    names = [j[0] for j in jobs]
    while True:
        rows = con.execute("SELECT job, state, lag, events_consumed, last_error, cycles FROM streaming_etl_jobs()").fetchall()
        for r in rows:
            assert r[1] in ("running", "retrying"), r
        if all(r[2] == 0 and r[5] > 0 for r in rows if r[0] in names):
            break
        time.sleep(0.02)
    for n in names:
        con.execute("SELECT * FROM streaming_etl_stop(?)", [n]).fetchall()
    print("caught_up", flush=True)
    con.close()


if __name__ == "__main__":
    main()
