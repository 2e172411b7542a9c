"""A confluent-kafka group member that counts a record only once its commit was acknowledged.

:class:`CountingMember` polls, processes (holds) each record, commits asynchronously, and
writes ``partition offset value`` to its output once an acknowledged commit of that
partition covers the record (the commit callback, served by ``poll`` on the member's own
thread: a synchronous commit there would wait for a rebalance that waits for ``poll``).
When partitions are revoked, what was read is committed synchronously first (Kafka's
pattern); what that commit does not cover is dropped, and its next owner reads it again
from the last committed offset. A record is written once, when it leaves ``pending``. So
the outputs of all members hold each record exactly once when no committed offset is
lost.

``python -m tests.harness.group_member BOOTSTRAP GROUP TOPIC STRATEGY OUT`` runs one as a
process of its own (a test SIGKILLs it), appending to the file OUT, until killed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

SESSION_TIMEOUT_MS = 3_000  # the broker's group.min.session.timeout.ms must allow it


def member_config(bootstrap: str, group: str, strategy: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "partition.assignment.strategy": strategy,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": 300,
        "fetch.wait.max.ms": 100,
        # The rows are written without transactions, so both levels read the same rows;
        # read-committed groups are tests/spark/test_kafka_consumers.py's. (A
        # cooperative-sticky group's stall is open at either level: docs/kafka.md.)
        "isolation.level": "read_uncommitted",
        "topic.metadata.refresh.interval.ms": 1_000,
    }


class CountingMember:
    """A member of ``group`` reading ``topic``; counted records go to ``out``."""

    def __init__(self, bootstrap: str, group: str, topic: str, strategy: str, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        # partition -> [(offset, value)] processed, commit not yet acknowledged
        self._pending: dict[int, list[tuple[int, str]]] = {}
        config = member_config(bootstrap, group, strategy)
        config["on_commit"] = self._committed
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic], on_revoke=self._revoked)

    def poll_once(self) -> None:
        message = self.consumer.poll(0.2)
        if message is None or message.error() is not None:
            return
        with self._lock:
            self._pending.setdefault(message.partition(), []).append(
                (message.offset(), message.value().decode())
            )
        self.consumer.commit(message=message, asynchronous=True)

    def _committed(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if error is None:  # else a later commit of the partition covers its records
            self._record(partitions)

    def _record(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            for p in partitions:
                if p.error is not None:
                    continue
                pending = self._pending.get(p.partition, [])
                done = [r for r in pending if r[0] < p.offset]
                self._pending[p.partition] = [r for r in pending if r[0] >= p.offset]
                for offset, value in done:
                    self._out.write(f"{p.partition} {offset} {value}\n")
            self._out.flush()

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            committed = consumer.commit(asynchronous=False)
        except KafkaException:
            committed = None  # nothing to commit, or refused: the next owner reads it again
        if committed:
            self._record(committed)
        with self._lock:
            for p in partitions:
                self._pending.pop(p.partition, None)


def main(argv: list[str]) -> None:
    bootstrap, group, topic, strategy, path = argv
    with open(path, "a") as out:
        member = CountingMember(bootstrap, group, topic, strategy, out)
        while True:
            member.poll_once()


if __name__ == "__main__":
    main(sys.argv[1:])
