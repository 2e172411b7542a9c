"""Which ``__transaction_state`` partition coordinates a key (docs/design.md §10).

Shared by the broker (which serves a key only from the coordinator of its partition) and
the client (which caches one coordinator per partition), so both compute it alike.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from broker_core.errors import InvalidRequestError
from broker_core.protocol.wire import field

TXN_STATE_TOPIC = "__transaction_state"


def state_partition_of(key: str, partitions: int) -> int:
    """The ``__transaction_state`` partition whose leader coordinates ``key``: crc32 of
    the part before the first '/' (a sink task's id ``<sink>/<n>`` lands with its sink),
    mod ``partitions``. Stable across processes and versions (never Python's ``hash``).
    Raises InvalidRequestError for ``partitions`` < 1."""
    if partitions < 1:
        raise InvalidRequestError(f"{TXN_STATE_TOPIC} needs at least 1 partition, not {partitions}")
    return zlib.crc32(key.split("/", 1)[0].encode("utf-8")) % partitions


STATE_PARTITION_FIELD = "state_partition"
ALL_LED = None  # no ``state_partition`` in a key-less request: every partition the broker leads


def state_partition_field(doc: dict[str, Any], what: str) -> int | None:
    """The optional ``state_partition`` of a key-less request (``list_transactions``,
    ``abort_sink_run`` by run, ``stable_ends``, ``tracked_batches``): the one state
    partition whose coordinator must answer, or :data:`ALL_LED`. Raises
    InvalidRequestError naming the field for a value that is not an int >= 0."""
    value: int | None = field(doc, STATE_PARTITION_FIELD, int, what, ALL_LED)
    if value is not None and value < 0:
        raise InvalidRequestError(
            f"{what}: field {STATE_PARTITION_FIELD!r} must be >= 0, got {value}"
        )
    return value


def with_state_partition(doc: dict[str, Any], state_partition: int | None) -> dict[str, Any]:
    """``doc`` with ``state_partition`` set when one is named (none: the old shape)."""
    if state_partition is not None:
        doc[STATE_PARTITION_FIELD] = state_partition
    return doc


@dataclass(frozen=True, slots=True)
class CoordinatorAddress:
    """FIND_COORDINATOR's answer: the broker leading ``state_partition`` of the
    ``state_partitions`` partitions of ``__transaction_state`` (the key's, or the one
    asked for); older brokers answer only the address (one state partition)."""

    broker_id: int
    host: str
    port: int
    state_partition: int = 0
    state_partitions: int = 1

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_doc(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "host": self.host,
            "port": self.port,
            "state_partition": self.state_partition,
            "state_partitions": self.state_partitions,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> CoordinatorAddress:
        what = "find_coordinator answer"
        partitions: int = field(doc, "state_partitions", int, what, 1)
        partition: int = field(doc, STATE_PARTITION_FIELD, int, what, 0)
        if partitions < 1 or not 0 <= partition < partitions:
            raise InvalidRequestError(
                f"{what}: state partition {partition} of {partitions} is out of range"
            )
        return cls(
            field(doc, "broker_id", int, what),
            field(doc, "host", str, what),
            field(doc, "port", int, what),
            partition,
            partitions,
        )
