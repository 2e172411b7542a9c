"""Each transaction ends at its own epoch (Kafka's transaction version 2, KIP-890), so an
end-transaction request that arrives late can never end the transaction after it.

Issue 36, tried black-box: T1's EndTxn held on a stalled link past its timeout, the client
retried on a fresh call and was told T1's outcome, T2 began at the same producer id and
epoch, and the late request, let go, ended T2 (150 of 200 rows visible before T2's commit,
the last stable offset held for good). Here a real broker behind the fault proxy holds the
request, and the test lets it go only once T2's rows are written.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer, TxnState
from broker_core.producer.errors import MaxBlockTimeoutError
from broker_core.protocol.wire import Action
from tests.harness.broker import BrokerProcess
from tests.harness.waiting import wait_until
from tests.producer.action_faults import ActionFault, ActionFaultProxy

CONFIG: dict[str, Any] = {
    "linger.ms": 2,
    "retry.backoff.ms": 20,
    "request.timeout.ms": 30_000,
    # The held request's call gives up after this; the other calls have time to spare on a
    # loaded machine (a first InitProducerId fsyncs the coordinator's record).
    "max.block.ms": 5000,
}


def rows(n: int, start: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 7})


def read(client: BrokerClient, topic: str, isolation: str = "read_committed") -> list[int]:
    table = client.read_table(topic, 0, isolation=isolation)
    return [] if table is None else sorted(table.column("id").to_pylist())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_late_end_txn_never_ends_the_next_transaction(
    proxy: ActionFaultProxy, client: BrokerClient, broker: BrokerProcess, commit: bool
) -> None:
    topic = f"late-end-{'commit' if commit else 'abort'}"
    client.create_topic(topic, 1)
    held = ActionFault(Action.END_TXN, held=True)
    with Producer(proxy.address, **CONFIG, transactional_id=topic) as producer:
        producer.init_transactions()
        first_pid, first_epoch = producer.producer_id_and_epoch
        producer.begin_transaction()
        producer.send(topic, rows(100, 0))
        producer.flush()
        proxy.add_action_faults(held)
        end = producer.commit_transaction if commit else producer.abort_transaction
        with pytest.raises(MaxBlockTimeoutError):
            end()  # T1's EndTxn is held on its link
        assert proxy.stats[held.stat] == 1, proxy.stats
        end()  # the retry, on a fresh call: told T1's outcome
        assert producer.txn.state is TxnState.READY
        # T2 writes at its own epoch.
        assert producer.producer_id_and_epoch == (first_pid, first_epoch + 1)
        producer.begin_transaction()
        t2 = producer.send(topic, rows(150, 1000))
        producer.flush()
        assert len(t2.result(0)) == 1  # written, not yet committed
        held.release.set()  # T1's request reaches the coordinator now, T2 open
        assert held.released.wait(30), "the held EndTxn was answered"
        # The fault fired as meant: the late request reached the broker and was refused.
        decision = "commit" if commit else "abort"
        assert "48 INVALID_TXN_STATE" in held.outcome, held.outcome
        late = (
            f"a late {decision} of the transaction of producer id {first_pid} epoch {first_epoch}"
        )
        assert late in held.outcome, held.outcome
        wait_until(
            lambda: f"refused a late {decision}" in broker.log_text(),
            "the broker's log line for the late request",
        )
        t1_rows = list(range(100)) if commit else []
        # The late request ended nothing: T2 is still open, holding the stable offset.
        assert read(client, topic) == t1_rows
        assert len(read(client, topic, "read_uncommitted")) == 250
        offsets = client.list_offsets(topic, 0)
        assert offsets["last_stable_offset"] < offsets["log_end_offset"]
        producer.commit_transaction()
    assert read(client, topic) == t1_rows + list(range(1000, 1150))
    offsets = client.list_offsets(topic, 0)
    assert offsets["last_stable_offset"] == offsets["log_end_offset"]
