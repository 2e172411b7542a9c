"""What ``make test``'s first phase hands its pytest-xdist workers, and in which order
(docs/contributing.md, Two phases); on with ``--heaviest-first`` (needs ``-n``).

xdist's scope schedulers hand out one work unit at a time, in the order of the collection,
and a worker keeps a unit to its end: a heavy unit handed out last leaves the other
worker idle, and a file of minutes-long tests on one worker is a long tail on its own.
Here a unit is a test file (so a module's fixtures are set up once), except in
:data:`SPLIT_FILES`, heavy files whose tests share no module-, class- or package-scoped
fixture (checked at collection): there each test is a unit. The workers order the
collection by unit, heaviest first by an estimate from the tier markers alone
(:data:`COST_S`), a function of the collection, so both compute the same list (xdist
checks it), and the controller keeps that order (scope reordering off).

``--dist loadgroup`` and ``xdist_group`` would say this with markers, but pytest-xdist
3.8 tags a grouped node id through ``item._nodeid``, which pytest 9.2 no longer reads:
every test became a unit of its own (pytest-dev/pytest-xdist#1386, open).
"""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

# Heavy files whose tests each take a unit of their own (none may use a shared fixture).
SPLIT_FILES = frozenset(
    {
        "tests/bench/test_bench_smoke.py",
        "tests/spark/test_faults.py",
        "tests/spark/test_broker_restart.py",
        "tests/cluster/test_broker_partition.py",
        "tests/producer/test_fault_schedules.py",
        "tests/store/test_compaction_model.py",
    }
)
SHARED_SCOPES = frozenset({"class", "module", "package"})

# Rough seconds per test by its tier marker (the largest that applies), for the order
# only: a bench target or a cluster scenario starts several processes and JVMs, a Spark
# test at least one JVM (about 10 s on two cores), a ZooKeeper test a broker or a
# session; ``slow`` adds SLOW_COST_S (the tests that take minutes carry it).
COST_S = {"bench": 90.0, "cluster": 60.0, "spark": 25.0, "zookeeper": 5.0}
SLOW_COST_S = 60.0
DEFAULT_COST_S = 0.5


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or itself in a split file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPLIT_FILES else path


def estimated_cost(item: pytest.Item) -> float:
    tier = max((COST_S[m.name] for m in item.iter_markers() if m.name in COST_S), default=0.0)
    slow = SLOW_COST_S if item.get_closest_marker("slow") else 0.0
    return max(tier + slow, DEFAULT_COST_S)


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures the test uses that are set up once for several tests."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in SHARED_SCOPES
    )


class HeaviestFirstScheduling(LoadScopeScheduling):
    """xdist's scope scheduler with :func:`unit_of` as the scope."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        # The workers' order is the plan: never xdist's re-sort by tests per unit.
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heaviest-first",
        action="store_true",
        default=False,
        help="with -n: a unit per file (per test in tests/harness/work_units.SPLIT_FILES), "
        "handed out heaviest first",
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling | None:
    if not config.getoption("heaviest_first"):
        return None
    return HeaviestFirstScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after tests/conftest.py applied the tier markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("heaviest_first"):
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        unit = unit_of(item.nodeid)
        if unit == item.nodeid and (shared := shared_fixtures(item)):
            raise pytest.UsageError(
                f"{item.nodeid} uses {shared}, set up once per module or class: its file "
                "cannot be in tests/harness/work_units.SPLIT_FILES"
            )
        units.setdefault(unit, []).append(item)
    # Stable: equal estimates keep the collection's order.
    ordered = sorted(units.values(), key=lambda u: -sum(estimated_cost(i) for i in u))
    items[:] = [item for unit in ordered for item in unit]
