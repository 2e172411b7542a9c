"""What the tests and the benchmarks both stand up, never shipped: a real ZooKeeper server
(:mod:`testkit.zookeeper`), TLS certificates (:mod:`testkit.tls`), the broker's failpoints
(:mod:`testkit.broker_failpoints`, the hooks a broker started for the fault tests loads),
the Spark sink's failpoints (:mod:`testkit.spark_failpoints`, the hooks the fault tests'
and the demo's writes name), and an unfenced coordinator state store over a local log
(:mod:`testkit.state_store`). The tests' fixtures around them are in ``tests/harness``;
nothing here imports the tests."""
