"""spark_sink.heartbeat: the process's one heartbeat thread keeps a registered run's
prepared transaction alive past transaction.timeout.ms, against a real broker process
(docs/design.md, "Long batches"); a run nobody beats for is timed out in the same test,
so the timeout really could have fired."""

from __future__ import annotations

import threading
import time

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt
from spark_sink.heartbeat import HEARTBEATS, Heartbeats, heartbeat_interval_s
from spark_sink.options import Scope, parse_options
from tests.broker.helpers import TEST_BROKER_CONFIG, prepared_attempt, rows
from tests.harness.broker import BrokerFactory
from tests.harness.waiting import wait_until

TOPIC = "beats"
TIMEOUT_MS = 1000  # the shortest a test can wait out a few times over


def _timed_out(client: BrokerClient) -> int:
    txns = client.metrics()["transactions"]
    assert txns is not None
    return int(txns["transactions_timed_out"])


def test_a_beaten_run_outlives_its_timeout_and_an_unbeaten_one_is_timed_out(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    options = parse_options(
        {"brokers": broker.address, "topic": TOPIC, "transaction.timeout.ms": str(TIMEOUT_MS)},
        Scope.WRITE,
    )
    assert heartbeat_interval_s(options) == TIMEOUT_MS / 4000
    with BrokerClient(broker.address) as client:
        client.create_topic(TOPIC, 1, schema=rows(1).schema)
        beaten = SinkAttempt("sink-beaten", "run-a", 0)
        idle = SinkAttempt("sink-idle", "run-b", 0)
        txn_beaten = prepared_attempt(
            client, beaten, 0, TOPIC, {0: [range(0, 10)]}, timeout_ms=TIMEOUT_MS
        )
        with HEARTBEATS.beating(options, broker.address, beaten.sink_id, beaten.run_id):
            assert HEARTBEATS.registered() == 1
            prepared_attempt(client, idle, 0, TOPIC, {0: [range(10, 20)]}, timeout_ms=TIMEOUT_MS)
            # The control: the run nobody beats for is timed out (the broker checks every
            # 100 ms), while the beaten one has gone as long without a write.
            wait_until(lambda: _timed_out(client) >= 1, "the idle run's transaction timed out")
            # The scenario's duration, not a synchronisation: three more timeouts in which
            # only the beats keep the beaten run alive.
            time.sleep(3 * TIMEOUT_MS / 1000)
            assert _timed_out(client) == 1
        assert HEARTBEATS.registered() == 0
        # Its prepared transaction was never aborted: the batch commits.
        assert client.commit_sink_batch(beaten.sink_id, 0, [txn_beaten], beaten.run_id)


def test_one_thread_serves_every_task_of_the_process_and_entries_leave_with_their_task(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    options = parse_options({"brokers": broker.address, "topic": TOPIC}, Scope.WRITE)
    beats = Heartbeats()
    before = {t.ident for t in threading.enumerate() if t.name == "idemlog-heartbeat"}
    for i in range(20):  # twenty tasks, one after the other, as a reused Python worker
        with beats.beating(options, broker.address, f"sink-{i}", "run"):
            assert beats.registered() == 1
    assert beats.registered() == 0  # the bound: nothing is left behind
    after = {t.ident for t in threading.enumerate() if t.name == "idemlog-heartbeat"}
    assert len(after - before) == 1
