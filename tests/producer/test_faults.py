"""docs/design.md §8 rows 1-3 through the fault proxy (tests/harness/fault_proxy.py) and a REAL
broker: the producer (or a raw produce stream) talks to the proxy, the proof reads the
broker directly with read_committed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import ErrorCode, NetworkError
from broker_core.producer import Producer
from tests.harness.fault_proxy import Fault, FaultProxy, Rule, nth_batch

ROW_BYTES = 24  # id int64, key int64, value float64
FAST: dict[str, Any] = {
    "linger.ms": 2,
    "retry.backoff.ms": 20,
    "request.timeout.ms": 1000,
    "delivery.timeout.ms": 60_000,
}


def keyed(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 7, "value": ids.astype(np.float64)})


def ids_of(client: BrokerClient, topic: str, partition: int = 0) -> list[int]:
    table = client.read_table(topic, partition, isolation="read_committed")
    return [] if table is None else table.column("id").to_pylist()


def producer(proxy: FaultProxy, rows_per_batch: int = 100, **config: Any) -> Producer:
    settings: dict[str, Any] = {**FAST, "batch.size": rows_per_batch * ROW_BYTES, **config}
    return Producer(proxy.address, **settings)


def test_metadata_points_at_the_proxy(proxy: FaultProxy, client: BrokerClient) -> None:
    client.create_topic("meta", 2)
    with BrokerClient(proxy.address) as via_proxy:
        view = via_proxy.metadata(refresh=True)
        assert {b.address for b in view.brokers.values()} == {proxy.address}
        assert via_proxy.leader("meta", 1).address == proxy.address


def test_row1_ack_lost_request_retried_gives_original_offsets_once(
    proxy: FaultProxy, client: BrokerClient
) -> None:
    client.create_topic("ack-lost", 1)
    # The 2nd batch is appended, its answer swallowed: nothing follows it, so the request
    # times out and the batch is resent with the same producer id, epoch and sequence.
    proxy.set_faults([Rule(Fault.DROP_RESPONSE, nth_batch(2, partition=0))])
    with producer(proxy) as p:
        first = p.send("ack-lost", keyed(100, 0))
        p.flush()
        second = p.send("ack-lost", keyed(100, 100))
        p.flush()
        [meta1] = first.result(0)
        [meta2] = second.result(0)
        metrics = p.metrics_snapshot()
    assert proxy.stats == {"drop_response": 1}
    assert (meta1.base_offset, meta1.last_offset, meta1.duplicate) == (0, 99, False)
    # The retry was a duplicate: the broker answered with the ORIGINAL offsets.
    assert (meta2.base_offset, meta2.last_offset, meta2.duplicate) == (100, 199, True)
    assert metrics["duplicates"] == 1 and metrics["retries"] >= 1, metrics
    assert metrics["record_errors"] == 0 and metrics["epoch_bumps"] == 0
    resent = [a for a in proxy.arrivals if a.base_sequence == 100]
    assert [a.attempt for a in resent] == [0, 1], "sent once, retried once"
    assert ids_of(client, "ack-lost") == list(range(200)), "no second copy"


def test_row2_request_lost_later_ones_out_of_order_resent_in_sequence(
    proxy: FaultProxy, client: BrokerClient
) -> None:
    client.create_topic("req-lost", 1)
    # One send of 800 rows = 8 batches of 100; 5 go in flight at once. The 2nd never
    # reaches the broker, so the ones behind it are OUT_OF_ORDER_SEQUENCE. (Not the 1st:
    # a partition accepts a producer id it never saw at any sequence, docs/design.md §4.)
    proxy.set_faults([Rule(Fault.DROP_REQUEST, nth_batch(2, partition=0))])
    with producer(proxy) as p:
        future = p.send("req-lost", keyed(800, 0))
        p.flush()
        result = future.result(0)
        metrics = p.metrics_snapshot()
    assert proxy.stats == {"drop_request": 1}
    assert sum(m.num_rows for m in result) == 800
    assert metrics["record_errors"] == 0 and metrics["epoch_bumps"] == 0, metrics
    assert metrics["out_of_order_resends"] >= 1, metrics  # the OOS answers were seen
    arrivals = [a for a in proxy.arrivals if a.partition == 0]
    first_retry = next(i for i, a in enumerate(arrivals) if a.attempt > 0)
    initial = arrivals[:first_retry]
    assert max(a.unanswered for a in initial) >= 1, "batches were pipelined before the fault"
    retried = [a for a in arrivals[first_retry:] if a.attempt > 0]
    last_retry = max(i for i, a in enumerate(arrivals) if a.attempt > 0)
    # Resent in sequence order, each alone on the wire (max 1 in flight while retrying),
    # and no new batch got in between.
    assert [a.base_sequence for a in retried] == sorted(a.base_sequence for a in retried)
    assert retried[0].base_sequence == 100
    assert all(a.unanswered == 0 for a in arrivals[first_retry : last_retry + 1]), arrivals
    assert all(a.attempt > 0 for a in arrivals[first_retry : last_retry + 1])
    assert ids_of(client, "req-lost") == list(range(800)), "every row once, in order"


def test_row3_oldest_of_more_than_five_in_flight_retried_is_not_a_second_copy(
    proxy: FaultProxy, client: BrokerClient
) -> None:
    client.create_topic("window", 1)
    proxy.set_faults([Rule(Fault.DROP_RESPONSE, nth_batch(1, partition=0))])
    with BrokerClient(proxy.address) as via_proxy:
        pid, epoch = via_proxy.init_producer_id()
        stream = via_proxy.produce_stream("window", 0)
        handles = [
            stream.send(
                keyed(10, 10 * i).to_batches()[0],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=10 * i,
            )
            for i in range(7)
        ]
        with pytest.raises(NetworkError, match="no answer for correlation id 0"):
            handles[0].result(10)  # its answer was dropped; later ones came
        assert [h.offsets(10) for h in handles[1:]] == [(10 * i, 10 * i + 9) for i in range(1, 7)]
        stream.close()
        # Six batches were appended after the oldest: it left the broker's 5-batch window.
        # Its retry is a certain duplicate all the same, never a second copy.
        retry = via_proxy.produce_stream("window", 0)
        answer = retry.send(
            keyed(10, 0).to_batches()[0], producer_id=pid, producer_epoch=epoch, base_sequence=0
        ).result(10)
        retry.close()
    assert answer.error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER.code, answer
    assert ids_of(client, "window") == list(range(70))


@pytest.mark.parametrize(
    "fault", [Fault.RESET, Fault.REORDER, Fault.DELAY_RESPONSE, Fault.DELAY_REQUEST]
)
def test_other_faults_on_a_pipelined_partition_keep_one_copy_in_order(
    proxy: FaultProxy, client: BrokerClient, fault: Fault
) -> None:
    topic = f"f-{fault.value.replace('_', '-')}"
    client.create_topic(topic, 1)
    proxy.set_faults([Rule(fault, nth_batch(2, partition=0), delay_s=0.2, window=2)])
    with producer(proxy) as p:
        future = p.send(topic, keyed(800, 0))
        p.flush()
        assert sum(m.num_rows for m in future.result(0)) == 800
        assert p.metrics_snapshot()["record_errors"] == 0
    assert proxy.stats == {fault.value: 1}
    assert ids_of(client, topic) == list(range(800))


def test_lost_first_request_of_a_producer_id_becomes_a_reset(
    proxy: FaultProxy, client: BrokerClient
) -> None:
    # A partition accepts a producer id it never saw at any sequence (docs/design.md §4), so the
    # proxy drops a producer's first batch (sequence 0) only with the rest of its stream.
    client.create_topic("first-lost", 1)
    proxy.set_faults([Rule(Fault.DROP_REQUEST, nth_batch(1, partition=0))])
    with producer(proxy) as p:
        future = p.send("first-lost", keyed(800, 0))
        p.flush()
        assert sum(m.num_rows for m in future.result(0)) == 800
    assert proxy.stats == {"drop_request": 1}
    assert proxy.arrivals[0].base_sequence == 0, "the lost first batch is resent first"
    assert ids_of(client, "first-lost") == list(range(800))
