#!/usr/bin/env python3
"""`make reliability`: the long reliability suite, and its table of figures.

For each scenario: faults injected, messages in, messages lost and doubled (against one straight
run), whether every message is accounted for exactly once, and the checkpoint's SQLite
integrity_check. Writes bench-out/reliability.json, prints the table, and writes it into docs/reliability.md
(its section 'latest run'; the scenarios are described around it). `--short` runs the
versions `make test` runs.
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
os.chdir(ROOT)

import reliability  # noqa: E402


def main():
    scale = "short" if "--short" in sys.argv else "long"
    rows = []
    failed = 0
    for scenario in reliability.SCENARIOS:
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
    os.makedirs(os.path.join(ROOT, "bench-out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench-out", "reliability.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "scale": scale, "rows": rows}, f, indent=1)
    table = [f"| scenario | faults | messages | lost | doubled | exactly once | integrity_check |",
             f"|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['scenario']} | {r['faults']} | {r['messages']} | {r['lost']} | {r['doubled']} | "
                     f"{'yes' if r['exact'] else 'NO'} | {r['integrity']} |")
    print()
    print("\n".join(table))
    if scale == "long":
        import docs_section
        docs_section.write_section("docs/reliability.md", "latest run", "make reliability",
                                   f"## Latest run\n\n{time.strftime('%Y-%m-%d')}, scale {scale}"
                                   f"{', with failures' if failed else ''}.\n\n" + "\n".join(table))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
