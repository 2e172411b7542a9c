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

from broker_core.client import BrokerClient
from broker_core.protocol import SinkAttempt
from tests.broker.conftest import TEST_BROKER_CONFIG, rows
from tests.harness.broker import BrokerFactory

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
        with client.produce_stream(TOPIC, p) as stream:
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


def read_batches(client: BrokerClient, ends: dict[int, int]) -> Counter[int]:
    """Rows per sink batch readable read_committed below ``ends``."""
    seen: Counter[int] = Counter()
    for p, end in ends.items():
        if end == 0:
            continue
        offset = 0
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
    """A sink commits two-partition batches while readers read; another writer keeps a
    transaction open on partition 1 now and then, so by LSO alone a reader would see a
    batch's partition-0 rows without its partition-1 rows. With the coordinator's cut no
    read ever holds part of a batch."""
    broker = broker_factory(TEST_BROKER_CONFIG)
    writer = client_for(broker)
    writer.create_topic(TOPIC, 2, schema=rows(1).schema)
    batches = 150
    done = threading.Event()
    reads = Counter[str]()
    partial: list[str] = []
    errors: list[BaseException] = []

    def sink() -> None:
        try:
            other = 0
            for batch in range(1, batches + 1):
                hold = batch % 3 == 0
                if hold:  # another writer's transaction, open before this batch's rows
                    other += 1
                    pid, epoch = writer.init_producer_id("other")
                    writer.add_partitions_to_txn("other", pid, epoch, [(TOPIC, 1)])
                    with writer.produce_stream(TOPIC, 1) as stream:
                        stream.send(
                            rows(1, start=900_000 + other), producer_id=pid,
                            producer_epoch=epoch, base_sequence=0, transactional=True,
                        ).offsets(10)  # fmt: skip
                txn = write_attempt(writer, "vis", "run", batch, 0, batch_ids(batch))
                assert writer.commit_sink_batch("vis", batch, [txn], "run")
                if hold:
                    time.sleep(0.05)  # readers get to look while the batch is held back
                    writer.end_txn("other", pid, epoch, commit=True)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def reader() -> None:
        client = client_for(broker)
        try:
            while not done.is_set():
                naive = {p: client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
                cut = client.stable_ends(TOPIC)
                for name, ends in (("naive", naive), ("cut", cut)):
                    seen = read_batches(client, ends)
                    reads[name] += 1
                    for batch, n in seen.items():
                        if batch < 9000 and n != 2 * ROWS_PER_PARTITION:
                            partial.append(f"{name}: batch {batch} read with {n} rows at {ends}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sink)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    cut_partial = [p for p in partial if p.startswith("cut")]
    naive_partial = [p for p in partial if p.startswith("naive")]
    print(f"reads {dict(reads)}; naive partial reads {len(naive_partial)}")
    assert not cut_partial, cut_partial[:5]
    # The scenario happened: the readers were there while batches were held back.
    assert reads["cut"] >= 500, reads
    assert naive_partial, "no read by LSO alone ever saw part of a batch: nothing was tested"
    final = read_batches(writer, writer.stable_ends(TOPIC))
    assert {b: n for b, n in final.items() if b < 9000} == dict.fromkeys(
        range(1, batches + 1), 2 * ROWS_PER_PARTITION
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
    with client.produce_stream(TOPIC, 0) as stream:
        stream.send(
            rows(3, start=500), producer_id=pid, producer_epoch=epoch, base_sequence=0,
            transactional=True,
        ).offsets(10)  # fmt: skip
    died = time.monotonic()
    second = write_attempt(client, "batch-second", "second", 0, 0, batch_ids(2))
    assert client.commit_sink_batch("batch-second", 0, [second], "second")
    while read_batches(client, client.stable_ends(TOPIC)).get(2, 0) == 0:
        assert time.monotonic() - died < 30, "the second writer's rows never became visible"
        time.sleep(0.05)  # polling another process's state
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
    with client.produce_stream(TOPIC, 1) as stream:
        stream.send(
            rows(2), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
        ).offsets(10)  # fmt: skip

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "broker_core.cli", "transactions", *args,
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
