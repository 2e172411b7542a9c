"""Recovery is a function of the directory: recover_partition returns what it recovered."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.log.config import LogConfig
from broker_core.log.producer_state import ProducerStateManager
from broker_core.log.recovery import CLEAN_SHUTDOWN_FILE, recover_partition
from tests.store.helpers import ManualClock, open_log, read_ids, rows

PID = 7


def fresh_state(config: LogConfig) -> ProducerStateManager:
    return ProducerStateManager(
        window=config.producer_state_batch_window,
        expiration_ms=config.producer_id_expiration_ms,
    )


def write_two_segments(directory: Path, *, clean: bool) -> Path:
    """Offsets 0..2 in a rolled segment (snapshot at 3), 3..4 in the active one; closed
    cleanly (snapshot at 5) or abandoned as by a crash."""
    log = open_log(directory)
    log.append(rows(3, 0), producer_id=PID, producer_epoch=0, base_sequence=0)
    log.roll()
    log.append(rows(2, 3), producer_id=PID, producer_epoch=0, base_sequence=3)
    active = log.active.log_path
    if clean:
        log.close()
    else:
        log.abandon()
    return active


def test_an_empty_directory_recovers_nothing(tmp_path: Path) -> None:
    config = LogConfig.from_mapping({})
    got = recover_partition(tmp_path, config, fresh_state(config))
    assert got.segments == []
    assert (got.clean, got.log_start_offset, got.log_end_offset) == (False, 0, 0)
    assert (got.snapshot_offset, got.producers) == (None, 0)


def test_a_clean_close_is_trusted_and_replays_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    write_two_segments(directory, clean=True)
    config = LogConfig.from_mapping({})
    state = fresh_state(config)

    got = recover_partition(directory, config, state)

    assert got.clean
    assert [s.base_offset for s in got.segments] == [0, 3]
    assert (got.log_start_offset, got.log_end_offset) == (0, 5)
    assert got.snapshot_offset == got.replayed_from == 5
    assert got.producers == len(state) == 1
    assert not (directory / CLEAN_SHUTDOWN_FILE).exists(), "the marker is consumed"
    for seg in got.segments:
        seg.close()


def test_a_crash_cuts_the_torn_tail_and_replays_from_the_snapshot(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    active = write_two_segments(directory, clean=False)
    good_size = active.stat().st_size
    with active.open("ab") as f:
        f.write(b"\x00" * 40)  # a torn append

    config = LogConfig.from_mapping({})
    state = fresh_state(config)

    got = recover_partition(directory, config, state)

    assert not got.clean
    assert got.log_end_offset == 5
    assert got.snapshot_offset == got.replayed_from == 3
    assert got.producers == len(state) == 1
    for seg in got.segments:
        seg.close()
    assert active.stat().st_size == good_size
    log = open_log(directory)  # what recovery left opens as the same log
    assert log.log_end_offset == 5
    assert read_ids(log) == list(range(5))
    # The producer state was rebuilt by the replay: the next sequence is accepted.
    result = log.append(rows(1, 5), producer_id=PID, producer_epoch=0, base_sequence=5)
    assert (result.base_offset, result.duplicate) == (5, False)
    log.close()


@pytest.mark.parametrize("shutdown", ["close", "crash"])
def test_a_restart_drops_producers_idle_past_their_expiration(
    tmp_path: Path, shutdown: str
) -> None:
    """A broker restarted more often than producer.id.expiration.check.interval.ms never
    runs the periodic pass; the reopen itself must then drop what has expired, or the
    producer state (and the snapshot read at every start) grows with every finished
    producer (bench-soak: 16 entries per df.write job, never dropped)."""
    clock = ManualClock()
    expiration = 60_000
    directory = tmp_path / "p"
    log = open_log(directory, clock, producer_id_expiration_ms=expiration)
    finished = list(range(100, 150))  # producers of finished jobs, idle from now on
    for i, pid in enumerate(finished):
        log.append(rows(1, i), producer_id=pid, producer_epoch=0, base_sequence=0)
    in_txn, recent = 7, 8
    log.append(
        rows(1, 50), producer_id=in_txn, producer_epoch=0, base_sequence=0, transactional=True
    )
    clock.advance(expiration)
    log.append(rows(1, 51), producer_id=recent, producer_epoch=0, base_sequence=0)
    assert len(log.state) == len(finished) + 2, "the scenario: every producer known before"
    if shutdown == "close":
        log.close()
    else:
        log.abandon()

    reopened = open_log(directory, clock, producer_id_expiration_ms=expiration)

    assert {e.producer_id for e in reopened.state} == {in_txn, recent}
    assert reopened.state.ongoing_transactions() == {in_txn: 50}
    assert reopened.last_stable_offset == 50
    # The kept recent producer's retry is still answered as a duplicate.
    retry = reopened.append(rows(1, 51), producer_id=recent, producer_epoch=0, base_sequence=0)
    assert retry.duplicate and retry.base_offset == 51
    reopened.close()


def test_a_restart_before_the_expiration_keeps_every_producer(tmp_path: Path) -> None:
    clock = ManualClock()
    directory = tmp_path / "p"
    log = open_log(directory, clock, producer_id_expiration_ms=60_000)
    for pid in range(100, 110):
        log.append(rows(1, pid - 100), producer_id=pid, producer_epoch=0, base_sequence=0)
    log.close()
    clock.advance(60_000 - 1)

    reopened = open_log(directory, clock, producer_id_expiration_ms=60_000)

    assert {e.producer_id for e in reopened.state} == set(range(100, 110))
    reopened.close()
