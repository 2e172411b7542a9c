"""The stack the cluster scenarios share (``tests/cluster/stack.py``), one per module:
JVMs take a while to start on two cores.

Each test writes its own topics with its own input and checkpoint, and heals every link
it cut (in ``finally``), so the next test finds the stack whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.stack import Stack, running_stack
from tests.spark.helpers import DriverLauncher


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("cluster")) as built:
        yield built


@pytest.fixture(autouse=True)
def stack_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test on the stack: every process's log tail on its report (pytest shows it
    on failure)."""
    yield
    if "stack" not in request.fixturenames:
        return
    stack: Stack = request.getfixturevalue("stack")
    request.node.add_report_section("teardown", "cluster logs", stack.bed.logs())
    for broker in stack.brokers.brokers:
        request.node.add_report_section("teardown", broker.name, broker.log_tail(40))


@pytest.fixture
def drivers(tmp_path: Path, stack: Stack) -> Iterator[DriverLauncher]:
    launcher = DriverLauncher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()
