"""One process per data directory, and inspection that never writes (issue 24).

Real broker processes: a second broker on a running broker's ``log.dir`` is refused in
one line and changes nothing; a lock file left by a SIGKILLed broker blocks nothing;
``idemlog log describe|dump`` run on a running broker's directory while it takes writes
leave every file as it was (apart from the broker's own appends), so that broker's next
restart after a SIGKILL still recovers its tail as after a crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from broker_core.client.broker_client import BrokerClient
from broker_core.fileutil import LOCK_FILE
from broker_core.log.inspect import LIVE_NOTE
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import REPO, BrokerFactory, BrokerProcess
from tests.harness.files import FileDigest, changed_files, digest_tree
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
SEGMENT_BYTES = 16 << 20
FILL_ROWS = 2000  # rows per batch while filling: ~160 KB, under max.request.bytes
WRITER_CAP = 12_000  # 10-row batches of ~800 bytes: < 10 MB, within the active segment's room
WRITER_PACE_S = 0.002  # between writes: a steady stream that outlasts both inspections


def _produce(
    client: BrokerClient, topic: str, batches: int, start: int, pid: int, size: int = 10
) -> None:
    with client.produce_stream(topic, 0) as stream:
        handles = [
            stream.send(rows(size, first), producer_id=pid, producer_epoch=0, base_sequence=first)
            for first in range(start, start + size * batches, size)
        ]
        for handle in handles:
            handle.offsets(30)  # raises what the broker answered, if not a success


def _second_on(factory: BrokerFactory, first: BrokerProcess, name: str) -> BrokerProcess:
    return factory({**TEST_BROKER_CONFIG, "log.dir": str(first.log_dir)}, name=name, start=False)


def test_second_broker_on_a_data_directory_exits_2_naming_it_and_changes_nothing(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    first = broker_factory(TEST_BROKER_CONFIG, name="first")
    client = client_for(first)
    client.create_topic("shared", 1)
    pid, _epoch = client.init_producer_id()
    _produce(client, "shared", 20, 0, pid)
    assert len(ids(client, "shared")) == 200
    assert (first.log_dir / LOCK_FILE).read_text().strip() == str(first.pid)
    before = digest_tree(first.log_dir)  # nothing writes during the attempt

    second = _second_on(broker_factory, first, "second")
    second.spawn()
    assert second.wait_exit() == 2
    output = second.log_text()
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("idemlog:")]
    assert errors == [
        f"idemlog: LOG_DIR_LOCKED (10004): log.dir {first.log_dir} is in use: "
        f"{first.log_dir / LOCK_FILE} is locked by process {first.pid} (a broker serves it; "
        f"one process per data directory)"
    ], output
    assert "opened after" not in output  # refused before any partition was recovered
    assert changed_files(first.log_dir, before, digest_tree(first.log_dir)) == []

    # The first still serves: reads and writes.
    assert first.running
    _produce(client, "shared", 5, 200, pid)
    assert ids(client, "shared") == list(range(250))


def test_lock_left_by_a_killed_broker_does_not_block_its_restart(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG, name="killed")
    client = client_for(broker)
    client.create_topic("stale", 1)
    pid, _epoch = client.init_producer_id()
    _produce(client, "stale", 3, 0, pid)
    old_pid = broker.pid
    assert broker.kill() == -9
    lock = broker.log_dir / LOCK_FILE
    assert lock.read_text().strip() == str(old_pid)  # left behind, naming a dead process
    broker.restart()
    assert lock.read_text().strip() == str(broker.pid) != str(old_pid)
    assert ids(client_for(broker), "stale") == list(range(30))
    # A lock file naming a live process that holds no lock (a pid reused) blocks nothing.
    broker.stop()
    lock.write_text(f"{os.getpid()}\n")
    broker.restart()
    assert lock.read_text().strip() == str(broker.pid)


def _inspect(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", "log", *args, "--data-dir", str(data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_describe_and_dump_of_a_live_directory_write_nothing(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG, name="live")
    client = client_for(broker)
    config = {"segment.bytes": SEGMENT_BYTES, "max.message.bytes": 1 << 20}
    client.create_topic("live", 1, config=config)
    partition = broker.log_dir / "live" / "0"
    pid, _epoch = client.init_producer_id()
    # Fill until a roll: sealed segments and their snapshots, and an almost empty active
    # segment with room for every write below (so no roll, no new file, during the test).
    written = 0
    while len(list(partition.glob("*.log"))) < 2:
        _produce(client, "live", 10, written, pid, size=FILL_ROWS)
        written += 10 * FILL_ROWS
    active = max(partition.glob("*.log"))
    assert active.stat().st_size < SEGMENT_BYTES // 4
    growing = [f"live/0/{active.name}", f"live/0/{active.stem}.index"]

    acked: list[int] = []
    stop = threading.Event()
    # The digests are taken between two writes (an append in progress may show its batch
    # half written: the header goes last); the inspections run while writes go on.
    pause, paused, resume = threading.Event(), threading.Event(), threading.Event()

    def write() -> None:
        with client.produce_stream("live", 0) as stream:
            first = written
            while not stop.is_set() and len(acked) < WRITER_CAP:
                if pause.is_set():
                    paused.set()
                    resume.wait(60)
                    resume.clear()
                handle = stream.send(
                    rows(10, first), producer_id=pid, producer_epoch=0, base_sequence=first
                )
                acked.append(handle.offsets(30)[1])  # one at a time: acked means written
                first += 10
                stop.wait(WRITER_PACE_S)  # pacing the load, not waiting for anything

    def digest_between_writes() -> dict[str, FileDigest]:
        paused.clear()
        pause.set()
        assert paused.wait(60), f"the writer did not pause ({len(acked)} writes acked)"
        try:
            return digest_tree(broker.log_dir)
        finally:
            pause.clear()
            resume.set()

    writer = threading.Thread(target=write, name="live-writer")
    writer.start()
    try:
        wait_until(lambda: len(acked) >= 20, "the writer's first acks")
        before = digest_between_writes()
        acked_before = len(acked)
        describe = _inspect(broker.log_dir, "describe", "--json")
        dump = _inspect(broker.log_dir, "dump", "--topic", "live")
        acked_after = len(acked)
        after = digest_between_writes()
    finally:
        stop.set()
        resume.set()
        writer.join(60)
    assert acked_after > acked_before, "no write happened while the inspection ran"
    assert acked_after < WRITER_CAP, "the writer stopped before the inspection ended"
    assert describe.returncode == 0, describe.stderr
    assert dump.returncode == 0, dump.stderr
    for result in (describe, dump):
        assert f"{LIVE_NOTE} (process {broker.pid} holds" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert " rows (read_committed)" in dump.stdout
    assert changed_files(broker.log_dir, before, after, growing=growing) == []
    assert not (partition / ".clean_shutdown").exists()

    # The broker never shut down cleanly: after a SIGKILL it recovers its tail as a crash.
    assert broker.kill() == -9
    broker.restart()
    restart_log = broker.log_text().split("\n=== start ")[2]
    assert "live-0: opened after a crash" in restart_log, restart_log
    total = written + 10 * len(acked)
    assert ids(client_for(broker), "live") == list(range(total))
