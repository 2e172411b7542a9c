"""Large batches (many pieces, ~0.5 MB each): checksummed, read back, and a torn tail."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker_core.record.batch import HEADER_SIZE, decode_header, verify_crc
from tests.store.helpers import open_store, read_ids, rows

BIG = 20_000  # rows of ~40 B


def test_large_batches_are_checksummed_and_read_back(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    for i in range(3):
        log.append(
            rows(BIG, i * BIG, width=24), producer_id=1, producer_epoch=0, base_sequence=i * BIG
        )
    segment = log.active
    assert segment.size > 3 * BIG * 24
    for stored in segment.batches():
        verify_crc(stored.header, stored.data)
    store.close()
    reopened = open_store(tmp_path).partition("t", 0)
    assert read_ids(reopened) == list(range(3 * BIG))


def test_payload_without_header_is_a_torn_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path)
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    log.append(rows(BIG, 0, width=24), producer_id=1, producer_epoch=0, base_sequence=0)
    good_end = log.active.size
    second = log.active
    log.append(rows(BIG, BIG, width=24), producer_id=1, producer_epoch=0, base_sequence=BIG)
    data = bytes(second.view()[good_end:])
    log.abandon()
    # What a crash between the payload write and the header write leaves behind.
    with open(second.log_path, "r+b") as f:
        f.truncate(good_end)
        f.seek(good_end + HEADER_SIZE)
        f.write(data[HEADER_SIZE:])
    with caplog.at_level(logging.WARNING):
        reopened = open_store(tmp_path).partition("t", 0)
    assert reopened.log_end_offset == BIG
    assert any("truncating" in r.getMessage() for r in caplog.records)
    # The producer's retry of the lost batch lands once.
    result = reopened.append(
        rows(BIG, BIG, width=24), producer_id=1, producer_epoch=0, base_sequence=BIG
    )
    assert (result.base_offset, result.duplicate) == (BIG, False)
    assert read_ids(reopened) == list(range(2 * BIG))
    header = decode_header(reopened.active.view(), good_end)
    assert header.base_offset == BIG
