"""Shared by the demos: runs SQL in the DuckDB CLI (PyPI duckdb-cli) and prints what it shows."""
import os
import subprocess
import sys

import duckdb_cli

CLI = os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb")


def cli(db, sql, title):
    """Prints the title and the SQL, then runs it in the CLI on `db`; exits on an error."""
    print(f"\n-- {title}\n{sql.strip()}\n", flush=True)
    r = subprocess.run([CLI, "-unsigned", db, "-c", sql], capture_output=True, text=True)
    print(r.stdout, end="")
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        sys.exit(r.returncode)
