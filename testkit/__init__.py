"""What the tests and the benchmarks both stand up, never shipped: a real ZooKeeper server
(:mod:`testkit.zookeeper`), TLS certificates (:mod:`testkit.tls`), and the Spark sink's
failpoints (:mod:`testkit.spark_failpoints`, the hooks the fault tests' and the demo's
writes name). The tests' fixtures around them are in ``tests/harness``; nothing here
imports the tests."""
