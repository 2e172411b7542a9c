"""Registers the real-ZooKeeper fixtures for everything under tests/zk."""

from tests.harness.zk_fixtures import zk_chroot, zk_client, zk_server

__all__ = ["zk_chroot", "zk_client", "zk_server"]
