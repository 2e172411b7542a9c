"""``idemlog consume``: print a topic's records as they arrive, as Kafka's console consumer.

idemlog consume (--bootstrap host:port | --path DIR) --topic T [--partition P]
                [--from-beginning | --offset N] [--max-messages N] [--timeout-ms T]
                [--isolation-level read_committed|read_uncommitted] [--json] [--count-only]

It starts at the end of each partition (what a reader of that isolation level can see
now: the last stable offset for read_committed, the high watermark otherwise) unless told
otherwise, and waits, printing each record when it becomes readable. It exits 0 after
``--max-messages`` records, or when nothing arrived for ``--timeout-ms``; Ctrl-C (or
SIGTERM) ends it with 130 (143) once what was fetched is printed. Always, at exit, one
line ``Processed a total of N messages`` on stderr (Kafka's); at the start, one line
``Consuming T (level) from partition:offset 0:N ...`` there too. It follows the topic by
its id: a topic deleted and recreated under the name ends it with exit code 1 and one
line naming the topic and both ids (``UNKNOWN_TOPIC_ID``), never reading the new topic
from the old one's offsets.

The default isolation is read_committed, unlike Kafka's console consumer
(read_uncommitted): what an exactly-once sink has committed is what its readers see, and
the consumer shows that unless asked otherwise (docs/broker.md, "Consuming").

Waiting is a fetch loop over the partitions with a bounded backoff between empty rounds
(``_IDLE_MIN_S`` doubling to ``_IDLE_MAX_S``), so an idle consumer costs a few fetches a
second, and a record arrives at most ``_IDLE_MAX_S`` late. The broker's fetch does not
long-poll (docs/protocol.md); a signal wakes the wait at once (``signal.set_wakeup_fd``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from types import FrameType
from typing import Any, TypeVar, cast

from broker_core.cli.broker_cmd import _broker_arguments, _client
from broker_core.cli.failures import ExitCode, silence_stdout, stdout_reader_left
from broker_core.cli.progress import Progress
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    IdemlogError,
    InvalidConfigError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.partition_log import IsolationLevel

T = TypeVar("T")
_IDLE_MIN_S = 0.01  # the first wait after an empty round
_IDLE_MAX_S = 0.2  # the longest: how late an idle consumer sees a new record at most
# One fetch per partition per round at most this large (one batch at least, if larger).
_FETCH_MAX_BYTES = 4 * 1024 * 1024
NO_LIMIT = None  # --max-messages / --timeout-ms not given


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One record as ``consume --json`` prints it (docs/broker.md, "JSON answers"): the
    row's columns under ``value``, so a column named ``offset`` cannot shadow the offset."""

    topic: str
    partition: int
    offset: int
    value: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "value": self.value,
        }

    def to_line(self) -> str:
        """The record as one line of JSON (``--json``), its decimals as JSON numbers."""
        return json_line(self.to_json())

    def to_text(self) -> str:
        """The value's columns, tab-separated (null for a missing value), as Kafka's
        console consumer prints a record's value alone."""
        return "\t".join(_text_cell(v) for v in self.value.values())


def _text_cell(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    return json_line(value)


def json_line(value: object) -> str:
    """``value`` as JSON, with a ``Decimal`` (a decimal column) written as a JSON number
    in its exact digits (``12.30``, as Kafka Connect's JsonConverter does with
    ``decimal.format=NUMERIC``), not a quoted string: ``json.loads(line,
    parse_float=Decimal)`` reads it back exactly. Other values json cannot write
    (timestamps, dates, bytes) as their ``str``."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        fields = (f"{json.dumps(str(k))}: {json_line(v)}" for k, v in value.items())
        return "{" + ", ".join(fields) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(json_line(v) for v in value) + "]"
    return json.dumps(value, default=str)


class _Interrupted(BaseException):
    """A stop signal while a call to the broker was under way (a BaseException, as
    KeyboardInterrupt, so no ``except Exception`` on the way takes it)."""


class _Stop:
    """The first SIGINT/SIGTERM while consuming: noted, and the idle wait woken at once
    through a wakeup pipe, so the loop ends after printing what it holds (no exception
    raised in the middle of a line). A call to the broker (``call``) runs on a daemon
    thread while this (main) thread waits on that pipe and the call's own: a Python
    signal handler cannot run while the main thread is inside a Flight call, which may
    wait 30 s and retry against a broker that does not answer. The previous handlers
    come back on ``restore``."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._done_read, self._done_write = os.pipe()
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        os.set_blocking(self._read, False)
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        self._previous_fd = signal.set_wakeup_fd(self._write)
        for s in self._previous:
            signal.signal(s, self._note)

    def _note(self, number: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = number

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``'s result, or what it raised; raises ``_Interrupted`` as soon as a stop
        signal comes, leaving the call to its (daemon) thread."""
        outcome: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                outcome.append((True, fn()))
            except BaseException as exc:  # handed to the main thread, raised there
                outcome.append((False, exc))
            finally:
                os.write(self._done_write, b"x")

        threading.Thread(target=run, name="consume-call", daemon=True).start()
        while not outcome:
            if self.signal is not None:
                raise _Interrupted
            select.select([self._read, self._done_read], [], [])
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 512)
        os.read(self._done_read, 1)
        ok, value = outcome[0]
        if ok:
            return cast(T, value)
        raise value

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; returns early when a signal arrives."""
        if self.signal is None and seconds > 0:
            select.select([self._read], [], [], seconds)
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 512)  # drain: the next wait must block again

    def restore(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        for fd in (self._read, self._write, self._done_read, self._done_write):
            os.close(fd)


def _start_offsets(
    client: BrokerClient, args: argparse.Namespace, partitions: list[int], topic_id: str | None
) -> dict[int, int]:
    starts = {}
    for p in partitions:
        if args.offset is not None:
            starts[p] = args.offset
            continue
        offsets = client.list_offsets(args.topic, p, topic_id=topic_id)
        if args.from_beginning:
            starts[p] = offsets["log_start_offset"]
        elif args.isolation == IsolationLevel.READ_COMMITTED.value:
            starts[p] = offsets["last_stable_offset"]
        else:
            starts[p] = offsets["high_watermark"]
    return starts


def consume(args: argparse.Namespace) -> int:
    """Follow the topic until ``--max-messages``, ``--timeout-ms`` of silence or a stop
    signal; see the module's docstring. Raises ``UnknownTopicOrPartitionError`` (as a
    usage error naming ``--topic``/``--partition``) and the fetch's errors."""
    if args.max_messages is not None and args.max_messages < 1:
        raise InvalidConfigError(f"--max-messages {args.max_messages}: must be at least 1")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise InvalidConfigError(f"--timeout-ms {args.timeout_ms}: must be 0 or more")
    stop = _Stop()
    printed = 0
    counts: dict[int, int] = {}
    progress = (
        Progress(f"consume {args.topic}", total=args.max_messages, unit="")
        if args.max_messages is not None and args.progress
        else None
    )
    try:
        with _client(args) as client:
            try:
                (topic,) = stop.call(lambda: client.describe_topics([args.topic]))
            except UnknownTopicOrPartitionError as exc:
                raise InvalidConfigError(f"--topic {args.topic}: {exc.message}") from exc
            every = [p.partition for p in topic.partitions]
            if args.partition is not None and args.partition not in every:
                raise InvalidConfigError(
                    f"--partition {args.partition}: topic {args.topic} has partitions "
                    f"0..{len(every) - 1}"
                )
            partitions = every if args.partition is None else [args.partition]
            counts = dict.fromkeys(partitions, 0)
            # The topic followed is this one, by its id: recreated under the name, every
            # later fetch is refused (UNKNOWN_TOPIC_ID, the line naming both ids: exit 1),
            # never read on from the old positions into the new topic.
            topic_id = topic.topic_id or None
            positions = stop.call(lambda: _start_offsets(client, args, partitions, topic_id))
            # Where it starts, once, on stderr: an operator (or a test) knows from this
            # line on that whatever becomes readable is printed.
            starts = " ".join(f"{p}:{o}" for p, o in positions.items())
            print(
                f"Consuming {args.topic} ({args.isolation}) from partition:offset {starts}",
                file=sys.stderr,
                flush=True,
            )
            idle_s = _IDLE_MIN_S
            last_arrival = time.monotonic()
            while stop.signal is None and (
                args.max_messages is None or printed < args.max_messages
            ):
                arrived = 0
                for p in partitions:
                    try:
                        response = stop.call(
                            lambda p=p: client.fetch_once(  # type: ignore[misc]
                                args.topic,
                                p,
                                positions[p],
                                isolation=args.isolation,
                                max_bytes=_FETCH_MAX_BYTES,
                                topic_id=topic_id,
                            )
                        )
                    except UnknownTopicIdError as exc:
                        raise _as_now(client, args.topic, topic_id or "", exc) from exc
                    for meta, batch in response.batches:
                        for i, row in enumerate(batch.to_pylist()):
                            offset = meta.base_offset + i
                            # A fetch returns whole batches: skip rows before the position.
                            if offset < positions[p]:
                                continue
                            if args.max_messages is not None and printed >= args.max_messages:
                                break
                            if not args.count_only:
                                record = ConsumedRecord(args.topic, p, offset, row)
                                print(record.to_line() if args.json else record.to_text())
                            printed += 1
                            arrived += 1
                            counts[p] += 1
                            positions[p] = offset + 1
                            if progress is not None:
                                progress.advance()
                    positions[p] = max(positions[p], response.trailer.next_offset)
                sys.stdout.flush()
                now = time.monotonic()
                if arrived:
                    last_arrival, idle_s = now, _IDLE_MIN_S
                    continue
                wait_s = idle_s
                if args.timeout_ms is not None:
                    left = args.timeout_ms / 1000 - (now - last_arrival)
                    if left <= 0:
                        break
                    wait_s = min(wait_s, left)
                stop.wait(wait_s)
                idle_s = min(idle_s * 2, _IDLE_MAX_S)
    except _Interrupted:
        pass  # stop.signal says which: the summary and the exit code follow
    except BrokenPipeError:
        # Its reader left (`idemlog consume ... | head`): done, as that reader wanted.
        # Caught here rather than in main's handler so that the summary is printed.
        if not stdout_reader_left():
            raise
        silence_stdout()
    finally:
        stop.restore()
        if progress is not None:
            progress.close()
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()
        print(f"Processed a total of {printed} messages", file=sys.stderr, flush=True)
    if args.count_only:
        for p, n in counts.items():
            print(f"partition={p} rows={n}")
        print(f"total_rows={printed} isolation={args.isolation}", flush=True)
    if stop.signal is not None:
        return int(ExitCode.INTERRUPTED if stop.signal == signal.SIGINT else ExitCode.TERMINATED)
    return int(ExitCode.OK)


def _as_now(
    client: BrokerClient, topic: str, old_id: str, refused: UnknownTopicIdError
) -> UnknownTopicIdError:
    """The refusal restated as the topic stands when it is reported: the broker answered
    at its moment, which may fall between a delete and the create that reuses the name
    ("was deleted" when by now it "was recreated")."""
    try:
        return UnknownTopicIdError.recreated(topic, old_id, client.topic_id(topic, refresh=True))
    except IdemlogError:
        return refused  # the store or the brokers are away: the broker's word stands


def fill_consume(cons: argparse.ArgumentParser) -> None:
    """Fill ``idemlog consume``'s parser."""
    _broker_arguments(cons)
    cons.add_argument("--topic", required=True, help="the topic to read")
    cons.add_argument("--partition", type=int, help="only this partition (default: all)")
    where = cons.add_mutually_exclusive_group()
    where.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the log start (default: at the end, printing only what arrives)",
    )
    where.add_argument("--offset", type=int, help="start at this offset in each partition")
    cons.add_argument(
        "--max-messages",
        type=int,
        metavar="N",
        help="exit (0) after printing N records (default: no limit)",
    )
    cons.add_argument(
        "--timeout-ms",
        type=int,
        metavar="T",
        help="exit (0) when no record arrived for T ms (default: wait until interrupted)",
    )
    cons.add_argument(
        "--isolation-level",
        "--isolation",
        dest="isolation",
        choices=[level.value for level in IsolationLevel],
        default=IsolationLevel.READ_COMMITTED.value,
        help="read_committed (default, unlike Kafka's console consumer): committed rows "
        "only; read_uncommitted: every row, open and aborted transactions' too",
    )
    cons.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per record: {"topic", "partition", "offset", "value": {...}}',
    )
    cons.add_argument(
        "--count-only", action="store_true", help="print no record, only counts at exit"
    )
    cons.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="with --max-messages, show no progress on stderr",
    )
    cons.set_defaults(func=consume)
