"""The producer against REAL broker processes (tests/harness/broker.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import ProducerFencedError
from broker_core.producer import Producer, SendResult
from tests.harness.broker import BrokerProcess
from tests.harness.waiting import wait_until

FAST = {"linger.ms": 2, "retry.backoff.ms": 20}


def keyed(n: int, start: int, keys: int = 500) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": (ids * 7919) % keys, "value": ids.astype(np.float64)})


def read_all(
    client: BrokerClient, topic: str, partitions: int, isolation: str = "read_committed"
) -> dict[int, pa.Table]:
    result = {}
    for p in range(partitions):
        batches = [b for _m, b in client.fetch(topic, p, isolation=isolation)]
        result[p] = pa.Table.from_batches(batches) if batches else None
    return {p: t for p, t in result.items() if t is not None}


def all_ids(tables: dict[int, pa.Table]) -> list[int]:
    return sorted(i for t in tables.values() for i in t.column("id").to_pylist())


def test_200k_keyed_rows_over_4_partitions_once_in_key_order(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("keyed", 4)
    n, per_send = 200_000, 2_000
    with Producer(broker.address, **FAST, **{"batch.size": 64 * 1024}) as producer:
        futures = [
            producer.send("keyed", keyed(per_send, start), key="key")
            for start in range(0, n, per_send)
        ]
        producer.flush()
        results = [f.result(10) for f in futures]
        metrics = producer.metrics_snapshot()
    assert sum(m.num_rows for r in results for m in r) == n
    assert metrics["records_sent"] == n and metrics["record_errors"] == 0
    tables = read_all(client, "keyed", 4)
    assert all_ids(tables) == list(range(n)), "every row exactly once"
    key_partition: dict[int, int] = {}
    for p, t in tables.items():
        ids = t.column("id").to_numpy()
        keys = t.column("key").to_numpy()
        for k in np.unique(keys):
            assert key_partition.setdefault(int(k), p) == p, "a key in two partitions"
            assert np.all(np.diff(ids[keys == k]) > 0), f"key {k}: order not kept"
    # The offsets reported by the futures point at the rows that were sent.
    first = results[0][0]
    t = tables[first.partition]
    assert t.column("id")[first.base_offset].as_py() in range(per_send)


def test_transactions_commit_and_abort(broker: BrokerProcess, client: BrokerClient) -> None:
    client.create_topic("txn", 2)
    with Producer(broker.address, **FAST, **{"transactional.id": "tx-1"}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        committed = producer.send("txn", keyed(1000, 0), key="key")
        producer.commit_transaction()
        assert sum(m.num_rows for m in committed.result(5)) == 1000
        producer.begin_transaction()
        producer.send("txn", keyed(500, 10_000), key="key")
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("txn", keyed(300, 20_000), key="key")
        producer.commit_transaction()
    expected = list(range(1000)) + list(range(20_000, 20_300))
    assert all_ids(read_all(client, "txn", 2)) == expected
    uncommitted = all_ids(read_all(client, "txn", 2, "read_uncommitted"))
    assert uncommitted == sorted(expected + list(range(10_000, 10_500)))


def test_second_producer_fences_the_first(broker: BrokerProcess, client: BrokerClient) -> None:
    client.create_topic("fence", 1)
    zombie = Producer(broker.address, **FAST, **{"transactional.id": "tx-f"})
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("fence", keyed(100, 0))
    zombie.flush()
    with Producer(broker.address, **FAST, **{"transactional.id": "tx-f"}) as successor:
        successor.init_transactions()  # bumps the epoch, aborts the zombie's transaction
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        successor.begin_transaction()
        successor.send("fence", keyed(50, 1000))
        successor.commit_transaction()
    zombie.close()
    assert all_ids(read_all(client, "fence", 1)) == list(range(1000, 1050))


@pytest.mark.slow
def test_broker_sigkill_mid_stream_then_restart(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("killed", 2)
    producer = Producer(
        broker.address,
        **FAST,
        **{"batch.size": 16 * 1024, "request.timeout.ms": 5000, "delivery.timeout.ms": 60_000},
    )
    futures: list[Future[SendResult]] = []
    acked = threading.Event()
    stop = threading.Event()
    sent_rows = [0]

    def produce() -> None:
        start = 0
        while not stop.is_set() and start < 400_000:
            futures.append(producer.send("killed", keyed(500, start), key="key"))
            start += 500
            sent_rows[0] = start
            if producer.metrics.records_sent > 20_000:
                acked.set()
            time.sleep(0.001)  # a steady stream, not one burst

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        assert acked.wait(30)
        assert broker.kill() == -9
        # The producer keeps sending into the dead broker until its sends start failing.
        errors_before = producer.metrics.retries + producer.metrics.batch_errors
        wait_until(
            lambda: producer.metrics.retries + producer.metrics.batch_errors > errors_before,
            "the producer to see a retry or batch error",
            timeout=60.0,
        )
        broker.restart()
        # ... and resumes: acknowledgements flow again from the restarted broker.
        acked_before = producer.metrics.records_sent
        wait_until(
            lambda: producer.metrics.records_sent > acked_before + 10_000,
            "10,000 more records sent",
            timeout=60.0,
        )
    finally:
        stop.set()
        thread.join(30)
    producer.flush(60)
    results = [f.result(0) for f in futures]
    metrics = producer.metrics_snapshot()
    producer.close()
    n = sent_rows[0]
    assert sum(m.num_rows for r in results for m in r) == n
    assert metrics["retries"] > 0, metrics
    tables = read_all(client, "killed", 2)
    ids = all_ids(tables)
    assert len(ids) == len(set(ids)), "a row was written twice"
    assert ids == list(range(n)), "a row was lost"
    for t in tables.values():
        keys, col = t.column("key").to_numpy(), t.column("id").to_numpy()
        for k in np.unique(keys):
            assert np.all(np.diff(col[keys == k]) > 0)
