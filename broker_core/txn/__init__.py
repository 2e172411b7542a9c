"""Transactions: the state machine, the coordinator and its durable state store, the
marker writer interface, producer-id blocks (file and ZooKeeper) and read visibility.

Depends on ``log`` and below."""
