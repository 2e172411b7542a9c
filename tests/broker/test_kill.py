"""A broker process killed (SIGKILL) or stopped (SIGTERM) and restarted on its log.dir."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceHandle
from broker_core.errors import IdemlogError, NetworkError, ProducerFencedError
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory, BrokerProcess
from tests.harness.schedule import paused
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
ROWS = 50  # rows per batch; batch i holds ids i*ROWS .. i*ROWS+ROWS-1, sequence i*ROWS
WINDOW = 5  # batches in flight: no more than the broker's producer.state.batch.window


def _offsets_by_id(client: BrokerClient, topic: str, partition: int = 0) -> dict[int, int]:
    found: dict[int, int] = {}
    for meta, batch in client.fetch(topic, partition, isolation="read_uncommitted"):
        for j, row_id in enumerate(batch.column("id").to_pylist()):
            assert row_id not in found, f"id {row_id} is in the log twice"
            found[row_id] = meta.base_offset + j
    return found


def _log_of_start(broker: BrokerProcess, start: int) -> str:
    """The log lines of the ``start``-th start of the broker (1-based)."""
    return broker.log_text().split("\n=== start ")[start]


def test_sigkill_during_pipelined_produce_then_resend_unacknowledged(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    client = client_for(broker, retries=0)
    client.create_topic("killed", 1)
    pid, epoch = client.init_producer_id()
    attempted: list[int] = []  # batch indexes handed to send(), in order
    acked: dict[int, tuple[int, int]] = {}
    failures: list[IdemlogError] = []
    enough = threading.Event()

    def produce() -> None:
        stream = client.produce_stream("killed", 0)
        window: deque[tuple[int, ProduceHandle]] = deque()
        try:
            for i in range(100_000):
                if len(window) == WINDOW:
                    done, handle = window.popleft()
                    acked[done] = handle.offsets(30)
                    if len(acked) >= 60:
                        enough.set()
                attempted.append(i)
                batch = rows(ROWS, start=i * ROWS)
                window.append(
                    (
                        i,
                        stream.send(
                            batch, producer_id=pid, producer_epoch=epoch, base_sequence=i * ROWS
                        ),
                    )
                )
        except IdemlogError as exc:
            failures.append(exc)
        finally:
            enough.set()
            stream.close(timeout=10)

    producer = threading.Thread(target=produce, name="test-producer")
    producer.start()
    assert enough.wait(60)
    assert broker.kill() == -9
    producer.join(30)
    assert not producer.is_alive()
    assert failures and isinstance(failures[0], NetworkError) and failures[0].retriable
    unacked = [i for i in attempted if i not in acked]
    assert 1 <= len(unacked) <= WINDOW + 1, unacked

    broker.restart()  # same port: the client's address still works
    assert "after a crash" in _log_of_start(broker, 2)
    with client.produce_stream("killed", 0) as stream:
        for i in unacked:  # resent as they were: same producer id, epoch and sequence
            response = stream.send(
                rows(ROWS, start=i * ROWS), producer_id=pid, producer_epoch=epoch,
                base_sequence=i * ROWS,
            ).result(30)  # fmt: skip
            assert response.error_code == 0, response
        nxt = max(attempted) + 1
        for i in range(nxt, nxt + 3):  # and the producer carries on where it was
            stream.send(
                rows(ROWS, start=i * ROWS), producer_id=pid, producer_epoch=epoch,
                base_sequence=i * ROWS,
            ).offsets(30)  # fmt: skip
    found = _offsets_by_id(client, "killed")
    assert sorted(found) == list(range((nxt + 3) * ROWS)), "a batch was lost or written twice"
    for i, (base, last) in acked.items():  # acknowledged batches kept their offsets
        assert (found[i * ROWS], found[i * ROWS + ROWS - 1]) == (base, last)
    assert ids(client, "killed") == list(range((nxt + 3) * ROWS))


def _write_txn(
    client: BrokerClient, txn_id: str, start: int, timeout_ms: int | None = None
) -> tuple[int, int]:
    pid, epoch = client.init_producer_id(txn_id, timeout_ms)
    client.add_partitions_to_txn(txn_id, pid, epoch, [("ledger", 0), ("ledger", 1)])
    for p in (0, 1):
        with client.produce_stream("ledger", p, transactional_id=txn_id) as stream:
            stream.send(
                rows(5, start=start + 100 * p), producer_id=pid, producer_epoch=epoch,
                base_sequence=0, transactional=True,
            ).offsets(10)  # fmt: skip
    return pid, epoch


@pytest.mark.parametrize("failpoint", ["after_prepare", "after_first_marker"])
def test_sigkill_during_end_txn_completes_after_restart(
    broker_factory: BrokerFactory, client_for: ClientFor, failpoint: str
) -> None:
    broker = broker_factory(
        {**TEST_BROKER_CONFIG, **TEST_HOOKS}, env={"IDEMLOG_TEST_FAILPOINT": failpoint}
    )
    client = client_for(broker, retries=0)
    client.create_topic("ledger", 2)
    plain_pid, _ = client.init_producer_id()
    for p in (0, 1):
        with client.produce_stream("ledger", p) as stream:
            stream.send(rows(3), producer_id=plain_pid, producer_epoch=0, base_sequence=0).offsets(
                10
            )
    # B stays open across the crash; A is being committed when the broker dies.
    b_pid, b_epoch = _write_txn(client, "txn-b", 2000, timeout_ms=2500)
    a_pid, a_epoch = _write_txn(client, "txn-a", 1000)
    with pytest.raises(NetworkError):
        client.end_txn("txn-a", a_pid, a_epoch, commit=True)
    assert broker.wait_exit(30) == -9  # the failpoint's SIGKILL
    assert f"test failpoint {failpoint}" in broker.log_text()

    broker.restart()  # no failpoint this time
    assert "finishing 1 prepared transactions" in _log_of_start(broker, 2)

    def stable(p: int) -> bool:
        offsets = client.list_offsets("ledger", p)
        return offsets["last_stable_offset"] == offsets["log_end_offset"]

    # A was finished by the new coordinator at start; B is aborted when its timeout passes.
    wait_until(lambda: stable(0) and stable(1), "both transactions to end", timeout=20)
    for p in (0, 1):
        a_rows = list(range(1000 + 100 * p, 1005 + 100 * p))
        b_rows = list(range(2000 + 100 * p, 2005 + 100 * p))
        assert ids(client, "ledger", p) == [0, 1, 2, *a_rows]
        assert ids(client, "ledger", p, "read_uncommitted") == [0, 1, 2, *b_rows, *a_rows]
    client.end_txn("txn-a", a_pid, a_epoch, commit=True)  # the client's retry: already done
    with pytest.raises(ProducerFencedError):
        client.end_txn("txn-b", b_pid, b_epoch, commit=True)  # timed out and fenced
    by_state = client.metrics()["transactions"]["by_state"]
    assert (by_state["COMPLETE_COMMIT"], by_state["COMPLETE_ABORT"]) == (1, 1)


def test_sigterm_writes_snapshots_and_restart_replays_nothing(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    client = client_for(broker)
    client.create_topic("snap", 2)
    pid, epoch = client.init_producer_id()
    last: Any = None
    with client.produce_stream("snap", 0) as stream:
        for i in range(3):
            last = stream.send(rows(5, start=5 * i), producer_id=pid, producer_epoch=epoch,
                               base_sequence=5 * i).offsets(10)  # fmt: skip
    with client.produce_stream("snap", 1) as stream:
        stream.send(rows(4), producer_id=pid, producer_epoch=epoch, base_sequence=0).offsets(10)
    assert broker.stop() == 0
    assert "STOPPED" in broker.log_text()
    for p, end in ((0, 15), (1, 4)):
        directory = broker.log_dir / "snap" / str(p)
        assert (directory / ".clean_shutdown").exists()
        assert f"{end:020d}.snapshot" in {s.name for s in directory.glob("*.snapshot")}

    broker.restart()
    opened = _log_of_start(broker, 2)
    assert re.search(
        r"snap-0: opened after a clean shutdown \(1 segments, offsets 0\.\.15, 1 producers, "
        r"replayed from 15\)",
        opened,
    ), opened
    assert "after a crash" not in opened
    assert not (broker.log_dir / "snap" / "0" / ".clean_shutdown").exists()
    # The producer state came back from the snapshot: a retry of the last batch is a
    # duplicate with its original offsets, the next batch follows on.
    with client.produce_stream("snap", 0) as stream:
        retry = stream.send(rows(5, start=10), producer_id=pid, producer_epoch=epoch,
                            base_sequence=10).result(10)  # fmt: skip
        assert (retry.duplicate, retry.base_offset, retry.last_offset) == (True, *last)
        nxt = stream.send(rows(5, start=15), producer_id=pid, producer_epoch=epoch,
                          base_sequence=15).offsets(10)  # fmt: skip
        assert nxt == (15, 19)
    assert ids(client, "snap", 0) == list(range(20))
    broker.kill()
    broker.restart()
    assert "snap-0: opened after a crash" in _log_of_start(broker, 3)
    assert ids(client, "snap", 0) == list(range(20))


def test_a_broker_stopped_across_its_signal_wait_resumes_and_still_stops_cleanly(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """SIGSTOP for longer than the main thread's 1 s wait for a stop signal, then SIGCONT:
    the wait returns interrupted past its deadline, for which CPython hands back an
    unfilled siginfo (found by the seeded schedule: a resumed broker's main thread died
    on a garbage signal number while its other threads went on). The broker goes on
    serving, and a SIGTERM afterwards still stops it cleanly."""
    broker = broker_factory(TEST_BROKER_CONFIG)
    client = client_for(broker)
    client.create_topic("resumed", 1)
    for i in range(3):  # each resume lands anywhere in a wait: three chances to hit one
        with paused(broker):
            time.sleep(1.5)  # the fault's duration: past the wait's 1 s deadline
        with client.produce_stream("resumed", 0) as stream:
            assert stream.send(rows(5, start=5 * i)).result(10).ok
    assert ids(client, "resumed", isolation="read_uncommitted") == list(range(15))
    assert broker.running
    assert "Traceback" not in broker.log_text(), broker.log_tail(30)
    assert broker.stop(timeout=20) == 0
    assert "received SIGTERM, shutting down" in broker.log_text()
