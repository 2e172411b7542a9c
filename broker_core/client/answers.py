"""The typed answer the client assembles itself: ``find_hanging_transactions`` returns
:class:`HangingTransaction`. The answers the broker sends (``describe_topics``'s
``TopicDescription`` with its ``PartitionInfo`` and ``PartitionOffsets``,
``list_transactions``' ``TransactionListing``) live with their requests, in
``protocol.admin_requests``. Every ``idemlog --json`` output is an answer's ``to_json()``,
and every text view renders from the same object, so the two carry the same fields
(docs/broker.md, "JSON answers", lists each shape and a test checks its keys against these
classes).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_core.protocol.requests import Doc as JsonDoc


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """A transaction open on a partition that no coordinator knows, idle at least the
    asked time (``find_hanging_transactions``): its producer as the partition's leader
    keeps it, and the partition's offsets, which it holds back at ``txn_start_offset``."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    txn_start_offset: int
    idle_ms: int
    last_stable_offset: int
    log_end_offset: int

    def to_json(self) -> JsonDoc:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "coordinator_epoch": self.coordinator_epoch,
            "txn_start_offset": self.txn_start_offset,
            "idle_ms": self.idle_ms,
            "last_stable_offset": self.last_stable_offset,
            "log_end_offset": self.log_end_offset,
        }
