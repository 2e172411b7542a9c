"""The embedded producer-id block allocator (a local file under flock), and the manager on it."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from broker_core.errors import (
    InvalidRequestError,
    ProducerIdAllocationError,
    ProducerIdSpaceExhaustedError,
)
from broker_core.producer_ids.manager import (
    MAX_PRODUCER_ID,
    CorruptProducerIdBlockRecordError,
    FileProducerIdBlockSource,
    ProducerIdBlock,
    ProducerIdManager,
)
from tests.harness.waiting import Recorder


def test_sequential_blocks_and_record_format(tmp_path: Path) -> None:
    path = tmp_path / "state" / "latest_producer_id_block.json"  # parent created on demand
    source = FileProducerIdBlockSource(path)

    blocks = [source.next_block(1), source.next_block(2), source.next_block(1)]

    assert [(b.broker_id, b.start, b.end) for b in blocks] == [
        (1, 0, 999),
        (2, 1000, 1999),
        (1, 2000, 2999),
    ]
    assert path.read_bytes() == b'{"version":1,"broker":1,"block_start":"2000","block_end":"2999"}'
    # Only the record and its lock file: no temp file left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "latest_producer_id_block.json",
        "latest_producer_id_block.json.lock",
    ]
    # Another allocator on the same file (e.g. after a restart) continues the sequence.
    assert FileProducerIdBlockSource(path).next_block(3).start == 3000


def test_threads_sharing_the_file_get_disjoint_blocks(tmp_path: Path) -> None:
    path = tmp_path / "pid.json"
    results: list[list[ProducerIdBlock]] = []
    start = threading.Barrier(4)

    def lease() -> None:
        source = FileProducerIdBlockSource(path)  # one per thread, like separate brokers
        start.wait(timeout=10)
        results.append([source.next_block(1) for _ in range(25)])

    threads = [threading.Thread(target=lease) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    starts = sorted(b.start for blocks in results for b in blocks)
    assert starts == [i * 1000 for i in range(100)]


def _lease_in_process(path: str, broker: int, count: int, start: Any, out: Any) -> None:
    source = FileProducerIdBlockSource(path)
    start.wait(timeout=30)
    out.put(
        [(b.broker_id, b.start, b.end) for b in (source.next_block(broker) for _ in range(count))]
    )


def test_processes_sharing_the_file_get_disjoint_contiguous_blocks(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    path = str(tmp_path / "pid.json")
    processes, per_process = 4, 25
    start = ctx.Barrier(processes)
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_lease_in_process, args=(path, broker, per_process, start, out))
        for broker in range(processes)
    ]
    for w in workers:
        w.start()
    try:
        results = [out.get(timeout=60) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    assert [w.exitcode for w in workers] == [0] * processes

    every = sorted((b for blocks in results for b in blocks), key=lambda b: b[1])
    assert [(s, e) for _, s, e in every] == [(i * 1000, i * 1000 + 999) for i in range(100)]
    for broker_blocks in results:
        brokers = {b for b, _, _ in broker_blocks}
        assert len(brokers) == 1
    assert FileProducerIdBlockSource(path).next_block(9).start == 100_000


def test_exhausted_space_raises_and_keeps_the_record(tmp_path: Path) -> None:
    path = tmp_path / "pid.json"
    path.write_bytes(ProducerIdBlock(1, MAX_PRODUCER_ID - 2000, MAX_PRODUCER_ID - 1001).to_record())
    source = FileProducerIdBlockSource(path)

    last = source.next_block(1)
    assert (last.start, last.end) == (2**63 - 1 - 1000, 2**63 - 2)
    before = path.read_bytes()

    with pytest.raises(ProducerIdSpaceExhaustedError) as excinfo:
        source.next_block(1)

    assert excinfo.value.retriable is False
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"version":2,"broker":1,"block_start":"0","block_end":"999"}',
        b'{"version":1,"block_start":"0","block_end":"999"}',
        b'{"version":1,"broker":"1","block_start":"0","block_end":"999"}',
        b'{"version":1,"broker":1,"block_start":0,"block_end":999}',
        b'{"version":1,"broker":1,"block_start":"-1","block_end":"999"}',
        b'{"version":1,"broker":1,"block_start":"1000","block_end":"999"}',
        b'{"version":1,"broker":1,"block_start":"0","block_end":"9223372036854775808"}',
    ],
    ids=[
        "empty",
        "not-json",
        "not-utf8",
        "not-object",
        "version-2",
        "no-broker",
        "broker-string",
        "bounds-numbers",
        "negative",
        "end-before-start",
        "past-2^63-1",
    ],
)
def test_corrupt_file_is_refused_naming_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "pid.json"
    path.write_bytes(content)

    with pytest.raises(CorruptProducerIdBlockRecordError) as excinfo:
        FileProducerIdBlockSource(path).next_block(1)

    assert str(path) in str(excinfo.value)
    assert excinfo.value.retriable is False
    assert path.read_bytes() == content  # never "repaired" by guessing


@pytest.mark.parametrize("broker_id", [-1, True, 1.5])
def test_invalid_broker_id_is_rejected(tmp_path: Path, broker_id: Any) -> None:
    with pytest.raises(InvalidRequestError):
        FileProducerIdBlockSource(tmp_path / "pid.json").next_block(broker_id)


def test_unwritable_location_is_a_retriable_allocation_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")

    with pytest.raises(ProducerIdAllocationError) as excinfo:
        FileProducerIdBlockSource(blocker / "pid.json").next_block(1)

    assert excinfo.value.retriable is True
    assert str(blocker) in str(excinfo.value)


# -- ProducerIdManager on the file source ----------------------------------------------------


class RecordingSource:
    """Wraps a source, records each lease's 1-based number and fails those in ``fail``."""

    def __init__(self, inner: FileProducerIdBlockSource, fail: set[int] | None = None) -> None:
        self.inner = inner
        self.fail = fail or set()
        self.leases = Recorder(timeout=10.0)
        self._numbering = threading.Lock()  # a number and its record, atomically

    @property
    def calls(self) -> int:
        return len(self.leases)

    def next_block(self, broker_id: int) -> ProducerIdBlock:
        with self._numbering:
            number = len(self.leases) + 1
            self.leases.record(number)
        if number in self.fail:
            raise ProducerIdAllocationError("injected lease failure")
        return self.inner.next_block(broker_id)

    def wait_for_calls(self, count: int) -> None:
        self.leases.wait_for_count(count, f"{count} leases")


def test_manager_hands_out_every_id_once_and_prefetches_at_90_percent(tmp_path: Path) -> None:
    source = RecordingSource(FileProducerIdBlockSource(tmp_path / "pid.json"))
    manager = ProducerIdManager(1, source)

    ids = [manager.generate_producer_id() for _ in range(899)]
    assert source.calls == 1  # 899 of 1000 used: no prefetch yet
    ids.append(manager.generate_producer_id())  # the 900th id: 90% used
    source.wait_for_calls(2)  # the prefetch runs in the background
    ids += [manager.generate_producer_id() for _ in range(1600)]

    assert ids == list(range(2500))
    assert manager.current_block == ProducerIdBlock(1, 2000, 2999)


def test_manager_survives_a_failed_prefetch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = RecordingSource(FileProducerIdBlockSource(tmp_path / "pid.json"), fail={2})
    manager = ProducerIdManager(1, source, prefetch_retry_s=3600)  # no retry of the prefetch

    ids = [manager.generate_producer_id() for _ in range(900)]
    source.wait_for_calls(2)  # the prefetch, which fails
    ids += [manager.generate_producer_id() for _ in range(1100)]

    # The failed prefetch cost nothing: the current block was used up, a lease on demand
    # took the next block, and once that lease had worked, prefetching resumed.
    assert ids == list(range(2000))
    source.wait_for_calls(4)
    assert "prefetch of the next producer id block for broker 1 failed" in caplog.text


def test_manager_raises_when_no_block_can_be_leased(tmp_path: Path) -> None:
    source = RecordingSource(FileProducerIdBlockSource(tmp_path / "pid.json"), fail={1})
    manager = ProducerIdManager(1, source)

    with pytest.raises(ProducerIdAllocationError):
        manager.generate_producer_id()
    # Retriable for real: the next call leases again and succeeds.
    assert manager.generate_producer_id() == 0


def test_manager_serves_the_last_block_then_reports_exhaustion(tmp_path: Path) -> None:
    path = tmp_path / "pid.json"
    path.write_bytes(ProducerIdBlock(1, MAX_PRODUCER_ID - 2000, MAX_PRODUCER_ID - 1001).to_record())
    manager = ProducerIdManager(1, FileProducerIdBlockSource(path))

    ids = [manager.generate_producer_id() for _ in range(1000)]

    assert ids[0] == 2**63 - 1 - 1000 and ids[-1] == 2**63 - 2
    with pytest.raises(ProducerIdSpaceExhaustedError):
        manager.generate_producer_id()
