#!/usr/bin/env python3
"""Writes src/sql/builtins.rs: the names of DuckDB's own functions on the DuckDB versions the tests
host (.venv, .venv/old, .venv/lts), split into aggregates and the rest, so planning a job written
as SQL tells `count` from `lower` without scanning `duckdb_functions()` (about 30 ms a call). A name
that is an aggregate on one version and not on another is in neither list; names in neither (a
loaded extension's, a user's) are looked up in `duckdb_functions()`.

usage: gen_builtins.py  (run by hand when a DuckDB version is added)
"""
import json
import os
import subprocess
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = [".venv/bin/python", ".venv/old/bin/python", ".venv/lts/bin/python"]
QUERY = ("import duckdb, json; print(json.dumps(duckdb.connect().execute(\"SELECT DISTINCT lower(function_name), "
         "function_type = 'aggregate' FROM duckdb_functions()\").fetchall()), duckdb.__version__)")


def names():
    agg, other, versions = set(), set(), []
    for py in HOSTS:
        out = subprocess.run([os.path.join(ROOT, py), "-c", QUERY], capture_output=True, text=True, check=True).stdout
        rows, version = out.rsplit(" ", 1)
        versions.append(version.strip())
        for name, is_agg in json.loads(rows):
            (agg if is_agg else other).add(name)
    both = agg & other
    return sorted(agg - both), sorted(other - both), versions


def block(const, items):
    text = " ".join(items)
    lines = textwrap.wrap(text, 92, break_long_words=False, break_on_hyphens=False)
    body = "\n".join(f'    "{line} ",' for line in lines)
    return f"pub const {const}: &str = concat!(\n{body}\n);\n"


def main():
    agg, other, versions = names()
    text = (f"//! DuckDB's own function names ({', '.join(versions)}), aggregates and the rest, written by\n"
            "//! scripts/gen_builtins.py: a job's statements are planned without scanning `duckdb_functions()`.\n"
            "#![forbid(unsafe_code)]\n\n"
            "/// Names of aggregate functions on every version, separated by spaces.\n"
            + block("AGGREGATES", agg)
            + "\n/// Names of the other functions (scalar, table, macro, window, pragma) on every version.\n"
            + block("NOT_AGGREGATES", other))
    with open(os.path.join(ROOT, "src", "sql", "builtins.rs"), "w") as f:
        f.write(text)
    print(f"{len(agg)} aggregates, {len(other)} others")


if __name__ == "__main__":
    main()
