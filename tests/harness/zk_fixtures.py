"""pytest fixtures for tests against a real ZooKeeper server (see ``zookeeper.py``).

Registered for the whole suite by ``pytest_plugins`` in ``tests/conftest.py`` (do not
import them into a test module or another conftest). Tests using them get the
``zookeeper`` marker automatically.

* ``zk_server`` (session): one server for the whole test session. If the jars or Java are
  missing, or the server does not come up, every test using it errors (never skips) with
  the reason and the tail of the server log.
* ``zk_chroot`` (function): a :class:`ZooKeeperHarness` with a unique chroot
  (``.chroot``), the connection string including it (``.hosts``), and the fault injection
  helpers; the chroot is deleted recursively afterwards and a stopped server restarted.
* ``zk_client`` (function): a factory ``zk_client(**kazoo_options) -> KazooClient`` of
  started clients on that chroot, all closed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.zookeeper import ClientFactory, ZooKeeperHarness, ZooKeeperServer


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_chroot(zk_server: ZooKeeperServer) -> Iterator[ZooKeeperHarness]:
    harness = ZooKeeperHarness(zk_server)
    harness.setup()
    try:
        yield harness
    finally:
        harness.teardown()


@pytest.fixture
def zk_client(zk_chroot: ZooKeeperHarness) -> ClientFactory:
    return zk_chroot.client
