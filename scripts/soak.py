#!/usr/bin/env python3
"""`make soak`: a continuous job for SOAK_MINUTES (default 10) at a steady rate, with faults, and
what its process and database do meanwhile.

A producer writes SOAK_RATE events/s (default 30,000; 50 keys, event time = the wall clock, 2%
of events 2-5 s late) into 4 files (`--variant files`), a Kafka topic of 4 partitions on
librdkafka's mock cluster (`kafka`), or files again with the output in a DuckLake whose catalog is
in PostgreSQL (`lake`, DuckDB 1.4.4). The job is the README's continuous job, `streaming_etl_run(...,
follow := true, write_mode := 'append')`, started on a new database by a plain statement (as a
user types it; `--prepared`: `PREPARE` then `EXECUTE`). Other variants: `fg-upsert` (the same in
`upsert` mode with `emit := 'update'` and `late_updates_ms`, prepared, in the foreground) and, in
the background (`background := true`, run by scripts/serve.py, the service runner), `bg-append`,
`bg-upsert` (as `fg-upsert`), `bg-sql` (a staged SQL job: a lookup join and `median`),
`bg-every` (bounded runs `every := INTERVAL '30 seconds'`) and `bg-changelog` (a table of 10,000
keys kept from a Debezium changelog, `INSERT OR REPLACE`; checked equal to the upstream table). Faults: the job is killed with SIGKILL and
started again every SOAK_KILL_EVERY seconds (default 180); halfway, the broker (`kafka`: its one
broker goes down for 10 s) or the catalog (`lake`: PostgreSQL killed and started again) is
restarted. The job's process samples every 10 s: its RSS, the database's WAL, DuckDB's temp files
(`<db>.tmp`) and `duckdb_memory()` (the background variants' service process is sampled from
outside: RSS, WAL and temp files).

At the end the producer stops, a last bounded run with `flush := true` closes every window, and
the accounting is checked: window counts + late events + dead letters = events sent, no window or
late event twice. Prints one JSON object; `--write-docs` puts the figures into docs/reliability.md
(section 'Soak') and a plot of RSS and WAL over time into docs/soak.png.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

PARTITIONS = 4
KEYS = 50
# Other data shapes (issue 65: build to the behaviour, not to one feed): SOAK_WINDOW_MS for the
# window, SOAK_KEYS for the keys of the in-process variants.
WINDOW_MS = int(os.environ.get("SOAK_WINDOW_MS", "1000"))
LATENESS_MS = 200
SAMPLE_S = 10


def ext_path():
    """The build the soak runs: copied at its start (SOAK_EXTENSION), so that a build made
    meanwhile does not change it between restarts."""
    if os.environ.get("SOAK_EXTENSION"):
        return os.environ["SOAK_EXTENSION"]
    import duckdb
    if duckdb.__version__.startswith("1.4"):
        return os.path.join(ROOT, "build", "release", "v1.4", "streaming_etl.duckdb_extension")
    return os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension")


def dir_size(path):
    total = 0
    for base, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(base, f))
            except OSError:
                pass
    return total


def rss_mb(pid="self", field="VmRSS"):
    """The process's resident memory in MB (`field`: VmRSS, or RssAnon: its anonymous pages,
    not the pages of the code it runs, which the kernel reads from the files as they are used)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# --- the job's process ----------------------------------------------------------------------


def open_db(spec):
    """The job's database, with the extension loaded and the spec's setup run."""
    import duckdb
    config = {"allow_unsigned_extensions": "true"}
    for option in ("extension_directory", "memory_limit"):
        if spec.get(option):
            config[option] = spec[option]
    con = duckdb.connect(spec["db"], config=config)
    con.execute(f"LOAD '{ext_path()}'")
    if spec.get("setup"):
        con.execute(spec["setup"])
    return con


def job_main(spec):
    """The job: one DuckDB connection runs the follow job; a second cursor samples."""
    db = spec["db"]
    con = open_db(spec)
    sampler = con.cursor()
    started = time.time()

    def sample():
        while True:
            time.sleep(SAMPLE_S)
            try:
                mem = {tag: round(used / 1e6, 1) for tag, used in sampler.execute(
                    "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0").fetchall()}
            except Exception as e:  # noqa: BLE001 (a sample that fails is reported, the job goes on)
                mem = {"error": str(e)[:100]}
            wal = db + ".wal"
            print(json.dumps({"sample": True, "t": time.time(), "uptime": round(time.time() - started, 1),
                              "rss_mb": rss_mb(), "wal_mb": os.path.getsize(wal) / 1e6 if os.path.exists(wal) else 0,
                              "tmp_mb": dir_size(db + ".tmp") / 1e6, "memory_mb": mem}), flush=True)

    threading.Thread(target=sample, daemon=True).start()
    call = call_of(spec, spec["named"])
    if spec.get("prepared"):
        con.execute(f"PREPARE soak AS SELECT * FROM {call}")
        cur = con.execute("EXECUTE soak")
    else:
        cur = con.execute(f"SELECT * FROM {call}")
    cols = [d[0] for d in cur.description]
    while True:
        rows = cur.fetchmany(1)
        if not rows:
            break
        print(json.dumps({"row": dict(zip(cols, [str(v) for v in rows[0]]))}), flush=True)
    con.close()


def heap_in_use_mb():
    """glibc's heap in use in this process (`mallinfo2()`: the arenas' allocated bytes and the
    mmapped chunks): the extension's Rust heap, SQLite, librdkafka and DuckDB's C++ objects that
    live outside its buffer manager."""
    m = mallinfo2()
    return round((m.uordblks + m.hblkhd) / 1e6, 2) if m else None


def heap_free_mb():
    """The bytes glibc's arenas hold free (`mallinfo2().fordblks`): freed by the program, kept by
    the allocator, resident where they were touched."""
    m = mallinfo2()
    return round(m.fordblks / 1e6, 2) if m else None


def mallinfo2():
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        return libc.mallinfo2()
    except (OSError, AttributeError):
        return None


def job_in_process_main(spec):
    """A background job started by this process, which then samples itself as an operator's
    process would (reading every result whole): RSS, glibc's heap in use, DuckDB's tracked
    memory and eviction queues, the WAL, and the job's row."""
    db = spec["db"]
    con = open_db(spec)
    again = os.path.exists(db + ".streaming_etl.sqlite")
    if again:
        con.execute("SELECT * FROM streaming_etl_resume()").fetchall()
    else:
        con.execute(f"SELECT * FROM {call_of(spec, spec['named'])}").fetchall()
    started = time.time()
    queues = "duckdb_eviction_queues" in {r[0] for r in con.execute(
        "SELECT function_name FROM duckdb_functions()").fetchall()}
    # SOAK_MALLOC_TRIM=1: the sampler gives glibc's free pages back before each sample, to tell
    # memory the allocator keeps from memory in use.
    trim = os.environ.get("SOAK_MALLOC_TRIM") == "1"
    while True:
        time.sleep(SAMPLE_S)
        if trim:
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        tracked = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchall()[0][0]
        mem = {tag: round(used / 1e6, 1) for tag, used in con.execute(
            "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0").fetchall()}
        nodes = dead = per_queue = None
        if queues:
            nodes, dead, per_queue = con.execute(
                "SELECT sum(approximate_size), sum(dead_nodes), list(approximate_size ORDER BY queue_index) "
                "FROM duckdb_eviction_queues()").fetchall()[0]
        cur = con.execute("SELECT * FROM streaming_etl_jobs()")
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
        wanted = ("state", "events_consumed", "open_windows", "state_bytes", "wal_bytes", "warning")
        job = {k: str(v) for k, v in zip(cols, rows[0]) if k in wanted} if rows else None
        wal = db + ".wal"
        rss = rss_mb()
        anon = rss_mb(field="RssAnon")
        print(json.dumps({"sample": True, "t": time.time(), "uptime": round(time.time() - started, 1),
                          "rss_mb": rss, "rss_anon_mb": anon,
                          "untracked_anon_mb": round(anon - tracked / 1e6, 2) if anon else None,
                          "wal_mb": os.path.getsize(wal) / 1e6 if os.path.exists(wal) else 0,
                          "tmp_mb": dir_size(db + ".tmp") / 1e6, "memory_mb": mem, "tracked_mb": round(tracked / 1e6, 2),
                          "untracked_mb": round(rss - tracked / 1e6, 2) if rss else None, "heap_mb": heap_in_use_mb(),
                          "heap_free_mb": heap_free_mb(),
                          "queue_nodes": nodes, "dead_nodes": dead, "queues": per_queue, "job": job}),
              flush=True)


# --- producers ------------------------------------------------------------------------------


class Producer:
    """Writes `rate` events/s over `keys` keys until stopped; counts what it sent."""

    def __init__(self, rate, write, keys=KEYS, changelog=False):
        self.rate, self.write, self.keys = rate, write, keys
        self.sent = 0
        # `changelog`: Debezium change events of a table of `keys` rows (each key in partition
        # key % PARTITIONS), and the table as it is after them.
        self.changelog = changelog
        self.table = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        rnd = random.Random(7)
        tick = 0.1
        per_tick = int(self.rate * tick)
        next_t = time.time()
        while not self.stopped.is_set():
            now_ms = int(time.time() * 1000)
            lines = [[] for _ in range(PARTITIONS)]
            for _ in range(per_tick if self.changelog else 0):
                k = rnd.randrange(self.keys)
                before = self.table.get(k)
                if before is not None and rnd.random() < 0.1:
                    op, after = "d", None
                    del self.table[k]
                else:
                    op = "u" if before is not None else "c"
                    after = {"id": k, "name": f"n{k}-{self.sent}", "v": self.sent % 1000}
                    self.table[k] = after
                lines[k % PARTITIONS].append(json.dumps(
                    {"before": before, "after": after, "op": op, "ts_ms": now_ms, "source": {"table": "customers"}}))
                self.sent += 1
            for _ in range(0 if self.changelog else per_tick):
                i = self.sent
                t = now_ms - rnd.randint(0, 150)
                if rnd.random() < 0.02:
                    t -= rnd.randint(2000, 5000)
                lines[i % PARTITIONS].append(json.dumps(
                    {"key": f"k{i % self.keys}", "event_time_ms": t, "payload": {"value": i % 100}}))
                self.sent += 1
            self.write(lines)
            next_t += tick
            time.sleep(max(0.0, next_t - time.time()))

    def stop(self):
        self.stopped.set()
        self.thread.join()


def file_writer(directory):
    os.makedirs(directory, exist_ok=True)
    files = [open(os.path.join(directory, f"part-{p}.ndjson"), "a") for p in range(PARTITIONS)]

    def write(lines):
        for f, ls in zip(files, lines):
            if ls:
                f.write("\n".join(ls) + "\n")
                f.flush()
    return write


def kafka_writer(bootstrap, topic):
    from confluent_kafka import Producer as KP
    p = KP({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
            "queue.buffering.max.messages": 1000000})

    def write(lines):
        for part, ls in enumerate(lines):
            for line in ls:
                while True:
                    try:
                        p.produce(topic, line.encode(), partition=part)
                        break
                    except BufferError:
                        p.poll(0.05)
        p.poll(0)
    write.flush = lambda: p.flush(60)
    return write


# --- the soak -------------------------------------------------------------------------------


def call_of(spec, named):
    """The job's call with these named arguments."""
    if spec.get("sql"):
        return f"streaming_etl_sql('{spec['topic']}', $${spec['sql']}$$, lateness_ms := {LATENESS_MS}{named})"
    return f"streaming_etl_run('{spec['topic']}', {WINDOW_MS}, {LATENESS_MS}{named})"


class Job:
    def __init__(self, spec, log, again=False):
        self.started = time.time()
        self.samples = []
        self.rows = 0
        self.serving = None
        if spec.get("in_process"):
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--job-in-process", json.dumps(spec)],
                                         stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        elif spec.get("background"):
            # The service runner: it starts the job in the background and waits, no statement open.
            jobs_sql = os.path.join(os.path.dirname(spec["db"]), "jobs.sql")
            with open(jobs_sql, "w") as f:
                f.write((spec.get("setup") or "") + ";\n" + f"SELECT * FROM {call_of(spec, spec['named'])};\n")
            # Started again after a kill, it resumes what the last process left running, as a
            # service's restart would (`--resume`: streaming_etl_resume()).
            start = ["--resume"] if again else ["--sql", jobs_sql]
            cmd = [sys.executable, os.path.join(ROOT, "scripts", "serve.py"), spec["db"], *start,
                   "--extension", ext_path(), "--status-every", "10"]
            if spec.get("extension_directory"):
                cmd += ["--config", f"extension_directory={spec['extension_directory']}"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
            threading.Thread(target=self.sample_outside, args=(spec["db"],), daemon=True).start()
        else:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--job", json.dumps(spec)],
                                         stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def sample_outside(self, db):
        """RSS, WAL and temp files of a process that does not sample itself."""
        while self.proc.poll() is None:
            time.sleep(SAMPLE_S)
            rss = rss_mb(self.proc.pid)
            if rss is None:
                return
            wal = db + ".wal"
            self.samples.append({"sample": True, "t": time.time(), "uptime": round(time.time() - self.started, 1),
                                 "rss_mb": rss, "wal_mb": os.path.getsize(wal) / 1e6 if os.path.exists(wal) else 0,
                                 "tmp_mb": dir_size(db + ".tmp") / 1e6, "pid": self.proc.pid})

    def read(self):
        for line in self.proc.stdout:
            if line.startswith("serving "):  # serve.py: "serving N job(s); ..."
                self.serving = int(line.split()[1])
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("sample"):
                obj["pid"] = self.proc.pid
                self.samples.append(obj)
            elif "row" in obj:
                self.rows += 1

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.thread.join(timeout=5)


def final_run(spec):
    """A bounded run with flush: every window closes; returns the accounting."""
    import duckdb
    config = {"allow_unsigned_extensions": "true"}
    if spec.get("extension_directory"):
        config["extension_directory"] = spec["extension_directory"]
    opened = time.time()
    con = duckdb.connect(spec["db"], config=config)
    open_s = time.time() - opened
    con.execute(f"LOAD '{ext_path()}'")
    if spec.get("setup"):
        con.execute(spec["setup"])
    named = spec["named"]
    for bg in (", follow := true", ", background := true", ", every := INTERVAL '30 seconds'"):
        named = named.replace(bg, "")
    con.execute(f"SELECT * FROM {call_of(spec, named + ', flush := true')}").fetchall()
    w, late, dead = spec["tables"]
    if spec.get("expected"):
        # A kept table: every change sent counts once it equals the upstream table.
        with open(spec["expected"]) as f:
            want = json.load(f)
        got = [list(r) for r in con.execute(f"SELECT id, name, v FROM {w} ORDER BY id").fetchall()]
        dead_n = con.execute(f"SELECT count(*) FROM {dead}").fetchall()[0][0]
        con.close()
        return {"in_windows": want["sent"] - dead_n if got == want["rows"] else 0, "late": 0, "dead": dead_n,
                "duplicate_windows": 0, "duplicate_late": 0, "open_after_kill_s": round(open_s, 2)}
    count = spec.get("count_column", "count")
    counted = con.execute(f"SELECT coalesce(sum({count}), 0) FROM {w}").fetchall()[0][0]
    # A late event that updated its window's row (`late_updates_ms`, applied) is counted there.
    late_cols = {r[0] for r in con.execute(f"DESCRIBE {late}").fetchall()}
    not_applied = " WHERE NOT coalesce(applied, false)" if "applied" in late_cols else ""
    late_n = con.execute(f"SELECT count(*) FROM {late}{not_applied}").fetchall()[0][0]
    dead_n = con.execute(f"SELECT count(*) FROM {dead}").fetchall()[0][0]
    keys = spec.get("window_key", "key, window_start_ms")
    dup_w = con.execute(f"SELECT count(*) FROM (SELECT {keys} FROM {w} GROUP BY ALL HAVING count(*) > 1)").fetchall()[0][0]
    dup_l = con.execute(f'SELECT count(*) FROM (SELECT partition, "offset" FROM {late} GROUP BY ALL HAVING count(*) > 1)').fetchall()[0][0]
    con.close()
    return {"in_windows": int(counted), "late": late_n, "dead": dead_n, "duplicate_windows": dup_w,
            "duplicate_late": dup_l, "open_after_kill_s": round(open_s, 2)}


def final_in_child(spec):
    """The last run, in a process of its own that then exits (as a scheduled job does): the
    accounting, and the WAL that process left behind."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--final", json.dumps(spec)],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    acct = json.loads(out.stdout.strip().splitlines()[-1])
    wal = spec["db"] + ".wal"
    acct["wal_after_exit_mb"] = round(os.path.getsize(wal) / 1e6, 2) if os.path.exists(wal) else 0
    return acct


# The staged SQL job of `bg-sql`: a lookup join and a holistic aggregate, per region and second.
SQL_JOB = ("INSERT INTO by_region SELECT r.region, window_start, count(*) AS n, median(s.v) AS median_v "
           "FROM TUMBLE(stream, event_time, INTERVAL '1 second') AS s JOIN regions AS r ON r.key = s.key GROUP BY ALL")
REGIONS = ("CREATE TABLE IF NOT EXISTS regions AS SELECT 'k' || i AS key, 'r' || (i % 5) AS region "
           f"FROM range({KEYS}) t(i)")
UPSERT_UPDATE = ", follow := true, emit := 'update', late_updates_ms := 5000"
# `bg-memory` fails when the process's memory outside DuckDB's tracked memory grows more than this
# from minute 2 to the end.
UNTRACKED_GROWTH_MAX_MB = 10
# variant: (what the job does, its named arguments, runs in the background)
VARIANTS = {
    "files": ("files, append", ", follow := true, write_mode := 'append'", False),
    "kafka": ("kafka, append", ", follow := true, write_mode := 'append'", False),
    "lake": ("lake, append", ", follow := true, write_mode := 'append'", False),
    "fg-upsert": ("files, upsert + update + late updates, PREPARE/EXECUTE", UPSERT_UPDATE, False),
    "bg-append": ("files, append", ", follow := true, write_mode := 'append', background := true", True),
    "bg-upsert": ("files, upsert + update + late updates", UPSERT_UPDATE + ", background := true", True),
    "bg-upsert-close": ("files, upsert", ", follow := true, background := true", True),
    "bg-sql": ("files, SQL job: lookup join + median", ", follow := true, background := true, "
               "columns := {'key': 'VARCHAR', 'payload.value AS v': 'DOUBLE'}", True),
    "bg-every": ("files, append, every 30 s", ", write_mode := 'append', every := INTERVAL '30 seconds'", True),
    "bg-changelog": ("files, a table kept from a Debezium changelog", ", follow := true, background := true, "
                     "envelope := 'debezium', primary_key := ['id'], columns := {'id': 'BIGINT', 'name': 'VARCHAR', 'v': 'BIGINT'}",
                     True),
    # Issue 65's job: one process for the whole run, which samples itself.
    "bg-memory": ("files, upsert + update + late updates, 200 keys, memory_limit 128MB, one process sampling itself",
                  UPSERT_UPDATE + ", background := true", True),
    "bg-memory-kafka": ("kafka, upsert + update + late updates, 200 keys, memory_limit 128MB, one process sampling itself",
                        UPSERT_UPDATE + ", background := true", True),
}


def soak(variant, minutes, rate, kill_every, prepared, label=None, in_process=False):
    work = os.path.join(ROOT, "bench-out", f"soak-{variant}{'-prepared' if prepared else ''}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    db = os.path.join(work, "soak.duckdb")
    what, named, background = VARIANTS[variant]
    prepared = prepared or variant == "fg-upsert"
    spec = {"db": db, "prepared": prepared, "named": named, "background": background,
            "tables": ("windows", "late_events", "dead_letters")}
    keys = KEYS
    if variant.startswith("bg-memory") or (in_process and background):
        # One process for the whole run, sampling itself (never killed).
        spec.update(in_process=True, memory_limit="128MB")
        kill_every = minutes * 60 + 60
        if variant.startswith("bg-memory"):
            keys = 200
        else:
            label = label or f"background: {what}, memory_limit 128MB, one process sampling itself"
        keys = int(os.environ.get("SOAK_KEYS", keys))
    if variant == "bg-sql":
        spec.update(sql=SQL_JOB, setup=REGIONS, count_column="n", window_key="region, window_start",
                    tables=("by_region", "late_events", "dead_letters"))
    if variant == "bg-changelog":
        keys = int(os.environ.get("SOAK_KEYS", 10_000))
        spec.update(sql="INSERT OR REPLACE INTO customers SELECT id, name, v FROM stream",
                    tables=("customers", "late_events", "dead_letters"))
    if variant.startswith("bg-"):
        label = label or f"background: {what}"
    elif variant == "fg-upsert":
        label = label or f"foreground: {what}"
    broker = pg = None
    if variant in ("kafka", "bg-memory-kafka"):
        from brokers import MockBroker
        broker = MockBroker(1)
        broker.create_topic("soak", PARTITIONS)
        writer = kafka_writer(broker.bootstrap, "soak")
        spec["topic"] = "soak"
        spec["named"] += f", brokers := '{broker.bootstrap}'"
    else:
        writer = file_writer(os.path.join(work, "data"))
        spec["topic"] = f"file:{work}/data/*.ndjson"
    if variant == "lake":
        import lake
        pg = lake.Postgres(os.path.join(work, "pg"))
        catalog = pg.new_database()
        spec["setup"] = lake.setup_sql(catalog, os.path.join(work, "lakedata"))
        spec["extension_directory"] = lake.EXTENSION_DIRECTORY
        spec["named"] += ", windows_table := 'lake.windows'"
        spec["tables"] = ("lake.windows", "lake.late_events", "lake.dead_letters")
    log = open(os.path.join(work, "job.log"), "w")
    producer = Producer(rate, writer, keys, changelog=variant == "bg-changelog")
    began = time.time()
    end = began + minutes * 60
    jobs = [Job(spec, log)]
    kills = restarts = 0
    fault_done = False
    next_kill = began + kill_every
    while time.time() < end:
        time.sleep(1)
        if restarts > 20:
            raise RuntimeError("the job keeps failing: see " + log.name)
        now = time.time()
        job = jobs[-1]
        if job.proc.poll() is not None:
            # The job ended by itself (a failed commit while the catalog was away): a service
            # manager starts it again.
            restarts += 1
            jobs.append(Job(spec, log, again=True))
        elif now >= next_kill and now < end - 30:
            job.kill()
            kills += 1
            jobs.append(Job(spec, log, again=True))
            next_kill = now + kill_every
        if not fault_done and now >= began + minutes * 30:
            fault_done = True
            if broker is not None and not variant.startswith("bg-memory"):
                broker.command("down 1")
                time.sleep(10)
                broker.command("up 1")
            if pg is not None:
                pg.kill()
                time.sleep(5)
                pg.start()
    producer.stop()
    if hasattr(writer, "flush"):
        writer.flush()
    # Let the job catch up with the last events, then stop it as a user would (SIGKILL is the
    # harder case; the last run settles what it left).
    time.sleep(5)
    jobs[-1].kill()
    if variant == "bg-changelog":
        # The last run's check: the kept table against the upstream one the producer kept.
        spec["expected"] = os.path.join(work, "expected.json")
        with open(spec["expected"], "w") as f:
            json.dump({"sent": producer.sent, "rows": sorted([r["id"], r["name"], r["v"]] for r in producer.table.values())}, f)
    acct = final_in_child(spec)
    sent = producer.sent
    accounted = acct["in_windows"] + acct["late"] + acct["dead"]
    samples = sorted((s for j in jobs for s in j.samples), key=lambda s: s["t"])
    for s in samples:
        s["at_s"] = round(s["t"] - began, 1)
    after_first_minute = [s for s in samples if s["at_s"] >= 60]
    first = [s for s in samples if s["pid"] == jobs[0].proc.pid]
    later = [s for s in samples if s["pid"] != jobs[0].proc.pid]

    def peak(xs, k):
        vals = [x[k] for x in xs if x.get(k) is not None]
        return round(max(vals), 1) if vals else None

    def growth(xs):
        """RSS growth of each job process after its first minute, the largest."""
        out = None
        for j in jobs:
            mine = [x for x in xs if x["pid"] == j.proc.pid and x["uptime"] >= 60 and x.get("rss_mb")]
            if len(mine) >= 2:
                g = max(x["rss_mb"] for x in mine) - mine[0]["rss_mb"]
                out = g if out is None else max(out, g)
        return None if out is None else round(out, 1)

    def slope(key, after_s=120):
        """The steepest per-process least-squares slope of `key` after `after_s` of uptime, in MB
        per hour (a process sampled for at least a minute more)."""
        out = None
        for j in jobs:
            pts = [(x["uptime"], x[key]) for x in samples
                   if x["pid"] == j.proc.pid and x["uptime"] >= after_s and x.get(key) is not None]
            if len(pts) < 6:
                continue
            n = len(pts)
            mx = sum(p[0] for p in pts) / n
            my = sum(p[1] for p in pts) / n
            var = sum((p[0] - mx) ** 2 for p in pts)
            if var == 0:
                continue
            b = sum((p[0] - mx) * (p[1] - my) for p in pts) / var * 3600
            out = b if out is None else max(out, b)
        return None if out is None else round(out, 1)

    def change(key, after_s=120):
        """How much `key` changed from minute 2 to the end of the longest process: the mean of its
        last minute's samples minus the mean of its samples in the minute after `after_s`."""
        j = max(jobs, key=lambda j: sum(1 for x in samples if x["pid"] == j.proc.pid))
        mine = [x for x in samples if x["pid"] == j.proc.pid and x.get(key) is not None]
        start = [x[key] for x in mine if after_s <= x["uptime"] < after_s + 60]
        end_at = mine[-1]["uptime"] if mine else 0
        end = [x[key] for x in mine if x["uptime"] > end_at - 60]
        if not start or not end or end_at < after_s + 120:
            return None
        return round(sum(end) / len(end) - sum(start) / len(start), 1)

    # A background job started again must have been resumed (else the last run did all the work).
    resumed_all = all(j.serving == 1 for j in jobs) if background and not spec.get("in_process") else True
    result = {
        "variant": label or ("foreground: " + what + (", PREPARE/EXECUTE" if prepared else "")),
        "minutes": minutes, "rate": rate,
        "sent": sent, "accounted": accounted, "exact": accounted == sent and not acct["duplicate_windows"]
        and not acct["duplicate_late"] and resumed_all, **acct, "every_restart_resumed_its_job": resumed_all, "kills": kills, "restarts_after_fault": restarts,
        "fault": {"kafka": "broker down 10 s", "lake": "PostgreSQL killed and restarted"}.get(variant, "-"),
        "wal_peak_mb": peak(samples, "wal_mb"), "wal_peak_first_run_mb": peak(first, "wal_mb"),
        "wal_peak_later_runs_mb": peak(later, "wal_mb"), "tmp_peak_mb": peak(samples, "tmp_mb"),
        "rss_growth_after_first_minute_mb": growth(samples), "rss_peak_mb": peak(after_first_minute, "rss_mb"),
        "rss_slope_mb_per_h": slope("rss_mb"),
        "samples": samples,
    }
    if spec.get("in_process"):
        # Issue 65's goals, from minute 2 to the end of the one process.
        result.update({
            "untracked_growth_mb": change("untracked_mb"), "untracked_anon_growth_mb": change("untracked_anon_mb"),
            "heap_growth_mb": change("heap_mb"), "heap_free_growth_mb": change("heap_free_mb"),
            "queue_nodes_growth": change("queue_nodes"), "untracked_slope_mb_per_h": slope("untracked_mb"),
            "heap_slope_mb_per_h": slope("heap_mb"),
        })
        grown = result["untracked_growth_mb"]
        result["memory_flat"] = grown is not None and grown <= UNTRACKED_GROWTH_MAX_MB
    if broker is not None:
        broker.stop()
    if pg is not None:
        pg.stop()
    log.close()
    return result


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in results:
        xs = [s["at_s"] / 60 for s in r["samples"]]
        axes[0].plot(xs, [s["rss_mb"] for s in r["samples"]], ".-", label=r["variant"], markersize=3)
        axes[1].plot(xs, [s["wal_mb"] for s in r["samples"]], ".-", label=r["variant"], markersize=3)
    axes[0].set_ylabel("job RSS (MB)")
    axes[1].set_ylabel("WAL (MB)")
    axes[1].axhline(16.8, color="grey", linestyle="--", linewidth=0.8)
    axes[1].text(0, 17.3, "checkpoint_threshold (16 MiB)", fontsize=7, color="grey")
    axes[1].set_xlabel("minutes (the job is killed with SIGKILL and started again every few minutes)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    memory = [r for r in results if "untracked_growth_mb" in r]
    if memory:
        fig, ax = plt.subplots(1, 1, figsize=(9, 4))
        for r in memory:
            xs = [s["at_s"] / 60 for s in r["samples"]]
            for key, what in (("rss_mb", "RSS"), ("untracked_mb", "RSS minus DuckDB's tracked memory"),
                              ("heap_mb", "glibc's heap in use")):
                ax.plot(xs, [s.get(key) for s in r["samples"]], ".-", label=what, markersize=3)
        ax.set_ylabel("MB")
        ax.set_xlabel("minutes (one process, memory_limit = '128MB')")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path.replace(".png", "_memory.png"), dpi=90)


def write_docs(results):
    rows = ["| run | minutes | events/s | events | kills | fault | WAL peak MB (first run / later) | temp files peak MB | RSS growth after 1st min MB | RSS slope after minute 2, MB/h | exact | WAL after exit MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['variant']} | {r['minutes']} | {r['rate']:,} | {r['sent']:,} | {r['kills']} | {r['fault']} | "
                    f"{r['wal_peak_mb']} ({r['wal_peak_first_run_mb']} / {r['wal_peak_later_runs_mb'] if r['wal_peak_later_runs_mb'] is not None else '-'}) | {r['tmp_peak_mb']} | "
                    f"{r['rss_growth_after_first_minute_mb']} | {r.get('rss_slope_mb_per_h', '-')} | {'yes' if r['exact'] else 'NO'} | {r['wal_after_exit_mb']} |")
    memory = [r for r in results if "untracked_growth_mb" in r]
    if memory:
        rows += ["", "One process for the whole run, sampling itself (from minute 2 to the end):", "",
                 "| run | minutes | RSS MB (end) | DuckDB's tracked memory MB (end) | untracked growth MB | untracked slope MB/h | glibc heap growth MB | heap slope MB/h | eviction queue nodes growth | WAL peak MB | exact |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in memory:
            last = r["samples"][-1] if r["samples"] else {}
            rows.append(f"| {r['variant']} | {r['minutes']} | {last.get('rss_mb', 0):.0f} | {last.get('tracked_mb', '-')} | "
                        f"{r['untracked_growth_mb']} | {r['untracked_slope_mb_per_h']} | {r['heap_growth_mb']} | {r['heap_slope_mb_per_h']} | "
                        f"{r['queue_nodes_growth']} | {r['wal_peak_mb']} | {'yes' if r['exact'] else 'NO'} |")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from docs_section import write_section
    write_section("docs/reliability.md", "soak", "make soak", "\n".join(rows))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--job":
        job_main(json.loads(args[1]))
        return
    if args and args[0] == "--job-in-process":
        job_in_process_main(json.loads(args[1]))
        return
    if args and args[0] == "--final":
        print(json.dumps(final_run(json.loads(args[1]))))
        return
    out = os.path.join(ROOT, "bench-out", "soak.json")
    if "--plot-only" in args:
        results = json.load(open(out))
        plot(results, os.path.join(ROOT, "docs", "soak.png"))
        write_docs(results)
        return
    minutes = float(os.environ.get("SOAK_MINUTES", "10"))
    rate = int(os.environ.get("SOAK_RATE", "30000"))
    kill_every = float(os.environ.get("SOAK_KILL_EVERY", "180"))
    variants = [a.split("=", 1)[1] for a in args if a.startswith("--variant=")] or ["files"]
    if not os.environ.get("SOAK_EXTENSION"):
        # (The file's name is the extension's: DuckDB looks for its entrypoint by it.)
        directory = os.path.join(ROOT, "bench-out", f"soak-ext-{os.getpid()}")
        os.makedirs(directory, exist_ok=True)
        copy = os.path.join(directory, "streaming_etl.duckdb_extension")
        shutil.copy(ext_path(), copy)
        os.environ["SOAK_EXTENSION"] = copy
    prepared = "--prepared" in args
    label = next((a.split("=", 1)[1] for a in args if a.startswith("--label=")), None)
    in_process = "--in-process" in args
    results = []
    for v in variants:
        r = soak(v, minutes, rate, kill_every, prepared, label, in_process)
        shown = {k: v for k, v in r.items() if k != "samples"}
        print(json.dumps(shown), flush=True)
        results.append(r)
    old = json.load(open(out)) if os.path.exists(out) else []
    keep = [o for o in old if o["variant"] not in {r["variant"] for r in results}]
    json.dump(keep + results, open(out, "w"))
    if "--write-docs" in args:
        all_results = keep + results
        plot(all_results, os.path.join(ROOT, "docs", "soak.png"))
        write_docs(all_results)
    if not all(r["exact"] and r.get("memory_flat", True) for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
