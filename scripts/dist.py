#!/usr/bin/env python3
"""`make dist`: a repository DuckDB's `INSTALL streaming_etl FROM '<dir or URL>'` reads.

For each line of scripts/dist_versions.txt: `dist/repository/<version>/<platform>/
streaming_etl.duckdb_extension.gz`, the release build of that line (`main`: target/release/
libstreaming_etl.so; `lts`: libstreaming_etl_lts.so) with its debug information moved to
`build/dist/<line>/streaming_etl.debug` (objcopy --only-keep-debug, then a .gnu_debuglink to it,
so perf and gdb still find it), stripped of it, and given DuckDB's metadata footer (platform,
extension version, C API version, ABI: scripts/append_footer.py; strip drops the footer, so it
is appended after). Prints the sizes as JSON.

usage: dist.py <platform> <extension version>
"""
import gzip
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDS = {"main": ("target/release/libstreaming_etl.so", "v1.5.6"),
          "lts": ("target/release/libstreaming_etl_lts.so", "v1.2.0")}


def versions():
    """(DuckDB version, build line, tested) from scripts/dist_versions.txt."""
    out = []
    with open(os.path.join(ROOT, "scripts", "dist_versions.txt")) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if words:
                out.append((words[0], words[1], "tested" in words[2:]))
    return out


def build(line, platform, version):
    so, c_api = BUILDS[line]
    out = os.path.join(ROOT, "build", "dist", line)
    os.makedirs(out, exist_ok=True)
    debug = os.path.join(out, "streaming_etl.debug")
    stripped = os.path.join(out, "streaming_etl.so")
    subprocess.run(["objcopy", "--only-keep-debug", os.path.join(ROOT, so), debug], check=True)
    subprocess.run(["strip", "--strip-debug", "-o", stripped, os.path.join(ROOT, so)], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", stripped], check=True)
    ext = os.path.join(out, "streaming_etl.duckdb_extension")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "append_footer.py"), stripped, ext, platform,
                    version, c_api], check=True)
    return ext


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    platform, version = sys.argv[1:3]
    repo = os.path.join(ROOT, "dist", "repository")
    shutil.rmtree(repo, ignore_errors=True)
    built = {line: build(line, platform, version) for line in BUILDS}
    sizes = {}
    for duckdb_version, line, _ in versions():
        d = os.path.join(repo, duckdb_version, platform)
        os.makedirs(d)
        with open(built[line], "rb") as src, gzip.open(os.path.join(d, "streaming_etl.duckdb_extension.gz"), "wb", 6) as dst:
            shutil.copyfileobj(src, dst)
        sizes[duckdb_version] = {"line": line, "mb": round(os.path.getsize(built[line]) / 1e6, 1),
                                 "gz_mb": round(os.path.getsize(os.path.join(d, "streaming_etl.duckdb_extension.gz")) / 1e6, 1)}
    for line, so in BUILDS.items():
        print(json.dumps({"line": line, "unstripped_mb": round(os.path.getsize(os.path.join(ROOT, so[0])) / 1e6, 1),
                          "shipped_mb": round(os.path.getsize(built[line]) / 1e6, 1),
                          "debug_mb": round(os.path.getsize(os.path.join(ROOT, "build", "dist", line, "streaming_etl.debug")) / 1e6, 1)}))
    print(json.dumps({"repository": repo, "versions": sizes}))


if __name__ == "__main__":
    main()
