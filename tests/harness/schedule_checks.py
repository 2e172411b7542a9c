"""The steady idempotent producer of the seeded fault schedule (``tests/harness/schedule.py``)
and the invariants checked over it (issue 15, required test 5).

* :class:`SteadyProducer`: an idempotent ``acks=all`` producer sending a steady stream of
  id ranges from a thread, recording which ids each acknowledged (or failed) send
  carried; its connections (:class:`ProxiedConnections`) go through a :class:`TcpProxy`
  per broker, so a fault can cut its link to one broker.
* Invariant checks:

  1. :func:`check_acknowledged`: the read-back (``read_committed``, from the current
     leaders) holds no id twice, no id never sent, and every id acknowledged before the
     read (waiting a bounded time: a new leader's high watermark may trail the old one's
     for a moment, as in Kafka), at the offsets its acknowledgement gave;
  2. :func:`check_replicas_agree`: for each partition, every running in-sync replica's
     batches below the leader's high watermark are the leader's, byte for byte (read from
     the segment files of running brokers; only whole batches below the watermark count);
  3. :func:`compare_stopped_replicas`: after a clean stop of every broker, each
     partition's replicas hold the same log bytes, the same newest producer-state
     snapshot and the same epochs that wrote batches.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.errors import IdemlogError
from broker_core.producer import Producer, SendResult
from broker_core.record.batch import decode_header, verify_crc
from tests.harness.replicated import ReplicatedCluster
from tests.harness.schedule import clean_stop
from tests.harness.tcp_proxy import TcpProxy
from tests.harness.waiting import wait_until

# -- the producer -------------------------------------------------------------------------


class ProxiedConnections(FlightConnections):
    """The producer's connection cache, with a :class:`TcpProxy` in front of each broker:
    every connection to a broker's address goes through its proxy, so :meth:`cut` can
    sever the producer's link to one broker (the proxy closed: open connections reset,
    new ones refused) while the brokers and the test's own client still reach it, and
    :meth:`heal` puts a new proxy in its place."""

    def __init__(self, targets: list[str]) -> None:
        super().__init__()
        self._map_lock = threading.Lock()
        self.proxies = {t: TcpProxy(t) for t in targets}
        self.cut_links: dict[str, TcpProxy] = {}  # the closed proxy of each cut link

    def _open(self, address: str) -> tuple[flight.FlightClient, float]:
        """Every channel to ``address`` (the streams' and the actions') dials its proxy;
        the cache keys and resets it under the broker's address, as any other channel."""
        with self._map_lock:
            proxy = self.proxies[address].address
        return flight.connect(f"grpc://{proxy}"), float("inf")

    def cut(self, address: str) -> TcpProxy:
        """Close ``address``'s proxy; returns it (its counters say what went through)."""
        with self._map_lock:
            proxy = self.proxies[address]
            self.cut_links[address] = proxy
        proxy.close()
        return proxy

    def heal(self, address: str) -> TcpProxy:
        """A new proxy for ``address``; the cached channel to the old one is dropped."""
        with self._map_lock:
            proxy = self.proxies[address] = TcpProxy(address)
            self.cut_links.pop(address, None)
        self.reset(address)
        return proxy

    def close(self) -> None:
        super().close()
        with self._map_lock:
            proxies = list(self.proxies.values())
        for proxy in proxies:
            proxy.close()


def id_table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 97, "value": ids.astype(np.float64)})


class SteadyProducer:
    """An idempotent acks=all producer sending ``rows`` ids every ``interval_s`` (a
    steady stream, not a flood) from a thread, split over the partitions by key; records
    which ids each acknowledged send carried, and each failed send."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rows: int = 100,
        interval_s: float = 0.01,
        connections: FlightConnections | None = None,
    ) -> None:
        self.topic = topic
        self.rows = rows
        self.interval_s = interval_s
        self.producer = Producer(
            bootstrap,
            acks="all",
            linger_ms=10,
            batch_size=64 * 1024,  # the test brokers' max.request.bytes is 256 KiB
            retry_backoff_ms=20,
            # Above the broker's acks=all wait (2 x replica.lag.time.max.ms + 5 s).
            request_timeout_ms=15_000,
            delivery_timeout_ms=300_000,
            connections=connections,
        )
        self._lock = threading.Lock()
        self._acked: dict[int, SendResult] = {}  # first id of an acknowledged send -> result
        self.failed: list[tuple[int, BaseException]] = []
        self.sent = 0  # ids 0..sent-1 were (or are being) handed to send()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                start = self.sent
                # Counted before send(): its ids may be read back before it returns.
                self.sent = start + self.rows
                future = self.producer.send(self.topic, id_table(start, self.rows), key="key")
                future.add_done_callback(functools.partial(self._done, start))
                self._stop.wait(self.interval_s)
        except BaseException as exc:  # reported by stop()
            self._error = exc

    def _done(self, start: int, future: Future[SendResult]) -> None:
        error = future.exception()
        with self._lock:
            if error is None:
                self._acked[start] = future.result()
            else:
                self.failed.append((start, error))

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self._acked) * self.rows

    def acked_results(self) -> dict[int, SendResult]:
        """First id of each acknowledged send -> its result (the offsets per partition)."""
        with self._lock:
            return dict(self._acked)

    def acked_ids(self) -> set[int]:
        with self._lock:
            starts = list(self._acked)
        return {i for s in starts for i in range(s, s + self.rows)}

    def wait_progress(self, more: int, what: str, timeout: float = 30.0) -> None:
        """Wait until ``more`` ids beyond those acknowledged now are acknowledged."""
        target = self.acked_count + more
        self.check_alive()
        wait_until(lambda: self.acked_count >= target, what, timeout=timeout)

    def check_alive(self) -> None:
        if self._error is not None:
            raise AssertionError(f"the producer thread died: {self._error!r}")
        assert not self.failed, f"sends failed: {self.failed[:3]}"

    def stop(self) -> None:
        """Stop sending, flush (every send then acknowledged or failed) and close."""
        self._stop.set()
        self._thread.join(30)
        try:
            self.producer.flush(120)
        finally:
            self.producer.close()
        self.check_alive()


# -- invariant 1: acknowledged => present once ---------------------------------------------


def read_rows(
    client: BrokerClient, topic: str, partitions: int, timeout: float = 30.0
) -> dict[tuple[int, int], int]:
    """Every committed row of the topic as the current leaders serve it (read_committed):
    (partition, offset) -> id. A leader change during the read refreshes the metadata and
    reads again, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rows: dict[tuple[int, int], int] = {}
            for p in range(partitions):
                for meta, batch in client.fetch(topic, p, isolation="read_committed"):
                    for i, id_ in enumerate(batch.column("id").to_pylist()):
                        rows[(p, meta.base_offset + i)] = id_
            return rows
        except IdemlogError:
            if time.monotonic() > deadline:
                raise
            with contextlib.suppress(IdemlogError):
                client.refresh_metadata()
            time.sleep(0.1)  # a retry's backoff: the election signals nothing here


def read_ids(client: BrokerClient, topic: str, partitions: int) -> list[int]:
    """Every committed id of the topic, partition by partition, in offset order."""
    return list(read_rows(client, topic, partitions).values())


@dataclass
class AckCheck:
    ids: int  # ids read back
    reads: int  # reads it took until every acknowledged id was there
    duplicates: int  # acknowledged runs answered as duplicates, with the original offsets
    blind_duplicates: int  # ... answered as duplicates without offsets (nothing to check)


def check_acknowledged(
    client: BrokerClient,
    topic: str,
    partitions: int,
    acked: Mapping[int, SendResult],
    rows: int,
    sent: Callable[[], int],
    timeout: float = 20.0,
) -> AckCheck:
    """Invariant 1 over the read-back: no id twice and none never sent (at once), and
    every id of ``acked`` (send's first id -> its result, acknowledged before this call;
    each send carried ``rows`` ids) present, waiting up to ``timeout`` for a new leader's
    high watermark; then each acknowledged run of offsets holds ids of its own send
    (the offsets a retry answered as a duplicate are the original ones). ``sent()``: how
    many ids were handed to the producer."""
    reads = [0]
    seen: list[dict[tuple[int, int], int]] = [{}]
    expected = {i for start in acked for i in range(start, start + rows)}

    def complete() -> bool:
        at = read_rows(client, topic, partitions)
        bound = sent()  # after the read: every id read had been handed to send() by then
        reads[0] += 1
        seen[0] = at
        ids = list(at.values())
        twice = [i for i, n in Counter(ids).items() if n > 1]
        assert not twice, f"{len(twice)} ids read more than once, e.g. {sorted(twice)[:5]}"
        stray = [i for i in ids if not 0 <= i < bound]
        assert not stray, f"ids never sent read back: {stray[:5]}"
        return not expected - set(ids)

    def what() -> str:
        missing = sorted(expected - set(seen[0].values()))
        return (
            f"all {len(expected)} acknowledged ids in the read-back: {len(missing)} missing, "
            f"e.g. {missing[:5]}"
        )

    wait_until(complete, what, timeout=timeout, interval=0.2)
    at, duplicates, blind = seen[0], 0, 0
    for start, result in acked.items():
        assert sum(m.num_rows for m in result) == rows, f"send {start}: {result}"
        for m in result:
            if m.base_offset < 0:  # DUPLICATE_SEQUENCE: written before, offsets unknown
                assert m.duplicate, f"send {start}: {m}"
                blind += 1
                continue
            duplicates += m.duplicate  # a retry answered with the original offsets: checked
            assert m.last_offset - m.base_offset + 1 == m.num_rows, f"send {start}: {m}"
            for offset in range(m.base_offset, m.last_offset + 1):
                got = at.get((m.partition, offset))
                assert got is not None and start <= got < start + rows, (
                    f"the send of ids {start}..{start + rows - 1} was acknowledged at "
                    f"{topic}-{m.partition} offsets {m.base_offset}..{m.last_offset}, but "
                    f"offset {offset} holds id {got}"
                )
    return AckCheck(len(at), reads[0], duplicates, blind)


# -- invariant 2: replicas agree below the high watermark ----------------------------------

Batch = tuple[int, int, bytes]  # base offset, leader epoch, the batch's bytes


def whole_batches_below(raw: bytes, bound: int) -> list[Batch]:
    """The whole batches of a replica's segment bytes that end below ``bound`` (offsets),
    CRC-checked; a running broker's torn or unwritten tail is not read."""
    out: list[Batch] = []
    position = 0
    while position < len(raw):
        try:
            header = decode_header(raw, position)
        except IdemlogError:
            break  # a header still being written
        end = position + header.size
        if end > len(raw) or header.last_offset >= bound:
            break
        data = raw[position:end]
        verify_crc(header, data)
        out.append((header.base_offset, header.leader_epoch, data))
        position = end
    return out


def _segments(directory: Path) -> bytes:
    chunks = []
    for path in sorted(directory.glob("*.log")):
        with contextlib.suppress(FileNotFoundError):  # a truncation deleted it meanwhile
            chunks.append(path.read_bytes())
    return b"".join(chunks)


@dataclass
class AgreementSample:
    partition: int
    leader: int
    epoch: int
    high_watermark: int
    compared: list[int]  # the in-sync brokers compared with the leader
    batches: int


def check_replicas_agree(
    cluster: ReplicatedCluster, topic: str, partition: int
) -> AgreementSample | None:
    """Invariant 2, one sample: the leader's high watermark h, then the ISR as the leader
    describes it (a follower still in it was in sync when h was read, or caught up with a
    later, higher watermark); the whole batches below h of each running in-sync replica
    must be the leader's. None when the leadership moved or a broker did not answer
    during the sample (the caller samples again later)."""
    try:
        first = cluster.state(topic, partition)
        leader = cluster.brokers[first.leader]
        if not leader.running:
            return None
        hw = cluster.offsets(leader, topic, partition)["high_watermark"]
        state = cluster.state(topic, partition, via=leader)
    except (IdemlogError, KeyError):
        return None
    if state.leader != first.leader or state.leader_epoch != first.leader_epoch:
        return None
    reference = whole_batches_below(_segments(cluster.partition_dir(leader, topic, partition)), hw)
    expected_end = reference[-1][0] if reference else -1
    compared = []
    for broker_id in state.isr:
        broker = cluster.brokers[broker_id]
        if broker_id == state.leader or not broker.running:
            continue
        mine = whole_batches_below(_segments(cluster.partition_dir(broker, topic, partition)), hw)
        if mine != reference:
            diff = _first_difference(reference, mine)
            raise AssertionError(
                f"{topic}-{partition}: in-sync replica {broker_id} differs from leader "
                f"{state.leader} (epoch {state.leader_epoch}) below the high watermark {hw} "
                f"(leader's last whole batch at {expected_end}): {diff}"
            )
        compared.append(broker_id)
    return AgreementSample(
        partition, state.leader, state.leader_epoch, hw, compared, len(reference)
    )


def _first_difference(reference: list[Batch], mine: list[Batch]) -> str:
    for i, (a, b) in enumerate(zip(reference, mine, strict=False)):
        if a != b:
            return (
                f"batch #{i}: leader has (offset {a[0]}, epoch {a[1]}, {len(a[2])} bytes), "
                f"follower (offset {b[0]}, epoch {b[1]}, {len(b[2])} bytes)"
            )
    return f"leader has {len(reference)} whole batches below it, follower {len(mine)}"


# -- invariant 3: at quiescence, after a clean stop ----------------------------------------


def compare_stopped_replicas(cluster: ReplicatedCluster, topic: str, partitions: int) -> None:
    """Stop every broker cleanly, then check that each partition's replicas came out
    identical (``ReplicatedCluster.assert_stopped_replicas_identical``)."""
    for broker in cluster.running():
        clean_stop(broker)
    cluster.assert_stopped_replicas_identical(topic, partitions)
