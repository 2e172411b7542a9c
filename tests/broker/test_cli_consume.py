"""``idemlog consume`` follows a topic as Kafka's console consumer does (docs/broker.md,
"Consuming"): a real broker process, the real command in a subprocess, producers in the
test and in a process of their own; never a traceback in any output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import IO

import pyarrow as pa
import pytest

from broker_core.cli.failures import ExitCode
from broker_core.client.broker_client import BrokerClient
from broker_core.producer.producer import Producer
from tests.harness.broker import BrokerProcess
from tests.harness.waiting import Recorder, wait_until

SCHEMA = pa.schema([("id", pa.int64())])
TOPIC = "payments"
PARTITIONS = 2
EXIT_TIMEOUT_S = 60.0


class Consumer:
    """``idemlog consume`` running in a subprocess; its stdout and stderr lines recorded
    as they come (read by threads), so a test waits on an event, not a sleep."""

    def __init__(self, address: str, *flags: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker_core.cli.main",
                "consume",
                "--bootstrap",
                address,
                "--topic",
                TOPIC,
                "--json",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out = Recorder(timeout=EXIT_TIMEOUT_S)
        self.err = Recorder(timeout=EXIT_TIMEOUT_S)
        assert self.process.stdout is not None and self.process.stderr is not None
        self._readers = [
            threading.Thread(target=_read_lines, args=(self.process.stdout, self.out)),
            threading.Thread(target=_read_lines, args=(self.process.stderr, self.err)),
        ]
        for reader in self._readers:
            reader.start()

    def wait_positioned(self) -> None:
        """Until the consumer said where it starts: anything readable from now is printed."""
        self.err.wait(
            lambda lines: any(str(line).startswith("Consuming ") for line in lines),
            "the consumer's start line",
        )

    def finish(self) -> int:
        code = self.process.wait(EXIT_TIMEOUT_S)
        for reader in self._readers:
            reader.join(EXIT_TIMEOUT_S)
        output = "\n".join(map(str, self.out.values + self.err.values))
        assert "Traceback" not in output, output
        return code

    def ids(self) -> list[int]:
        return [json.loads(str(line))["value"]["id"] for line in self.out.values]

    def summary(self) -> str:
        (line,) = [str(x) for x in self.err.values if str(x).startswith("Processed a total")]
        return line

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(EXIT_TIMEOUT_S)


def _read_lines(stream: IO[str], into: Recorder) -> None:
    for line in stream:
        into.record(line.rstrip("\n"))


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    started: list[Consumer] = []
    yield started
    for consumer in started:
        consumer.close()


@pytest.fixture
def topic(broker: BrokerProcess, client: BrokerClient) -> str:
    client.create_topic(TOPIC, PARTITIONS, schema=SCHEMA)
    return TOPIC


def _commit(address: str, ids: range, txn_id: str = "before") -> None:
    with Producer(address, **{"transactional.id": txn_id}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, pa.table({"id": pa.array(list(ids), pa.int64())}))
        producer.commit_transaction()


def test_consume_follows_a_producer_in_another_process_and_exits_at_max_messages(
    broker: BrokerProcess, topic: str, consumers: list[Consumer]
) -> None:
    _commit(broker.address, range(5))  # before the consumer: at the end, never printed
    consumer = Consumer(broker.address, "--max-messages", "30")
    consumers.append(consumer)
    consumer.wait_positioned()
    assert consumer.out.values == []  # it waits: nothing was printed, it did not exit
    assert consumer.process.poll() is None
    producer = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.broker.cli_producer",
            broker.address,
            TOPIC,
            "100",
            "30",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S,
        check=False,
    )
    assert producer.returncode == 0 and "COMMITTED 30" in producer.stdout, producer.stderr
    assert consumer.finish() == ExitCode.OK
    assert sorted(consumer.ids()) == list(range(100, 130))  # exactly the produced rows
    assert consumer.summary() == "Processed a total of 30 messages"


def test_from_beginning_prints_what_is_there_and_timeout_ms_ends_it(
    broker: BrokerProcess, topic: str, consumers: list[Consumer]
) -> None:
    _commit(broker.address, range(5))
    started = time.monotonic()
    consumer = Consumer(broker.address, "--from-beginning", "--timeout-ms", "1500")
    consumers.append(consumer)
    assert consumer.finish() == ExitCode.OK
    assert time.monotonic() - started >= 1.5  # it waited the silence out before leaving
    assert sorted(consumer.ids()) == list(range(5))
    assert consumer.summary() == "Processed a total of 5 messages"


@pytest.mark.parametrize(
    ("level", "expected"),
    [("read_committed", list(range(5))), ("read_uncommitted", [*range(5), 50, 51, 52])],
)
def test_isolation_levels_with_an_open_transaction(
    broker: BrokerProcess, topic: str, consumers: list[Consumer], level: str, expected: list[int]
) -> None:
    _commit(broker.address, range(5))
    with Producer(broker.address, **{"transactional.id": "open"}) as open_txn:
        open_txn.init_transactions()
        open_txn.begin_transaction()
        open_txn.send(TOPIC, pa.table({"id": pa.array([50, 51, 52], pa.int64())}))
        open_txn.flush()  # its rows are in the log; its transaction stays open
        args = ["--from-beginning", "--timeout-ms", "1000", "--isolation-level", level]
        consumer = Consumer(broker.address, *args)
        consumers.append(consumer)
        assert consumer.finish() == ExitCode.OK
        assert sorted(consumer.ids()) == expected
        open_txn.commit_transaction()
    after = Consumer(broker.address, "--from-beginning", "--timeout-ms", "500")
    consumers.append(after)
    assert after.finish() == ExitCode.OK
    assert sorted(after.ids()) == [*range(5), 50, 51, 52]  # committed: now visible


def test_ctrl_c_exits_130_after_printing_with_the_summary(
    broker: BrokerProcess, topic: str, consumers: list[Consumer]
) -> None:
    consumer = Consumer(broker.address)
    consumers.append(consumer)
    consumer.wait_positioned()
    _commit(broker.address, range(3))
    consumer.out.wait_for_count(3, "the 3 rows printed")
    consumer.process.send_signal(signal.SIGINT)
    assert consumer.finish() == ExitCode.INTERRUPTED == 130
    assert sorted(consumer.ids()) == [0, 1, 2]
    assert consumer.summary() == "Processed a total of 3 messages"
    assert not [line for line in consumer.err.values if str(line).startswith("idemlog:")]


def _idemlog(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S,
        check=False,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def test_describe_and_transactions_json_carry_what_the_text_shows(
    broker: BrokerProcess, topic: str
) -> None:
    _commit(broker.address, range(5))
    with Producer(broker.address, **{"transactional.id": "held"}) as open_txn:
        open_txn.init_transactions()
        open_txn.begin_transaction()
        open_txn.send(TOPIC, pa.table({"id": pa.array([7], pa.int64())}))
        open_txn.flush()
        bootstrap = ["--bootstrap", broker.address]
        described = _idemlog("topics", "describe", *bootstrap, "--topic", TOPIC, "--json")
        assert described.returncode == 0, described.stderr
        (doc,) = json.loads(described.stdout)
        assert doc["schema"] == ["id: int64"]  # Arrow's text form, not base64 bytes
        offsets = [p["offsets"] for p in doc["partitions"]]
        held = [o for o in offsets if o["last_stable_offset"] < o["log_end_offset"]]
        assert len(held) == 1  # the open transaction holds its partition's LSO back
        text = _idemlog("topics", "describe", *bootstrap, "--topic", TOPIC).stdout
        assert "schema [id: int64]" in text
        for o in offsets:
            assert f"end {o['log_end_offset']:>10}" in text
            assert f"last stable {o['last_stable_offset']:>10}" in text
        listed = _idemlog("transactions", "list", *bootstrap, "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["transactional_id"] == "held" and row["state"] == "ONGOING"
        assert row["partitions"] and row["age_ms"] is not None
        assert "held" in _idemlog("transactions", "list", *bootstrap).stdout
        open_txn.abort_transaction()


def _fetch_waiting_in(port: int) -> bool:
    """Whether bytes wait unread in an established connection to ``port``: a request
    the (frozen) broker has not read (the kernel's own counter, /proc/net/tcp)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                local, state, queues = fields[1], fields[3], fields[4]
                unread = int(queues.split(":")[1], 16)
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01" and unread:
                    return True
    return False


def test_ctrl_c_during_a_fetch_the_frozen_broker_never_answers_exits_130_at_once(
    broker: BrokerProcess, topic: str, consumers: list[Consumer]
) -> None:
    consumer = Consumer(broker.address)
    consumers.append(consumer)
    consumer.wait_positioned()
    port = int(broker.address.rsplit(":", 1)[1])
    process = broker.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        # The consumer's next fetch reaches the frozen broker and waits there (up to the
        # client's 30 s timeout, then retries): that is where Ctrl-C must land.
        wait_until(lambda: _fetch_waiting_in(port), "a fetch waiting in the frozen broker")
        consumer.process.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert consumer.finish() == ExitCode.INTERRUPTED
        took = time.monotonic() - started
    finally:
        process.send_signal(signal.SIGCONT)
    assert consumer.summary() == "Processed a total of 0 messages"
    assert took < 10.0, took  # not the client's 30 s timeout and its retries
    print(f"exit {took:.2f} s after SIGINT during a fetch to a frozen broker")


def test_a_reader_that_leaves_ends_it_quietly(broker: BrokerProcess, topic: str) -> None:
    # 20,000 lines, more than a pipe holds (64 KiB), so a write meets the closed pipe.
    _commit(broker.address, range(20_000))
    command = (
        f"set -o pipefail; {sys.executable} -m broker_core.cli.main consume --bootstrap "
        f"{broker.address} --topic {TOPIC} --from-beginning --timeout-ms 2000 | head -n 2"
    )
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=EXIT_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    (summary,) = [x for x in done.stderr.splitlines() if x.startswith("Processed a total")]
    assert int(summary.split()[4]) < 20_000  # it stopped when its reader left


def test_a_bad_topic_partition_or_limit_is_one_usage_line(
    broker: BrokerProcess, topic: str
) -> None:
    base = ["consume", "--bootstrap", broker.address, "--timeout-ms", "100"]
    for flags, start in [
        (["--topic", "nope"], "idemlog: --topic nope: topic 'nope' does not exist"),
        (["--topic", TOPIC, "--partition", "9"], f"idemlog: --partition 9: topic {TOPIC} has"),
        (["--topic", TOPIC, "--max-messages", "0"], "idemlog: --max-messages 0: must be"),
    ]:
        done = _idemlog(*base, *flags)
        assert done.returncode == ExitCode.USAGE, done.stderr
        errors = [x for x in done.stderr.splitlines() if x.startswith("idemlog:")]
        assert len(errors) == 1 and errors[0].startswith(start), done.stderr
        assert done.stdout == ""


def test_a_topic_recreated_under_the_consumer_ends_it_naming_both_ids(
    broker: BrokerProcess, client: BrokerClient, topic: str, consumers: list[Consumer]
) -> None:
    _commit(broker.address, range(5))
    old_id = client.topic_id(TOPIC)
    consumer = Consumer(broker.address, "--from-beginning")
    consumers.append(consumer)
    consumer.out.wait(lambda lines: len(lines) >= 5, "the old topic's 5 rows")
    # Stopped across the delete and the create. A fetch it sent just before may be
    # answered between them ("was deleted"): the line it prints states the topic as it
    # stands when reported, recreated.
    os.kill(consumer.process.pid, signal.SIGSTOP)
    try:
        client.delete_topic(TOPIC)
        client.create_topic(TOPIC, PARTITIONS, schema=SCHEMA)
        new_id = client.topic_id(TOPIC, refresh=True)
        _commit(broker.address, range(1000, 1010), txn_id="after")  # never printed
    finally:
        os.kill(consumer.process.pid, signal.SIGCONT)
    assert consumer.finish() == ExitCode.FAILURE
    assert sorted(consumer.ids()) == list(range(5))
    line = f"topic {TOPIC!r} was recreated: id {old_id} is now {new_id}"
    assert [str(x) for x in consumer.err.values if line in str(x)], consumer.err.values
    assert consumer.summary() == "Processed a total of 5 messages"


def test_decimals_are_printed_as_json_numbers_in_their_exact_digits(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    """A decimal column (Spark's DecimalType) is printed as a JSON number, not a quoted
    string: ``12.30`` keeps its scale, and ``parse_float=Decimal`` reads every digit back;
    the text form prints the same digits, unquoted."""
    schema = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(38, 2))])
    client.create_topic("prices", 1, schema=schema)
    amounts = [Decimal("12.30"), Decimal("-0.05"), Decimal("123456789012345678901234567890.12")]
    with Producer(broker.address) as producer:
        rows = pa.table({"id": [0, 1, 2], "amount": pa.array(amounts, pa.decimal128(38, 2))})
        future = producer.send("prices", rows)
        producer.flush()
        assert sum(r.num_rows for r in future.result(EXIT_TIMEOUT_S)) == 3
    read = ["consume", "--bootstrap", broker.address, "--topic", "prices", "--from-beginning"]
    read += ["--timeout-ms", "1000"]
    as_json = _idemlog(*read, "--json")
    assert as_json.returncode == ExitCode.OK, as_json.stderr
    assert '"amount": 12.30}' in as_json.stdout, as_json.stdout
    values = [
        json.loads(line, parse_float=Decimal)["value"] for line in as_json.stdout.splitlines()
    ]
    assert [v["amount"] for v in sorted(values, key=lambda v: v["id"])] == amounts
    as_text = _idemlog(*read)
    assert sorted(as_text.stdout.splitlines()) == sorted(
        f"{i}\t{amount}" for i, amount in enumerate(amounts)
    ), as_text.stdout
