"""Tests against a real ZooKeeper server (testkit/zookeeper.py)."""
