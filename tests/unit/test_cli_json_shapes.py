"""docs/broker.md documents every ``--json`` shape ("JSON answers"); each documented
shape's keys are exactly those its class's ``to_json()`` writes, and the text views and
``--json`` render from those same objects (so a field cannot drift out of one view)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from broker_core.cli.consume_cmd import ConsumedRecord
from broker_core.cli.registry import Liveness, RegisteredBroker
from broker_core.client.answers import HangingTransaction
from broker_core.protocol.admin_requests import (
    PartitionInfo,
    PartitionOffsets,
    TopicDescription,
    TransactionListing,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "broker.md"
OFFSETS = PartitionOffsets(0, 10, 10, 8)
PART = PartitionInfo(0, 1, (1, 2), (1,), 3, OFFSETS)
SAMPLES: dict[str, Any] = {
    "TopicDescription": TopicDescription(
        "t", pa.schema([("id", pa.int64())]), {"retention.ms": "-1"}, (PART,)
    ),
    "PartitionInfo": PART,
    "PartitionOffsets": OFFSETS,
    "TransactionListing": TransactionListing("tx", "ONGOING", 0, 7, 0, 5, age_ms=9),
    "HangingTransaction": HangingTransaction("t", 0, 7, 1, -1, 5, 900_001, 5, 12),
    "ConsumedRecord": ConsumedRecord("t", 0, 4, {"id": 1}),
    "RegisteredBroker": RegisteredBroker(
        1, "127.0.0.1:1", "/d", "embedded", "idemlog", "2026-01-01T00:00:00+00:00",
        "/c", 1.0, Liveness.ALIVE,
    ),
}  # fmt: skip


def documented_shapes() -> dict[str, list[str]]:
    """``<!-- json-shape: Name -->`` then the first ``{"key", ...}`` after it."""
    text = DOC.read_text()
    shapes = {}
    for match in re.finditer(r"<!-- json-shape: (\w+) -->(.*?)(?=<!-- json-shape|\Z)", text, re.S):
        braces = re.search(r"`\{(.*?)\}`", match.group(2), re.S)
        assert braces, f"no {{...}} shape after the {match.group(1)} marker"
        shapes[match.group(1)] = re.findall(r'"(\w+)"', braces.group(1))
    return shapes


def test_every_answer_is_documented_with_exactly_its_keys() -> None:
    shapes = documented_shapes()
    assert set(shapes) == set(SAMPLES)
    for name, keys in shapes.items():
        assert keys == list(SAMPLES[name].to_json()), name


def test_the_schema_is_arrows_text_form_and_offsets_are_carried() -> None:
    doc = SAMPLES["TopicDescription"].to_json()
    assert doc["schema"] == ["id: int64"]
    assert doc["partitions"][0]["offsets"]["last_stable_offset"] == 8
    wire = {
        "name": "t",
        "schema": None,
        "config": {},
        "partitions": [{"partition": 0, "leader": 2}],  # a broker from before replicas
    }
    (old,) = TopicDescription.from_doc(wire).partitions
    assert (old.replicas, old.isr, old.leader_epoch) == ((2,), (2,), 0)
