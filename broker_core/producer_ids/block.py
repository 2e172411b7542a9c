"""Producer-id allocation: blocks of 1000 ids leased from one shared record (docs/design.md §5).

The record, in ZooKeeper node ``/latest_producer_id_block`` or, without ZooKeeper, in a
local file, is UTF-8 JSON, byte for byte what Kafka writes::

    {"version":1,"broker":B,"block_start":"S","block_end":"E"}

``B`` is the broker that leased the block, ``S`` and ``E`` its first and last id (inclusive),
as decimal strings (64-bit values do not survive every JSON parser as numbers). The record
names the most recently leased block, so the next block is ``E+1 .. E+1000``; the first is
``0 .. 999``. Blocks are never reused: the record only moves forward, and every update is
conditional on the version that was read (ZooKeeper's version check, or an exclusive file
lock), so two brokers can never lease the same block. A lease that fails half-way (a write
whose reply was lost) may waste a block, never duplicate one.

Like Kafka, no block may end at ``2**63 - 1``: the last block that can be leased starts at
``2**63 - 1 - 1000``; asking for one more raises :class:`ProducerIdSpaceExhaustedError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from broker_core.errors import (
    InvalidRequestError,
    ProducerIdSpaceExhaustedError,
    UnknownServerError,
)

PRODUCER_ID_BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1
LATEST_PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
RECORD_VERSION = 1


class CorruptProducerIdBlockRecordError(UnknownServerError):
    """The stored block record cannot be parsed.

    Not retriable: guessing where the id space stands could hand out ids twice, so an
    operator has to repair or restore the record.
    """


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Ids ``start .. end`` (inclusive), leased by ``broker_id``."""

    broker_id: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= MAX_PRODUCER_ID:
            raise ValueError(f"invalid producer id block {self.start}..{self.end}")

    @property
    def size(self) -> int:
        return self.end - self.start + 1

    def __contains__(self, producer_id: object) -> bool:
        return isinstance(producer_id, int) and self.start <= producer_id <= self.end

    def to_record(self) -> bytes:
        """The stored form; key order and compact separators match Kafka's znode."""
        record = {
            "version": RECORD_VERSION,
            "broker": self.broker_id,
            "block_start": str(self.start),
            "block_end": str(self.end),
        }
        return json.dumps(record, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_record(cls, data: bytes, where: str) -> ProducerIdBlock:
        """Parse a stored record; ``where`` names its file or znode in the error message."""

        def corrupt(problem: str) -> CorruptProducerIdBlockRecordError:
            shown = data[:200].decode("utf-8", "replace")
            return CorruptProducerIdBlockRecordError(
                f"producer id block record {where} is corrupt ({problem}): {shown!r}; "
                "refusing to lease producer ids until it is repaired"
            )

        try:
            record = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise corrupt(f"not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise corrupt("not a JSON object")
        if record.get("version") != RECORD_VERSION:
            raise corrupt(f"unsupported version {record.get('version')!r}")
        broker = record.get("broker")
        if not isinstance(broker, int) or isinstance(broker, bool):
            raise corrupt("'broker' is not an integer")
        bounds: list[int] = []
        for key in ("block_start", "block_end"):
            value = record.get(key)
            # Decimal strings only, as Kafka writes them (no sign, no spaces, no floats).
            if not isinstance(value, str) or not value.isascii() or not value.isdigit():
                raise corrupt(f"{key!r} is not a decimal string")
            bounds.append(int(value))
        start, end = bounds
        if not start <= end <= MAX_PRODUCER_ID:
            raise corrupt(f"block {start}..{end} is empty or beyond 2^63-1")
        return cls(broker_id=broker, start=start, end=end)


def check_broker_id(broker_id: int) -> None:
    if not isinstance(broker_id, int) or isinstance(broker_id, bool) or broker_id < 0:
        raise InvalidRequestError(f"broker id must be a non-negative integer, got {broker_id!r}")


def next_block_after(previous: ProducerIdBlock | None, broker_id: int) -> ProducerIdBlock:
    """The block to lease after ``previous`` (the first block if there is none)."""
    start = 0 if previous is None else previous.end + 1
    # Kafka's bound: the check is on the start, so the last block ends at 2^63-2.
    if start > MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE:
        raise ProducerIdSpaceExhaustedError(
            f"producer id space exhausted: the last leased block ends at {start - 1}; the "
            f"next would be {start}..{start + PRODUCER_ID_BLOCK_SIZE - 1}, but no block may "
            f"start after 2^63-1-{PRODUCER_ID_BLOCK_SIZE} (Kafka's limit)"
        )
    return ProducerIdBlock(broker_id, start, start + PRODUCER_ID_BLOCK_SIZE - 1)


class ProducerIdBlockSource(Protocol):
    """Where blocks come from: each call leases a block no other caller ever gets."""

    def next_block(self, broker_id: int) -> ProducerIdBlock: ...


class IssuedProducerIds:
    """``producer_id_known`` for the store: was this id ever handed out by the cluster?

    True for every id up to the end of the newest leased block. The bound is cached and
    re-read from the block record only on a miss, so a valid producer costs nothing and a
    forged id costs one small read.
    """

    def __init__(self, read_latest: Callable[[], ProducerIdBlock | None]) -> None:
        self._read_latest = read_latest
        self._lock = threading.Lock()
        self._highest = -1

    def __call__(self, producer_id: int) -> bool:
        if producer_id <= self._highest:
            return True
        latest = self._read_latest()
        with self._lock:
            if latest is not None and latest.end > self._highest:
                self._highest = latest.end
            return producer_id <= self._highest
