#!/usr/bin/env python3
"""Scale-out measurements for `subscribe := true` (DuckDB 1.4.4's Python: DuckLake, a real
PostgreSQL catalog from test/python/lake.py, a broker from test/python/brokers.py).

- commits: N members (1, 2, 4, 8; DuckDB `threads = 1` each, so no client busy-polls) of one job
  on a 16-partition topic, a producer writing all the time, cycles of 50 ms: DuckLake commits per
  second into the Postgres catalog (snapshots made), in all and per member, over 10 s once every
  member owns partitions; at one member, also the catalog round trips per commit (statements
  PostgreSQL logs).
- cpu: one member, then three, in the DuckDB 1.4.4 CLI with `threads = 1`, read the same
  messages (300,000 sent to 12 partitions, or --cpu-events; what the mock cluster keeps of
  them), `append`: events per CPU-second of the members' processes (utime + stime from /proc,
  from their start), and the ratio.
- threads: one member on 12 partitions of 1.2M messages (what the mock cluster keeps of them),
  run in the DuckDB 1.4.4 CLI with `threads = 1`, then `2` (alternating, the best of three each):
  events per second from the first cycle that read to the last (the group's join is not in it),
  and the ratio (test_group.py checks that the rows do not depend on `threads`; here the mock
  cluster's retention may drop old messages between the runs).
- start: a member's start in the DuckDB 1.4.4 CLI (loading DuckLake and postgres, attaching,
  loading the extension; then joining, claiming 12 partitions, one cycle, the end), alone and
  three at once: wall, CPU, the group's join wait and the catalog commits made.
- changes: three members (the DuckDB 1.4.4 CLI, `threads = 2` each) while a producer writes; N membership changes at random (kill -9, a
  SIGSTOP past the session timeout then SIGCONT, a new member), each waited out; then the rows
  are compared with one straight single-process run: lost and doubled rows, and the pause from
  each kill to the next commit of the killed member's partitions by another member.

usage: group_scale.py [--quick] [--only commits|cpu|threads|start|changes] [--broker mock|tansu]
                      [--changes N] [--cpu-events N]
Prints one JSON line per measurement and a markdown summary at the end.
"""
import json
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
import warnings
from collections import Counter

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

import lake  # noqa: E402
from brokers import MockBroker, TansuBroker  # noqa: E402
import group  # noqa: E402
from group import (Member, assert_same, ends, job_args, lake_env, messages, owned, send,  # noqa: E402
                   straight, tables, wait_for, wait_until_committed)

WORK = os.path.join(ROOT, "bench-out", "group")


class Dir:
    """A directory under WORK that behaves like pytest's tmp_path for the helpers."""

    def __init__(self, name):
        import pathlib
        self.path = pathlib.Path(WORK) / name
        self.path.mkdir(parents=True, exist_ok=True)


def cpu_seconds(pid):
    """CPU time of a member's process (utime + stime of all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fresh(pg, name):
    d = Dir(name).path
    catalog, data = pg.new_database(), str(d / "lakedata")
    con = lake.connect(d / "reader.duckdb", group.EXT, catalog, data)
    return d, catalog, data, con


def commits(pg, broker, writers_list, seconds=10):
    out = []
    for n in writers_list:
        d, catalog, data, con = fresh(pg, f"commits{n}")
        topic = "c" + uuid.uuid4().hex[:8]
        broker.create_topic(topic, 16)
        env = lake_env(catalog, data)
        env["STREAMING_ETL_THREADS"] = "1"
        args = job_args(broker.bootstrap, "c", "", "follow=true", "max_runtime_ms=600000",
                        "checkpoint_interval_ms=50", "write_mode='append'")
        stop = threading.Event()

        def produce():
            i = 0
            while not stop.is_set():
                line = json.dumps({"key": "k", "event_time_ms": 1_000_000 + i * 10, "payload": {"value": 1}})
                send(broker.bootstrap, topic, [[("k", line)] for _ in range(16)])
                i += 1
                time.sleep(0.02)

        producer = threading.Thread(target=produce)
        producer.start()
        members = [Member(d, f"m{i}", env, topic, args) for i in range(n)]
        try:
            wait_for(lambda: len(owned(con, "c")) == n, members, f"{n} members owning partitions", timeout=300)
            snap = "SELECT max(snapshot_id) FROM ducklake_snapshots('lake')"
            before, t0 = con.execute(snap).fetchone()[0], time.time()
            time.sleep(seconds)
            after, t1 = con.execute(snap).fetchone()[0], time.time()
            rate = (after - before) / (t1 - t0)
            row = {"commits": {"writers": n, "commits_per_s": round(rate, 1), "per_writer": round(rate / n, 1)}}
            if n == 1:
                row["commits"]["statements_per_commit"] = statements_per_commit(pg, con, snap)
            print(json.dumps(row), flush=True)
            out.append(row["commits"])
        finally:
            stop.set()
            producer.join()
            for m in members:
                m.stop()
            con.close()
    return out


def statements_per_commit(pg, con, snap, seconds=3):
    """The catalog round trips of one member's commits: PostgreSQL logs every statement it is
    sent for a few seconds (`log_statement = 'all'`), divided by the snapshots made meanwhile
    (PostgreSQL's log names each statement's backend: the member's is the one that sent most)."""
    log = os.path.join(pg.directory, "log")
    size = os.path.getsize(log) if os.path.exists(log) else 0
    pg.server.psql("ALTER SYSTEM SET log_statement = 'all'; SELECT pg_reload_conf();")
    before = con.execute(snap).fetchone()[0]
    time.sleep(seconds)
    after = con.execute(snap).fetchone()[0]
    pg.server.psql("ALTER SYSTEM SET log_statement = 'none'; SELECT pg_reload_conf();")
    with open(log, errors="replace") as f:
        f.seek(size)
        text = f.read()
    per_backend = Counter(m.group(1) for m in re.finditer(r"\[(\d+)\] LOG:  (?:statement|execute [^:]*): ", text))
    # The member's backend (the reader sends a handful for its one query).
    statements = max(per_backend.values(), default=0)
    return round(statements / max(after - before, 1), 1)


def kept_messages(bootstrap, topic):
    """What the broker keeps of a topic (the mock cluster drops the oldest past ~5 MB a
    partition)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return sum(h - lo for lo, h in (c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                                        for p in range(group.PARTITIONS)))
    finally:
        c.close()


class CliMember(Member):
    """One member as a DuckDB 1.4.4 CLI process running a follow run (`threads` DuckDB threads);
    signalled, stopped and read as a Python member is."""

    def __init__(self, d, name, catalog, data, topic, args, threads=1):
        import subprocess
        sql = (f"SET extension_directory = '{lake.EXTENSION_DIRECTORY}'; {lake.setup_sql(catalog, data)} "
               f"LOAD '{group.EXT}'; SET threads = {threads}; "
               f"SELECT * FROM streaming_etl_run('{topic}', 1000, 200, "
               + ", ".join(a.replace("=", " := ", 1) for a in args) + ");")
        self.err = open(d / f"{name}.err", "w+")
        self.proc = subprocess.Popen([cli_binary(), "-unsigned", "-json", str(d / f"{name}.duckdb"), "-c", sql],
                                     stdout=subprocess.DEVNULL, stderr=self.err)


def filled_topic(broker, prefix, total):
    """A new topic of group.PARTITIONS partitions holding `total` messages (as sent: the mock
    cluster may keep fewer)."""
    topic = prefix + uuid.uuid4().hex[:8]
    broker.create_topic(topic, group.PARTITIONS)
    for start in range(0, total, 50_000):
        send(broker.bootstrap, topic, messages(start, 50_000))
    return topic


def cpu(pg, broker, total=300_000):
    topic = filled_topic(broker, "u", total)
    want = ends(broker.bootstrap, topic)
    kept = kept_messages(broker.bootstrap, topic)
    result = {"messages_kept": kept}
    for n in (1, 3):
        d, catalog, data, con = fresh(pg, f"cpu{n}")
        # Members in the DuckDB CLI, `threads = 1` each: the CPU of a process is its run's,
        # DuckDB's writes and its start (no client busy-polls, as DuckDB 1.4.4's Python does
        # while a table function runs on a worker).
        args = job_args(broker.bootstrap, f"cpu{n}", "", "follow=true", "max_runtime_ms=600000", "write_mode='append'")
        members = [CliMember(d, f"m{i}", catalog, data, topic, args) for i in range(n)]
        try:
            wait_until_committed(con, f"cpu{n}", want, members, timeout=600)
            secs = sum(cpu_seconds(m.proc.pid) for m in members)
        finally:
            for m in members:
                m.stop()
            con.close()
        result[n] = {"cpu_s": round(secs, 2), "events_per_cpu_s": round(kept / secs)}
    result["ratio_3_to_1"] = round(result[3]["events_per_cpu_s"] / result[1]["events_per_cpu_s"], 2)
    print(json.dumps({"cpu": result}), flush=True)
    return result


def cli_binary():
    """DuckDB 1.4.4's CLI (PyPI duckdb-cli, in the venv of the DuckDB 1.4 host)."""
    import duckdb_cli
    path = os.path.join(os.path.dirname(sys.executable), "duckdb")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb")
    os.chmod(path, 0o755)  # pip installs it without its execute bit
    return path


def cli_member(d, catalog, data, topic, bootstrap, threads, job, messages_in):
    """One member, a `follow` run in the DuckDB CLI that stops once it has read `messages_in`
    messages; its result rows (one per cycle)."""
    import subprocess
    args = ", ".join(a.replace("=", " := ", 1) for a in job_args(bootstrap, job, "", "follow=true",
                                                                    "checkpoint_interval_ms=100",
                                                                    f"max_messages={messages_in}",
                                                                    "max_runtime_ms=600000"))
    sql = (f"SET extension_directory = '{lake.EXTENSION_DIRECTORY}'; {lake.setup_sql(catalog, data)} "
           f"LOAD '{group.EXT}'; SET threads = {threads}; "
           f"SELECT events_consumed, elapsed_ms FROM streaming_etl_run('{topic}', 1000, 200, {args});")
    p = subprocess.run([cli_binary(), "-unsigned", "-json", str(d / f"{job}.duckdb"), "-c", sql],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout)


def threads(pg, broker, total=1_200_000):
    topic = filled_topic(broker, "t", total)
    kept = kept_messages(broker.bootstrap, topic)
    best = {}
    for rnd in range(3):
        for n in (1, 2):
            d, catalog, data, con = fresh(pg, f"threads{n}-{rnd}")
            out = cli_member(d, catalog, data, topic, broker.bootstrap, n, f"t{n}", kept)
            reading = [r for r in out if r["events_consumed"] > 0]
            first, last = reading[0], reading[-1]
            secs = (last["elapsed_ms"] - first["elapsed_ms"]) / 1000
            rate = (last["events_consumed"] - first["events_consumed"]) / secs if secs > 0 else 0
            con.close()
            if rate > best.get(n, {}).get("events_per_s", 0):
                best[n] = {"events_per_s": round(rate), "events": last["events_consumed"], "cycles": len(out)}
    result = {"messages_kept": kept, "threads": best, "speedup_2_to_1": round(best[2]["events_per_s"] / best[1]["events_per_s"], 2)}
    print(json.dumps({"threads": result}), flush=True)
    return result


def cli_timed(members_sql, timeout=600):
    """Runs DuckDB 1.4.4 CLI processes at once, each `(database, sql)`: the wall time until the
    last ends, and each one's JSON rows (their CPU is RUSAGE_CHILDREN's growth meanwhile)."""
    import subprocess
    t0 = time.time()
    procs = [subprocess.Popen([cli_binary(), "-unsigned", "-json", db, "-c", sql],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for db, sql in members_sql]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(stderr[-2000:])
        out.append(json.loads(stdout) if stdout.strip() else [])
    return time.time() - t0, out


def start(pg, broker, rounds=3):
    """A member's start: the DuckDB CLI loading DuckLake and postgres, attaching the lake and
    loading the extension (DuckDB's part), then the same with a `subscribe` run over 12
    partitions of 100 messages each that joins, claims, reads and commits once and ends
    (non-follow). One member alone, then three at once (their claims contend). Wall and CPU
    per member, the group join as the run's rows show it, and the catalog commits (DuckLake
    snapshots) the start made."""
    import resource
    topic = "s" + uuid.uuid4().hex[:8]
    broker.create_topic(topic, group.PARTITIONS)
    send(broker.bootstrap, topic, messages(0, 100 * group.PARTITIONS, keyed=False))
    prefix = lambda catalog, data: (f"SET extension_directory = '{lake.EXTENSION_DIRECTORY}'; "
                                    f"{lake.setup_sql(catalog, data)} LOAD '{group.EXT}'; ")
    snap = "SELECT count(*) FROM ducklake_snapshots('lake')"

    def children_cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    best = {}
    for rnd in range(rounds):
        for n in (1, 3):
            d, catalog, data, con = fresh(pg, f"start{n}-{rnd}")
            con.execute("SELECT 1")
            # DuckDB's part: the same process without the run.
            c0 = children_cpu()
            load_wall, _ = cli_timed([(str(d / f"l{i}.duckdb"), prefix(catalog, data) + "SELECT 1 AS x;")
                                      for i in range(n)])
            load_cpu = (children_cpu() - c0) / n
            job = f"s{n}r{rnd}"
            args = ", ".join(a.replace("=", " := ", 1) for a in job_args(broker.bootstrap, job, "",
                                                                          "checkpoint_interval_ms=100"))
            sql = (prefix(catalog, data) +
                   f"SELECT partitions, elapsed_ms, status FROM streaming_etl_run('{topic}', 1000, 200, {args});")
            before = con.execute(snap).fetchone()[0]
            c0 = children_cpu()
            wall, rows = cli_timed([(str(d / f"m{i}.duckdb"), sql) for i in range(n)])
            cpu_s = (children_cpu() - c0) / n
            snapshots = con.execute(snap).fetchone()[0] - before
            con.close()
            # The run's rows: one per cycle; the last one with no partition is the wait for the
            # group's first assignment (the coordinator's, ±1 cycle).
            joined = [max((r["elapsed_ms"] for r in rs if r["partitions"] == 0), default=0) for rs in rows]
            run_ms = [rs[-1]["elapsed_ms"] for rs in rows]
            row = {"members": n, "wall_s": round(wall, 2), "cpu_s": round(cpu_s, 2),
                   "duckdb_load_attach_cpu_s": round(load_cpu, 2), "duckdb_load_attach_wall_s": round(load_wall, 2),
                   "join_wait_ms": max(joined), "run_after_join_ms": max(r - j for r, j in zip(run_ms, joined)),
                   "catalog_commits": snapshots}
            if n not in best or row["cpu_s"] < best[n]["cpu_s"]:
                best[n] = row
    result = {"one": best[1], "three": best[3]}
    print(json.dumps({"start": result}), flush=True)
    return result


def changes(pg, broker, count, seed=7):
    rnd = random.Random(seed)
    d, catalog, data, con = fresh(pg, f"changes-{broker.name}")
    topic = "m" + uuid.uuid4().hex[:8]
    broker.create_topic(topic, group.PARTITIONS)
    env = lake_env(catalog, data)
    args = job_args(broker.bootstrap, "group", "", "follow=true", "max_runtime_ms=3600000",
                    "checkpoint_interval_ms=300")
    stop = threading.Event()
    produced = [0]

    def produce():
        # 500 messages/s: the fullest partition (5 of the 40 keys) stays within the ~5 MB the
        # mock cluster keeps of a partition over a run of 30 changes (checked at the end).
        while not stop.is_set():
            send(broker.bootstrap, topic, messages(produced[0], 250))
            produced[0] += 250
            time.sleep(0.5)

    producer = threading.Thread(target=produce)
    producer.start()

    def new_member(name):
        # In the DuckDB CLI, each member's partition tasks on two threads at once (DuckDB 1.4.4's
        # Python would busy-poll a core per member, starving the others on two cores).
        return CliMember(d, name, catalog, data, topic, args, threads=2)

    members = [new_member(f"m{i}") for i in range(3)]
    names = 3
    done = {"kill": 0, "pause": 0, "join": 0}
    pauses = []
    try:
        wait_for(lambda: len(owned(con, "group")) == 3, members, "three members owning partitions", timeout=300)
        for _ in range(count):
            alive = [m for m in members if m.proc.poll() is None]
            action = rnd.choice(["kill", "pause", "join"] if 2 <= len(alive) <= 3 else
                                (["join"] if len(alive) < 2 else ["kill", "pause"]))
            if action == "join":
                names += 1
                members.append(new_member(f"m{names}"))
                wait_for(lambda: members[-1].proc.pid in owned(con, "group"), members, "the new member", timeout=300)
            else:
                victim = max(alive, key=lambda m: owned(con, "group").get(m.proc.pid, 0))
                rows = con.execute("SELECT partition, seq FROM lake.streaming_etl_partitions WHERE job = 'group' AND owner LIKE ?",
                                   [f"% pid {victim.proc.pid} %"]).fetchall()
                seqs = dict(rows)
                t0 = time.time()
                victim.signal(signal.SIGKILL if action == "kill" else signal.SIGSTOP)
                if action == "pause" and broker.name == "tansu":
                    # tansu 0.6 expires a silent member only while the group rebalances (after
                    # max.poll.interval.ms), not at its session timeout: a member joining makes it.
                    names += 1
                    members.append(new_member(f"m{names}"))
                    done["join"] += 1

                def moved_and_committed():
                    now = dict(con.execute(
                        "SELECT partition, seq FROM lake.streaming_etl_partitions WHERE job = 'group' AND owner NOT LIKE ?",
                        [f"% pid {victim.proc.pid} %"]).fetchall())
                    return any(p in now and now[p] > s for p, s in seqs.items())

                wait_for(moved_and_committed, members, "the victim's partitions to be committed elsewhere", timeout=300)
                if action == "kill":
                    pauses.append(time.time() - t0)
                else:
                    victim.signal(signal.SIGCONT)
            done[action] += 1
            print(json.dumps({"change": action, "members": len([m for m in members if m.proc.poll() is None])}), flush=True)
        stop.set()
        producer.join()
        wait_until_committed(con, "group", ends(broker.bootstrap, topic), members, timeout=600)
    finally:
        stop.set()
        producer.join()
        for m in members:
            m.stop()
    kept = kept_messages(broker.bootstrap, topic)
    if kept != produced[0]:
        raise RuntimeError(f"the broker kept {kept} of the {produced[0]} messages produced (retention): "
                           "the straight run could not read what the members did, so the rows cannot be compared")
    got = tables(con, "")
    want = straight(d, env, con, broker.bootstrap, topic)
    from collections import Counter
    lost = sum(sum((Counter(w) - Counter(g)).values()) for g, w in zip(got, want))
    doubled = sum(sum((Counter(g) - Counter(w)).values()) for g, w in zip(got, want))
    assert_same(got, want)
    pauses.sort()
    result = {"broker": broker.name, "changes": done, "messages": produced[0], "lost": lost, "doubled": doubled,
              "kill_pause_s": {"min": round(pauses[0], 1), "median": round(pauses[len(pauses) // 2], 1),
                               "max": round(pauses[-1], 1)} if pauses else None,
              "session_timeout_ms": group.SESSION_MS}
    print(json.dumps({"changes": result}), flush=True)
    return result


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    only = args[args.index("--only") + 1] if "--only" in args else None
    broker_name = args[args.index("--broker") + 1] if "--broker" in args else "mock"
    count = int(args[args.index("--changes") + 1]) if "--changes" in args else (6 if quick else 30)
    import shutil
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    pg = lake.Postgres(os.path.join(WORK, "pg"))
    broker = TansuBroker() if broker_name == "tansu" else MockBroker()
    results = {}
    try:
        if only in (None, "commits"):
            results["commits"] = commits(pg, broker, [1, 2] if quick else [1, 2, 4, 8])
        if only in (None, "cpu"):
            events = int(args[args.index("--cpu-events") + 1]) if "--cpu-events" in args else 300_000
            results["cpu"] = cpu(pg, broker, 60_000 if quick else events)
        if only in (None, "threads"):
            results["threads"] = threads(pg, broker, 300_000 if quick else 1_200_000)
        if only in (None, "start"):
            results["start"] = start(pg, broker, 1 if quick else 3)
        if only in (None, "changes"):
            results["changes"] = changes(pg, broker, count)
    finally:
        broker.stop()
        pg.stop()
    print(json.dumps({"group": results}))


if __name__ == "__main__":
    main()
