"""Fixtures of the producer tests: a manual clock (unit tests of the sender) and a fault
proxy in front of the test's real broker (integration tests). The broker fixtures come from
``tests/harness/broker.py`` through ``pytest_plugins`` in ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.broker import BrokerProcess
from tests.producer.action_faults import ActionFaultProxy
from tests.producer.fakes import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def proxy(broker: BrokerProcess) -> Iterator[ActionFaultProxy]:
    """A fault proxy in front of the test's broker: faults on produce streams
    (``tests/harness/fault_proxy.py``) and on actions (``action_faults.py``)."""
    with ActionFaultProxy(broker.address) as p:
        yield p
