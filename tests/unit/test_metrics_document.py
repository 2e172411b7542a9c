"""The metrics document's bounds (broker_core.server.observability.metrics, protocol.metrics):
its size does not grow with the producers, the top producers are the exact ranking even after
expiries, and the paged detail returns every producer exactly once, by id, while
producers come and go between pages."""

from __future__ import annotations

import json
import random

import pytest

from broker_core.errors import InvalidRequestError
from broker_core.protocol.metrics import (
    MAX_PAGE_SIZE,
    MAX_TOP,
    AppendOutcome,
    MetricsRequest,
    PartitionGauges,
    ProducerPage,
    duplicates_of,
    merge_documents,
    top_producers,
)
from broker_core.server.observability.metrics import Metrics


def _metrics_with(producers: int, duplicated: int = 20) -> Metrics:
    """``producers`` idempotent producers with one batch each on 4 partitions; the first
    ``duplicated`` answered a duplicate too."""
    metrics = Metrics()
    for pid in range(producers):
        metrics.record_append("t", pid % 4, pid, AppendOutcome.APPENDED, 10, 1000)
    for pid in range(duplicated):
        for _ in range(1 + pid % 3):
            metrics.record_append("t", pid % 4, pid, AppendOutcome.DUPLICATE)
    return metrics


def _gauges(producers: int) -> dict[tuple[str, int], PartitionGauges]:
    return {("t", p): PartitionGauges(0, producers, producers, producers // 4, 0) for p in range(4)}


def test_the_default_documents_size_does_not_grow_with_producers() -> None:
    small = _metrics_with(30).document(0, _gauges(30), None)
    large = _metrics_with(100_000).document(0, _gauges(100_000), None)
    assert large["producers_tracked"] == 100_000 and len(large["producers"]) == 10
    # The same shape, only wider numbers: a few bytes per figure, never per producer.
    assert len(json.dumps(large)) <= len(json.dumps(small)) + 200
    most = _metrics_with(100_000, duplicated=300).document(0, _gauges(1), None, top=MAX_TOP)
    assert len(most["producers"]) == MAX_TOP


def test_the_top_producers_are_the_exact_ranking_after_expiries() -> None:
    rng = random.Random(26)
    metrics = Metrics()
    dups: dict[int, int] = {}
    for step in range(20_000):
        pid = rng.randrange(400)
        if rng.random() < 0.3:
            metrics.record_append("t", 0, pid, AppendOutcome.DUPLICATE_BEYOND_WINDOW)
            dups[pid] = dups.get(pid, 0) + 1
        else:
            metrics.record_append("t", 0, pid, AppendOutcome.APPENDED, 1, 1)
            dups.setdefault(pid, 0)
        if step % 2000 == 1999:  # expire a few, among them ranked ones
            gone = rng.sample(sorted(dups), 30)
            metrics.record_expired("t", 0, gone)
            for g in gone:
                del dups[g]
            doc = metrics.document(0, {}, None, top=MAX_TOP)
            expected = sorted((p for p in dups if dups[p]), key=lambda p: (-dups[p], p))
            assert [r["producer_id"] for r in doc["producers"]] == expected[:MAX_TOP]
            assert [duplicates_of(r) for r in doc["producers"]] == [
                dups[p] for p in expected[:MAX_TOP]
            ]


def test_paging_returns_every_producer_exactly_once_while_producers_come_and_go() -> None:
    metrics = _metrics_with(2_500)
    seen: list[int] = []
    after, pages = -1, 0
    while True:
        page = metrics.producer_page(0, after, 1000)
        assert len(page.producers) <= 1000
        seen.extend(r["producer_id"] for r in page.producers)
        pages += 1
        if pages == 1:  # between pages: an old one expires, a new one appears
            metrics.record_expired("t", 0, [2_000])
            metrics.record_append("t", 0, 5_000, AppendOutcome.APPENDED, 1, 1)
        if page.next_page_token is None:
            break
        after = MetricsRequest("producers", page.next_page_token, 1000).after()
    assert pages == 3
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert set(seen) == (set(range(2_500)) - {2_000}) | {5_000}
    round_trip = ProducerPage.from_doc(json.loads(json.dumps(page.to_doc())))
    assert round_trip == page


def test_a_request_outside_its_bounds_is_refused_naming_the_field() -> None:
    cases = [
        ({"top": MAX_TOP + 1}, "'top' must be in 0..100"),
        ({"detail": "producers", "page_size": MAX_PAGE_SIZE + 1}, "'page_size' must be in 1..1000"),
        ({"detail": "producers", "page_size": 0}, "'page_size' must be in 1..1000"),
        ({"detail": "everything"}, "field 'detail' must be 'producers'"),
        ({"detail": "producers", "page_token": "x1"}, "field 'page_token' must be a token"),
        ({"page_token": "5"}, "'page_token' needs detail='producers'"),
        ({"top": "ten"}, "top"),
    ]
    for body, message in cases:
        with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(")):
            MetricsRequest.from_doc(body)
    request = MetricsRequest.from_doc({"detail": "producers", "page_token": "41", "page_size": 7})
    assert (request.after(), request.page_size) == (41, 7)
    assert MetricsRequest.from_doc(request.to_doc()) == request


def test_merged_documents_rank_the_brokers_top_producers_again() -> None:
    one = _metrics_with(50, duplicated=5).document(1, _gauges(50), None, top=3)
    two = _metrics_with(50, duplicated=5).document(2, _gauges(50), None, top=3)
    merged = merge_documents([one, two])
    assert merged["brokers"] == [1, 2] and merged["producers_tracked"] == 100
    assert merged["totals"]["duplicates_in_window"] == 2 * one["totals"]["duplicates_in_window"]
    assert merged["requests"]["produce"]["count"] == 0
    ranked = top_producers(merged["producers"], 3)
    assert merged["producers"] == ranked and duplicates_of(ranked[0]) == 2 * 3


def test_the_cli_refuses_a_top_or_page_size_outside_its_bounds_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from broker_core.cli.main import main as cli_main

    for flags, message in (
        (["--top", "101"], "argument --top: 101 is not in 0..100"),
        (["--producers", "--page-size", "0"], "argument --page-size: 0 is not in 1..1000"),
    ):
        with pytest.raises(SystemExit) as exited:
            cli_main(["metrics", "--bootstrap", "127.0.0.1:1", *flags])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
