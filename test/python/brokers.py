"""Real Kafka-protocol brokers for the tests, started by the tests themselves:

- librdkafka's mock cluster, through the project's own `tools/mock-kafka` binary (fast; fault
  injection: broker down/up, latency, request errors, leader moves);
- tansu 0.6.0 with its SQLite storage engine, an independent broker implementation.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOCK = os.path.join(ROOT, "target", "release", "mock-kafka")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class MockBroker:
    name = "mock"

    def __init__(self, brokers=1):
        self.proc = subprocess.Popen([MOCK, str(brokers)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "bootstrap", f"mock-kafka did not start: {line}"
        self.bootstrap = line[1]

    def command(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "ok", f"{cmd}: {answer}"

    def create_topic(self, topic, partitions):
        self.command(f"create {topic} {partitions}")

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()


class ClientMockBroker:
    """librdkafka's mock cluster hosted by the confluent-kafka client in this process. Its
    librdkafka (2.16) writes transaction markers, which the 2.12 mock of `tools/mock-kafka` does
    not: the transactional tests use it. Topics are created on first use with 4 partitions."""
    name = "mock-2.16"

    def __init__(self, brokers=3):
        from confluent_kafka import Producer

        self.host = Producer({"test.mock.num.brokers": brokers})
        md = self.host.list_topics(timeout=10)
        self.bootstrap = ",".join(f"{b.host}:{b.port}" for b in md.brokers.values())

    def create_topic(self, topic, partitions):
        assert partitions <= 4, "the client-hosted mock creates topics with 4 partitions"

    def stop(self):
        self.host = None


def tansu_binary():
    return shutil.which("tansu") or os.path.expanduser("~/.cargo/bin/tansu")


class TansuBroker:
    name = "tansu"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="setl-tansu-")
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        url = f"tcp://127.0.0.1:{self.port}"
        self.log = open(os.path.join(self.dir, "tansu.log"), "w")
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "sqlite://tansu.db"],
            cwd=self.dir, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert self.proc.poll() is None, "tansu exited: " + open(self.log.name).read()
                time.sleep(0.1)
        raise RuntimeError("tansu did not start listening")

    def create_topic(self, topic, partitions):
        r = subprocess.run([tansu_binary(), "topic", "create", "--broker", f"tcp://{self.bootstrap}",
                            "--partitions", str(partitions), topic], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def produce(bootstrap, topic, partitions_lines, key_of=None, compression="none", raw=False):
    """Produces lines to explicit partitions (partitions_lines[p] is the list for partition p),
    in order. key_of(line) gives the message key (None: no key); a (key, value) pair is produced as
    it is (a value of None: a tombstone)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": compression,
                  "batch.num.messages": 10000, "queue.buffering.max.messages": 2000000,
                  "enable.idempotence": False, "acks": "all"})
    errors = []

    def report(err, _msg):
        if err is not None:
            errors.append(err)

    for part, lines in enumerate(partitions_lines):
        for line in lines:
            if isinstance(line, tuple):
                key, value = line
            else:
                value = line if isinstance(line, (bytes, str)) else json.dumps(line)
                key = key_of(line) if key_of else None
            while True:
                try:
                    p.produce(topic, value=value, key=key, partition=part, on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
    remaining = p.flush(60)
    assert remaining == 0 and not errors, (remaining, errors[:3])


def committed(bootstrap, group, topic, partitions):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        res = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in res}
    finally:
        c.close()
