"""Issue 23 test 6: transactional ids expire in a real broker process (docs/design.md §5,
"Expiry"). A finished df.write-like job's ids and sink record, and an idle producer's id,
disappear from ``idemlog transactions list --all``; the coordinator's count drops in the
metrics; a restart does not bring them back (the tombstones are loaded); the late producer
gets a clear, non-retriable error, and initialising again gives it a new producer id.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.producer.producer import Producer
from broker_core.protocol.txn_inputs import batch_job_sink_id
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, prepared_attempt, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

# Serial (docs/contributing.md): waits on expiry timers a loaded machine stretches.
pytestmark = pytest.mark.serial

TOPIC = "expiring"
EXPIRY_MS = 4_000
CONFIG = {
    **TEST_BROKER_CONFIG,
    "transactional.id.expiration.ms": EXPIRY_MS,
    "transaction.remove.expired.transaction.cleanup.interval.ms": 200,
}


def cli_list_all(broker: BrokerProcess, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", "transactions", "list", "--all",
         *args, "--bootstrap", broker.address],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def listed(broker: BrokerProcess) -> dict[str, str]:
    """``idemlog transactions list --all --json``: transactional id -> state."""
    return {r["transactional_id"]: r["state"] for r in json.loads(cli_list_all(broker, "--json"))}


def coordinator_metrics(client: BrokerClient) -> dict[str, Any]:
    transactions = client.metrics()["transactions"]
    assert transactions is not None
    return dict(transactions)


def test_idle_ids_and_a_finished_jobs_sink_expire_and_stay_gone(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(CONFIG)
    client = BrokerClient(broker.address, timeout_s=20.0)
    client.create_topic(TOPIC, 2, schema=rows(1).schema)
    # A df.write job: two tasks, one commit by the driver, under the job's sink id.
    run = uuid.uuid4().hex
    job = batch_job_sink_id(run)
    attempt = SinkAttempt(job, run, 0)
    txns = [
        prepared_attempt(client, attempt, 0, TOPIC, {0: [range(0, 5)]}),
        prepared_attempt(client, attempt, 1, TOPIC, {1: [range(5, 10)]}),
    ]
    assert client.commit_sink_batch(job, 0, txns, run) is True
    # A plain transactional producer, idle once it committed.
    late = Producer(broker.address, **{"transactional.id": "late", "max.block.ms": 5000})
    late.init_transactions()
    late.begin_transaction()
    late.send(TOPIC, rows(2, 100)).result(10)
    late.commit_transaction()
    old_pid, _ = late.producer_id_and_epoch
    before = listed(broker)
    assert before == {
        f"{job}/0": "COMPLETE_COMMIT",
        f"{job}/1": "COMPLETE_COMMIT",
        "late": "COMPLETE_COMMIT",
    }
    assert coordinator_metrics(client)["transactional_ids"] == 3

    wait_until(lambda: listed(broker) == {}, "every idle id expired", timeout=60)
    figures = coordinator_metrics(client)
    assert figures["transactional_ids"] == 0 and figures["transactional_ids_expired"] == 3
    assert figures["sinks"] == 0 and figures["sinks_expired"] == 1

    client.close()
    broker.stop()
    broker.restart()
    client = BrokerClient(broker.address, timeout_s=20.0)
    try:
        assert listed(broker) == {}  # the tombstones were loaded: nothing comes back
        figures = coordinator_metrics(client)
        assert figures["transactional_ids"] == 0 and figures["sinks"] == 0
        assert sorted(ids(client, TOPIC, 0) + ids(client, TOPIC, 1)) == [
            *range(10),
            100,
            101,
        ]
        # The late producer's next transaction: refused, clearly, and not retried.
        late.begin_transaction()
        with pytest.raises(IdemlogError) as refused:
            late.send(TOPIC, rows(2, 200)).result(30)
            late.commit_transaction()
        error = refused.value
        # The producer fails the transaction (abortable) with the coordinator's answer.
        assert "INVALID_PRODUCER_ID_MAPPING" in str(error) and "'late'" in str(error)
        assert "transactional.id.expiration.ms=4000" in str(error)
        assert not error.retriable
        # Aborting re-initialises the id (a new InitProducerId): a new producer id, never
        # the old one, and the next transaction commits.
        late.abort_transaction()
        assert late.producer_id_and_epoch[0] != old_pid
        late.begin_transaction()
        late.send(TOPIC, rows(2, 300)).result(10)
        late.commit_transaction()
        late.close()
        assert listed(broker) == {"late": "COMPLETE_COMMIT"}
        table = cli_list_all(broker).splitlines()
        assert table[0] == "1 transactional ids" and table[2].split()[:2] == [
            "late",
            "COMPLETE_COMMIT",
        ]
        assert 300 in ids(client, TOPIC, 0) + ids(client, TOPIC, 1)
        assert 200 not in ids(client, TOPIC, 0, "read_uncommitted") + ids(
            client, TOPIC, 1, "read_uncommitted"
        )
    finally:
        client.close()


def test_a_stream_slower_than_the_expiry_goes_on_and_its_record_stays(
    broker_factory: BrokerFactory,
) -> None:
    """A query whose trigger is slower than transactional.id.expiration.ms: between its
    batches its ids expire, the next batch initialises them again (new producer ids) and
    commits; its sink record stays, so after a restart the re-run of its last batch is
    recognised as committed and nothing is written twice."""
    broker = broker_factory(CONFIG)
    client = BrokerClient(broker.address, timeout_s=20.0)
    try:
        client.create_topic(TOPIC, 2, schema=rows(1).schema)
        query = str(uuid.uuid4())
        first = SinkAttempt(query, "run-1", 0)
        txns = [prepared_attempt(client, first, 0, TOPIC, {0: [range(0, 5)]})]
        assert client.commit_sink_batch(query, 0, txns, "run-1") is True
        wait_until(lambda: listed(broker) == {}, "the idle query's id expired", timeout=60)
        assert coordinator_metrics(client)["sinks"] == 1  # its record is kept
        second = SinkAttempt(query, "run-1", 1)
        txns2 = [prepared_attempt(client, second, 0, TOPIC, {0: [range(5, 10)]})]
        assert txns2[0][1] != txns[0][1]  # a new producer id for the expired id
        assert client.commit_sink_batch(query, 1, txns2, "run-1") is True
        client.close()
        broker.stop()
        broker.restart()
        client = BrokerClient(broker.address, timeout_s=20.0)
        # The driver died before its checkpoint recorded batch 1: the restarted query
        # (a new run) re-runs it. The record says it is committed: nothing is written.
        _, _, status = client.init_sink_producer(f"{query}/0", None, SinkAttempt(query, "run-2", 1))
        assert status is SinkTxnStatus.COMMITTED
        assert ids(client, TOPIC, 0) == list(range(10))
    finally:
        client.close()
