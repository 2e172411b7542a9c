"""An operator's abort of a hanging transaction (``PartitionLog.abort_open_transaction``):
found by producer id or first offset, refused when nothing is open or the producer moved
to another epoch, written one producer epoch up so the producer is fenced on the
partition, and counted in the last stable offset like a coordinator's abort."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import InvalidProducerEpochError, InvalidTxnStateError
from broker_core.log.store import LogStore
from broker_core.protocol.admin_requests import NO_OFFSET
from broker_core.record.batch import MAX_PRODUCER_EPOCH, ControlType
from tests.store.helpers import SCHEMA, read_ids, rows

HANGING, OTHER, PLAIN = 7, 8, 9  # producer ids


def test_abort_by_producer_or_offset_fences_the_producer(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t", 1, schema=SCHEMA)
    log = store.partition("t", 0)
    log.append(rows(2, 0), producer_id=HANGING, producer_epoch=3, base_sequence=0,
               transactional=True)  # fmt: skip
    log.append(rows(2, 10), producer_id=OTHER, producer_epoch=0, base_sequence=0,
               transactional=True)  # fmt: skip
    log.append(rows(2, 20), producer_id=PLAIN, producer_epoch=0, base_sequence=0)
    described = {p.producer_id: p for p in log.describe_producers()}
    assert [p.txn_start_offset for p in described.values()] == [0, 2, NO_OFFSET]
    assert described[HANGING].producer_epoch == 3 and described[HANGING].last_sequence == 1
    assert log.last_stable_offset == 0

    with pytest.raises(InvalidProducerEpochError, match="at epoch 3, not 2"):
        log.abort_open_transaction(HANGING, 2)
    with pytest.raises(InvalidTxnStateError, match="no open transaction starts at offset 1"):
        log.abort_open_transaction(None, start_offset=1)
    with pytest.raises(InvalidTxnStateError, match="producer id 9 has no open transaction"):
        log.abort_open_transaction(PLAIN)

    done = log.abort_open_transaction(HANGING, 3)
    assert (done.producer_id, done.txn_start_offset, done.marker_epoch) == (HANGING, 0, 4)
    assert done.marker.offset == 6 and done.marker.last_stable_offset == 2  # OTHER's open
    # The producer is fenced here: its next write at its old epoch is refused.
    with pytest.raises(InvalidProducerEpochError):
        log.append(rows(1, 30), producer_id=HANGING, producer_epoch=3, base_sequence=2,
                   transactional=True)  # fmt: skip

    by_offset = log.abort_open_transaction(None, start_offset=2)
    assert by_offset.producer_id == OTHER and by_offset.marker_epoch == 1
    assert log.last_stable_offset == log.log_end_offset == 8
    assert read_ids(log) == [20, 21]
    assert log.read_control(6) is not None and log.read_control(6)[1] is ControlType.ABORT  # type: ignore[index]


def test_at_the_last_epoch_the_marker_stays_at_it(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t", 1, schema=SCHEMA)
    log = store.partition("t", 0)
    log.append(rows(1, 0), producer_id=HANGING, producer_epoch=MAX_PRODUCER_EPOCH,
               base_sequence=0, transactional=True)  # fmt: skip
    assert log.abort_open_transaction(HANGING).marker_epoch == MAX_PRODUCER_EPOCH
    assert log.last_stable_offset == log.log_end_offset
