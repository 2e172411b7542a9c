"""``spark_sink.reader`` across a failover, with a scripted broker client (the decision
only; the failovers themselves run against real brokers in tests/broker and tests/spark).

After an election the new leader's high watermark starts below the old leader's and
catches up as its followers fetch: the planned rows are in its log, not yet readable. A
task reading them waits instead of failing; a log that really ends before them still
fails at once, naming the offsets.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

import spark_sink.reader as reader
from broker_core.client.broker_client import FetchResponse
from broker_core.client.fetch_stream import FetchedBatches
from broker_core.errors import NetworkError, NotLeaderOrFollowerError, OffsetOutOfRangeError
from broker_core.protocol.wire import FetchBatchMeta, FetchTrailer
from spark_sink.options import Scope, parse_options
from spark_sink.reader import OffsetRangePartition, read_range

SCHEMA = pa.schema([("id", pa.int64())])


@dataclass
class ScriptedClient:
    """Answers fetches from ``script`` in turn; ``log_end`` is what list_offsets says."""

    script: list[FetchedBatches | Exception]  # an exception: the fetch's open raises it
    log_end: int
    fetches: list[int] = field(default_factory=list)

    def fetch_stream(self, topic: str, partition: int, offset: int, **_: Any) -> FetchedBatches:
        self.fetches.append(offset)
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def list_offsets(
        self, topic: str, partition: int, *, topic_id: str | None = None
    ) -> dict[str, int]:
        return {"log_start_offset": 0, "log_end_offset": self.log_end}

    def close(self) -> None:
        pass


def _empty(offset: int, hw: int) -> FetchResponse:
    return FetchResponse(SCHEMA, [], FetchTrailer(offset, hw, hw, 0))


def _rows(offset: int, n: int) -> FetchResponse:
    batch = pa.RecordBatch.from_pylist([{"id": offset + i} for i in range(n)], schema=SCHEMA)
    meta = FetchBatchMeta(offset, 1, 0, offset, False, 0)
    return FetchResponse(
        SCHEMA, [(meta, batch)], FetchTrailer(offset + n, offset + n, offset + n, 0)
    )


@dataclass
class BrokenStream:
    """A streamed fetch that delivers ``delivered`` and then breaks with ``error``."""

    delivered: FetchResponse
    error: Exception
    closed: bool = False

    @property
    def batches(self) -> Iterator[tuple[FetchBatchMeta, pa.RecordBatch]]:
        yield from self.delivered.batches
        raise self.error

    @property
    def trailer(self) -> FetchTrailer:
        raise AssertionError("a broken stream has no trailer")

    def close(self) -> None:
        self.closed = True


def _read(client: ScriptedClient, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    monkeypatch.setattr(reader, "sink_client", lambda *a, **k: client)
    monkeypatch.setattr(reader, "READABLE_WAIT_S", 0.0)
    options = parse_options({"topic": "t", "brokers": "127.0.0.1:1"}, Scope.READ)
    out = read_range(options, "t", SCHEMA, OffsetRangePartition(0, 10, 20))
    return [i for batch in out for i in batch.column(0).to_pylist()]


def test_a_new_leaders_lagging_watermark_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    script = [_rows(10, 5), _empty(15, 15), _empty(15, 15), _rows(15, 5)]
    client = ScriptedClient(script, log_end=20)
    assert _read(client, monkeypatch) == list(range(10, 20))  # every row once, in order
    assert client.fetches == [10, 15, 15, 15]  # it waited twice at 15, then read on


def test_a_log_that_ends_before_the_range_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    client = ScriptedClient([_rows(10, 5), _empty(15, 15)], log_end=15)
    with pytest.raises(OffsetOutOfRangeError, match=r"offsets \[15, 20\) were planned"):
        _read(client, monkeypatch)
    assert client.fetches == [10, 15]


def test_a_watermark_that_never_catches_up_fails_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = ScriptedClient([_empty(10, 10)] * (reader.READABLE_WAITS + 1), log_end=20)
    with pytest.raises(OffsetOutOfRangeError, match=f"after {reader.READABLE_WAITS} tries"):
        _read(client, monkeypatch)


def test_a_stream_broken_mid_fetch_is_fetched_again_from_the_first_row_not_yielded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = BrokenStream(_rows(10, 4), NetworkError("link broke"))
    client = ScriptedClient([broken, _rows(14, 6)], log_end=20)
    assert _read(client, monkeypatch) == list(range(10, 20))  # every row once, in order
    assert client.fetches == [10, 14]  # the second fetch starts after the yielded rows
    assert broken.closed


def test_a_fetch_that_keeps_failing_fails_the_task_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = iter(range(0, 1000, 10))  # each failure 10 s after the one before
    monkeypatch.setattr(reader, "_clock", lambda: float(next(ticks)))
    tries = int(reader.FETCH_FAILOVER_S // 10) + 1
    script: list[FetchedBatches | Exception] = [
        BrokenStream(_empty(10, 20), NotLeaderOrFollowerError("moved")) for _ in range(tries)
    ]
    client = ScriptedClient(script, log_end=20)
    with pytest.raises(NotLeaderOrFollowerError, match="moved"):
        _read(client, monkeypatch)
    assert client.fetches == [10] * tries  # retried while under the bound, then raised


def test_a_non_retriable_error_mid_stream_is_raised_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = ScriptedClient(
        [BrokenStream(_rows(10, 2), OffsetOutOfRangeError("gone")), _rows(12, 8)], log_end=20
    )
    with pytest.raises(OffsetOutOfRangeError, match="gone"):
        _read(client, monkeypatch)
    assert client.fetches == [10]


def test_a_fetch_whose_open_fails_during_an_election_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The stream breaks after 4 rows; the next open fails (the client's routed retries
    # ran out while no leader was elected); the one after reads on from the new leader.
    broken = BrokenStream(_rows(10, 4), NetworkError("link broke"))
    client = ScriptedClient(
        [broken, NetworkError("leader 3 of t-0 is not alive"), _rows(14, 6)], log_end=20
    )
    assert _read(client, monkeypatch) == list(range(10, 20))
    assert client.fetches == [10, 14, 14]
