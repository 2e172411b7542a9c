"""The write's hooks (spark_sink/hooks.py): a task and the driver's commit call the one
object handed to them at each point of the protocol, in order, with an ``effect`` that
really does what the point names; the task's transport goes through the hooks' wrapper.
A real broker process; the task's steps are ``writer._write_task`` without Spark (as in
test_writer_init.py), so a recording hooks object is handed in directly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.producer.transport import Transport
from broker_core.protocol.wire import SinkAttempt
from spark_sink import writer
from spark_sink.commit import commit_batch
from spark_sink.hooks import Point, SinkHooks
from spark_sink.options import Scope, parse_options
from tests.harness.broker import BrokerProcess

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32())])
ROWS = 30_000


class _Counting:
    """A transport proxy counting the produce requests sent through it."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sends = 0

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self.sends += 1
        return self.inner.send(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Recording(SinkHooks):
    def __init__(self, client: BrokerClient, topic: str) -> None:
        self.client, self.topic = client, topic
        self.calls: list[tuple[str, int, int | None]] = []
        self.spans: list[str] = []
        self.transports: list[_Counting] = []
        self.in_log_at_mid_write = -1

    def at(
        self,
        point: Point,
        batch_id: int,
        partition_id: int | None = None,
        *,
        effect: Callable[[], object] | None = None,
    ) -> None:
        self.calls.append((point.value, batch_id, partition_id))
        if point is Point.MID_WRITE:
            assert effect is not None
            effect()
            ends = [self.client.list_offsets(self.topic, p)["log_end_offset"] for p in range(2)]
            self.in_log_at_mid_write = sum(ends)

    def transport(self, batch_id: int, partition_id: int) -> Callable[[Transport], Transport]:
        def wrap(inner: Transport) -> Transport:
            self.transports.append(_Counting(inner))
            return self.transports[-1]  # type: ignore[return-value]

        return wrap

    def span(self, name: str, **attrs: Any) -> AbstractContextManager[dict[str, Any]]:
        self.spans.append(name)
        return nullcontext(attrs)


def test_a_task_and_its_commit_call_the_hooks_at_each_point_in_order(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("hooked", 2, schema=SCHEMA)
    options = parse_options(
        {"topic": "hooked", "brokers": broker.address, "key": "key"}, Scope.WRITE
    )
    hooks = Recording(client, "hooked")

    def rows() -> Iterator[pa.RecordBatch]:
        for start in range(0, ROWS, 10_000):
            ids = pa.array(range(start, start + 10_000), pa.int64())
            keys = pa.array([i % 7 for i in range(10_000)], pa.int32())
            yield pa.record_batch([ids, keys], schema=SCHEMA)

    attempt = SinkAttempt("sink-hooked", "run-1", 4)
    message = writer._write_task(options, SCHEMA, attempt, rows(), 0, 1, "", hooks)
    assert commit_batch(options, None, "run-1", 4, [message], hooks) is True

    assert hooks.calls == [
        ("before_write", 4, 1),
        ("mid_write", 4, 1),
        ("after_prepare", 4, 1),
        ("before_commit", 4, None),
        ("inside_commit", 4, None),
        ("after_commit", 4, None),
    ]
    assert hooks.in_log_at_mid_write > 0  # the effect flushed the first rows into the log
    (transport,) = hooks.transports
    assert transport.sends >= message.batches > 0  # every produce request went through it
    # As sets of names: init_producer runs on a thread of its own, beside pull_head.
    task = ["open_producer", "pull_head", "init_producer", "wait_init", "flush", "prepare"]
    assert sorted(hooks.spans) == sorted([*task, "commit", "commit_request"])
    assert message.rows == ROWS
