"""The log's side of transaction verification (KIP-890 part 1): a leader's append of a
client's transactional batch names its transactional id and passes only under a guard
made before the coordinator was asked, or onto the transaction already verified here;
a marker written while the coordinator answered voids the guard; another transactional
id, or another epoch, is verified again; the check precedes the sequence check."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import InvalidTxnStateError
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType
from tests.store.helpers import SCHEMA, read_ids, rows

PID, EPOCH, TID = 5, 0, "app"


def test_the_first_batch_needs_the_guard_later_ones_ride_on_it(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t", 1, schema=SCHEMA)
    log = store.partition("t", 0)
    with pytest.raises(InvalidTxnStateError, match="was verified with its coordinator"):
        log.append(rows(2, 0), producer_id=PID, producer_epoch=EPOCH, base_sequence=0,
                   transactional=True, transactional_id=TID)  # fmt: skip
    guard = log.verification_needed(PID, EPOCH, TID)
    assert guard is not None
    log.append(rows(2, 0), producer_id=PID, producer_epoch=EPOCH, base_sequence=0,
               transactional=True, transactional_id=TID, verification=guard)  # fmt: skip
    assert log.verification_needed(PID, EPOCH, TID) is None  # the steady path: no call
    log.append(rows(2, 2), producer_id=PID, producer_epoch=EPOCH, base_sequence=2,
               transactional=True, transactional_id=TID)  # fmt: skip
    # Under another transactional id, or another epoch: verified again.
    assert log.verification_needed(PID, EPOCH, "other") is not None
    with pytest.raises(InvalidTxnStateError):
        log.append(rows(1, 9), producer_id=PID, producer_epoch=EPOCH, base_sequence=4,
                   transactional=True, transactional_id="other")  # fmt: skip
    assert log.verification_needed(PID, EPOCH + 1, TID) is not None
    log.write_marker(PID, EPOCH, ControlType.COMMIT)
    assert read_ids(log) == [0, 1, 2, 3]
    # The marker ended the verified transaction: the next one is verified again.
    assert log.verification_needed(PID, EPOCH, TID) is not None
    with pytest.raises(InvalidTxnStateError):
        log.append(rows(1, 4), producer_id=PID, producer_epoch=EPOCH, base_sequence=4,
                   transactional=True, transactional_id=TID)  # fmt: skip
    assert log.last_stable_offset == log.log_end_offset


def test_a_marker_while_the_coordinator_answered_voids_the_guard(tmp_path: Path) -> None:
    """The race KAFKA-14884 names: the coordinator said the partition is in the ongoing
    transaction, but that transaction's marker was written before the append."""
    store = LogStore(tmp_path)
    store.create_topic("t", 1, schema=SCHEMA)
    log = store.partition("t", 0)
    first = log.verification_needed(PID, EPOCH, TID)
    assert first is not None
    log.append(rows(1, 0), producer_id=PID, producer_epoch=EPOCH, base_sequence=0,
               transactional=True, transactional_id=TID, verification=first)  # fmt: skip
    stale = log.verification_needed(PID, EPOCH + 1, TID)  # asked; the coordinator says yes
    assert stale is not None
    log.write_marker(PID, EPOCH + 1, ControlType.ABORT)  # meanwhile: the abort's marker
    end = log.log_end_offset
    with pytest.raises(InvalidTxnStateError):
        log.append(rows(1, 1), producer_id=PID, producer_epoch=EPOCH + 1, base_sequence=0,
                   transactional=True, transactional_id=TID, verification=stale)  # fmt: skip
    assert log.log_end_offset == end and log.last_stable_offset == end  # nothing opened
    # Two asks of the same producer at once share one guard: both appends pass.
    shared = log.verification_needed(PID, EPOCH + 1, TID)
    assert shared is not None and log.verification_needed(PID, EPOCH + 1, TID) is shared
    log.append(rows(1, 1), producer_id=PID, producer_epoch=EPOCH + 1, base_sequence=0,
               transactional=True, transactional_id=TID, verification=shared)  # fmt: skip
    log.append(rows(1, 2), producer_id=PID, producer_epoch=EPOCH + 1, base_sequence=1,
               transactional=True, transactional_id=TID, verification=shared)  # fmt: skip
    log.write_marker(PID, EPOCH + 2, ControlType.ABORT)
    # A refused verification drops its guard: a later append cannot use it.
    refused = log.verification_needed(PID, EPOCH + 2, TID)
    assert refused is not None
    log.drop_verification(PID, refused)
    with pytest.raises(InvalidTxnStateError):
        log.append(rows(1, 3), producer_id=PID, producer_epoch=EPOCH + 2, base_sequence=0,
                   transactional=True, transactional_id=TID, verification=refused)  # fmt: skip


def test_the_verification_comes_before_the_sequence_check(tmp_path: Path) -> None:
    """A batch under another's producer id is refused before its sequence is judged: the
    refusal names no expected sequence or epoch of that producer."""
    store = LogStore(tmp_path)
    store.create_topic("t", 1, schema=SCHEMA)
    log = store.partition("t", 0)
    guard = log.verification_needed(PID, EPOCH, TID)
    log.append(rows(3, 0), producer_id=PID, producer_epoch=EPOCH, base_sequence=0,
               transactional=True, transactional_id=TID, verification=guard)  # fmt: skip
    for seq in (0, 3, 8):
        with pytest.raises(InvalidTxnStateError) as refused:
            log.append(rows(1, 50), producer_id=PID, producer_epoch=EPOCH, base_sequence=seq,
                       transactional=True, transactional_id="intruder")  # fmt: skip
        assert "expected" not in refused.value.message
        assert "sequence" not in refused.value.message
    assert read_ids(log, isolation="read_uncommitted") == [0, 1, 2]
