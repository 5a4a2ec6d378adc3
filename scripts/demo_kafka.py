#!/usr/bin/env python3
"""`make demo-kafka`: the job on a real Kafka-protocol broker.

Starts librdkafka's mock cluster (tools/mock-kafka; pass --tansu to use tansu instead), creates
the topic `orders` with 4 partitions, produces sample events (keyed, some late, a few
malformed), runs the job in the DuckDB CLI part-way, shows the checkpoint with its lag, then
finishes the run and shows the result.
"""
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import duckdb  # noqa: E402

from brokers import MockBroker, TansuBroker, produce  # noqa: E402
from datagen import generate_sql  # noqa: E402
from democli import cli as run_cli  # noqa: E402

DEMO = os.path.join(ROOT, "demo-kafka")
EVENTS = 200_000


def cli(sql, title):
    run_cli(os.path.join(DEMO, "orders.duckdb"), sql, title)


def main():
    shutil.rmtree(DEMO, ignore_errors=True)
    os.makedirs(DEMO)
    broker = TansuBroker() if "--tansu" in sys.argv else MockBroker()
    try:
        broker.create_topic("orders", 4)
        paths = generate_sql(duckdb.connect(), os.path.join(DEMO, "data"), EVENTS, partitions=4,
                             late_pct=5, bad_permille=1)
        lines = [open(p, "rb").read().splitlines() for p in paths]
        produce(broker.bootstrap, "orders", lines, compression="lz4",
                key_of=lambda line: line[8:line.index(b'"', 8)] if line.startswith(b'{"key":"') else None)
        print(f"{broker.name} broker on {broker.bootstrap}: produced {EVENTS} events to topic 'orders' (4 partitions)")
        setup = (f"LOAD streaming_etl;\nSET streaming_etl_brokers = '{broker.bootstrap}';\n"
                 f"SET streaming_etl_checkpoint = '{DEMO}/orders.ckpt';")
        cli(f"{setup}\nSELECT * FROM streaming_etl_run('orders', 1000, 200, max_messages := 120000);",
            "first run: stops after 120,000 messages")
        cli(f"{setup}\nSELECT partition, next_offset, end_offset, lag, partition_watermark_ms, global_watermark_ms\n"
            "FROM streaming_etl_checkpoint() ORDER BY partition;", "the checkpoint, with each partition's lag")
        cli(f"{setup}\nSELECT * FROM streaming_etl_run('orders', 1000, 200, flush := true);",
            "second run: resumes, drains the topic, flushes")
        cli(f"{setup}\nSELECT window_start_ms, key, count, round(sum_value, 2) AS sum_value FROM windows\n"
            "ORDER BY window_start_ms, key LIMIT 5;\n"
            "SELECT (SELECT sum(count) FROM windows) AS in_windows, (SELECT count(*) FROM late_events) AS late,\n"
            "       (SELECT count(*) FROM dead_letters) AS dead;\n"
            "SELECT partition, next_offset, lag FROM streaming_etl_checkpoint() ORDER BY partition;",
            "the result")
    finally:
        broker.stop()


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
