"""Issue 11, item 2: no public Producer call raises a retriable error.

Like Kafka's producer, a public call that needs the cluster (send()'s metadata,
init_transactions / init_sink_transaction's InitProducerId, commit's AddPartitionsToTxn and
EndTxn, prepare_sink_transaction) retries retriable errors retry.backoff.ms apart for up to
max.block.ms, then raises MaxBlockTimeoutError naming max.block.ms; a non-retriable error
is raised at once.

The first tests use a scripted transport; the others a REAL broker behind the fault proxy
with connection resets injected into the actions (tests/producer/action_faults.py). Resets
of coordinator calls outnumber BrokerClient's own retries (5), so they reach the producer.
Each test checks the proxy counted its resets: the call survived a reset that happened.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidTopicError,
    NetworkError,
)
from broker_core.producer import Producer, TxnState
from broker_core.producer.errors import MaxBlockTimeoutError
from broker_core.protocol.wire import Action, SinkAttempt, SinkTxnStatus
from tests.producer.action_faults import ActionFault, ActionFaultProxy
from tests.producer.fakes import AutoTransport, FakeTransport, table

# Far under request.timeout.ms (30 s) and the held call (released only after): a bound on
# a blocking call, not a timing.
BLOCK_BOUND_S = 15.0
BEYOND_CLIENT_RETRIES = 7  # BrokerClient retries a coordinator call 5 times by itself
FAST: dict[str, Any] = {
    "linger.ms": 2,
    "retry.backoff.ms": 20,
    "request.timeout.ms": 5000,
    "max.block.ms": 30_000,
}


# -- scripted transport ---------------------------------------------------------------------
class FlakyMetadata(FakeTransport):
    def __init__(self, errors: list[Exception]) -> None:
        super().__init__(partitions=1)
        self.errors = errors
        self.metadata_calls = 0

    def partitions_for(self, topic: str) -> int:
        self.metadata_calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.partitions


def test_send_retries_retriable_metadata_errors() -> None:
    transport = FlakyMetadata([NetworkError("reset"), CoordinatorNotAvailableError("x")])
    producer = Producer(transport=transport, linger_ms=0, retry_backoff_ms=1)
    try:
        producer.send("t", table(3))  # queued: the scripted transport never answers it
    finally:
        producer.close(timeout=0)
    assert transport.metadata_calls == 3 and transport.errors == []


def test_send_raises_max_block_timeout_not_the_retriable_error() -> None:
    transport = FlakyMetadata([NetworkError("reset")] * 1_000_000)
    producer = Producer(transport=transport, max_block_ms=200, retry_backoff_ms=20)
    with producer, pytest.raises(MaxBlockTimeoutError, match=r"max\.block\.ms=200") as raised:
        producer.send("t", table(3))
    assert isinstance(raised.value, TimeoutError)
    assert isinstance(raised.value.__cause__, NetworkError), "the last error is the cause"
    assert transport.metadata_calls >= 2, "retried before giving up"
    assert f"({transport.metadata_calls} attempts; last error: " in str(raised.value)


def test_send_raises_a_non_retriable_metadata_error_at_once() -> None:
    transport = FlakyMetadata([InvalidTopicError("bad name")])
    producer = Producer(transport=transport, max_block_ms=60_000)
    with producer, pytest.raises(InvalidTopicError):
        producer.send("t", table(3))
    assert transport.metadata_calls == 1


class SlowCoordinator(AutoTransport):
    def __init__(self, failures: int) -> None:
        super().__init__(partitions=1)
        self.failures = failures
        self.end_calls = 0

    def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> tuple[int, int]:
        self.end_calls += 1
        if self.end_calls <= self.failures:
            raise CoordinatorNotAvailableError("loading")
        return super().end_txn(transactional_id, producer_id, epoch, commit)


def test_commit_timing_out_on_end_txn_may_be_called_again() -> None:
    """EndTxn retriable past max.block.ms: commit raises MaxBlockTimeoutError and stays
    COMMITTING (EndTxn is idempotent), so calling commit again completes it -- Kafka's
    behaviour -- instead of leaving only an abort."""
    transport = SlowCoordinator(failures=1_000_000)
    producer = Producer(transport=transport, linger_ms=0, transactional_id="tx", max_block_ms=100)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        future = producer.send("t", table(3))
        with pytest.raises(MaxBlockTimeoutError, match=r"EndTxn.*max\.block\.ms=100"):
            producer.commit_transaction()
        assert transport.end_calls >= 2 and transport.ended == []
        assert producer.txn.state is TxnState.COMMITTING_TRANSACTION
        transport.failures = 0  # the coordinator is back
        producer.commit_transaction()
        assert transport.ended == [True] and producer.txn.state is TxnState.READY
        assert future.result(0)[0].num_rows == 3
    finally:
        producer.close(timeout=0)


# -- a real broker behind the fault proxy ------------------------------------------------------
def rows(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 7})


def committed_ids(client: BrokerClient, topic: str) -> list[int]:
    table = client.read_table(topic, 0, isolation="read_committed")
    return [] if table is None else sorted(table.column("id").to_pylist())


def test_first_send_survives_resets_while_fetching_metadata(
    proxy: ActionFaultProxy, client: BrokerClient
) -> None:
    """The user's report: a reset during a topic's first metadata fetch made send() raise
    NETWORK_EXCEPTION. BrokerClient does not retry metadata: the producer must."""
    client.create_topic("meta-reset", 1)
    with Producer(proxy.address, **FAST) as producer:
        reset = ActionFault(Action.METADATA, times=3)
        proxy.add_action_faults(reset)
        future = producer.send("meta-reset", rows(10))
        producer.flush()
        assert future.result(0)[0].num_rows == 10
    assert proxy.stats[reset.stat] == 3, proxy.stats
    assert committed_ids(client, "meta-reset") == list(range(10))


def test_transactional_calls_survive_resets(proxy: ActionFaultProxy, client: BrokerClient) -> None:
    """InitProducerId, AddPartitionsToTxn and EndTxn each see more resets than BrokerClient
    retries; AddPartitionsToTxn and EndTxn reach the broker first (their answers are lost,
    the retries repeat an applied request)."""
    client.create_topic("txn-reset", 1)
    init = ActionFault(Action.INIT_PRODUCER_ID, times=BEYOND_CLIENT_RETRIES)
    add = ActionFault(Action.ADD_PARTITIONS_TO_TXN, times=BEYOND_CLIENT_RETRIES, forwarded=True)
    end = ActionFault(Action.END_TXN, times=BEYOND_CLIENT_RETRIES, forwarded=True)
    proxy.add_action_faults(init, add, end)
    with Producer(proxy.address, **FAST, transactional_id="tx-reset") as producer:
        producer.init_transactions()
        assert proxy.stats[init.stat] == BEYOND_CLIENT_RETRIES
        producer.begin_transaction()
        future = producer.send("txn-reset", rows(10))
        producer.commit_transaction()
        assert future.result(0)[0].num_rows == 10
        assert producer.txn.state is TxnState.READY
    assert proxy.stats[add.stat] == BEYOND_CLIENT_RETRIES, proxy.stats
    assert proxy.stats[end.stat] == BEYOND_CLIENT_RETRIES, proxy.stats
    assert committed_ids(client, "txn-reset") == list(range(10))


def test_max_block_ms_bounds_an_end_txn_held_by_a_stalled_link(
    proxy: ActionFaultProxy, client: BrokerClient
) -> None:
    """Issue 36: an EndTxn stalled on its link waited out request.timeout.ms (and the
    client's retries) past max.block.ms. Now the call gives up at max.block.ms, the
    commit stays COMMITTING, and calling it again commits once (the held request, let go
    later, is answered as a retry of the one that ended it)."""
    client.create_topic("held-end", 1)
    held = ActionFault(Action.END_TXN, held=True)
    proxy.add_action_faults(held)
    config = {**FAST, "request.timeout.ms": 30_000, "max.block.ms": 3000}
    with Producer(proxy.address, **config, transactional_id="held-end") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        future = producer.send("held-end", rows(10))
        started = time.monotonic()
        with pytest.raises(MaxBlockTimeoutError, match=r"EndTxn.*max\.block\.ms=3000"):
            producer.commit_transaction()
        waited = time.monotonic() - started
        assert proxy.stats[held.stat] == 1, proxy.stats  # the stall happened
        assert waited < BLOCK_BOUND_S, f"commit blocked {waited:.1f} s, max.block.ms is 3 s"
        assert producer.txn.state is TxnState.COMMITTING_TRANSACTION
        producer.commit_transaction()  # a fresh call: the coordinator commits
        assert producer.txn.state is TxnState.READY
        assert future.result(0)[0].num_rows == 10
        held.release.set()
        assert held.released.wait(30), "the held EndTxn reached the broker"
    assert committed_ids(client, "held-end") == list(range(10))
    assert client.list_offsets("held-end", 0)["last_stable_offset"] == 11  # rows + marker


def test_sink_transaction_calls_survive_resets(
    proxy: ActionFaultProxy, client: BrokerClient
) -> None:
    client.create_topic("sink-reset", 1)
    init = ActionFault(Action.INIT_PRODUCER_ID, times=BEYOND_CLIENT_RETRIES)
    prepare = ActionFault(Action.PREPARE_SINK_TXN, times=BEYOND_CLIENT_RETRIES, forwarded=True)
    proxy.add_action_faults(init, prepare)
    attempt = SinkAttempt("sink-reset", "run-1", 3)
    with Producer(proxy.address, **FAST, transactional_id="sink-reset/0") as producer:
        assert producer.init_sink_transaction(attempt) is SinkTxnStatus.NEW
        producer.begin_transaction()
        sent = producer.send("sink-reset", rows(10))
        producer.flush()
        (meta,) = sent.result()
        producer.prepare_sink_transaction(
            3, [("sink-reset", 0, meta.base_offset, meta.last_offset)]
        )
    assert proxy.stats[init.stat] == BEYOND_CLIENT_RETRIES, proxy.stats
    assert proxy.stats[prepare.stat] == BEYOND_CLIENT_RETRIES, proxy.stats
    # Prepared: a later attempt of the task finds all its rows in that transaction.
    with Producer(proxy.address, **FAST, transactional_id="sink-reset/0") as retry:
        assert retry.init_sink_transaction(attempt) is SinkTxnStatus.PREPARED
