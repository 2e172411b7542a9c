"""What counts as "ZooKeeper cannot be reached right now", decided once.

These kazoo errors mean the request may or may not have been applied and that retrying
after the client reconnects is the right move; every other KazooException is an answer
(a conflict, a missing node, an authorisation failure) and is handled by the caller.
"""

from __future__ import annotations

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)

ZK_UNAVAILABLE: tuple[type[Exception], ...] = (
    ConnectionLoss,
    SessionExpiredError,
    ConnectionClosedError,
    OperationTimeoutError,
)
