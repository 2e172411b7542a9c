"""1,000,000 rows through 50 randomised fault schedules (tests/harness/fault_proxy.py).

Each schedule: a fresh 4-partition topic on the group's REAL broker, a fresh proxy whose
fault probabilities (drop request, drop response, delay request/response, reorder, reset)
are drawn from the schedule's seed, plus one disruptive fault (drop request / response or
reset) at a seed-chosen early batch so that every schedule injects at least one, and an
idempotent producer bootstrapped from the proxy sending 20,000 keyed rows. After flush
the schedule asserts its faults were injected (the proxy's counters) and made the producer
resend, then reads the topic back from the broker directly with read_committed: every row
exactly once, and in each partition the rows in the order they were sent (ids are sent in
increasing order, so: strictly increasing ids). One summary line per schedule is printed
(``pytest -s`` shows them).

request.timeout.ms is low (400 ms) so a dropped last answer times out fast.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from tests.harness.broker import BrokerFactory
from tests.harness.fault_proxy import Fault, FaultProxy, RandomFaults, Rule, nth_batch

SCHEDULES = 50
GROUPS = 5  # test functions, each with its own broker, SCHEDULES // GROUPS schedules each
ROWS = 20_000
PARTITIONS = 4
SENDS = 20
KEYS = 1000
ROW_BYTES = 24  # id int64, key int64, value float64
CONFIG: dict[str, Any] = {
    "linger.ms": 2,
    "retry.backoff.ms": 10,
    "request.timeout.ms": 400,
    "delivery.timeout.ms": 60_000,
    "batch.size": 250 * ROW_BYTES,
}


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": (ids * 7919) % KEYS, "value": ids.astype(np.float64)})


# Faults the producer cannot miss: each makes it resend (a lost request, a lost answer, a
# broken stream). Delays and reorders alone may pass without any retry.
DISRUPTIVE = (Fault.DROP_REQUEST, Fault.DROP_RESPONSE, Fault.RESET)


@dataclass(frozen=True)
class Schedule:
    seed: int
    topic: str
    random_faults: RandomFaults
    guaranteed: Rule  # fires once whatever the random draws are


def schedule_for(seed: int) -> Schedule:
    """The seed's random fault probabilities, plus one disruptive fault at a seed-chosen
    early batch of a seed-chosen partition: random draws alone may inject nothing (small
    probabilities, few batches), and a schedule without a fault proves nothing."""
    rng = random.Random(seed)
    topic = f"sched-{seed}"
    random_faults = RandomFaults(
        seed,
        drop_request=rng.uniform(0, 0.06),
        drop_response=rng.uniform(0, 0.06),
        delay_request=rng.uniform(0, 0.05),
        delay_response=rng.uniform(0, 0.05),
        reorder=rng.uniform(0, 0.05),
        reset=rng.uniform(0, 0.05),
        max_delay_s=0.05,
        max_window=3,
    )
    # Each partition gets about ROWS / PARTITIONS = 5,000 rows, ~20 batches of 250 rows
    # (batch.size), so its 2nd..10th batch always arrives; the run asserts it fired.
    guaranteed = Rule(
        rng.choice(DISRUPTIVE),
        nth_batch(rng.randint(2, 10), partition=rng.randrange(PARTITIONS), topic=topic),
        delay_s=0.0,
    )
    return Schedule(seed, topic, random_faults, guaranteed)


def test_every_schedule_has_a_fault_that_fires() -> None:
    """The generator itself, without a broker: every seed's guaranteed fault is disruptive
    and early enough to fire, and its random faults are not all zero."""
    for seed in range(SCHEDULES):
        schedule = schedule_for(seed)
        assert schedule.guaranteed.fault in DISRUPTIVE
        assert schedule.guaranteed.times == 1
        faults = schedule.random_faults
        total = faults.drop_request + faults.drop_response + faults.reset + faults.reorder
        assert total > 0, seed


def run_schedule(broker_address: str, client: BrokerClient, seed: int) -> str:
    schedule = schedule_for(seed)
    topic = schedule.topic
    client.create_topic(topic, PARTITIONS)
    started = time.monotonic()
    with FaultProxy(
        broker_address, rules=[schedule.guaranteed], random_faults=schedule.random_faults
    ) as proxy:
        with Producer(proxy.address, **CONFIG) as producer:
            per_send = ROWS // SENDS
            futures = [
                producer.send(topic, rows(start, per_send), key="key")
                for start in range(0, ROWS, per_send)
            ]
            producer.flush(60)
            results = [f.result(0) for f in futures]
            metrics = producer.metrics_snapshot()
        injected = dict(sorted(proxy.stats.items()))
    elapsed = time.monotonic() - started
    # The schedule really injected faults, and the producer had to recover from them: a
    # run without any would pass for nothing.
    assert schedule.guaranteed.fired == 1, f"seed {seed}: the guaranteed fault never fired"
    assert sum(injected.values()) >= 1, f"seed {seed}: no fault injected {injected}"
    assert metrics["send_attempts"] > metrics["batches_sent"], (
        f"seed {seed}: no batch was resent despite {injected}: {metrics}"
    )
    assert metrics["record_errors"] == 0, (seed, metrics)
    assert sum(m.num_rows for r in results for m in r) == ROWS
    seen: list[np.ndarray] = []
    key_partition: dict[int, int] = {}
    for p in range(PARTITIONS):
        table = client.read_table(topic, p, isolation="read_committed")
        assert table is not None, f"seed {seed}: partition {p} is empty"
        ids = table.column("id").to_numpy()
        assert np.all(np.diff(ids) > 0), f"seed {seed}: partition {p} not in send order"
        for k in np.unique(table.column("key").to_numpy()):
            assert key_partition.setdefault(int(k), p) == p, f"seed {seed}: key {k} split"
        seen.append(ids)
    every = np.sort(np.concatenate(seen))
    assert len(every) == ROWS and np.array_equal(every, np.arange(ROWS)), (
        f"seed {seed}: {len(every)} rows read, {len(np.unique(every))} distinct, {ROWS} sent"
    )
    return (
        f"schedule seed={seed} rows={ROWS} faults={sum(injected.values())} {injected} "
        f"retries={metrics['retries']} oos_resends={metrics['out_of_order_resends']} "
        f"duplicates={metrics['duplicates']} epoch_bumps={metrics['epoch_bumps']} "
        f"attempts={metrics['send_attempts']} batches={metrics['batches_sent']} "
        f"{elapsed:.2f}s"
    )


@pytest.mark.slow
@pytest.mark.parametrize("group", range(GROUPS))
def test_random_fault_schedules_every_row_once_in_order(
    broker_factory: BrokerFactory, group: int
) -> None:
    broker = broker_factory()
    per_group = SCHEDULES // GROUPS
    with BrokerClient(broker.address) as client:
        for seed in range(group * per_group, (group + 1) * per_group):
            print(run_schedule(broker.address, client, seed), flush=True)
