"""The client's typed answers to operators' calls: frozen dataclasses, one per shape.

``BrokerClient.describe_topics`` returns :class:`TopicDescription` (its partitions as
:class:`PartitionInfo`, with :class:`PartitionOffsets` when asked for them),
``list_transactions`` returns :class:`TransactionListing`, ``find_hanging_transactions``
:class:`HangingTransaction`. Every ``idemlog --json`` output is an answer's ``to_json()``,
and every text view renders from the same object, so the two carry the same fields
(docs/broker.md, "JSON answers", lists each shape and a test checks its keys against these
classes). The first four are the broker's answers as the wire carries them, so they live
with their requests (``protocol.admin_requests``) and are named here with the one the
client assembles itself. A field a broker from before it does not send gets the value that
broker implied (a leader alone in its replicas and ISR).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_core.protocol.admin_requests import PartitionInfo as PartitionInfo
from broker_core.protocol.admin_requests import PartitionOffsets as PartitionOffsets
from broker_core.protocol.admin_requests import TopicDescription as TopicDescription
from broker_core.protocol.admin_requests import TransactionListing as TransactionListing
from broker_core.protocol.admin_requests import schema_fields as schema_fields
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
