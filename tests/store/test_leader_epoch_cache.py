"""The leader-epoch cache: OffsetsForLeaderEpoch answers, truncation, the checkpoint file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import CorruptRecordError, InvalidRequestError
from broker_core.log.leader_epoch import (
    CHECKPOINT_FILE,
    UNDEFINED,
    EpochEndOffset,
    EpochEntry,
    LeaderEpochCache,
    decode_checkpoint,
    encode_checkpoint,
)
from broker_core.record.batch import NO_LEADER_EPOCH


def cache_with(tmp_path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in entries:
        assert cache.assign(epoch, start)
    return cache


def test_end_offset_for_follows_kafkas_offsets_for_leader_epoch(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 10), (3, 25), (4, 40))
    end = 57
    assert cache.latest_epoch == 4 and cache.earliest_epoch == 1
    assert cache.end_offset_for(4, end) == EpochEndOffset(4, 57)  # the latest: the log end
    assert cache.end_offset_for(3, end) == EpochEndOffset(3, 40)  # next higher epoch's start
    assert cache.end_offset_for(1, end) == EpochEndOffset(1, 25)
    assert cache.end_offset_for(2, end) == EpochEndOffset(1, 25)  # unknown: the floor epoch
    assert cache.end_offset_for(0, end) == EpochEndOffset(0, 10)  # below all: earliest start
    assert cache.end_offset_for(5, end) == UNDEFINED and UNDEFINED.undefined
    assert cache.end_offset_for(NO_LEADER_EPOCH, end) == UNDEFINED
    assert LeaderEpochCache(tmp_path / "x").end_offset_for(0, 0) == UNDEFINED
    assert [cache.epoch_at(o) for o in (9, 10, 24, 25, 39, 40, 100)] == [-1, 1, 1, 3, 3, 4, 4]


def test_assign_is_monotonic_and_durable(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (0, 0), (2, 5))
    assert not cache.assign(2, 9)  # the latest epoch keeps its first start offset
    with pytest.raises(InvalidRequestError, match="older than this log's latest epoch 2"):
        cache.assign(1, 9)
    with pytest.raises(InvalidRequestError, match="cannot start at offset 4"):
        cache.assign(3, 4)
    with pytest.raises(InvalidRequestError, match="outside"):
        cache.assign(2**31, 9)
    reloaded = LeaderEpochCache.load(tmp_path)
    assert reloaded is not None
    assert reloaded.entries == [EpochEntry(0, 0), EpochEntry(2, 5)]


def test_truncation_from_end_and_start(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (0, 0), (1, 10), (2, 20), (3, 30))
    cache.truncate_from_end(20)  # entries starting at or after 20 go
    assert cache.entries == [EpochEntry(0, 0), EpochEntry(1, 10)]
    cache.truncate_from_start(15)  # epoch 0 wholly gone, epoch 1 now starts at 15
    assert cache.entries == [EpochEntry(1, 15)]
    cache.truncate_from_start(15)
    cache.truncate_from_start(3)
    assert cache.entries == [EpochEntry(1, 15)]
    reloaded = LeaderEpochCache.load(tmp_path)
    assert reloaded is not None and reloaded.entries == [EpochEntry(1, 15)]


def test_checkpoint_format_and_corruption(tmp_path: Path) -> None:
    entries = [EpochEntry(0, 0), EpochEntry(4, 17)]
    assert encode_checkpoint(entries) == b"0\n2\n0 0\n4 17\n"
    assert decode_checkpoint(encode_checkpoint(entries)) == entries
    for bad in (b"", b"1\n0\n", b"0\n2\n0 0\n", b"0\n1\nx y\n", b"0\n2\n3 5\n2 9\n", b"\xff"):
        with pytest.raises(CorruptRecordError):
            decode_checkpoint(bad)
    missing = LeaderEpochCache.load(tmp_path)  # no file: nothing but epoch 0 was written
    assert missing is not None and missing.entries == []
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"0\n5\n")
    assert LeaderEpochCache.load(tmp_path) is None  # unreadable: the caller rebuilds


def test_a_cache_of_only_the_initial_epoch_is_not_written(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (0, 0))
    cache.truncate_from_start(4)
    assert cache.entries == [EpochEntry(0, 4)]
    assert not (tmp_path / CHECKPOINT_FILE).exists()  # no file says exactly that
    cache.assign(1, 9)
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == b"0\n2\n0 4\n1 9\n"
    cache.truncate_from_end(9)  # a file once written is kept up to date
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == b"0\n1\n0 4\n"


def test_rebuild_from_batch_epochs(tmp_path: Path) -> None:
    cache = LeaderEpochCache.rebuild(tmp_path, [(0, 0), (0, 3), (2, 7), (2, 9), (5, 12)])
    assert cache.entries == [EpochEntry(0, 0), EpochEntry(2, 7), EpochEntry(5, 12)]
    reloaded = LeaderEpochCache.load(tmp_path)
    assert reloaded is not None and reloaded.entries == cache.entries
