"""The acks=all wait of a replicated partition (``broker_core.server.replication.partition``),
without processes: a batch appended while this replica led, whose wait begins only after it
stopped leading (a pipelined produce stream answers its batches in order, so the answer
thread may reach a batch long after it was appended), is answered
NOT_LEADER_OR_FOLLOWER at once, not after the ack timeout, and never acknowledged by a
later leadership of the same broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker_core.cluster.records import PartitionState
from broker_core.errors import NotLeaderOrFollowerError
from broker_core.server.replication.partition import Partition
from tests.store.helpers import open_log, rows

TIMEOUT_S = 5.0


def _partition(tmp_path: Path) -> Partition:
    partition = Partition("t", 0, open_log(tmp_path / "t-0"), broker_id=1)
    partition.apply(PartitionState((1, 2), 1, 0, (1, 2)))
    return partition


def _append(partition: Partition, start: int) -> tuple[int, int]:
    """One batch appended as leader: (the offset its answer waits for, the epoch)."""
    result = partition.append_as_leader(lambda log_: log_.append(rows(10, start=start)), True)
    return result.last_offset + 1, partition.leader_epoch


def test_a_wait_begun_after_the_leadership_ended_is_answered_at_once(tmp_path: Path) -> None:
    partition = _partition(tmp_path)
    end, epoch = _append(partition, 0)
    partition.apply(PartitionState((1, 2), 2, 1, (2,)))  # broker 2 elected: we follow
    started = time.monotonic()
    with pytest.raises(NotLeaderOrFollowerError):
        partition.wait_replicated(end, TIMEOUT_S, epoch)
    assert time.monotonic() - started < TIMEOUT_S / 2


def test_a_batch_of_an_earlier_leadership_is_never_acknowledged(tmp_path: Path) -> None:
    """Led at epoch 0, followed at 1, led again at 2 with the high watermark past the
    batch's offsets (they may hold another leader's batches now): not acknowledged."""
    partition = _partition(tmp_path)
    end, epoch = _append(partition, 0)
    partition.apply(PartitionState((1, 2), 2, 1, (1, 2)))
    partition.apply(PartitionState((1, 2), 1, 2, (1,)))  # alone in the ISR: HW = log end
    _append(partition, 10)
    assert partition.log.high_watermark >= end
    with pytest.raises(NotLeaderOrFollowerError):
        partition.wait_replicated(end, TIMEOUT_S, epoch)
