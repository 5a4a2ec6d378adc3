#!/usr/bin/env python3
"""A small sqllogictest runner for DuckDB's dialect, over the `duckdb` Python package.

DuckDB's official runner is not installable here (it is git-only), so this implements the part
of the format the tests use:

    require streaming_etl            LOAD the extension under test (path given on the command line)
    load <path>                      reopen on a database file
    restart                          close every connection and reopen the same database
    statement ok | statement error   with, for errors, `----` and a substring of the message
    query <types> [rowsort|nosort]   with `----` and the expected rows, tab-separated
    mode skip | mode unskip
    loop <var> <from> <to> ... endloop   repeat records with ${var} set
    skipif <cond> | onlyif <cond>    on the line before a record: skip it when the host matches
                                     (or does not); <cond> is `duckdb<X.Y` or `duckdb>=X.Y`, the
                                     host's DuckDB version (1.4 registers no settings: see README)

`__TEST_DIR__` is replaced (in statements and expected output) by a fresh temporary directory
per test file; paths are relative
to the repository root (the working directory). NULL prints as NULL, booleans as true/false.

usage: sqllogictest.py <extension path> <test file or directory> [...]
"""
import math
import os
import shutil
import sys
import tempfile
import traceback

import duckdb


class Failure(Exception):
    pass


def fmt(v):
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v == int(v) and abs(v) < 1e15:
            return f"{v:.1f}"
        return repr(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in bytes(v))
    if v == "":
        return "(empty)"
    return str(v)


class Runner:
    def __init__(self, extension, path):
        self.extension = os.path.abspath(extension)
        self.path = path
        self.tmp = tempfile.mkdtemp(prefix="setl-slt-")
        self.db = ":memory:"
        self.con = None
        self.loaded = False
        self.skip = False

    def connect(self):
        self.con = duckdb.connect(self.db, config={"allow_unsigned_extensions": "true"})
        if self.loaded:
            self.con.execute(f"LOAD '{self.extension}'")

    def close(self):
        if self.con is not None:
            self.con.close()
            self.con = None

    def sub(self, text):
        return text.replace("__TEST_DIR__", self.tmp)

    def records(self):
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.strip() or line.startswith("#"):
                i += 1
                continue
            start = i + 1
            header = line.strip()
            i += 1
            conds = []
            while header.split()[0] in ("skipif", "onlyif") and i < len(lines):
                conds.append(header.split(None, 1))
                header = lines[i].strip()
                i += 1
            if not all(host_matches(c[1]) == (c[0] == "onlyif") for c in conds):
                header = "skipped " + header
            body = []
            while i < len(lines) and lines[i].strip() and lines[i] != "----":
                body.append(lines[i])
                i += 1
            expected = None
            if i < len(lines) and lines[i] == "----":
                i += 1
                expected = []
                while i < len(lines) and lines[i] != "":
                    expected.append(lines[i])
                    i += 1
            yield start, header, "\n".join(body), expected

    def run(self):
        self.connect()
        try:
            records = list(self.records())
            i = 0
            while i < len(records):
                lineno, header, sql, expected = records[i]
                if header.startswith("loop "):
                    _, var, lo, hi = header.split()
                    end = next(j for j in range(i + 1, len(records)) if records[j][1] == "endloop")
                    body = records[i + 1 : end]
                    for n in range(int(lo), int(hi)):
                        for rec in body:
                            self.one(rec, {"${" + var + "}": str(n)})
                    i = end + 1
                    continue
                self.one(records[i], {})
                i += 1
        finally:
            self.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def one(self, rec, env):
        lineno, header, sql, expected = rec
        for k, v in env.items():
            sql = sql.replace(k, v)
        try:
            if expected is not None:
                expected = [self.sub(line) for line in expected]
            self.record(header, self.sub(sql), expected)
        except Failure as e:
            raise Failure(f"{self.path}:{lineno}: {header}\n{sql}\n{e}") from None

    def record(self, header, sql, expected):
        words = header.split()
        kind = words[0]
        if kind == "skipped":
            return
        if kind == "mode":
            self.skip = words[1] == "skip"
            return
        if self.skip:
            return
        if kind == "require":
            if words[1] != "streaming_etl":
                raise Failure(f"unknown requirement {words[1]}")
            self.con.execute(f"LOAD '{self.extension}'")
            self.loaded = True
        elif kind == "load":
            self.close()
            self.db = self.sub(words[1])
            self.connect()
        elif kind == "restart":
            self.close()
            self.connect()
        elif kind == "statement":
            self.statement(words[1], sql, expected)
        elif kind == "query":
            self.query(words[1], words[2] if len(words) > 2 else "nosort", sql, expected or [])
        else:
            raise Failure(f"unknown record type {kind!r}")

    def statement(self, want, sql, expected):
        try:
            self.con.execute(sql).fetchall()
        except duckdb.Error as e:
            if want == "ok":
                raise Failure(f"expected success, got: {e}")
            msg = "\n".join(expected or [])
            if msg and msg not in str(e):
                raise Failure(f"expected an error containing:\n  {msg}\ngot:\n  {e}")
            return
        if want == "error":
            raise Failure("expected an error, the statement succeeded")

    def query(self, types, sort, sql, expected):
        try:
            rows = self.con.execute(sql).fetchall()
        except duckdb.Error as e:
            raise Failure(f"query failed: {e}")
        got = [[fmt(v) for v in row] for row in rows]
        for row in got:
            if len(row) != len(types):
                raise Failure(f"expected {len(types)} columns ({types}), got {len(row)}: {row}")
        want = [line.split("\t") for line in expected]
        if sort == "rowsort":
            got.sort()
            want.sort()
        if got != want:
            g = "\n".join("\t".join(r) for r in got)
            w = "\n".join("\t".join(r) for r in want)
            raise Failure(f"wrong result\n-- expected:\n{w}\n-- got:\n{g}")


def host_matches(cond):
    """`duckdb<1.5` / `duckdb>=1.5`: compares the host's DuckDB version (major.minor)."""
    for op in ("<=", ">=", "<", ">", "=="):
        name, sep, ver = cond.partition(op)
        if sep:
            break
    else:
        raise Failure(f"unknown condition {cond!r}")
    if name.strip() != "duckdb":
        raise Failure(f"unknown condition {cond!r}")
    have = tuple(int(x) for x in duckdb.__version__.split(".")[:2])
    want = tuple(int(x) for x in ver.strip().split(".")[:2])
    return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want, "==": have == want}[op]


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    extension = sys.argv[1]
    files = []
    for p in sys.argv[2:]:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".test"))
        else:
            files.append(p)
    failed = 0
    for f in files:
        try:
            Runner(extension, f).run()
            print(f"ok    {f}  (duckdb {duckdb.__version__})")
        except Failure as e:
            failed += 1
            print(f"FAIL  {f}  (duckdb {duckdb.__version__})\n{e}\n")
        except Exception:
            failed += 1
            print(f"ERROR {f}\n{traceback.format_exc()}")
    print(f"{len(files) - failed}/{len(files)} test files passed (duckdb {duckdb.__version__})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
