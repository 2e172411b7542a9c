"""A broker restarted more often than ``producer.id.expiration.check.interval.ms`` still
forgets producers idle past ``producer.id.expiration.ms`` (docs/storage.md, producer
expiry): the partition drops them when it is opened. Before, every restart put the
periodic pass off again, and a stream's topic kept the state of every producer that had
ever written it, reloaded from the snapshot at each start (``make bench-soak``).
"""

from __future__ import annotations

import signal
import time

import pytest

from broker_core.client.broker_client import BrokerClient
from tests.broker.helpers import TEST_BROKER_CONFIG, rows
from tests.harness.broker import BrokerFactory
from tests.harness.waiting import wait_until

TOPIC = "finished-jobs"
EXPIRY_MS = 6_000  # longer than the restarts below take on a loaded machine
FINISHED = 6  # producers that write once and are never heard from again
CONFIG = {
    **TEST_BROKER_CONFIG,
    "log.producer.id.expiration.ms": EXPIRY_MS,
    # The periodic pass never runs during the test: only the restart can drop them.
    "producer.id.expiration.check.interval.ms": 3_600_000,
}


def _partition(client: BrokerClient) -> dict[str, int]:
    doc = client.metrics()
    partition: dict[str, int] = next(p for p in doc["partitions"] if p["topic"] == TOPIC)
    return partition


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["clean", "crash"])
def test_a_restart_forgets_producers_idle_past_their_expiration(
    broker_factory: BrokerFactory, stop: signal.Signals
) -> None:
    broker = broker_factory(CONFIG)
    with BrokerClient(broker.address, timeout_s=20.0) as client:
        client.create_topic(TOPIC, 1)
        with client.produce_stream(TOPIC, 0) as stream:
            for i in range(FINISHED):
                pid, epoch = client.init_producer_id()
                stream.send(
                    rows(1, start=i), producer_id=pid, producer_epoch=epoch, base_sequence=0
                ).offsets(10)
        written = time.monotonic()
        assert _partition(client)["producers"] == FINISHED
    # Past their expiration, and the periodic pass has not run: they are all still there.
    wait_until(lambda: time.monotonic() - written > EXPIRY_MS / 1000 + 0.5, "the expiry")
    with BrokerClient(broker.address, timeout_s=20.0) as client:
        before = _partition(client)
        assert (before["producers"], before["expired_producers"]) == (FINISHED, 0)

    broker.kill(stop)
    broker.restart()

    with BrokerClient(broker.address, timeout_s=20.0) as client:
        after = _partition(client)
        assert after["producers"] == 0, after
        assert after["log_end_offset"] == FINISHED  # their rows stay; only the state goes
        # A producer that writes now is kept across the next restart (not yet expired).
        pid, epoch = client.init_producer_id()
        with client.produce_stream(TOPIC, 0) as stream:
            stream.send(
                rows(1, start=FINISHED), producer_id=pid, producer_epoch=epoch, base_sequence=0
            ).offsets(10)
    broker.kill(stop)
    broker.restart()
    with BrokerClient(broker.address, timeout_s=20.0) as client:
        assert _partition(client)["producers"] == 1
    assert f"dropped {FINISHED} producers idle past" in broker.log_text()
