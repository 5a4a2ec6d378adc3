#!/usr/bin/env python3
"""Latency and CPU of a continuous (`follow := true`) streaming_etl job, for Kafka and for files.

What is measured, per source:
- A producer (this process) sends events at a steady rate for `seconds`, spread over 50 keys and
  4 partitions (Kafka: the mock broker of test/python/brokers.py; files: 4 NDJSON files appended
  to), with event time = the wall clock when the event is sent.
- The job runs in a child process (Python + DuckDB + the extension, nothing else):
  `streaming_etl_run(topic, 1000, 200, follow := true)` at the default checkpoint cycle, in a
  thread (or, in the background rows, with `background := true`: on the extension's own thread),
  while a watcher thread on another cursor polls the `windows` table every 10 ms and notes when
  each (window, key) row first became visible.
- Latency of a row = first seen - (window_end_ms + lateness_ms), i.e. how long after the
  watermark could first pass the window's end (given event time = wall clock) its row was
  committed. The poll's start time counts as "first seen" (the row was committed before that
  snapshot), so the figure errs by at most one poll interval upwards. Only windows that start
  after the producer started and that events sent before it stopped close are counted; an
  expected row that never appears is reported in windows_missing.
  Windows and cycles are both 1000 ms long, so within one run the latency mostly reflects where
  the run's cycle boundaries fall relative to the window ends (one phase per run, drifting only
  as much as the cycle length exceeds 1000 ms); min_latency_ms shows how narrow that is. Across
  runs, p99 ranges between about the processing delay and one cycle plus it.
- CPU, as % of one core, of the whole child process (utime + stime over all its threads):
  streaming = while the producer runs, minus the watcher thread's own CPU time; idle = for
  `idle_seconds` after the producer stopped and the last windows were committed, with the
  watcher stopped (nothing else runs in the process: the job's own cost of waiting). The
  watcher's queries run on its own thread (checked: process CPU with the watcher on an idle job
  = the watcher thread's CPU + the idle figure), so subtracting its thread time is exact enough.

- Stop: from asking the job to stop (a foreground run: the client's interrupt; a background job:
  `streaming_etl_stop`) to its run being over, everything read committed.

Goals: p99 within one checkpoint cycle + 100 ms, in the foreground and in the background; idle
under 2% of a core; a background job's stop within one cycle + 1 s.

usage: bench_latency.py [seconds [idle_seconds]]   prints JSON lines, then a Markdown table
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

EXT = os.environ.get("STREAMING_ETL_EXTENSION") or os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension")
WINDOW, LATENESS, CYCLE = 1000, 200, 1000  # CYCLE: the default checkpoint_interval_ms
RATE, KEYS, PARTITIONS = 10_000, 50, 4
POLL_S = 0.010
SETTLE_S = 2.0  # after the producer stops: the last closed windows' commit (one cycle) and margin


def now_ms():
    return time.time() * 1000


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Watcher(threading.Thread):
    """Polls the windows table; notes the first time each (window_start, key) row was seen."""

    def __init__(self, cur):
        super().__init__(daemon=True)
        self.cur, self.halt = cur, threading.Event()
        self.seen = {}  # (window_start_ms, key) -> (first seen ms, window_end_ms)
        self.cpu = 0.0  # this thread's CPU seconds so far
        self.polls = 0

    def run(self):
        t0, hi = time.thread_time(), None
        while not self.halt.is_set():
            start = now_ms()
            try:
                where = "" if hi is None else f" WHERE window_start_ms >= {hi}"
                rows = self.cur.execute(f"SELECT window_start_ms, window_end_ms, key FROM windows{where}").fetchall()
            except Exception:  # the table does not exist yet
                rows = []
            for s, e, k in rows:
                self.seen.setdefault((s, k), (start, e))
                hi = s if hi is None else max(hi, s)
            self.polls += 1
            self.cpu = time.thread_time() - t0
            time.sleep(max(0.0, POLL_S - (now_ms() - start) / 1000))

    def stop(self):
        self.halt.set()
        self.join()


def child(cfg):
    """The DuckDB side. Protocol on stdin/stdout: prints `ready` once the job runs; reads
    `stop <start_ms> <stop_ms>` when the producer is done; prints its measurements as JSON."""
    import duckdb

    con = duckdb.connect(cfg["db"], config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    named = "".join(f", {k} := {v}" for k, v in cfg["named"].items())
    background = cfg.get("background", False)
    if background:
        named += ", background := true, job := 'latency'"
    sql = f"SELECT * FROM streaming_etl_run('{cfg['topic']}', {WINDOW}, {LATENESS}, follow := true{named})"
    run_cur, result = con.cursor(), {}

    def go():
        try:
            result["rows"] = run_cur.execute(sql).fetchall()
        except duckdb.InterruptException:  # how this benchmark ends the run
            pass
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"

    runner = threading.Thread(target=go, daemon=True)
    if background:
        go()  # returns at once; the job runs on the extension's own thread and connection
        done = threading.Event()
        runner = threading.Thread(target=done.wait, daemon=True)
        runner.start()
    else:
        runner.start()
    watcher = Watcher(con.cursor())
    probe = con.cursor()
    deadline = time.time() + 30
    while time.time() < deadline and runner.is_alive():  # the job has started: its checkpoint lists the partitions
        try:
            if probe.execute("SELECT count(*) FROM streaming_etl_checkpoint()").fetchone()[0] >= PARTITIONS:
                break
        except Exception:
            pass
        time.sleep(0.05)
    watcher.start()
    c0, w0 = cpu_s(), watcher.cpu
    t0 = time.perf_counter()
    print("ready", flush=True)

    cmd = sys.stdin.readline().split()  # the producer is done
    c1, w1 = cpu_s(), watcher.cpu
    t1 = time.perf_counter()
    assert cmd and cmd[0] == "stop", cmd
    start_ms, stop_ms = float(cmd[1]), float(cmd[2])
    time.sleep(SETTLE_S)
    watcher.stop()

    c2, t2 = cpu_s(), time.perf_counter()  # idle: the job alone
    time.sleep(cfg["idle_seconds"])
    c3, t3 = cpu_s(), time.perf_counter()
    if background:
        probe.execute("SELECT * FROM streaming_etl_stop('latency')").fetchall()
        done.set()
    else:
        run_cur.interrupt()
    runner.join(30)
    stop_s = time.perf_counter() - t3  # from asking the job to stop to its run being over

    first_full = -(-int(start_ms) // WINDOW) * WINDOW  # the first window the producer filled
    lat, seen_windows = [], set()
    for (s, k), (seen, e) in watcher.seen.items():
        if s >= first_full and e + LATENESS <= stop_ms:
            lat.append(seen - (e + LATENESS))
            seen_windows.add(s)
    expected = set(range(first_full, int(stop_ms) - WINDOW - LATENESS + 1, WINDOW))
    closed = probe.execute('SELECT count(*), coalesce(sum("count"), 0) FROM windows').fetchone()
    late = probe.execute("SELECT count(*) FROM late_events").fetchone()[0]
    dead = probe.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    print(json.dumps({
        "latencies_ms": lat, "rows_expected": len(expected) * KEYS, "windows_missing": sorted(expected - seen_windows),
        "cpu_streaming_s": (c1 - c0) - (w1 - w0), "streaming_s": t1 - t0, "watcher_cpu_s": w1 - w0,
        "cpu_idle_s": c3 - c2, "idle_s": t3 - t2, "polls": watcher.polls,
        "window_rows": closed[0], "events_in_closed_windows": closed[1], "late_events": late, "dead_letters": dead,
        "run_error": result.get("error") or ("the run did not stop" if runner.is_alive() else None),
        "stop_ms": round(stop_s * 1000),
    }), flush=True)


def kafka_sink(d):
    from confluent_kafka import Producer
    from brokers import MockBroker

    broker = MockBroker()
    broker.create_topic("latency", PARTITIONS)
    # The mock keeps 5 MiB per partition: lz4 keeps 30 s at 10K events/s well within it.
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "lz4",
                  "enable.idempotence": False, "acks": 1, "queue.buffering.max.messages": 1_000_000,
                  "log.connection.close": False})

    def send(part, lines):
        for line in lines:
            p.produce("latency", value=line, partition=part)
        p.poll(0)

    def close():
        p.flush(30)
        broker.stop()

    return "latency", {"brokers": f"'{broker.bootstrap}'"}, send, close


def file_sink(d):
    files = [open(os.path.join(d, "in", f"part-{i}.ndjson"), "a") for i in range(PARTITIONS)]

    def send(part, lines):
        files[part].write("".join(line + "\n" for line in lines))
        files[part].flush()

    def close():
        for f in files:
            f.close()

    return f"file:{d}/in/*.ndjson", {}, send, close


def produce(send, seconds, rate):
    """Steady pacing in 5 ms ticks: at each tick, the events due so far, event time = now."""
    sent, t0 = 0, time.perf_counter()
    start_ms = now_ms()
    while (elapsed := time.perf_counter() - t0) < seconds:
        due = int(elapsed * rate) - sent
        if due > 0:
            t = int(now_ms())
            batches = [[] for _ in range(PARTITIONS)]
            for i in range(sent, sent + due):
                k = i % KEYS
                batches[k % PARTITIONS].append(f'{{"key":"k{k}","event_time_ms":{t},"payload":{{"value":{i % 100}.5}}}}')
            for part, lines in enumerate(batches):
                send(part, lines)
            sent += due
        time.sleep(0.005)
    return sent, start_ms, now_ms(), time.perf_counter() - t0


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q / 100 * len(v))) - 1))] if v else None


def one_source(source, seconds, idle_seconds, rate=RATE, background=False):
    d = tempfile.mkdtemp(prefix="setl-latency-")
    os.makedirs(os.path.join(d, "in"))
    for i in range(PARTITIONS):
        open(os.path.join(d, "in", f"part-{i}.ndjson"), "w").close()
    topic, named, send, close = (kafka_sink if source == "kafka" else file_sink)(d)
    t_wall = time.perf_counter()
    try:
        cfg = {"db": os.path.join(d, "db.duckdb"), "topic": topic, "named": named, "idle_seconds": idle_seconds,
               "background": background}
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"child did not start: {line!r} (exit {p.wait()})")
        events, start_ms, stop_ms, took = produce(send, seconds, rate)
        p.stdin.write(f"stop {start_ms} {stop_ms}\n")
        p.stdin.flush()
        out, _ = p.communicate(timeout=idle_seconds + SETTLE_S + 120)
        if p.returncode != 0:
            raise RuntimeError(f"child failed with exit {p.returncode}")
        m = json.loads(out.strip().splitlines()[-1])
    finally:
        close()
        shutil.rmtree(d, ignore_errors=True)
    lat = m["latencies_ms"]
    r = {
        "scenario": f"latency, follow, {rate:,} events/s, window {WINDOW} ms, lateness {LATENESS} ms",
        "source": ("kafka (mock cluster)" if source == "kafka" else "files (4 appended NDJSON files)")
        + (", background" if background else ""),
        "events": events,
        "rate_per_sec": round(events / took),
        "p50_latency_ms": round(percentile(lat, 50)) if lat else None,
        "p99_latency_ms": round(percentile(lat, 99)) if lat else None,
        "max_latency_ms": round(max(lat)) if lat else None,
        "min_latency_ms": round(min(lat)) if lat else None,
        "cycle_ms": CYCLE,
        "cpu_streaming_pct": round(100 * m["cpu_streaming_s"] / m["streaming_s"], 1),
        "cpu_idle_pct": round(100 * m["cpu_idle_s"] / m["idle_s"], 2),
        "rows_measured": len(lat),
        "rows_expected": m["rows_expected"],
        "windows_missing": m["windows_missing"],
        "watcher_cpu_pct": round(100 * m["watcher_cpu_s"] / m["streaming_s"], 1),
        "late_events": m["late_events"],
        "dead_letters": m["dead_letters"],
        "run_error": m["run_error"],
        "stop_ms": m["stop_ms"],
        "wall_s": round(time.perf_counter() - t_wall, 1),
    }
    return r


def latency_jobs(seconds: int = 30, idle_seconds: int = 10) -> list[dict]:
    """One row per source and mode: Kafka (mock broker), then files; in the foreground (the call
    runs in a statement of the child's) and in the background (`background := true`)."""
    return [one_source(s, seconds, idle_seconds, background=bg) for bg in (False, True) for s in ("kafka", "files")]


def markdown(rows) -> str:
    """The latency table, printed (docs/benchmarks.md shows a selection of its columns)."""
    lines = ["| source | events | events/s | p50 ms | p99 ms | max ms | cycle ms | CPU streaming | CPU idle | stop ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['source']} | {r['events']:,} | {r['rate_per_sec']:,} | {r['p50_latency_ms']} | {r['p99_latency_ms']} | "
                     f"{r['max_latency_ms']} | {r['cycle_ms']} | {r['cpu_streaming_pct']}% | {r['cpu_idle_pct']}% | {r.get('stop_ms')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        sys.exit(0)
    args = [int(a) for a in sys.argv[1:3]]
    rows = latency_jobs(*args)
    for r in rows:
        print(json.dumps(r), flush=True)
    print(markdown(rows))
