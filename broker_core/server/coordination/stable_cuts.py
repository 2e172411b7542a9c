"""The stable cut a Kafka consumer reads to with read_committed, kept a moment per topic.

A Kafka client's read_committed stops at each partition's last stable offset; idemlog's
own readers stop lower, at the cut across coordinators that holds every sink batch whole
or not at all (``protocol.stable_cut``, docs/design.md "Several coordinators"). The
Kafka listener gives Kafka clients the same cut: ListOffsets (latest, read_committed)
answers it and Fetch (read_committed) returns no batch reaching it.

A cut asks every coordinator twice and reads every partition's last stable offset, so
one cut per topic is kept ``refresh_s`` and shared by the requests in that time. A cut
stays true once computed: rows written after it land above every offset read for it,
so a kept cut never shows part of a batch; it only holds rows back up to ``refresh_s``
longer. When a new cut cannot be had (a coordinator down), the last one serves and the
failure is logged; with none yet, :meth:`StableCuts.ends` raises what the computation
raised (retriable).

Identity: cuts are kept per topic id, so a topic deleted and created again under its
name never reads at the old topic's cut.

Bound: one cut per topic read with read_committed in the last ``expire_s``; the older
ones are dropped at the next call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from broker_core.errors import IdemlogError

log = logging.getLogger("idemlog.kafka")

CUT_REFRESH_S = 0.1
CUT_EXPIRE_S = 300.0
WARN_INTERVAL_S = 10.0


@dataclass
class _Kept:
    topic_id: str | None
    used: float
    ends: dict[int, int] | None = None
    at: float = 0.0
    warned_at: float = -WARN_INTERVAL_S
    lock: threading.Lock = field(default_factory=threading.Lock)


class StableCuts:
    """Topics' stable cuts from ``compute(topic)`` ({partition: end}, e.g.
    ``BrokerClient.stable_ends``), each kept ``refresh_s`` and forgotten after
    ``expire_s`` unused."""

    def __init__(
        self,
        compute: Callable[[str], Mapping[int, int]],
        *,
        refresh_s: float = CUT_REFRESH_S,
        expire_s: float = CUT_EXPIRE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._compute = compute
        self.refresh_s = refresh_s
        self._expire_s = expire_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, _Kept] = {}

    def ends(self, topic: str, topic_id: str | None) -> Mapping[int, int]:
        """Where a read_committed reader of ``topic`` (the one whose id is ``topic_id``)
        stops, per partition: a cut at most ``refresh_s`` old, computed now if the kept
        one is older (one computation per topic at a time; the others wait for it), or
        the last one if that fails. Raises what ``compute`` raises when no cut of this
        topic was had yet."""
        now = self._clock()
        with self._lock:
            for name in [n for n, k in self._kept.items() if now - k.used > self._expire_s]:
                del self._kept[name]
            kept = self._kept.get(topic)
            if kept is None or kept.topic_id != topic_id:
                kept = self._kept[topic] = _Kept(topic_id, now)
            kept.used = now
        with kept.lock:
            if kept.ends is not None and now - kept.at < self.refresh_s:
                return kept.ends
            started = self._clock()
            try:
                ends = dict(self._compute(topic))
            except IdemlogError as exc:
                if kept.ends is None:
                    raise
                if started - kept.warned_at >= WARN_INTERVAL_S:
                    kept.warned_at = started
                    log.warning(
                        "kafka: read_committed readers of %r stay at the cut of %.1f s ago: %s",
                        topic,
                        started - kept.at,
                        exc,
                    )
                return kept.ends
            kept.ends, kept.at = ends, started
            return ends

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)
