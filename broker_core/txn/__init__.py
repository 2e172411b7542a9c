"""Transactions: the coordinator and its parts (``coordinator``), and what it persists in
``__transaction_state`` (``state_topic``: the records, the topic's schema and upgrade, the
store over a state partition, the legacy ZooKeeper reader a migration needs).

Depends on ``log`` and below; where the state partitions live and who leads them is the
broker's (``server.coordination``)."""
