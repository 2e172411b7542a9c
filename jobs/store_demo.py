"""Store demo (``make demo`` until the Spark sink lands): exactly-once appends under faults.

A deterministic producer writes payments into a local store while the demo injects the
faults the idempotent design exists for: lost acknowledgements (the batch is resent),
retries older than the cached window, a zombie with an old epoch, an aborted transaction,
and a crash that tears the tail of the log. At the end the topic is read back
``read_committed`` and compared with what the producer meant to write.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from broker_core.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType, increment_sequence

SCHEMA = pa.schema([("payment_id", pa.int64()), ("account", pa.int32()), ("amount", pa.float64())])
PRODUCER_ID = 4242


def payments(first_id: int, n: int) -> pa.RecordBatch:
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return pa.record_batch(
        [pa.array(ids), pa.array((ids % 97).astype(np.int32)), pa.array(ids * 0.01)],
        schema=SCHEMA,
    )


@dataclass
class Producer:
    """Just enough client to show the broker-side guarantees: epoch, sequence, resend."""

    log: PartitionLog
    epoch: int = 0
    next_seq: int = 0
    sent: list[tuple[int, int, pa.RecordBatch]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def send(self, batch: pa.RecordBatch, *, transactional: bool = False) -> None:
        seq = self.next_seq
        self.next_seq = increment_sequence(seq, batch.num_rows)
        self.sent.append((self.epoch, seq, batch))
        self.log.append(
            batch,
            producer_id=PRODUCER_ID,
            producer_epoch=self.epoch,
            base_sequence=seq,
            transactional=transactional,
        )

    def resend(self, index: int) -> None:
        epoch, seq, batch = self.sent[index]
        try:
            result = self.log.append(
                batch, producer_id=PRODUCER_ID, producer_epoch=epoch, base_sequence=seq
            )
            self.counts["duplicate (original offsets returned)" if result.duplicate else "?"] += 1
        except DuplicateSequenceError:
            self.counts["duplicate beyond the cached window"] += 1
        except InvalidProducerEpochError:
            self.counts["fenced (stale epoch)"] += 1
        except OutOfOrderSequenceError:
            self.counts["out-of-order rejected"] += 1

    def bump_epoch(self) -> None:
        self.epoch += 1
        self.next_seq = 0


def run(data_dir: Path, batches: int, seed: int) -> int:
    """The demo on a fresh store in ``data_dir`` (removed first): ``batches`` batches,
    faults drawn from ``seed`` (the same seed, the same run). Prints the fault counts and
    the verdict line; returns 0 if the committed rows are exactly the ones meant, once
    each and in order, 1 otherwise."""
    rng = random.Random(seed)
    shutil.rmtree(data_dir, ignore_errors=True)
    config = {"segment.bytes": 64 * 1024, "max.message.bytes": 64 * 1024}
    store = LogStore(data_dir, config)
    store.create_topic("payments", 1, schema=SCHEMA)
    producer = Producer(store.partition("payments", 0))
    expected: list[int] = []
    next_id = 0
    for i in range(batches):
        n = rng.randint(50, 400)
        batch = payments(next_id, n)
        next_id += n
        if i % 17 == 16:
            # A transaction the coordinator aborts: its rows must never be read.
            producer.send(batch, transactional=True)
            producer.log.write_marker(PRODUCER_ID, producer.epoch, ControlType.ABORT)
            producer.counts["aborted transactions"] += 1
        else:
            producer.send(batch)
            expected.extend(range(next_id - n, next_id))
        fault = rng.random()
        if fault < 0.3:
            producer.resend(len(producer.sent) - 1)  # the ack was lost
        elif fault < 0.4 and len(producer.sent) > 8:
            producer.resend(rng.randrange(len(producer.sent) - 8))  # a very late retry
        if i == batches // 2:
            # A crash that tears the last write, then a restart and the producer's retry.
            log = producer.log
            log.abandon()
            active = log.segment_files()[-1]
            with active.open("ab") as f:
                f.write(b"\x00torn-write" * 7)
            store = LogStore(data_dir, config)
            producer.log = store.partition("payments", 0)
            producer.resend(len(producer.sent) - 1)
            producer.counts["crashes recovered"] += 1
        if i == batches * 3 // 4:
            # A new instance of the producer takes over; the old one's retry is fenced.
            producer.bump_epoch()
            producer.send(payments(next_id, 10))
            expected.extend(range(next_id, next_id + 10))
            next_id += 10
            producer.resend(len(producer.sent) - 2)
        if (i + 1) % max(1, batches // 10) == 0:
            log = producer.log
            print(
                f"progress: batch {i + 1}/{batches} log_end_offset={log.log_end_offset} "
                f"segments={len(log.segments)} faults={sum(producer.counts.values())}",
                flush=True,
            )
    log = producer.log
    committed: list[int] = []
    offset = log.log_start_offset
    while True:
        result = log.read(offset)
        for b in result.batches:
            committed.extend(b.records.column("payment_id").to_pylist())
        if result.next_offset == offset:
            break
        offset = result.next_offset
    store.close()
    seen = Counter(committed)
    duplicates = sum(c - 1 for c in seen.values() if c > 1)
    missing = len(set(expected) - set(seen))
    unexpected = len(set(seen) - set(expected))
    ok = committed == expected and duplicates == 0 and missing == 0
    print()
    print(f"{'fault / outcome':<42}{'count':>8}")
    for name, count in sorted(producer.counts.items()):
        print(f"{name:<42}{count:>8}")
    print()
    print(
        f"exactly_once={'OK' if ok else 'FAIL'} rows_expected={len(expected)} "
        f"rows_committed={len(committed)} duplicates={duplicates} missing={missing}"
        + ("" if not unexpected else f" unexpected={unexpected}")
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m jobs.store_demo``: :func:`run` with the command line's arguments; its
    exit status (0: exactly once held)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/store-demo"))
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    return run(args.data_dir, args.batches, args.seed)


if __name__ == "__main__":
    sys.exit(main())
