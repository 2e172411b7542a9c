"""The producer tokens a client was issued (``security.producer_token``), by producer id.

An idempotent InitProducerId answers a token binding the new producer id to the caller's
principal; every non-transactional batch of that id must carry it. The client keeps the
tokens it was given so that its produce streams attach them without their callers
threading them through. Bounded: the :data:`MAX_TOKENS` most recently issued are kept
(a producer re-initialises rarely: once per epoch bump); a batch of an id whose token
was dropped goes without one and is refused (INVALID_PRODUCER_ID_MAPPING), after which
``broker_core.producer`` initialises a new id.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_TOKENS = 1024


class ProducerTokenBook:
    """Thread-safe; shared by a client's calls and its produce streams."""

    def __init__(self, max_tokens: int = MAX_TOKENS) -> None:
        self._max = max_tokens
        self._lock = threading.Lock()
        self._tokens: OrderedDict[int, bytes] = OrderedDict()

    def remember(self, producer_id: int, token: bytes) -> None:
        with self._lock:
            self._tokens[producer_id] = token
            self._tokens.move_to_end(producer_id)
            while len(self._tokens) > self._max:
                self._tokens.popitem(last=False)

    def token_for(self, producer_id: int) -> bytes:
        """The token issued for ``producer_id`` to this client; empty if none is kept."""
        with self._lock:
            return self._tokens.get(producer_id, b"")
