#!/usr/bin/env python3
"""Long installs that the tests need late (tansu, the fuzz targets) built in the background while
the builds and the first tests run, instead of a quarter hour of their own before them
(docs/development.md: CI and its budget). Each runs in a session of its own: under the kernel's
autogroup scheduling it gets an equal share of the cores (its `nice` only orders it within its
session), so it is done before the tests that need it.

    python3 scripts/background.py start <name> <command> [args...]   start it, unless done or running
    python3 scripts/background.py wait <name>                        wait for it; exit with its status

Each command runs under `nice -n 19`, its output in build/background/<name>.log; its exit status
goes to build/background/<name>.status once it ends. `wait` on a name never started returns 0
(nothing to wait for), so a target that installed the tool itself needs no background.
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "build", "background")


def paths(name):
    base = os.path.join(DIR, name)
    return base + ".log", base + ".status", base + ".pid"


def alive(pid_file):
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def start(name, cmd):
    log, status, pid_file = paths(name)
    os.makedirs(DIR, exist_ok=True)
    if alive(pid_file):
        print(f"background {name}: already running")
        return 0
    for p in (status, pid_file):
        if os.path.exists(p):
            os.remove(p)
    # The shell writes the status once the command ends, whatever happens to this process.
    script = 'nice -n 19 "$@"; echo $? > "$STATUS_FILE"'
    with open(log, "wb") as out:
        proc = subprocess.Popen(["sh", "-c", script, "sh", *cmd], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, STATUS_FILE=status))
    with open(pid_file, "w") as f:
        f.write(str(proc.pid))
    print(f"background {name}: started (log: {os.path.relpath(log, ROOT)})")
    return 0


def wait(name):
    log, status, pid_file = paths(name)
    if not os.path.exists(pid_file) and not os.path.exists(status):
        return 0
    t0 = time.monotonic()
    while not os.path.exists(status):
        if not alive(pid_file) and not os.path.exists(status):
            time.sleep(0.5)
            if not os.path.exists(status):
                print(f"background {name}: ended without a status; see {log}", file=sys.stderr)
                return 1
        time.sleep(1)
    with open(status) as f:
        code = int(f.read().strip() or 1)
    waited = time.monotonic() - t0
    print(f"background {name}: done (exit {code}), waited {waited / 60:.1f} min", flush=True)
    if code != 0:
        with open(log, errors="replace") as f:
            sys.stderr.write(f.read()[-4000:])
    return code


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "start":
        return start(sys.argv[2], sys.argv[3:])
    if len(sys.argv) == 3 and sys.argv[1] == "wait":
        return wait(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
