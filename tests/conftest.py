"""Root of the test suite: the shared harness fixtures and the tier markers.

Fixtures used by more than one test package are registered here, once, through
``pytest_plugins`` (never imported into a test module or another conftest):

* ``tests.harness.zk_fixtures``: ``zk_server`` (a real ZooKeeper for the session),
  ``zk_chroot``, ``zk_client``;
* ``tests.harness.broker``: ``broker_factory``, ``broker``, ``client`` (real broker
  processes, killed at teardown);
* ``tests.harness.netns``: ``testbed`` (hosts of their own in network namespaces,
  removed at teardown);
* ``tests.harness.replicated``: ``replicated_cluster`` (three brokers on a ZooKeeper
  chroot, for the replication tests);
* ``tests.harness.tls``: ``tls_certs`` (a CA, broker and client certificates, one of
  another CA, an expired one, generated per session);
* ``tests.harness.work_units``: ``--heaviest-first``, the work units of ``make test``'s
  first phase on pytest-xdist workers and their order.

Markers (declared in pyproject.toml, ``--strict-markers``) are applied here, by where a
test lives and what it uses, so a new test cannot forget its tier:

* ``spark``: every test under ``tests/spark/``;
* ``bench``: every test under ``tests/bench/`` (the benchmark targets at a smoke size);
* ``cluster``: every test under ``tests/cluster/`` (hosts in network namespaces; root);
* ``zookeeper``: every test that uses the ``zk_server`` fixture, directly or through
  ``zk_chroot``/``zk_client``;
* ``slow``: set by hand (``@pytest.mark.slow``) on tests that take more than a few seconds.

Every Spark driver a test starts, in the pytest process or in a subprocess (jobs, tools,
``make bench-*``, the wheel smoke), gets the JVM options of ``tests.harness.jvm``
through ``SPARK_SUBMIT_OPTS``, set here before any test runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.jvm import set_submit_options

pytest_plugins = [
    "tests.harness.zk_fixtures",
    "tests.harness.broker",
    "tests.harness.netns",
    "tests.harness.replicated",
    "tests.harness.tls",
    "tests.harness.work_units",
]

SPARK_DIR = Path(__file__).parent / "spark"
BENCH_DIR = Path(__file__).parent / "bench"
CLUSTER_DIR = Path(__file__).parent / "cluster"


def pytest_configure(config: pytest.Config) -> None:
    set_submit_options(os.environ)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(SPARK_DIR):
            item.add_marker(pytest.mark.spark)
        if item.path.is_relative_to(BENCH_DIR):
            item.add_marker(pytest.mark.bench)
        if item.path.is_relative_to(CLUSTER_DIR):
            item.add_marker(pytest.mark.cluster)
        # fixturenames is the whole closure: zk_client -> zk_chroot -> zk_server counts.
        if "zk_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.zookeeper)
