"""A transactional producer in a process of its own, for ``test_cli_consume``.

python -m tests.broker.cli_producer ADDRESS TOPIC FIRST COUNT TRANSACTIONS

Commits ``TRANSACTIONS`` transactions holding the ids ``FIRST .. FIRST+COUNT-1`` between
them (an ``id: int64`` column), then prints ``COMMITTED <n>`` and exits 0.
"""

from __future__ import annotations

import sys

import pyarrow as pa

from broker_core.producer.producer import Producer


def main(address: str, topic: str, first: int, count: int, transactions: int) -> None:
    ids = list(range(first, first + count))
    per = -(-count // transactions)
    with Producer(address, **{"transactional.id": f"cli-producer-{topic}-{first}"}) as producer:
        producer.init_transactions()
        for start in range(0, count, per):
            producer.begin_transaction()
            producer.send(topic, pa.table({"id": pa.array(ids[start : start + per], pa.int64())}))
            producer.commit_transaction()
    print(f"COMMITTED {count}", flush=True)


if __name__ == "__main__":
    address, topic, first, count, txns = sys.argv[1:6]
    main(address, topic, int(first), int(count), int(txns))
