"""Helpers of the broker tests (plain functions, not fixtures: the fixtures are in
conftest.py, which test modules never import)."""

from __future__ import annotations

import subprocess
import sys

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from tests.store.helpers import SCHEMA, rows

__all__ = [
    "SCHEMA",
    "TEST_BROKER_CONFIG",
    "idemlog",
    "ids",
    "prepared_attempt",
    "rows",
    "sink_task_attempt",
]

# Small limits, so the tests can hit them with small batches.
TEST_BROKER_CONFIG: dict[str, object] = {
    "max.request.bytes": 256 * 1024,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 100,
    # The cluster tests written around one coordinator (they read __transaction_state-0,
    # kill "the" coordinator) keep one state partition; several: test_state_partitions.
    "transaction.state.log.num.partitions": 1,
}


def idemlog(*args: str) -> subprocess.CompletedProcess[str]:
    """``idemlog ARGS`` run as a user runs it, its output captured; asserts that it did not
    end in a traceback (every failure of the CLI is one line)."""
    done = subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def ids(
    client: BrokerClient, topic: str, partition: int = 0, isolation: str = "read_committed"
) -> list[int]:
    """Every id readable from the partition, in offset order."""
    result: list[int] = []
    for _meta, batch in client.fetch(topic, partition, isolation=isolation):
        result.extend(batch.column("id").to_pylist())
    return result


def prepared_attempt(
    client: BrokerClient,
    attempt: SinkAttempt,
    task: int,
    topic: str,
    batches: dict[int, list[range]],
    *,
    timeout_ms: int | None = None,
) -> tuple[str, int, int]:
    """One sink task attempt: InitProducerId for ``<sink>/<task>``, the id ranges of
    ``batches[p]`` into partition p in one transaction, then prepare with the offsets
    they got -- whatever the init answered. Its (transactional id, pid, epoch), for the
    driver's commit."""
    txn, _ = sink_task_attempt(
        client, attempt, task, topic, batches, timeout_ms=timeout_ms, write_when_reused=True
    )
    return txn


def _write_and_prepare(
    client: BrokerClient,
    txn: tuple[str, int, int],
    batch_id: int,
    topic: str,
    batches: dict[int, list[range]],
) -> None:
    tid, pid, epoch = txn
    client.add_partitions_to_txn(tid, pid, epoch, [(topic, p) for p in batches])
    ranges = []
    for p, spans in batches.items():
        with client.produce_stream(topic, p, transactional_id=tid) as stream:
            acked, sequence = [], 0
            for span in spans:
                acked.append(
                    stream.send(
                        rows(len(span), start=span.start),
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=sequence,
                        transactional=True,
                    ).offsets(10)
                )
                sequence += len(span)
        ranges.append((topic, p, acked[0][0], acked[-1][1]))
    client.prepare_sink_txn(tid, pid, epoch, batch_id, ranges)


def sink_task_attempt(
    client: BrokerClient,
    attempt: SinkAttempt,
    task: int,
    topic: str,
    batches: dict[int, list[range]],
    *,
    timeout_ms: int | None = None,
    write_when_reused: bool = False,
) -> tuple[tuple[str, int, int], SinkTxnStatus]:
    """One sink task attempt exactly as the Spark writer makes it: after an init that
    answers NEW, :func:`prepared_attempt`'s writes and prepare; after one that hands back
    an earlier attempt's transaction of the batch (PREPARED or COMMITTED), nothing is
    written: that transaction holds the task's rows, the earlier attempt's
    (``write_when_reused``: written and prepared all the same). Its (transactional id,
    pid, epoch) and the init's status."""
    tid = f"{attempt.sink_id}/{task}"
    pid, epoch, status = client.init_sink_producer(tid, timeout_ms, attempt)
    if status is SinkTxnStatus.NEW or write_when_reused:
        _write_and_prepare(client, (tid, pid, epoch), attempt.batch_id, topic, batches)
    return (tid, pid, epoch), status
