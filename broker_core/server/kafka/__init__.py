"""Kafka's binary protocol on the broker (``kafka.listener``, off by default): the
framing, the APIs served and their versions, the handlers and the TCP listener
(docs/broker.md, "The Kafka listener")."""
