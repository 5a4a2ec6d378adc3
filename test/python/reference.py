"""A reference model of the event-time semantics, written from SPEC sections 3, 4 and 9 (not from
the extension's code): tumbling, hopping and session windows, composite keys and every aggregate,
one message at a time in the extension's reading order (the partition whose largest event time so
far is smallest, ties to the lower partition).

run(parts, window_ms, lateness_ms, ...) returns (closed windows, still-open windows, late
(partition, offset, event_time, watermark), dead (partition, offset), final watermark).
A window is keyed (start, end, key tuple); its value is a dict of aggregate name -> value.
"""
import datetime
import json
import math

MIN_T, MAX_T = -62_135_596_800_000, 253_402_300_799_999
DEFAULT_AGGS = ["count(*) AS count", "sum(payload.value) AS sum_value", "min(payload.value) AS min_value",
                "max(payload.value) AS max_value"]


class Num:
    """A JSON number with its literal text."""

    def __init__(self, text, integer):
        self.text, self.integer = text, integer

    def value(self):
        return float(self.text)


def loads(line):
    return json.loads(line, parse_int=lambda s: Num(s, True), parse_float=lambda s: Num(s, False),
                      parse_constant=lambda s: (_ for _ in ()).throw(ValueError(s)))


def get(d, path):
    """(present, value) of a dotted path."""
    cur = d
    for seg in path.split("."):
        if not isinstance(cur, dict) or seg not in cur:
            return False, None
        cur = cur[seg]
    return True, cur


def parse_agg(expr):
    e = expr.strip()
    alias = None
    low = e.lower()
    if " as " in low:
        at = low.rfind(" as ")
        e, alias = e[:at].strip(), e[at + 4:].strip()
    func, arg = e[:e.index("(")].strip().lower(), e[e.index("(") + 1:-1].strip()
    if arg == "*":
        return "count*", None, alias or "count"
    return func, arg, alias or f"{func}_{arg.split('.')[-1]}"


def text_of(v):
    if isinstance(v, Num):
        return v.text
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


class Agg:
    def __init__(self, func):
        self.func = func
        self.n = 0
        self.total = 0.0
        self.m = None
        self.seen = set()
        self.stamp = None  # (t, text)

    def add(self, t, v):
        f = self.func
        if f == "count*":
            self.n += 1
        elif v is None:
            return
        elif f == "count":
            self.n += 1
        elif f in ("sum", "avg"):
            self.n += 1
            self.total += v
        elif f == "min":
            self.m = v if self.m is None else min(self.m, v)
        elif f == "max":
            self.m = v if self.m is None else max(self.m, v)
        elif f == "approx_count_distinct":
            self.seen.add(v)
        elif f == "first":
            if self.stamp is None or t < self.stamp[0]:
                self.stamp = (t, v)
        elif f == "last":
            if self.stamp is None or t >= self.stamp[0]:
                self.stamp = (t, v)

    def merge(self, o):
        f = self.func
        if f in ("count*", "count"):
            self.n += o.n
        elif f in ("sum", "avg"):
            self.n += o.n
            self.total += o.total
        elif f in ("min", "max") and o.m is not None:
            self.m = o.m if self.m is None else (min if f == "min" else max)(self.m, o.m)
        elif f == "approx_count_distinct":
            self.seen |= o.seen
        elif f == "first" and o.stamp is not None and (self.stamp is None or o.stamp[0] < self.stamp[0]):
            self.stamp = o.stamp
        elif f == "last" and o.stamp is not None and (self.stamp is None or o.stamp[0] >= self.stamp[0]):
            self.stamp = o.stamp

    def result(self):
        f = self.func
        if f in ("count*", "count"):
            return self.n
        if f == "sum":
            return self.total if self.n else None
        if f == "avg":
            return self.total / self.n if self.n else None
        if f in ("min", "max"):
            return self.m
        if f == "approx_count_distinct":
            return len(self.seen)
        return self.stamp[1] if self.stamp else None


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def iso_ms(text):
    """Epoch ms of an RFC 3339 string with an offset (Python's reading), or None."""
    if not isinstance(text, str):
        return None
    try:
        dt = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    return (dt - EPOCH) // datetime.timedelta(milliseconds=1)


class Job:
    def __init__(self, window_ms, lateness_ms, hop_ms=None, session=False, group_by=None, aggregates=None,
                 time_field="event_time_ms", key_field="key", value_field="payload.value", time_format=None):
        self.window, self.lateness = window_ms, lateness_ms
        self.hop = hop_ms or window_ms
        self.session = session
        self.default_key = group_by is None
        self.keys = [key_field] if group_by is None else [g.split(" AS ")[0].split(" as ")[0].strip() for g in group_by]
        aggs = aggregates or [a.replace("payload.value", value_field) for a in DEFAULT_AGGS]
        self.aggs = [parse_agg(a) for a in aggs]
        self.time_field = time_field
        self.time_format = time_format

    def decode(self, line):
        """(time, key tuple, inputs) or None (dead letter)."""
        try:
            d = loads(line)
        except Exception:
            return None
        if not isinstance(d, dict):
            return None
        present, t = get(d, self.time_field)
        if self.time_format == "iso8601":
            t = iso_ms(t)
            if t is None:
                return None
        elif not present or not isinstance(t, Num) or not t.integer or not MIN_T <= int(t.text) <= MAX_T:
            return None
        else:
            t = int(t.text)
        key = []
        for k in self.keys:
            present, v = get(d, k)
            if isinstance(v, str) or isinstance(v, Num) or (isinstance(v, bool) and not self.default_key):
                key.append(text_of(v))
            else:
                return None
        inputs = []
        for func, arg, _ in self.aggs:
            if arg is None:
                inputs.append(None)
                continue
            present, v = get(d, arg)
            if v is None:
                inputs.append(None)
            elif func in ("sum", "avg", "min", "max"):
                if not isinstance(v, Num) or not math.isfinite(v.value()):
                    return None
                inputs.append(v.value())
            elif func == "count":
                inputs.append(True)
            else:
                inputs.append(text_of(v))
        return t, tuple(key), inputs

    def new_state(self):
        return [Agg(f) for f, _, _ in self.aggs]

    def results(self, state):
        return {name: a.result() for a, (_, _, name) in zip(state, self.aggs)}


def run(parts, job, flush=False):
    n = len(parts)
    pos, offs, mx = [0] * n, [0] * n, [None] * n
    wm = -math.inf
    W, h, g = job.window, job.hop, job.window
    open_w = {}        # (start, key) -> state (tumbling/hopping)
    sessions = {}      # key -> list of [start, last, state]
    written = {}       # key -> list of (start, end) written sessions
    closed, late, dead = {}, [], []

    def close(limit):
        if job.session:
            for key in list(sessions):
                keep = []
                for s in sessions[key]:
                    end = s[1] + g
                    if end <= limit:
                        closed[(s[0], end, key)] = job.results(s[2])
                        written.setdefault(key, []).append((s[0], end))
                    else:
                        keep.append(s)
                sessions[key] = keep
        else:
            for (s, key) in sorted(k for k in open_w if k[0] + W <= limit):
                closed[(s, s + W, key)] = job.results(open_w.pop((s, key)))

    while True:
        live = [i for i in range(n) if pos[i] < len(parts[i])]
        if not live:
            break
        i = min(live, key=lambda j: (-math.inf if mx[j] is None else mx[j], j))
        line = parts[i][pos[i]]
        off = offs[i]
        pos[i] += 1
        offs[i] += len(line.encode()) + 1
        ev = job.decode(line)
        if ev is None:
            dead.append((i, off))
            continue
        t, key, inputs = ev
        if job.session:
            reach = [s for s in sessions.get(key, []) if s[0] <= t + g and s[1] + g >= t]
            start = min([t] + [s[0] for s in reach])
            last = max([t] + [s[1] for s in reach])
            hits_written = any(t <= e and t + g >= s for s, e in written.get(key, []))
            if last + g <= wm or hits_written:
                late.append((i, off, t, wm))
            else:
                state = job.new_state()
                for s in sorted(reach):
                    for a, b in zip(state, s[2]):
                        a.merge(b)
                for a, v in zip(state, inputs):
                    a.add(t, v)
                sessions[key] = sorted([s for s in sessions.get(key, []) if s not in reach] + [[start, last, state]],
                                       key=lambda s: s[0])
        else:
            last_start = (t // h) * h
            if last_start + W <= wm:
                late.append((i, off, t, wm))
            else:
                s = last_start
                while s > t - W:
                    if s + W > wm:
                        st = open_w.setdefault((s, key), job.new_state())
                        for a, v in zip(st, inputs):
                            a.add(t, v)
                    s -= h
        if mx[i] is None or t > mx[i]:
            mx[i] = t
            if all(m is not None for m in mx):
                new = min(mx) - job.lateness
                if new > wm:
                    wm = new
                    close(wm)
    if flush:
        close(math.inf)
        still_open = {}
    else:
        still_open = dict(open_w) if not job.session else {k: v for k, v in sessions.items() if v}
    return closed, still_open, late, dead, wm
