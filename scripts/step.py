#!/usr/bin/env python3
"""Runs one step of a build or test target and records how long it took, so that `.ci/run` can
print where its time went (docs/development.md keeps the budget).

    python3 scripts/step.py <name> <command> [args...]     run it, append "<name>\t<seconds>"
    python3 scripts/step.py --report                        print the steps recorded, and the total
    python3 scripts/step.py --reset                         forget them

The steps go to build/ci-steps.tsv (STREAMING_ETL_STEPS overrides the path). A step that fails
is recorded with its time and its exit status, which this script exits with.
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG = os.environ.get("STREAMING_ETL_STEPS", os.path.join(ROOT, "build", "ci-steps.tsv"))


def report():
    if not os.path.exists(LOG):
        print("no steps recorded")
        return 0
    rows = [line.rstrip("\n").split("\t") for line in open(LOG, encoding="utf-8") if line.strip()]
    # Steps named background:... or parallel:... ran beside the others (a parallel group's own
    # step counts its time once); they are not part of the sum.
    total = sum(float(r[1]) for r in rows if not r[0].startswith(("background:", "parallel:")))
    width = max(len(r[0]) for r in rows + [["total of the foreground steps"]])
    print(f"{'step':<{width}}  minutes")
    for name, secs, *status in rows:
        flag = f"  (exit {status[0]})" if status and status[0] != "0" else ""
        print(f"{name:<{width}}  {float(secs) / 60:7.1f}{flag}")
    print(f"{'total of the foreground steps':<{width}}  {total / 60:7.1f}")
    return 0


def main():
    args = sys.argv[1:]
    if args == ["--report"]:
        return report()
    if args == ["--reset"]:
        if os.path.exists(LOG):
            os.remove(LOG)
        return 0
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    name, cmd = args[0], args[1:]
    t0 = time.monotonic()
    code = subprocess.call(cmd)
    secs = time.monotonic() - t0
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(f"{name}\t{secs:.1f}\t{code}\n")
    print(f"step {name}: {secs / 60:.1f} min", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
