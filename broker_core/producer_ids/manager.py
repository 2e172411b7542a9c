"""Hands out single producer ids from leased blocks (docs/design.md §5).

:class:`ProducerIdManager` serves ids from the current block and fetches the next block in
the background once 90% of the current one is used; the blocks come from a
:class:`~broker_core.producer_ids.block.ProducerIdBlockSource` (ZooKeeper or the embedded file).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from broker_core.producer_ids.block import (
    LATEST_PRODUCER_ID_BLOCK_PATH,
    MAX_PRODUCER_ID,
    PRODUCER_ID_BLOCK_SIZE,
    CorruptProducerIdBlockRecordError,
    ProducerIdBlock,
    ProducerIdBlockSource,
    check_broker_id,
    next_block_after,
)
from broker_core.producer_ids.file_source import FileProducerIdBlockSource
from broker_core.producer_ids.zk_source import ZkProducerIdBlockSource

__all__ = [
    "LATEST_PRODUCER_ID_BLOCK_PATH",
    "MAX_PRODUCER_ID",
    "PRODUCER_ID_BLOCK_SIZE",
    "CorruptProducerIdBlockRecordError",
    "FileProducerIdBlockSource",
    "ProducerIdBlock",
    "ProducerIdBlockSource",
    "ProducerIdManager",
    "ZkProducerIdBlockSource",
    "next_block_after",
]

log = logging.getLogger("idemlog.pid")


@dataclass(slots=True)
class _Fetch:
    future: Future[ProducerIdBlock]
    prefetch: bool


class ProducerIdManager:
    """Hands out unique producer ids for one broker from leased blocks.

    Once ``prefetch_threshold`` of the current block is used, the next block is leased in a
    background thread, so a slow or unavailable source does not stall allocation while ids
    remain. A failed prefetch is logged and retried ``prefetch_retry_s`` later at the
    earliest; it changes nothing else: once the block runs out, the caller leases a block
    itself and gets the error if that fails too. Thread-safe; at most one lease in flight.
    """

    def __init__(
        self,
        broker_id: int,
        source: ProducerIdBlockSource,
        *,
        prefetch_threshold: float = 0.9,
        prefetch_retry_s: float = 1.0,
    ) -> None:
        check_broker_id(broker_id)
        if not 0.0 < prefetch_threshold <= 1.0:
            raise ValueError("prefetch_threshold must be in (0, 1]")
        self._broker_id = broker_id
        self._source = source
        self._prefetch_threshold = prefetch_threshold
        self._prefetch_retry_s = prefetch_retry_s
        self._lock = threading.Lock()
        self._current: ProducerIdBlock | None = None
        self._next_id = 0
        self._prefetch_at = 0
        self._ready: ProducerIdBlock | None = None
        self._fetch: _Fetch | None = None
        self._no_prefetch_before = 0.0

    @property
    def broker_id(self) -> int:
        return self._broker_id

    @property
    def current_block(self) -> ProducerIdBlock | None:
        with self._lock:
            return self._current

    def generate_producer_id(self) -> int:
        """A producer id nobody else has or will get; blocks only when a block must be leased.

        Raises what the source raises when no block can be leased, e.g. the retriable
        :class:`ProducerIdAllocationError` or the non-retriable
        :class:`ProducerIdSpaceExhaustedError`.
        """
        retried_failed_prefetch = False
        while True:
            with self._lock:
                current = self._current
                if current is not None and self._next_id <= current.end:
                    producer_id = self._next_id
                    self._next_id += 1
                    if producer_id >= self._prefetch_at:
                        self._maybe_prefetch_locked()
                    return producer_id
                if self._ready is not None:
                    self._install_locked(self._ready)
                    self._ready = None
                    continue
                fetch = self._fetch or self._start_fetch_locked(prefetch=False)
            try:
                fetch.future.result()
            except Exception:
                # A prefetch's deadline started counting when it was launched, possibly long
                # before this caller arrived, so the caller gets one lease attempt of its own.
                if fetch.prefetch and not retried_failed_prefetch:
                    retried_failed_prefetch = True
                    continue
                raise

    def _install_locked(self, block: ProducerIdBlock) -> None:
        self._current = block
        self._next_id = block.start
        # The id whose issue makes `threshold` of the block used.
        used_ids = max(1, math.ceil(block.size * self._prefetch_threshold))
        self._prefetch_at = block.start + used_ids - 1
        log.info(
            "broker %d allocates producer ids from block %d..%d",
            self._broker_id,
            block.start,
            block.end,
        )

    def _maybe_prefetch_locked(self) -> None:
        if self._fetch is not None or self._ready is not None:
            return
        if time.monotonic() < self._no_prefetch_before:
            return
        self._start_fetch_locked(prefetch=True)

    def _start_fetch_locked(self, *, prefetch: bool) -> _Fetch:
        fetch = _Fetch(Future(), prefetch=prefetch)
        self._fetch = fetch
        threading.Thread(
            target=self._run_fetch,
            args=(fetch,),
            name=f"idemlog-pid-lease-broker-{self._broker_id}",
            daemon=True,
        ).start()
        return fetch

    def _run_fetch(self, fetch: _Fetch) -> None:
        try:
            block = self._source.next_block(self._broker_id)
        except BaseException as exc:
            with self._lock:
                self._fetch = None
                if fetch.prefetch:
                    self._no_prefetch_before = time.monotonic() + self._prefetch_retry_s
            if fetch.prefetch:
                log.warning(
                    "prefetch of the next producer id block for broker %d failed; ids left "
                    "in the current block are still handed out: %s",
                    self._broker_id,
                    exc,
                )
            fetch.future.set_exception(exc)
            return
        with self._lock:
            # Published before the future resolves, so a woken waiter finds it.
            self._ready = block
            self._fetch = None
            self._no_prefetch_before = 0.0  # the source works again: no reason to hold back
        fetch.future.set_result(block)
