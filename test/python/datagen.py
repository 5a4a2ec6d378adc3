"""Event generator shared by the tests, the demo and the benchmark.

The predecessor's workload: event time = base + i; a late event is shifted 2-5 windows back;
key k{i % keys}; value uniform 0-100; messages spread round-robin over partitions. Options add
malformed lines and a partition that runs behind in event time.
"""
import json
import os
import random
from dataclasses import dataclass, field

BASE_MS = 1_700_000_000_000


@dataclass
class Generated:
    files: list
    events: int = 0
    late_injected: int = 0
    bad: int = 0
    # (partition, offset) of each injected late event and each bad line
    late_at: set = field(default_factory=set)
    bad_at: set = field(default_factory=set)


def generate(directory, events, partitions=4, keys=50, late_ratio=0.05, bad_ratio=0.0,
             window_ms=1000, skew_ms=0, skew_partition=None, seed=42, prefix="part"):
    """Writes `events` messages into `partitions` NDJSON files under `directory`."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    paths = [os.path.join(directory, f"{prefix}-{p}.ndjson") for p in range(partitions)]
    files = [open(p, "wb") for p in paths]
    offsets = [0] * partitions
    g = Generated(files=paths)
    for i in range(events):
        p = i % partitions
        t = BASE_MS + i
        if skew_partition is not None and p == skew_partition:
            t -= skew_ms
        r = rng.random()
        if r < bad_ratio:
            line = rng.choice([b'{"key": broken', b"not json at all", b'{"key":"x"}',
                               b'{"key":"x","event_time_ms":"soon"}'])
            g.bad += 1
            g.bad_at.add((p, offsets[p]))
        else:
            if rng.random() < late_ratio:
                t -= window_ms * rng.randint(2, 5)
                g.late_injected += 1
                g.late_at.add((p, offsets[p]))
            line = b'{"key":"k%d","event_time_ms":%d,"payload":{"value":%.2f}}' % (
                i % keys, t, rng.uniform(0, 100))
        files[p].write(line + b"\n")
        offsets[p] += len(line) + 1
        g.events += 1
    for f in files:
        f.close()
    return g


def append_lines(path, lines):
    with open(path, "ab") as f:
        for line in lines:
            f.write((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n")


SQL_TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "sql", "generate_events.sql")


def generate_sql(con, directory, events, partitions=4, keys=50, late_pct=5.0, bad_permille=0,
                 window_ms=1000, skew_ms=0, skew_partition=-1, seed=42, base_ms=BASE_MS, iso_times=False):
    """Fast generation inside DuckDB (sql/generate_events.sql); returns the file paths. With
    iso_times, event_time_ms holds RFC 3339 text (2023-11-14T22:13:20.123Z) instead of a number."""
    from string import Template
    os.makedirs(directory, exist_ok=True)
    with open(SQL_TEMPLATE) as f:
        template = Template(f.read())
    paths = []
    for p in range(partitions):
        path = os.path.join(str(directory), f"part-{p}.ndjson")
        con.execute(template.substitute(
            partitions=partitions, base_ms=base_ms, late_pct=late_pct, window_ms=window_ms,
            bad_permille=bad_permille, skew_partition=skew_partition, skew_ms=skew_ms, keys=keys,
            seed=seed, p=p, events=events, path=path,
            time_open="'\"' || strftime(epoch_ms(CAST(" if iso_times else "",
            time_close=" AS BIGINT)), '%Y-%m-%dT%H:%M:%S.%gZ') || '\"'" if iso_times else ""))
        paths.append(path)
    return paths


ORDERS_TEMPLATE = os.path.join(os.path.dirname(SQL_TEMPLATE), "generate_orders.sql")


def generate_orders(con, directory, events, partitions=4, seed=42, base_ms=BASE_MS):
    """An order stream with composite keys and bursty customers (sql/generate_orders.sql)."""
    from string import Template
    os.makedirs(directory, exist_ok=True)
    with open(ORDERS_TEMPLATE) as f:
        template = Template(f.read())
    paths = []
    for p in range(partitions):
        path = os.path.join(str(directory), f"part-{p}.ndjson")
        con.execute(template.substitute(partitions=partitions, base_ms=base_ms, seed=seed, p=p, events=events, path=path))
        paths.append(path)
    return paths


def scan(paths):
    """Counts the lines of generated files and finds the malformed ones: (events, {(partition, offset)})."""
    events, bad = 0, set()
    for p, path in enumerate(paths):
        off = 0
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b'{"key": broken'):
                    bad.add((p, off))
                off += len(line)
                events += 1
    return events, bad
