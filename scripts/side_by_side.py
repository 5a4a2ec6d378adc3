#!/usr/bin/env python3
"""Runs test commands side by side (each keeps about one core busy; the machine has two), each
named, its output in build/logs/<name>.log; prints each one's last lines as it ends, the whole
log of one that failed, records each one's time as a step (scripts/step.py), and exits 1 if any
failed.

    python3 scripts/side_by_side.py <name>=<shell command> [<name>=<shell command> ...]
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
    for arg in sys.argv[1:]:
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
                f.write(f"{j['name']}\t{secs:.1f}\t{code}\n")
            text = open(j["log"], errors="replace").read()
            if code != 0:
                failed.append(j["name"])
                print(f"--- {j['name']} FAILED (exit {code}) after {secs / 60:.1f} min; its log:\n{text}", flush=True)
            else:
                tail = "\n".join(text.rstrip().splitlines()[-3:])
                print(f"--- {j['name']} passed in {secs / 60:.1f} min:\n{tail}", flush=True)
    if failed:
        print("failed: " + ", ".join(failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
