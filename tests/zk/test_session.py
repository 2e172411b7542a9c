"""The one ZooKeeper session helper (broker_core.zookeeper.ZkSession) on a real server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kazoo.exceptions import NodeExistsError

from broker_core.errors import RequestTimedOutError
from broker_core.zookeeper import ZkSession, ZkUnavailable
from testkit.zookeeper import ZooKeeperHarness


def test_nothing_is_sent_into_a_client_that_is_not_connected(zk_chroot: ZooKeeperHarness) -> None:
    session = ZkSession(zk_chroot.client(start=False), request_timeout_s=1.0)
    sent: list[str] = []

    with pytest.raises(ZkUnavailable, match="client not connected yet"):
        session.call(lambda: sent.append("request"))
    assert sent == []
    session.close()


def test_requests_answer_and_kazoo_errors_other_than_unavailable_pass_through(
    zk_chroot: ZooKeeperHarness,
) -> None:
    client = zk_chroot.client()
    session = ZkSession(client, request_timeout_s=5.0)
    session.call(lambda: client.create_async("/node", b"v"))
    data, _ = session.call(lambda: client.get_async("/node"))
    assert data == b"v"
    with pytest.raises(NodeExistsError):  # an answer, not "unavailable"
        session.call(lambda: client.create_async("/node", b"w"))
    session.close()


def test_retrying_gives_up_at_the_deadline_with_the_callers_error(
    zk_chroot: ZooKeeperHarness,
) -> None:
    client = zk_chroot.client()
    session = ZkSession(client, request_timeout_s=0.5)
    zk_chroot.stop_server()
    retries: list[int] = []

    def give_up(exc: ZkUnavailable, attempts: int) -> RequestTimedOutError:
        return RequestTimedOutError(f"gave up after {attempts} attempts: {exc}")

    began = time.monotonic()
    with pytest.raises(RequestTimedOutError) as excinfo:
        session.retrying(
            lambda deadline: session.call(lambda: client.get_async("/"), deadline=deadline),
            deadline=began + 1.0,
            give_up=give_up,
            backoff_s=0.05,
            max_backoff_s=0.2,
            on_retry=lambda exc, attempts, delay: retries.append(attempts),
        )
    elapsed = time.monotonic() - began

    assert 0.9 <= elapsed < 5.0
    assert excinfo.value.retriable is True
    assert isinstance(excinfo.value.__cause__, ZkUnavailable)
    assert len(retries) >= 2 and retries == list(range(1, len(retries) + 1))
    assert f"gave up after {len(retries) + 1} attempts" in str(excinfo.value)
    zk_chroot.start_server()
    session.close()


def test_a_retry_wait_ends_when_a_new_connection_comes_up(zk_chroot: ZooKeeperHarness) -> None:
    client = zk_chroot.client()
    session = ZkSession(client, request_timeout_s=1.0)
    client.create("/here", b"back")
    zk_chroot.stop_server()
    waiting = threading.Event()
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def read() -> None:
        try:
            outcome["value"] = session.retrying(
                lambda deadline: session.call(lambda: client.get_async("/here"), deadline=deadline),
                deadline=time.monotonic() + 60.0,
                give_up=lambda exc, attempts: RequestTimedOutError(str(exc)),
                # The first wait alone is at least 16 s (20 s -20% jitter): only a new
                # connection can end it sooner.
                backoff_s=20.0,
                max_backoff_s=20.0,
                on_retry=lambda *_: waiting.set(),
            )[0]
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=read, daemon=True).start()
    assert waiting.wait(10.0), "the read never failed while ZooKeeper was down"
    zk_chroot.start_server()

    assert done.wait(15.0), "the retry wait did not end when the client reconnected"
    assert outcome == {"value": b"back"}
    session.close()
