#!/usr/bin/env python3
"""`make demo-cdc`: a table kept from a Debezium changelog, replayed from files, and a join
against it.

It writes `demo/cdc/customers/*.ndjson`, the changes of an upstream table `customers` as a
Debezium connector writes them (snapshot reads, creates, updates, deletes; some events in the
JSON converter's `{"schema": ..., "payload": ...}` wrapper), and `demo/cdc/orders/*.ndjson`, orders
of those customers. In `demo/cdc.duckdb`:
1. a job keeps `customers` equal to the upstream table (`INSERT OR REPLACE INTO customers ...`,
   `envelope := 'debezium'`) and its history (`INSERT INTO customer_history ...`), in two runs
   (as a scheduled job would), the second picking up where the first stopped;
2. a second job windows the orders joined with the kept table: revenue per tier and minute;
3. it prints the table, checked against the upstream state the generator kept, the history and the
   join.
"""
import json
import os
import random
import shutil
import sys

import duckdb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXT = os.path.join(ROOT, "build", "release", "streaming_etl.duckdb_extension")
DIR = os.path.join(ROOT, "demo", "cdc")
COLUMNS = "{'id': 'BIGINT', 'name': 'VARCHAR', 'tier': 'VARCHAR', 'city': 'VARCHAR'}"


def generate(rng):
    """The changelog (2 partitions, each customer's changes in one) and the upstream table."""
    names = ["Ada", "Bo", "Cy", "Di", "Eve", "Fay", "Gil", "Hal", "Ivy", "Jo", "Kai", "Lu"]
    tiers, cities = ["bronze", "silver", "gold"], ["Lyon", "Oslo", "Pune", "Quito"]
    upstream, parts, ts = {}, [[], []], 1_767_225_600_000

    def change(op, before, after):
        nonlocal ts
        ts += rng.randint(100, 900)
        e = {"before": before, "after": after, "op": op, "ts_ms": ts,
             "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "customers"}}
        if rng.random() < 0.3:
            e = {"schema": {"type": "struct", "name": "shop.public.customers.Envelope"}, "payload": e}
        k = (after or before)["id"]
        parts[k % 2].append(json.dumps(e))

    for i in range(1, 9):
        upstream[i] = {"id": i, "name": names[i - 1], "tier": rng.choice(tiers), "city": rng.choice(cities)}
        change("r", None, upstream[i])
    for _ in range(60):
        k = rng.randint(1, 12)
        if k not in upstream:
            upstream[k] = {"id": k, "name": names[k - 1], "tier": "bronze", "city": rng.choice(cities)}
            change("c", None, upstream[k])
        elif rng.random() < 0.1:
            change("d", upstream.pop(k), None)
        else:
            new = dict(upstream[k], tier=rng.choice(tiers), city=rng.choice(cities))
            change("u", upstream[k], new)
            upstream[k] = new
    orders = [json.dumps({"order_id": n, "customer": rng.randint(1, 12), "amount": round(rng.uniform(5, 120), 2),
                          "ts": ts + n * 400}) for n in range(300)]
    return parts, upstream, orders


def write(directory, parts):
    os.makedirs(directory, exist_ok=True)
    for p, lines in enumerate(parts):
        with open(os.path.join(directory, f"p{p}.ndjson"), "w") as f:
            f.write("".join(line + "\n" for line in lines))


def show(con, title, sql, echo=True):
    print(f"\n{title}" + (f"\n  {sql}" if echo else ""))
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    print("  " + " | ".join(str(c).ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    return rows


def main():
    shutil.rmtree(DIR, ignore_errors=True)
    rng = random.Random(2026)
    parts, upstream, orders = generate(rng)
    half = [p[: len(p) // 2] for p in parts]
    write(os.path.join(DIR, "customers"), half)
    write(os.path.join(DIR, "orders"), [orders])
    db = os.path.join(DIR, "cdc.duckdb")
    con = duckdb.connect(db, config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{EXT}'")
    keep = f"""SELECT events_consumed, dead_letters, status FROM streaming_etl_sql('file:{DIR}/customers/*.ndjson', $$
    INSERT OR REPLACE INTO customers SELECT id, name, tier, city FROM stream;
    INSERT INTO customer_history SELECT op, id, name, before.tier AS old_tier, after.tier AS new_tier, ts_ms FROM stream $$,
  job := 'customers', envelope := 'debezium', primary_key := ['id'],
  columns := {COLUMNS})"""
    print("The job (run it from cron: each run picks up where the last stopped):\n" + keep)
    show(con, "First run, half of the changelog written:", keep, echo=False)
    write(os.path.join(DIR, "customers"), parts)
    show(con, "Second run, the rest written:", keep, echo=False)
    got = show(con, "The kept table:", "SELECT * FROM customers ORDER BY id")
    want = [(r["id"], r["name"], r["tier"], r["city"]) for _, r in sorted(upstream.items())]
    print(f"\n  equal to the upstream table after the last change: {got == want}")
    show(con, "Its history (last 6 changes):",
          "SELECT * FROM customer_history ORDER BY ts_ms DESC LIMIT 6")
    show(con, "Orders windowed by minute and joined with the kept table (another job):",
         f"""SELECT events_consumed, windows_emitted, status FROM streaming_etl_sql('file:{DIR}/orders/*.ndjson', $$
    INSERT INTO revenue_by_tier SELECT coalesce(c.tier, '(none)') AS tier, window_start, count(*) AS orders, sum(o.amount) AS revenue
    FROM TUMBLE(stream, event_time, INTERVAL 1 MINUTE) AS o LEFT JOIN customers AS c ON c.id = o.customer GROUP BY ALL $$,
  job := 'revenue', time_field := 'ts', flush := true, columns := {{'customer': 'BIGINT', 'amount': 'DOUBLE'}})""")
    show(con, "Revenue per tier and minute:",
         "SELECT tier, window_start, orders, round(revenue, 2) AS revenue FROM revenue_by_tier ORDER BY window_start, tier LIMIT 12")
    con.close()
    if got != want:
        sys.exit("the kept table differs from the upstream one")


if __name__ == "__main__":
    main()
