"""Sink batches through a real broker process: readers see each batch whole or not at all,
leftovers stop holding readers back within the stated bound, operators see and abort
hanging transactions (docs/design.md, "Readers see whole sink batches", "Leftovers")."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt
from tests.broker.helpers import TEST_BROKER_CONFIG, rows
from tests.harness.broker import BrokerFactory
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
TOPIC = "sink_vis"
ROWS_PER_PARTITION = 4


def write_attempt(
    client: BrokerClient, sink: str, run: str, batch: int, task: int, ids: dict[int, range]
) -> tuple[str, int, int]:
    """One prepared task attempt writing ``ids[p]`` into partition p, as the sink does."""
    tid = f"{sink}/{task}"
    pid, epoch, _ = client.init_sink_producer(tid, 2000, SinkAttempt(sink, run, batch))
    client.add_partitions_to_txn(tid, pid, epoch, [(TOPIC, p) for p in ids])
    ranges = []
    for p, span in ids.items():
        with client.produce_stream(TOPIC, p, transactional_id=tid) as stream:
            acked = stream.send(
                rows(len(span), start=span.start), producer_id=pid, producer_epoch=epoch,
                base_sequence=0, transactional=True,
            ).offsets(10)  # fmt: skip
        ranges.append((TOPIC, p, acked[0], acked[1]))
    client.prepare_sink_txn(tid, pid, epoch, batch, ranges)
    return tid, pid, epoch


def batch_ids(batch: int) -> dict[int, range]:
    base = batch * 100
    return {p: range(base + p * 10, base + p * 10 + ROWS_PER_PARTITION) for p in (0, 1)}


def read_batches(
    client: BrokerClient, ends: dict[int, int], starts: dict[int, int] | None = None
) -> Counter[int]:
    """Rows per sink batch readable read_committed in ``[starts, ends)`` (from 0)."""
    seen: Counter[int] = Counter()
    for p, end in ends.items():
        offset = 0 if starts is None else starts.get(p, 0)
        while offset < end:
            response = client.fetch_once(TOPIC, p, offset, max_offset=end)
            for _meta, batch in response.batches:
                seen.update(i // 100 for i in batch.column("id").to_pylist())
            if response.trailer.next_offset <= offset:
                break  # nothing more below the end (markers skipped, or a held-back tail)
            offset = response.trailer.next_offset
    return seen


def test_concurrent_reads_never_hold_part_of_a_sink_batch(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """A sink commits two-partition batches while three readers read, until they have
    read 1500 times at the coordinator's cut (and as often at the LSO alone). Every third
    batch another writer keeps a transaction open on partition 1 from before the batch's
    rows until a read has happened, so by LSO alone a reader sees the batch's partition-0
    rows without its partition-1 rows. At the cut no read ever holds part of a batch."""
    broker = broker_factory(TEST_BROKER_CONFIG)
    writer = client_for(broker)
    writer.create_topic(TOPIC, 2, schema=rows(1).schema)
    target_reads, max_batches = 1500, 3000
    done = threading.Event()
    progress = threading.Condition()
    reads = Counter[str]()
    partial: list[str] = []
    errors: list[BaseException] = []
    committed: list[int] = []

    def sink() -> None:
        try:
            for batch in range(1, max_batches + 1):
                with progress:
                    if reads["cut"] >= target_reads:
                        break
                hold = batch % 3 == 0
                if hold:  # another writer's transaction, open before this batch's rows
                    pid, epoch = writer.init_producer_id("other")
                    writer.add_partitions_to_txn("other", pid, epoch, [(TOPIC, 1)])
                    with writer.produce_stream(TOPIC, 1, transactional_id="other") as stream:
                        stream.send(
                            rows(1, start=900_000 + batch), producer_id=pid,
                            producer_epoch=epoch, base_sequence=0, transactional=True,
                        ).offsets(10)  # fmt: skip
                txn = write_attempt(writer, "vis", "run", batch, 0, batch_ids(batch))
                assert writer.commit_sink_batch("vis", batch, [txn], "run")
                committed.append(batch)
                if hold:
                    # The batch stays held back at partition 1 until a reader has looked.
                    with progress:
                        wanted = reads["naive"] + 1
                        assert progress.wait_for(
                            lambda wanted=wanted: reads["naive"] >= wanted, timeout=30
                        )
                    writer.end_txn("other", pid, epoch, commit=True)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def reader() -> None:
        # Each read takes what is new since this reader's previous end (as a stream
        # reader does): consistent, monotonic ends put every batch in one window whole.
        client = client_for(broker)
        previous: dict[str, dict[int, int]] = {"naive": {}, "cut": {}}
        try:
            while not done.is_set():
                naive = {p: client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
                cut = client.stable_ends(TOPIC)
                for name, ends in (("naive", naive), ("cut", cut)):
                    window = read_batches(client, ends, previous[name])
                    for batch, n in window.items():
                        if batch < 9000 and n != 2 * ROWS_PER_PARTITION:
                            partial.append(
                                f"{name}: batch {batch} read with {n} rows in "
                                f"[{previous[name]}, {ends})"
                            )
                    previous[name] = ends
                    with progress:
                        reads[name] += 1
                        progress.notify_all()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sink)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    cut_partial = [p for p in partial if p.startswith("cut")]
    naive_partial = [p for p in partial if p.startswith("naive")]
    print(
        f"{len(committed)} batches, reads {dict(reads)}; naive partial reads {len(naive_partial)}"
    )
    assert not cut_partial, cut_partial[:5]
    # The scenario happened: thousands of reads, and by LSO alone some saw half a batch.
    assert reads["cut"] >= target_reads, reads
    assert naive_partial, "no read by LSO alone ever saw part of a batch: nothing was tested"
    final = read_batches(writer, writer.stable_ends(TOPIC))
    assert {b: n for b, n in final.items() if b < 9000} == dict.fromkeys(
        committed, 2 * ROWS_PER_PARTITION
    )


def test_a_dead_writers_leftovers_hold_readers_back_at_most_the_bound(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """A df.write job killed mid-write leaves a prepared and an open transaction; a
    second writer commits rows behind them. They stay invisible only until the
    leftovers time out: transaction.timeout.ms (2 s here) plus the cleanup interval."""
    timeout_ms, interval_ms = 2000, 500
    broker = broker_factory(
        {
            **TEST_BROKER_CONFIG,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": interval_ms,
        }
    )
    client = client_for(broker)
    client.create_topic(TOPIC, 2, schema=rows(1).schema)
    write_attempt(client, "batch-dead", "dead", 0, 0, batch_ids(1))  # prepared, never committed
    tid = "batch-dead/1"
    pid, epoch, _ = client.init_sink_producer(tid, timeout_ms, SinkAttempt("batch-dead", "dead", 0))
    client.add_partitions_to_txn(tid, pid, epoch, [(TOPIC, 0)])
    with client.produce_stream(TOPIC, 0, transactional_id=tid) as stream:
        stream.send(
            rows(3, start=500), producer_id=pid, producer_epoch=epoch, base_sequence=0,
            transactional=True,
        ).offsets(10)  # fmt: skip
    died = time.monotonic()
    second = write_attempt(client, "batch-second", "second", 0, 0, batch_ids(2))
    assert client.commit_sink_batch("batch-second", 0, [second], "second")
    wait_until(
        lambda: read_batches(client, client.stable_ends(TOPIC)).get(2, 0) > 0,
        "the second writer's committed rows to become visible",
        timeout=30,
    )
    held = time.monotonic() - died
    print(f"second writer's committed rows held back {held:.2f} s")
    assert held <= (timeout_ms + interval_ms) / 1000 + 1.5, held
    assert held >= timeout_ms / 1000 * 0.9, f"visible after {held:.2f} s: nothing held it back"
    assert read_batches(client, client.stable_ends(TOPIC)) == Counter({2: 8})


def test_transactions_cli_lists_and_aborts_a_hanging_transaction(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    client = client_for(broker)
    client.create_topic(TOPIC, 2, schema=rows(1).schema)
    pid, epoch, _ = client.init_sink_producer("q/0", 600_000, SinkAttempt("q", "run-7", 3))
    client.add_partitions_to_txn("q/0", pid, epoch, [(TOPIC, 1)])
    with client.produce_stream(TOPIC, 1, transactional_id="q/0") as stream:
        stream.send(
            rows(2), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
        ).offsets(10)  # fmt: skip

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "broker_core.cli.main", "transactions", *args,
             "--bootstrap", broker.address],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout

    listed = cli("list")
    assert "q/0" in listed and "sink q run run-7 batch 3" in listed and f"{TOPIC}-1" in listed
    assert "no open transaction" in cli("list", "--min-age-ms", "3600000")
    assert "aborted the open transaction of q/0" in cli("abort", "--transactional-id", "q/0")
    assert "nothing aborted" in cli("abort", "--transactional-id", "q/0")
    offsets = client.list_offsets(TOPIC, 1)
    assert offsets["last_stable_offset"] == offsets["log_end_offset"]


def _send(
    client: BrokerClient, tid: str, p: int, ids: range, pid: int, epoch: int, seq: int
) -> tuple[int, int]:
    with client.produce_stream(TOPIC, p, transactional_id=tid) as stream:
        acked = stream.send(
            rows(len(ids), start=ids.start), producer_id=pid, producer_epoch=epoch,
            base_sequence=seq, transactional=True,
        ).offsets(10)  # fmt: skip
    return acked[0], acked[1]


def test_interleaved_sink_batches_are_read_whole(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """Issue 23, bug 1, through a broker process: sinks B and X commit batch after batch
    whose transactions interleave on partition 0 (B's rows before and after X's), while
    another writer holds partition 1 between B's rows and X's there until a reader has
    looked. Then B is settled and X is not, and X's cut on partition 0 falls inside B's
    range. Three readers read at the coordinator's cut, through ``stable_ends`` and
    through ``stable_ends_across`` with this one coordinator: no read holds part of B or
    X; by the LSO alone some reads do."""
    broker = broker_factory(TEST_BROKER_CONFIG)
    writer = client_for(broker)
    writer.create_topic(TOPIC, 2, schema=rows(1).schema)
    rounds = 40
    expected: dict[int, int] = {}
    done = threading.Event()
    progress = threading.Condition()
    reads = Counter[str]()
    partial: list[str] = []
    errors: list[BaseException] = []

    def attempt(sink: str, batch: int) -> tuple[str, int, int]:
        tid = f"{sink}/0"
        pid, epoch, _ = writer.init_sink_producer(tid, 60_000, SinkAttempt(sink, "run", batch))
        writer.add_partitions_to_txn(tid, pid, epoch, [(TOPIC, 0), (TOPIC, 1)])
        return tid, pid, epoch

    def sinks() -> None:
        try:
            for n in range(1, rounds + 1):
                b, x = n * 100, (5000 + n) * 100  # row id // 100 names the batch
                tb, pb, eb = attempt("b", n)
                tx, px, ex = attempt("x", n)
                b0, _ = _send(writer, tb, 0, range(b, b + 2), pb, eb, 0)
                x0 = _send(writer, tx, 0, range(x, x + 2), px, ex, 0)
                _, b0_last = _send(writer, tb, 0, range(b + 2, b + 4), pb, eb, 2)
                b1 = _send(writer, tb, 1, range(b + 4, b + 6), pb, eb, 0)
                pid, epoch = writer.init_producer_id("other")
                writer.add_partitions_to_txn("other", pid, epoch, [(TOPIC, 1)])
                _send(writer, "other", 1, range(900_000 + n, 900_001 + n), pid, epoch, 0)
                x1 = _send(writer, tx, 1, range(x + 2, x + 4), px, ex, 0)
                writer.prepare_sink_txn(tb, pb, eb, n, [(TOPIC, 0, b0, b0_last), (TOPIC, 1, *b1)])
                writer.prepare_sink_txn(tx, px, ex, n, [(TOPIC, 0, *x0), (TOPIC, 1, *x1)])
                assert writer.commit_sink_batch("b", n, [(tb, pb, eb)], "run")
                assert writer.commit_sink_batch("x", n, [(tx, px, ex)], "run")
                expected[n], expected[5000 + n] = 6, 4
                with progress:  # the bad moment: B settled, X held at partition 1
                    wanted = reads["naive"] + 2
                    assert progress.wait_for(
                        lambda wanted=wanted: reads["naive"] >= wanted, timeout=60
                    )
                writer.end_txn("other", pid, epoch, commit=True)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def reader(index: int) -> None:
        client = client_for(broker)
        previous: dict[str, dict[int, int]] = {"naive": {}, "cut": {}, "across": {}}
        try:
            while not done.is_set():
                naive = {p: client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
                ends = {
                    "naive": naive,
                    "cut": client.stable_ends(TOPIC),
                    "across": client.stable_ends_across(TOPIC, [broker.address]),
                }
                for name, end in ends.items():
                    window = read_batches(client, end, previous[name])
                    for batch, n in window.items():
                        want = 6 if batch < 5000 else 4
                        if batch < 9000 and n != want:
                            partial.append(f"{name}: batch {batch} read with {n} rows")
                    previous[name] = end
                    with progress:
                        reads[name] += 1
                        progress.notify_all()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sinks)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    naive_partial = [p for p in partial if p.startswith("naive")]
    print(f"reads {dict(reads)}; naive partial reads {len(naive_partial)}")
    assert not [p for p in partial if not p.startswith("naive")], partial[:5]
    assert naive_partial, "no read by LSO alone saw part of a batch: nothing was tested"
    assert reads["cut"] >= 2 * rounds
    final = read_batches(writer, writer.stable_ends(TOPIC))
    assert {b: n for b, n in final.items() if b < 9000} == expected
