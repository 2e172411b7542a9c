"""One confluent-kafka group member as a process of its own, so a test can SIGKILL it.

``python -m tests.harness.group_member BOOTSTRAP GROUP TOPIC STRATEGY OUT`` consumes
``TOPIC`` in ``GROUP`` with ``partition.assignment.strategy`` STRATEGY, commits each
record synchronously after processing it, and only then appends ``partition offset
value`` to OUT (flushed), so OUT lists exactly the records whose commit was acknowledged.
It writes ``assigned p,p,..`` lines as its assignment changes, and runs until killed.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from confluent_kafka import Consumer, KafkaException

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
        "topic.metadata.refresh.interval.ms": 1_000,
    }


def consume_once(consumer: Consumer, out: TextIO) -> bool:
    """Poll one record; process (record it) only once its commit was acknowledged.
    False when nothing came."""
    message = consumer.poll(0.2)
    if message is None or message.error() is not None:
        return False
    try:
        consumer.commit(message=message, asynchronous=False)
    except KafkaException:
        return True  # not committed (a rebalance took the partition): its new owner reads it
    out.write(f"{message.partition()} {message.offset()} {message.value().decode()}\n")
    out.flush()
    return True


def main(argv: list[str]) -> None:
    bootstrap, group, topic, strategy, path = argv
    consumer = Consumer(member_config(bootstrap, group, strategy))
    with open(path, "a") as out:

        def assigned(_: Consumer, partitions: list[Any]) -> None:
            out.write(f"assigned {','.join(str(p.partition) for p in partitions)}\n")
            out.flush()

        consumer.subscribe([topic], on_assign=assigned)
        while True:
            consume_once(consumer, out)


if __name__ == "__main__":
    main(sys.argv[1:])
