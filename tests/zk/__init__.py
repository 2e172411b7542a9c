"""Tests against a real ZooKeeper server (tests/harness/zookeeper.py)."""
