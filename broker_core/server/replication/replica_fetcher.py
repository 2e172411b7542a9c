"""A follower's copy loop for one partition: Kafka's ReplicaFetcherThread, one per partition.

Started when the broker becomes a follower of the partition at some leader epoch and
stopped when that changes (a new fetcher is started for the next epoch). Each run:

1. **Truncate first** (KIP-101/KIP-279): ask the leader where this log's latest epoch
   ended in its log (``offsets_for_leader_epoch``) and cut whatever this log holds past
   that: a tail written under a leader that was replaced, never acknowledged with
   ``acks=all``. A log without epochs (empty) has nothing to cut. Never below this log's
   high watermark to a leader at an epoch this log already holds: such a leader lost
   acknowledged batches (a process restarted on an empty disk); the fetcher refuses,
   logs it at ERROR, counts it (``truncations_refused``) and asks again after the
   backoff, fetching nothing meanwhile, so it drops out of the ISR.
2. **Fetch** from the log end, long-polling (``replica.fetch.wait.max.ms``): append the
   batches as they are (``PartitionLog.append_as_follower``: producer state, transaction
   index and epoch cache follow from them), then take the leader's high watermark,
   capped at this log's end.

Errors are retried after ``replica.fetch.backoff.ms``: a fenced or unknown epoch, a
leader that no longer leads and a topic id that is not the leader's (``UNKNOWN_TOPIC_ID``:
one side holds a deleted incarnation of the topic) wait for the metadata to catch up (the
fetcher is replaced, or the copy deleted, when it does). An offset out of range means
either that this log ends below the leader's log start (a wiped disk, or a replica away
longer than retention): the next run **resets** the log to start where the leader's
does, with the leader's producer state and leader epoch there (``replica_log_start``,
``PartitionLog.reset_to``); or that the logs diverged again: the next run truncates
first. Nothing here decides leadership.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from broker_core.client.connections import FlightConnections
from broker_core.errors import BrokerNotAvailableError, IdemlogError, OffsetOutOfRangeError
from broker_core.log.leader_epoch import UNDEFINED_EPOCH_OFFSET
from broker_core.protocol.replica import (
    NO_BROKER_EPOCH,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicaLogStartRequest,
    ReplicaLogStartResponse,
)
from broker_core.protocol.wire import Action, decode_json, encode_json
from broker_core.record.batch import NO_LEADER_EPOCH
from broker_core.server.replication.partition import Partition

log = logging.getLogger("idemlog.replica")

FETCH_TIMEOUT_MARGIN_S = 10.0  # on top of the long poll, for the answer itself
READERS_WAIT_S = 10.0  # for open fetch streams before a truncation below the watermark


class TruncationRefusedError(Exception):
    """The leader at an epoch this log holds ends below this log's high watermark."""


@dataclass(frozen=True)
class FetcherConfig:
    """The ``replica.fetch.*`` keys, in the units the fetcher uses."""

    max_bytes: int
    max_wait_ms: int
    backoff_s: float


class ReplicaFetcher:
    """Copies ``partition`` from broker ``leader_id`` (at ``address()``, read at each call
    so a leader back on a new port is found) at ``leader_epoch``, as broker ``broker_id``.

    ``connections`` is shared with the broker's other fetchers (one channel per leader).
    """

    def __init__(
        self,
        partition: Partition,
        *,
        broker_id: int,
        leader_id: int,
        leader_epoch: int,
        broker_epoch: Callable[[], int] = lambda: NO_BROKER_EPOCH,
        address: Callable[[], str | None],
        connections: FlightConnections,
        config: FetcherConfig,
    ) -> None:
        self.partition = partition
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self._broker_epoch = broker_epoch  # this process's, sent with every request
        self._address = address
        self._connections = connections
        self._config = config
        self._stop = threading.Event()
        # Held while the log is changed (truncated, appended to): stop() waits for it.
        self._applying = threading.Lock()
        self._truncated = False
        self._out_of_range = False  # the last fetch was refused: below the leader's start?
        self.resets = 0  # resets to the leader's log start (tests and logs)
        self.truncations_refused = 0  # below the high watermark at a known epoch (metrics)
        self.fetches = 0  # answered fetches (tests and metrics)
        self.appended_batches_bytes = 0
        self._thread = threading.Thread(
            target=self._run,
            name=f"idemlog-fetcher-{partition.name}",
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop: once this returns the fetcher changes the log no more.

        It waits for a truncation or an append in progress, never for a call on the wire:
        a leader cut off answers no call until its timeout, and the role change waiting
        for this must not wait that long. The thread ends when its call does.
        """
        self._stop.set()
        with self._applying:
            pass

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        name = self.partition.name
        while not self._stop.is_set():
            try:
                if self._out_of_range:
                    self._reset_if_below_start()
                    self._out_of_range = False
                if not self._truncated:
                    self._truncate()
                    self._truncated = True
                self._fetch_once()
            except OffsetOutOfRangeError as exc:
                log.warning(
                    "%s: fetch from broker %d: %s; checking its log start, truncating again",
                    name,
                    self.leader_id,
                    exc,
                )
                self._truncated = False
                self._out_of_range = True
                self._stop.wait(self._config.backoff_s)
            except TruncationRefusedError as exc:
                log.error("%s", exc)
                self._stop.wait(self._config.backoff_s)
            except IdemlogError as exc:
                level = logging.DEBUG if exc.retriable else logging.WARNING
                log.log(level, "%s: fetch from broker %d failed: %s", name, self.leader_id, exc)
                self._stop.wait(self._config.backoff_s)
            except Exception:
                # A bug, not a fault of the leader: logged with its traceback, and the
                # loop goes on after the backoff rather than leaving the replica behind.
                log.exception("%s: the replica fetcher failed unexpectedly", name)
                self._stop.wait(self._config.backoff_s)

    @property
    def _topic_id(self) -> str | None:
        """The id of the topic this log is a copy of, sent with every request: a leader
        holding another incarnation of the topic refuses it (UNKNOWN_TOPIC_ID), so no
        copy crosses a delete and create. None for a copy from before ids."""
        return self.partition.topic_id or None

    def _call(self, action: Action, body: bytes, timeout_s: float) -> bytes:
        address = self._address()
        if address is None:
            raise BrokerNotAvailableError(
                f"leader broker {self.leader_id} of {self.partition.name} is not live"
            )
        return self._connections.action(
            address, action.value, body, timeout_s, f"{action.value} of {self.partition.name}"
        )

    def _truncate(self) -> None:
        """Cut this log's tail that the leader does not have (KIP-279)."""
        partition, log_ = self.partition, self.partition.log
        latest = log_.epochs.latest_epoch
        if latest == NO_LEADER_EPOCH or log_.log_end_offset == log_.log_start_offset:
            return
        request = OffsetsForLeaderEpochRequest(
            partition.topic,
            partition.partition,
            self.leader_epoch,
            latest,
            topic_id=self._topic_id,
            replica_id=self.broker_id,
            broker_epoch=self._broker_epoch(),
        )
        answer = OffsetsForLeaderEpochResponse.from_doc(
            decode_json(
                self._call(
                    Action.OFFSETS_FOR_LEADER_EPOCH,
                    encode_json(request.to_doc()),
                    FETCH_TIMEOUT_MARGIN_S,
                ),
                "offsets_for_leader_epoch answer",
            )
        )
        epoch, end = answer.epoch, answer.end_offset
        if end == UNDEFINED_EPOCH_OFFSET:
            # The leader cannot place our epoch (its log starts later, or is older than
            # epochs): keep what the high watermark covers, which every ISR member has.
            target = log_.high_watermark
        elif epoch != latest:
            # The leader never had our latest epoch: its largest one at or below it ends
            # at ``end``; our copy of that epoch may end earlier.
            ours = log_.end_offset_for(epoch)
            target = min(end, ours.end_offset if ours.end_offset >= 0 else end)
        else:
            target = end
        if target < log_.high_watermark and self.leader_epoch <= latest:
            # A leader at an epoch this log already holds claims less than this log's high
            # watermark, which every in-sync replica had: that leader lost acknowledged
            # batches (an empty disk at the same epoch). Only an unclean election, which
            # bumps the epoch, may cut below it.
            self.truncations_refused += 1
            raise TruncationRefusedError(
                f"{partition.name}: refused to truncate from {log_.log_end_offset} to "
                f"{target}, below the high watermark {log_.high_watermark}, to follow broker "
                f"{self.leader_id} at leader epoch {self.leader_epoch} (this log's latest "
                f"epoch {latest}): the leader lacks acknowledged batches; retrying, out of "
                "the ISR meanwhile"
            )
        if target < log_.high_watermark and not partition.wait_for_readers(READERS_WAIT_S):
            # Only after an unclean election: rows below the high watermark were served.
            log.warning(
                "%s: truncating below the high watermark with fetch streams still open",
                partition.name,
            )
        with self._applying:
            if self._stop.is_set() or target >= log_.log_end_offset:
                return  # replaced meanwhile (a newer fetcher truncates), or nothing to cut
            before = log_.log_end_offset
            new_end = log_.truncate_to(max(target, log_.log_start_offset))
            log.warning(
                "%s: truncated from %d to %d to follow broker %d at leader epoch %d "
                "(our epoch %d ends at %d in its log)",
                partition.name,
                before,
                new_end,
                self.leader_id,
                self.leader_epoch,
                latest,
                end,
            )

    def _reset_if_below_start(self) -> None:
        """If this log ends below the leader's log start, start it again where the leader
        says, with the leader's producer state there (``PartitionLog.reset_to``: durable,
        crash-safe). Nothing to do otherwise: the logs diverged, truncation handles it."""
        partition, log_ = self.partition, self.partition.log
        request = ReplicaLogStartRequest(
            partition.topic,
            partition.partition,
            self.broker_id,
            self.leader_epoch,
            topic_id=self._topic_id,
            broker_epoch=self._broker_epoch(),
        )
        answer = ReplicaLogStartResponse.decode(
            self._call(
                Action.REPLICA_LOG_START, encode_json(request.to_doc()), FETCH_TIMEOUT_MARGIN_S
            )
        )
        with self._applying:
            before = (log_.log_start_offset, log_.log_end_offset)
            if self._stop.is_set() or before[1] >= answer.log_start_offset:
                return  # replaced meanwhile, or not below the leader's start
            log_.reset_to(answer.offset, answer.epoch, answer.snapshot)
            self.resets += 1
        log.warning(
            "%s: log [%d, %d) ends below broker %d's log start %d: reset to start at %d with "
            "its producer state there (%d producers, leader epoch %d)",
            partition.name,
            before[0],
            before[1],
            self.leader_id,
            answer.log_start_offset,
            answer.offset,
            len(log_.state),
            answer.epoch,
        )

    def _fetch_once(self) -> None:
        partition, log_ = self.partition, self.partition.log
        config = self._config
        request = ReplicaFetchRequest(
            partition.topic,
            partition.partition,
            self.broker_id,
            log_.log_end_offset,
            self.leader_epoch,
            config.max_bytes,
            config.max_wait_ms,
            topic_id=self._topic_id,
            broker_epoch=self._broker_epoch(),
        )
        timeout_s = config.max_wait_ms / 1000.0 + FETCH_TIMEOUT_MARGIN_S
        answer = ReplicaFetchResponse.decode(
            self._call(Action.REPLICA_FETCH, encode_json(request.to_doc()), timeout_s)
        )
        with self._applying:
            if self._stop.is_set():
                return  # replaced meanwhile: the log is another fetcher's or a leader's
            if answer.records:
                log_.append_as_follower(answer.records)
                self.appended_batches_bytes += len(answer.records)
            hw = min(answer.high_watermark, log_.log_end_offset)
            if hw >= log_.log_start_offset:
                log_.update_high_watermark(hw)
        self.fetches += 1
