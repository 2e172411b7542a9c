"""A sink commit on a real broker process (docs/design.md §6, §10): one marker append per
partition whatever the number of tasks, and a coordinator SIGKILLed between the sink's
PREPARE record and its markers (or after the first partition's) finishes the commit
when it restarts, readers seeing the batch once and whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import NetworkError
from broker_core.protocol.wire import SinkAttempt
from testkit.broker_failpoints import ENV as FAILPOINT_ENV
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, prepared_attempt
from tests.harness.broker import TEST_HOOKS, BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
TOPIC = "ledger"
TASKS, PARTITIONS = 4, 3


def _batch(client: BrokerClient, batch: int) -> tuple[list[tuple[str, int, int]], list[int]]:
    """A prepared sink batch of TASKS tasks writing 5 rows to every partition; its
    transactions and every id it wrote."""
    attempt = SinkAttempt("q", "run-1", batch)
    txns, written = [], []
    for task in range(TASKS):
        spans = {
            p: [
                range(
                    batch * 10_000 + task * 100 + p * 10, batch * 10_000 + task * 100 + p * 10 + 5
                )
            ]
            for p in range(PARTITIONS)
        }
        txns.append(prepared_attempt(client, attempt, task, TOPIC, spans))
        written += [i for ranges in spans.values() for r in ranges for i in r]
    return txns, written


def _partition_rows(client: BrokerClient) -> dict[int, dict[str, Any]]:
    doc = client.metrics()
    return {r["partition"]: r for r in doc["partitions"] if r["topic"] == TOPIC}


def _read_all(client: BrokerClient) -> list[int]:
    return sorted(i for p in range(PARTITIONS) for i in ids(client, TOPIC, p))


def test_a_sink_commit_is_one_marker_append_per_partition(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    client = client_for(broker)
    client.create_topic(TOPIC, PARTITIONS)
    txns, written = _batch(client, 0)
    before = _partition_rows(client)
    assert client.commit_sink_batch("q", 0, txns, "run-1") is True
    after = _partition_rows(client)
    for p in range(PARTITIONS):
        assert after[p]["marker_appends"] - before[p]["marker_appends"] == 1
        # TASKS markers in it, and the LSO past the batch.
        assert after[p]["log_end_offset"] - before[p]["log_end_offset"] == TASKS
        assert after[p]["last_stable_offset"] == after[p]["log_end_offset"]
    assert _read_all(client) == sorted(written)


def _log_of_start(broker: BrokerProcess, start: int) -> str:
    return broker.log_text().split("\n=== start ")[start]


@pytest.mark.parametrize("failpoint", ["after_prepare", "after_first_marker"])
def test_sigkill_between_the_sink_prepare_and_its_markers_is_finished_on_restart(
    broker_factory: BrokerFactory, client_for: ClientFor, failpoint: str
) -> None:
    broker = broker_factory({**TEST_BROKER_CONFIG, **TEST_HOOKS}, env={FAILPOINT_ENV: failpoint})
    client = client_for(broker, retries=0)
    client.create_topic(TOPIC, PARTITIONS)
    txns, written = _batch(client, 0)
    with pytest.raises(NetworkError):
        client.commit_sink_batch("q", 0, txns, "run-1")
    assert broker.wait_exit(30) == -9  # the failpoint's SIGKILL
    assert f"test failpoint {failpoint}" in broker.log_text()

    broker.restart()  # no failpoint this time
    assert "finishing 0 prepared transactions and 1 sink commits" in _log_of_start(broker, 2)

    def stable() -> bool:
        rows = _partition_rows(client)
        return all(rows[p]["lso_lag"] == 0 for p in range(PARTITIONS))

    wait_until(stable, "the restarted coordinator to finish the commit", timeout=30)
    rows = _partition_rows(client)
    # The restart wrote each partition's markers again (harmless), in one append.
    assert [rows[p]["marker_appends"] for p in range(PARTITIONS)] == [1] * PARTITIONS
    assert _read_all(client) == sorted(written)  # once, whole
    ends = client.stable_ends(TOPIC)
    assert all(ends[p] == rows[p]["log_end_offset"] for p in range(PARTITIONS))
    # The driver's retry of the commit: committed before, nothing twice.
    assert client.commit_sink_batch("q", 0, txns, "run-1") is False
    assert _read_all(client) == sorted(written)
