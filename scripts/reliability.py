#!/usr/bin/env python3
"""`make reliability`: the long reliability suite, and its table of figures.

For each scenario: faults injected, messages in, messages lost and doubled (against one straight
run), whether every message is accounted for exactly once, and the checkpoint's SQLite
integrity_check. Writes bench-out/reliability.json, prints the table, and writes it into docs/reliability.md
(its section 'latest run'; the scenarios are described around it). `--short` runs the
versions `make test` runs. `--only NAME` runs one scenario (its function's name; `lake`: the
DuckLake ones) and writes bench-out/reliability-NAME.json instead, leaving the docs alone.

The DuckLake scenarios (kill -9 of a job writing into a DuckLake on PostgreSQL; PostgreSQL killed
and restarted mid-run) run in scripts/reliability_lake.py under DuckDB 1.4.4's Python
(.venv/lts/bin/python), the only host with the DuckLake and postgres extensions; their rows join
the table.
"""
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
os.chdir(ROOT)

import reliability  # noqa: E402

LTS_PY = os.environ.get("RELIABILITY_LTS_PYTHON") or os.path.join(ROOT, ".venv", "lts", "bin", "python")


LAKE_SCENARIOS = ("kill_lake", "postgres_kill")  # scripts/reliability_lake.py


def lake_scenarios(scale, names=()):
    """The rows of scripts/reliability_lake.py (a child under DuckDB 1.4.4), as they come."""
    if not os.path.exists(LTS_PY):
        print(json.dumps({"scenario": "DuckLake scenarios", "note": f"skipped: no {LTS_PY} (make configure)"}), flush=True)
        return
    started = time.time()
    p = subprocess.Popen([LTS_PY, os.path.join(ROOT, "scripts", "reliability_lake.py"), scale, *names],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    err = []
    t = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    t.start()
    got = 0
    for line in p.stdout:
        if line.startswith("{"):
            got += 1
            yield json.loads(line)
    p.wait()
    t.join()
    if p.returncode != 0 or not got:
        yield {"scenario": "DuckLake scenarios (scripts/reliability_lake.py)", "faults": "-", "messages": "-", "lost": "?",
               "doubled": "?", "exact": False, "integrity": "?", "seconds": round(time.time() - started, 1),
               "note": f"FAILED: exit {p.returncode}: {''.join(err)[-300:]}"}


def main():
    scale = "short" if "--short" in sys.argv else "long"
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    rows = []
    failed = 0
    for scenario in reliability.SCENARIOS:
        if only and only != scenario.__name__:
            continue
        started = time.time()
        try:
            r = scenario(scale)
        except AssertionError as e:
            failed += 1
            r = {"scenario": scenario.__name__, "faults": "-", "messages": "-", "lost": "?", "doubled": "?",
                 "exact": False, "integrity": "?", "note": f"FAILED: {str(e)[:300]}"}
        r["seconds"] = round(time.time() - started, 1)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if not only or only == "lake" or only in LAKE_SCENARIOS:
        for r in lake_scenarios(scale, [only] if only in LAKE_SCENARIOS else []):
            failed += not r["exact"]
            rows.append(r)
            print(json.dumps(r), flush=True)
    os.makedirs(os.path.join(ROOT, "bench-out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench-out", f"reliability-{only}.json" if only else "reliability.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "scale": scale, "rows": rows}, f, indent=1)
    table = [f"| scenario | faults | messages | lost | doubled | exactly once | integrity_check |",
             f"|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['scenario']} | {r['faults']} | {r['messages']} | {r['lost']} | {r['doubled']} | "
                     f"{'yes' if r['exact'] else 'NO'} | {r['integrity']} |")
    print()
    print("\n".join(table))
    if scale == "long" and not only:
        import docs_section
        docs_section.write_section("docs/reliability.md", "latest run", "make reliability",
                                   f"## Latest run\n\n{time.strftime('%Y-%m-%d')}, scale {scale}"
                                   f"{', with failures' if failed else ''}.\n\n" + "\n".join(table))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
