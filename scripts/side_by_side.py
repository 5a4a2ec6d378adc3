#!/usr/bin/env python3
"""Runs test commands side by side (each keeps about one core busy; the machine has two), each
named, its output in build/logs/<name>.log; prints each one's last lines as it ends, the whole
log of one that failed, records the group's time as the step `--step` names and each one's as a
`parallel:` step (scripts/step.py), and exits 1 if any failed.

    python3 scripts/side_by_side.py --step <name> <name>=<shell command> [<name>=<shell command> ...]
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGS = os.path.join(ROOT, "build", "logs")
STEPS = os.environ.get("STREAMING_ETL_STEPS", os.path.join(ROOT, "build", "ci-steps.tsv"))


def main():
    jobs = []
    os.makedirs(LOGS, exist_ok=True)
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--step":
        print(__doc__, file=sys.stderr)
        return 2
    group, args = args[1], args[2:]
    t0 = time.monotonic()
    for arg in args:
        name, _, cmd = arg.partition("=")
        if not name or not cmd:
            print(__doc__, file=sys.stderr)
            return 2
        log = os.path.join(LOGS, f"{name}.log")
        out = open(log, "wb")
        proc = subprocess.Popen(["bash", "-c", cmd], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        jobs.append({"name": name, "proc": proc, "log": log, "out": out, "t0": time.monotonic()})
        print(f"started {name} (log: {os.path.relpath(log, ROOT)})", flush=True)
    failed = []
    pending = list(jobs)
    while pending:
        time.sleep(0.5)
        for j in list(pending):
            code = j["proc"].poll()
            if code is None:
                continue
            pending.remove(j)
            j["out"].close()
            secs = time.monotonic() - j["t0"]
            with open(STEPS, "a", encoding="utf-8") as f:
                f.write(f"parallel:{j['name']}\t{secs:.1f}\t{code}\n")
            text = open(j["log"], errors="replace").read()
            if code != 0:
                failed.append(j["name"])
                print(f"--- {j['name']} FAILED (exit {code}) after {secs / 60:.1f} min; its log:\n{text}", flush=True)
            else:
                tail = "\n".join(text.rstrip().splitlines()[-3:])
                print(f"--- {j['name']} passed in {secs / 60:.1f} min:\n{tail}", flush=True)
    code = 1 if failed else 0
    with open(STEPS, "a", encoding="utf-8") as f:
        f.write(f"{group}\t{time.monotonic() - t0:.1f}\t{code}\n")
    if failed:
        print("failed: " + ", ".join(failed), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
