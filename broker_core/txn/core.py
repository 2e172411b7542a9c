"""The transaction coordinator's state and the durable steps it is built from.

:class:`TransactionCoordinator` (``txn_coordinator``) is the public face; this base class
keeps the in-memory maps, the claims that serialise requests per id, and the steps every
request is made of: a durable transition, marker writes with retries, and finishing what
an earlier request (or a previous coordinator) left half done.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Protocol

from broker_core.errors import (
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidConfigError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
)
from broker_core.txn.markers import MarkerWriter, StableOffsets
from broker_core.txn.state import (
    MAX_CLIENT_EPOCH,
    NO_SINK,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_store import CoordinatorEpochFencedError, TxnStateStore
from broker_core.txn.visibility import Range, consistent_cut

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_MAX_MARKER_BACKOFF_S = 1.0


class ProducerIdSource(Protocol):
    def generate_producer_id(self) -> int: ...


class LsoSource(Protocol):
    """Each partition's last stable offset of a topic, as its leader has it now."""

    def last_stable_offsets(self, topic: str) -> dict[int, int]: ...


class _Tracked:
    """A committed sink batch readers may still see in part (see ``visibility``)."""

    __slots__ = ("pending", "ranges")

    def __init__(self, ranges: list[tuple[str, int, int, int]]) -> None:
        self.ranges = ranges
        # Partitions whose LSO has not yet been reported past the batch's rows.
        self.pending = {(t, p) for t, p, _, _ in ranges}


class CoordinatorStatus(Enum):
    LOADING = "loading"  # constructed; start() has not loaded the state yet
    RUNNING = "running"
    CLOSED = "closed"


_STATUS_TRANSITIONS = {
    CoordinatorStatus.LOADING: frozenset({CoordinatorStatus.RUNNING, CoordinatorStatus.CLOSED}),
    CoordinatorStatus.RUNNING: frozenset({CoordinatorStatus.CLOSED}),
    CoordinatorStatus.CLOSED: frozenset(),
}

_TXN = "transactional id"
_SINK = "sink"


class Claims:
    """The ids one request holds exclusively; all released together when it ends."""

    def __init__(self, lock: threading.Lock, busy: set[tuple[str, str]]) -> None:
        self._lock = lock
        self._busy = busy
        self._held: set[tuple[str, str]] = set()

    def txn(self, transactional_id: str) -> None:
        self._take((_TXN, transactional_id))

    def sink(self, sink_id: str) -> None:
        self._take((_SINK, sink_id))

    def _take(self, key: tuple[str, str]) -> None:
        if key in self._held:
            return
        with self._lock:
            if key in self._busy:
                raise ConcurrentTransactionsError(
                    f"{key[0]} {key[1]!r} is being changed by another request (a state "
                    "change or marker write is in progress); retry"
                )
            self._busy.add(key)
        self._held.add(key)

    def release(self) -> None:
        with self._lock:
            self._busy.difference_update(self._held)
        self._held.clear()


class TxnCoordinatorCore:
    """State, lifecycle and the durable steps; the requests are in TransactionCoordinator."""

    def __init__(
        self,
        state_store: TxnStateStore,
        pids: ProducerIdSource,
        markers: MarkerWriter,
        *,
        max_timeout_ms: int = 900_000,
        default_timeout_ms: int = 60_000,
        coordinator_epoch: int = 0,
        clock: Callable[[], int] | None = None,
        marker_retry_deadline_s: float = 30.0,
        marker_retry_backoff_s: float = 0.05,
        stable_offsets: LsoSource | None = None,
    ) -> None:
        if max_timeout_ms < 1 or default_timeout_ms < 1:
            raise InvalidConfigError(
                f"transaction timeouts must be >= 1 ms: max_timeout_ms={max_timeout_ms}, "
                f"default_timeout_ms={default_timeout_ms}"
            )
        if coordinator_epoch < 0:
            raise InvalidConfigError(f"coordinator_epoch={coordinator_epoch} must be >= 0")
        self._store = state_store
        self._pids = pids
        self._markers = markers
        self.max_timeout_ms = max_timeout_ms
        # A configured maximum below the default lowers the default with it, rather than
        # refusing every InitProducerId that asks for no timeout in particular.
        self.default_timeout_ms = min(default_timeout_ms, max_timeout_ms)
        self.coordinator_epoch = coordinator_epoch
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._marker_retry_deadline_s = marker_retry_deadline_s
        self._marker_retry_backoff_s = marker_retry_backoff_s
        self._lock = threading.Lock()
        self._closing = threading.Event()  # wakes marker retries up on close()
        self._status = CoordinatorStatus.LOADING
        self._txns: dict[str, TransactionMetadata] = {}
        self._sinks: dict[str, SinkCommitRecord] = {}
        self._busy: set[tuple[str, str]] = set()
        self._stable_offsets = stable_offsets
        # Sink runs: the run each sink was last seen in (a new one retires the others'
        # leftovers), and when each (sink, run) last showed life; in memory only: after a
        # restart every sink transaction gets a full timeout from the load (_loaded_ms).
        self._sink_runs: dict[str, str] = {}
        self._run_alive_ms: dict[tuple[str, str], int] = {}
        self._loaded_ms = 0
        # (sink id, batch id) -> a committed batch readers may still see in part. Changed
        # and read under _visibility_lock, which stable_ends holds across its LSO reads.
        self._visibility_lock = threading.Lock()
        self._tracked: dict[tuple[str, int], _Tracked] = {}
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "transactions_committed",
                "transactions_aborted",
                "transactions_fenced",
                "transactions_timed_out",
                "producer_id_rotations",
                "sink_batches_committed",
                "sink_batches_repeated",
                "sink_attempts_reused",
                "sink_leftovers_aborted",
                "transactions_aborted_by_operator",
                "marker_retries",
            ),
            0,
        )

    # -- lifecycle ---------------------------------------------------------------------
    def _set_status(self, new: CoordinatorStatus, *, idempotent: bool = False) -> None:
        with self._lock:
            if idempotent and new is self._status:
                return
            if new not in _STATUS_TRANSITIONS[self._status]:
                raise InvalidTxnStateError(
                    f"coordinator cannot go from {self._status.name} to {new.name}"
                )
            self._status = new

    @property
    def status(self) -> CoordinatorStatus:
        return self._status

    def _check_running(self) -> None:
        status = self._status
        if status is CoordinatorStatus.LOADING:
            raise CoordinatorNotAvailableError(
                "the transaction coordinator is still loading its state"
            )
        if status is CoordinatorStatus.CLOSED:
            raise NotCoordinatorError("the transaction coordinator was closed")

    # -- building blocks (callers hold the claims of the ids they change) ------------------
    @contextlib.contextmanager
    def _claims(self) -> Iterator[Claims]:
        claims = Claims(self._lock, self._busy)
        try:
            yield claims
        finally:
            claims.release()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def _meta(self, tid: str) -> TransactionMetadata | None:
        with self._lock:
            return self._txns.get(tid)

    def _sink_record(self, sid: str) -> SinkCommitRecord | None:
        with self._lock:
            return self._sinks.get(sid)

    def _persist(self, meta: TransactionMetadata) -> TransactionMetadata:
        """Store ``meta`` durably, then make it the current state (never the other way)."""
        with self._fenced_closes():
            self._store.put_transaction(meta, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            self._txns[meta.transactional_id] = meta
        return meta

    def _persist_sink(self, record: SinkCommitRecord) -> None:
        # Tracked before it is durable: a reader's cut must know a batch before any of
        # its markers can be written, and a record that failed to store is only extra.
        self._track(record)
        with self._fenced_closes():
            self._store.put_sink(record, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            self._sinks[record.sink_id] = record

    # -- what readers may see (broker_core.txn.visibility) ----------------------------------------
    def _track(self, record: SinkCommitRecord) -> None:
        with self._visibility_lock:
            for batch_id, ranges in record.unsettled:
                key = (record.sink_id, batch_id)
                if key not in self._tracked and ranges:
                    self._tracked[key] = _Tracked(list(ranges))

    def _settled_by(self, lsos: StableOffsets) -> None:
        """Forget the ranges that markers report below their partition's LSO."""
        if not lsos:
            return
        with self._visibility_lock:
            for key, tracked in list(self._tracked.items()):
                for topic, partition, _first, last in tracked.ranges:
                    lso = lsos.get((topic, partition))
                    if lso is not None and lso > last:
                        tracked.pending.discard((topic, partition))
                if not tracked.pending:
                    del self._tracked[key]

    def _tracked_count(self) -> int:
        with self._visibility_lock:
            return len(self._tracked)

    def _unsettled_of(self, sink_id: str) -> list[tuple[int, list[tuple[str, int, int, int]]]]:
        with self._visibility_lock:
            return sorted(
                (batch_id, list(t.ranges))
                for (sid, batch_id), t in self._tracked.items()
                if sid == sink_id
            )

    def stable_ends(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, where a read_committed reader may stop so that it
        holds every committed sink batch whole or not at all."""
        self._check_running()
        if self._stable_offsets is None:
            raise CoordinatorNotAvailableError("this coordinator cannot read partition offsets")
        with self._visibility_lock:
            # LSOs and tracked batches under one lock: a batch is tracked before its first
            # marker and dropped only once wholly below the LSOs, so none slips between.
            ends = self._stable_offsets.last_stable_offsets(topic)
            batches: list[list[Range]] = [
                [(p, first, last) for t, p, first, last in tracked.ranges if t == topic]
                for tracked in self._tracked.values()
            ]
        cut = consistent_cut(ends, batches)
        held = {p: ends[p] - cut[p] for p in ends if cut[p] < ends[p]}
        if held:
            log.debug("stable ends of %r held back to keep sink batches whole: %s", topic, held)
        return cut

    # -- sink runs -----------------------------------------------------------------------
    def _touch_run(self, sink_id: str, run_id: str, now_ms: int) -> None:
        with self._lock:
            self._run_alive_ms[(sink_id, run_id)] = now_ms

    def _forget_runs_older_than(self, oldest_ms: int) -> None:
        """Drop the liveness of runs silent since before ``oldest_ms`` (one per batch job
        and query start would pile up otherwise). Safe once that is longer ago than any
        timeout: their transactions count as expired with or without the entry."""
        with self._lock:
            gone = [key for key, beat in self._run_alive_ms.items() if beat < oldest_ms]
            for sink_id, run_id in gone:
                del self._run_alive_ms[(sink_id, run_id)]
                if self._sink_runs.get(sink_id) == run_id:
                    del self._sink_runs[sink_id]

    def _alive_since(self, meta: TransactionMetadata) -> int:
        """When the transaction last showed life, for its timeout.

        A sink task's transaction lives as long as any task of its run writes or beats
        (docs/design.md, "Long batches"); any other transaction counts from its start.
        """
        if meta.sink_id == NO_SINK:
            return meta.txn_start_ms
        with self._lock:
            beat = self._run_alive_ms.get((meta.sink_id, meta.sink_run), 0)
        return max(meta.txn_start_ms, beat, self._loaded_ms)

    def _fence(
        self,
        claims: Claims,
        tid: str,
        target: Callable[[TransactionMetadata], bool],
        reason: str,
    ) -> bool:
        """Take an attempt's id away from it: abort what it has open and bump the epoch,
        so its next append or request is refused as fenced, naming ``reason``.

        ``target`` is checked again once the id is claimed and settled: between the scan
        that chose it and now, a newer attempt (of the run that is meant to survive) may
        have taken the id, or a decided commit may have committed it; both are kept.
        """
        claims.txn(tid)
        meta = self._settle(claims, tid)
        if meta is None or not meta.holds_attempt or not target(meta):
            return False
        if meta.state is _S.ONGOING:
            self._end(meta, commit=False, epoch=meta.producer_epoch + 1, reason=reason)
        else:
            self._persist(self._bumped(meta, reason))
        self._count("sink_leftovers_aborted")
        log.info("%s %r: %s", _TXN, tid, reason)
        return True

    def _bumped(
        self, meta: TransactionMetadata, reason: str = "", *, bump: bool = True
    ) -> TransactionMetadata:
        """``meta`` at the next epoch (``bump=False``: at its epoch, already bumped by an
        abort's markers), EMPTY, held by no sink attempt; a new producer id once the
        epochs run out."""
        epoch = meta.producer_epoch + 1 if bump else meta.producer_epoch
        new = meta.copy()
        new.transition(_S.EMPTY, self._clock())
        new.sink_id = new.sink_run = NO_SINK
        new.fence_reason = reason
        if epoch > MAX_CLIENT_EPOCH:
            new.previous_producer_id = meta.producer_id
            new.producer_id = self._pids.generate_producer_id()
            new.producer_epoch = 0
            self._count("producer_id_rotations")
            log.info(
                "%s %r: epochs of producer id %d exhausted, new producer id %d",
                _TXN,
                meta.transactional_id,
                meta.producer_id,
                new.producer_id,
            )
        else:
            new.producer_epoch = epoch
        return new

    def _fence_sink_leftovers(
        self, claims: Claims, sink_id: str, keep: Callable[[TransactionMetadata], bool], why: str
    ) -> int:
        """Fence every attempt of ``sink_id`` holding an id, except those ``keep`` keeps."""

        def target(m: TransactionMetadata) -> bool:
            return m.sink_id == sink_id and not keep(m)

        fenced = 0
        for meta in self._attempts(target):
            what = f"attempt of sink {sink_id!r} run {meta.sink_run!r} batch {meta.sink_batch}"
            fenced += self._fence(
                claims, meta.transactional_id, target, f"{what} fenced and aborted: {why}"
            )
        return fenced

    def _attempts(self, target: Callable[[TransactionMetadata], bool]) -> list[TransactionMetadata]:
        """Sink attempts still holding an id that ``target`` selects, by transactional id."""
        with self._lock:
            found = [m for m in self._txns.values() if m.holds_attempt and target(m)]
        return sorted(found, key=lambda m: m.transactional_id)

    @contextlib.contextmanager
    def _fenced_closes(self) -> Iterator[None]:
        """A store refusing this coordinator's epoch means a newer coordinator took over:
        stop serving (NOT_COORDINATOR from now on, marker retries cut short)."""
        try:
            yield
        except CoordinatorEpochFencedError as exc:
            self._stand_down(exc)
            raise

    def _stand_down(self, exc: CoordinatorEpochFencedError) -> None:
        if self._status is not CoordinatorStatus.CLOSED:
            log.error(
                "transaction coordinator of epoch %d was replaced by a newer one; it stops "
                "serving: %s",
                self.coordinator_epoch,
                exc.message,
            )
        self._set_status(CoordinatorStatus.CLOSED, idempotent=True)
        self._closing.set()

    def _require(self, tid: str, producer_id: int, epoch: int) -> TransactionMetadata:
        """The id's state if (producer_id, epoch) is its current holder, else the error."""
        meta = self._meta(tid)
        if meta is None:
            raise InvalidProducerIdMappingError(
                f"{_TXN} {tid!r} is unknown to the coordinator: call init_producer_id first"
            )
        if producer_id != meta.producer_id:
            if producer_id == meta.previous_producer_id:
                raise ProducerFencedError(
                    f"{_TXN} {tid!r}: producer id {producer_id} was replaced by "
                    f"{meta.producer_id} when its epochs ran out (fenced)"
                )
            raise InvalidProducerIdMappingError(
                f"{_TXN} {tid!r} belongs to producer id {meta.producer_id}, not {producer_id}"
            )
        if epoch != meta.producer_epoch:
            relation = "older" if epoch < meta.producer_epoch else "newer"
            why = meta.fence_reason or "another producer holds this id"
            raise ProducerFencedError(
                f"{_TXN} {tid!r}: producer id {producer_id} epoch {epoch} is {relation} than "
                f"the current epoch {meta.producer_epoch}: {why}"
            )
        return meta

    def _transitioned(
        self,
        meta: TransactionMetadata,
        state: TransactionState,
        epoch: int | None = None,
        reason: str | None = None,
    ) -> TransactionMetadata:
        new = meta.copy()
        new.transition(state, self._clock())
        if epoch is not None:
            new.producer_epoch = epoch
        if reason is not None:
            new.fence_reason = reason
        return new

    def _end(
        self,
        meta: TransactionMetadata,
        commit: bool,
        epoch: int | None = None,
        reason: str | None = None,
    ) -> TransactionMetadata:
        """ONGOING -> PREPARE_x (durable, optionally at a bumped epoch) -> markers -> COMPLETE_x."""
        prepare = _S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT
        return self._complete(self._persist(self._transitioned(meta, prepare, epoch, reason)))

    def _complete(self, meta: TransactionMetadata) -> TransactionMetadata:
        """PREPARE_x -> markers -> COMPLETE_x; on failure it stays PREPARE_x and raises."""
        commit = meta.state is _S.PREPARE_COMMIT
        self._send_markers(meta, commit)
        done = self._persist(
            self._transitioned(meta, _S.COMPLETE_COMMIT if commit else _S.COMPLETE_ABORT)
        )
        self._count("transactions_committed" if commit else "transactions_aborted")
        return done

    def _send_markers(self, meta: TransactionMetadata, commit: bool) -> None:
        partitions = meta.sorted_partitions()
        if not partitions:
            return
        deadline = time.monotonic() + self._marker_retry_deadline_s
        delay = self._marker_retry_backoff_s
        attempt = 1
        while True:
            try:
                lsos = self._markers.write_markers(
                    meta.producer_id,
                    meta.producer_epoch,
                    commit,
                    self.coordinator_epoch,
                    partitions,
                )
                # The LSO each partition reports after its marker: batches wholly below
                # it no longer need tracking for the readers' cut.
                self._settled_by(lsos)
                return
            except TransactionCoordinatorFencedError as exc:
                # A partition has seen a newer coordinator's marker: same as a newer
                # coordinator's state in the store (and the same error for the client).
                fenced = CoordinatorEpochFencedError(
                    f"{_TXN} {meta.transactional_id!r}: the partitions refused the markers of "
                    f"coordinator epoch {self.coordinator_epoch}: the transaction was changed "
                    f"by another coordinator of a newer epoch; this coordinator was replaced "
                    f"(fenced) ({exc.message})"
                )
                self._stand_down(fenced)
                raise fenced from exc
            except IdemlogError as exc:
                remaining = deadline - time.monotonic()
                if not exc.retriable or remaining <= 0 or self._closing.is_set():
                    log.error(
                        "%s markers for %s %r (producer id %d epoch %d) failed after %d "
                        "attempts; it stays %s until retried: %s",
                        "COMMIT" if commit else "ABORT",
                        _TXN,
                        meta.transactional_id,
                        meta.producer_id,
                        meta.producer_epoch,
                        attempt,
                        meta.state.name,
                        exc,
                    )
                    raise
                wait = min(delay, remaining)
                log.warning(
                    "markers for %s %r failed (%s), retrying in %.2fs (attempt %d)",
                    _TXN,
                    meta.transactional_id,
                    exc,
                    wait,
                    attempt,
                )
                self._count("marker_retries")
                if self._closing.wait(wait):
                    raise
                delay = min(delay * 2, _MAX_MARKER_BACKOFF_S)
                attempt += 1

    def _pending_sink_holding(self, meta: TransactionMetadata) -> SinkCommitRecord | None:
        """The pending sink record that names this transaction, if any: it must commit."""
        key = (meta.transactional_id, meta.producer_id, meta.producer_epoch)
        with self._lock:
            for record in self._sinks.values():
                if record.is_pending and key in record.transactions:
                    return record
        return None

    def _settle(self, claims: Claims, tid: str) -> TransactionMetadata | None:
        """Finish what earlier requests left half done for ``tid``, and return its state."""
        meta = self._meta(tid)
        if meta is None:
            return None
        record = self._pending_sink_holding(meta)
        if record is not None:
            self._finish_sink(claims, record)
            meta = self._meta(tid) or meta  # ids are never removed: always found
        if meta.state.is_prepare:
            meta = self._complete(meta)
        return meta

    def _settled(self, claims: Claims, tid: str) -> TransactionMetadata:
        """:meth:`_settle` for an id the caller knows exists (checked by :meth:`_require`)."""
        meta = self._settle(claims, tid)
        if meta is None:
            raise InvalidProducerIdMappingError(f"{_TXN} {tid!r} is unknown to the coordinator")
        return meta

    def _finish_sink(self, claims: Claims, record: SinkCommitRecord) -> None:
        """Commit every transaction of a PREPARE sink record, then mark it COMPLETE."""
        claims.sink(record.sink_id)
        current = self._sink_record(record.sink_id)
        if current is None or not current.is_pending or current.batch_id != record.batch_id:
            return  # finished (and maybe succeeded) by a request that held it meanwhile
        record = current
        for tid, _, _ in record.transactions:
            claims.txn(tid)
        # Every transaction is checked before any is committed: a broken one leaves the
        # whole batch uncommitted (and the record PREPARE), never part of it.
        metas = [self._decided_member(record, *txn) for txn in record.transactions]
        for meta in metas:
            if meta.state is _S.ONGOING:
                self._end(meta, commit=True)
            elif meta.state is _S.PREPARE_COMMIT:
                self._complete(meta)
        self._persist_sink(
            SinkCommitRecord(
                record.sink_id,
                record.batch_id,
                SinkCommitState.COMPLETE,
                record.transactions,
                self._unsettled_of(record.sink_id),
            )
        )

    def _decided_member(
        self, record: SinkCommitRecord, tid: str, pid: int, epoch: int
    ) -> TransactionMetadata:
        """A transaction of a decided sink commit, still where the decision left it."""
        meta = self._meta(tid)
        found = "unknown" if meta is None else None
        if meta is not None and (meta.producer_id, meta.producer_epoch) != (pid, epoch):
            found = f"at producer id {meta.producer_id} epoch {meta.producer_epoch}"
        elif meta is not None and meta.state not in (
            _S.ONGOING,
            _S.PREPARE_COMMIT,
            _S.COMPLETE_COMMIT,
            _S.EMPTY,
        ):
            found = meta.state.name
        if meta is None or found is not None:
            # Cannot happen while the invariant holds (a transaction named in a decided
            # commit is never fenced): completing the record anyway would report rows
            # committed that are not, so the sink stops here, loudly.
            raise InvalidTxnStateError(
                f"sink {record.sink_id!r} batch {record.batch_id}: the commit is decided "
                f"but {_TXN} {tid!r} (producer id {pid} epoch {epoch}) is now {found}; "
                "the commit cannot be completed and none of the batch's rows is committed. "
                "This is a bug: keep the broker's logs and data directory"
            )
        return meta

    def _abort_if_open(self, claims: Claims, tid: str, producer_id: int, epoch: int) -> None:
        """Abort the transaction if it is still open at exactly (producer_id, epoch)."""
        meta = self._meta(tid)
        if meta is None or (meta.producer_id, meta.producer_epoch) != (producer_id, epoch):
            return  # unknown, or a newer holder fenced it (and aborted what was open)
        meta = self._settle(claims, tid)
        if meta is not None and meta.state is _S.ONGOING:
            self._end(meta, commit=False)

    def _recover_sink(self, record: SinkCommitRecord) -> None:
        """Finish a pending sink commit; on failure it stays pending for a later call."""
        try:
            with self._claims() as claims:
                self._finish_sink(claims, record)
        except ConcurrentTransactionsError:
            pass  # another request holds it, and finishes it
        except IdemlogError as exc:
            log.error("could not finish the commit of sink %r yet: %s", record.sink_id, exc)

    def _recover_txn(self, transactional_id: str) -> None:
        """Finish a PREPARE_x transaction; on failure it stays so for a later call."""
        try:
            with self._claims() as claims:
                claims.txn(transactional_id)
                self._settle(claims, transactional_id)
        except ConcurrentTransactionsError:
            pass  # another request holds it, and finishes it
        except IdemlogError as exc:
            log.error("could not finish %s %r yet: %s", _TXN, transactional_id, exc)
