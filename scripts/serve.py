#!/usr/bin/env python3
"""Runs a DuckDB database's streaming_etl jobs as a service (systemd, a container, a script).

    python3 scripts/serve.py my.duckdb --sql jobs.sql [--extension streaming_etl] [--status-every 60]
    python3 scripts/serve.py my.duckdb --resume

It opens the database, loads the extension, runs the statements of `--sql` (settings, and calls
that start jobs in the background: `background := true` or `every := ...`) and, with `--resume`,
starts again every job the database's last process left running (`streaming_etl_resume()`). Then
it waits, with no statement open (a statement that only waits would hold an old transaction, and
DuckDB could not checkpoint what the jobs write), printing `streaming_etl_jobs()` every
`--status-every` seconds. SIGTERM or SIGINT closes the database, which stops every job at a cycle
boundary (everything read committed; they stay recorded, so `--resume` starts them again), and
exits 0 once the database is released; it exits 1 once no job is left running and one has failed,
0 once all have ended by themselves. Other connections cannot open the database file
while it runs (DuckDB's lock); read its tables through this process, or stop it first.
"""
import argparse
import signal
import sys
import threading
import time

import duckdb

ALIVE = ("running", "waiting", "retrying")


def statements(text):
    """The statements of a SQL file, split at semicolons outside quotes and $$ strings."""
    out, cur, quote, i = [], [], None, 0
    while i < len(text):
        c = text[i]
        if quote:
            if text.startswith(quote, i):
                cur.append(quote)
                i += len(quote)
                quote = None
                continue
        elif text.startswith("$$", i) or c in "'\"":
            quote = "$$" if text.startswith("$$", i) else c
            cur.append(quote)
            i += len(quote)
            continue
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif c == ";":
            out.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur).strip())
    return [s for s in out if s]


def jobs(con):
    cur = con.execute("SELECT job, state, runs, cycles, events_consumed, round(events_per_sec) AS per_sec, lag, "
                      "windows_emitted, late_events, dead_letters, last_error FROM streaming_etl_jobs()")
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def show(rows):
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items() if v is not None), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("database")
    ap.add_argument("--sql", help="a file of statements that start the jobs (and set what they need)")
    ap.add_argument("--resume", action="store_true", help="start again the jobs the last process left running")
    ap.add_argument("--extension", default="streaming_etl", help="the extension's name or file (default: by name)")
    ap.add_argument("--status-every", type=float, default=60.0, help="seconds between status lines (0: none)")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                    help="a DuckDB setting for the database (allow_unsigned_extensions=true is set)")
    args = ap.parse_args()

    config = {"allow_unsigned_extensions": "true"}
    config.update(kv.split("=", 1) for kv in args.config)
    # Handlers before anything starts: a signal is then noted whichever thread the kernel hands it
    # to (with the signals blocked in this thread instead, a test's service once died of its
    # SIGTERM: some thread had not blocked it).
    asked = threading.Event()
    got = []

    def on_signal(signo, _frame):
        got.append(signo)
        asked.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    con = duckdb.connect(args.database, config=config)
    ext = args.extension
    con.execute(f"LOAD '{ext}'" if "/" in ext or ext.endswith(".duckdb_extension") else f"LOAD {ext}")
    if args.resume:
        con.execute("SELECT * FROM streaming_etl_resume()").fetchall()
    if args.sql:
        with open(args.sql, encoding="utf-8") as f:
            for stmt in statements(f.read()):
                try:
                    con.execute(stmt).fetchall()
                except duckdb.InvalidInputException as e:
                    # A job --resume already started again: its call in the file is not needed.
                    if "a background job of this name is" not in str(e):
                        raise
                    print(f"already running: {e}", flush=True)
    rows = jobs(con)
    show(rows)
    print(f"serving {len(rows)} job(s); SIGTERM stops them", flush=True)
    code = 0
    while True:
        wait = args.status_every if args.status_every > 0 else 5.0
        if asked.wait(wait):
            print(f"signal {signal.Signals(got[0]).name}: stopping", flush=True)
            break
        rows = jobs(con)
        if args.status_every > 0:
            show(rows)
        if rows and not any(r["state"] in ALIVE for r in rows):
            code = 1 if any(r["state"] == "failed" for r in rows) else 0
            print("no job left running", flush=True)
            break
    con.close()
    # The last close stops the jobs at a cycle boundary, then the extension releases the
    # database: until then, a connection with another configuration is refused.
    deadline = time.time() + 60
    while True:
        try:
            duckdb.connect(args.database, config={"threads": 1}).close()
            break
        except duckdb.ConnectionException:
            if time.time() > deadline:
                print("the database was not released within 60 s", flush=True)
                return 1
            time.sleep(0.02)
    print("jobs stopped, database closed", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
