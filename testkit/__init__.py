"""What the tests and the benchmarks both stand up, never shipped: a real ZooKeeper server
(:mod:`testkit.zookeeper`) and TLS certificates (:mod:`testkit.tls`). The tests' fixtures
around them are in ``tests/harness``; nothing here imports the tests."""
