"""A raw producer run on a broker's own host (``Host.popen``) by
``test_replica_cut.py``: it keeps reaching that broker when the host's link is cut.

``produce``: one pipelined ``acks=all`` stream (``BrokerClient.produce_stream``) to one
partition of the broker at ``--address``, which must lead it; an idempotent producer id
taken from that broker; a batch of ``--rows`` rows every ``--every`` seconds, batch ``i``
holding ids ``i * rows ...`` with base sequence ``i * rows``. Every event is a JSON line
appended (and flushed) to ``--events``, with ``time.monotonic()`` (the same clock in every
network namespace, so comparable with the test's):

* ``{"event": "start", "producer_id", "producer_epoch", "address", "t"}``;
* ``{"event": "sent", "batch", "t"}``: ``t`` taken *before* the batch was written;
* ``{"event": "acked", "batch", "base_offset", "duplicate", "t"}``;
* ``{"event": "failed", "batch", "code", "error", "t"}``: the broker's answer was an
  error, the stream failed, or no answer came within ``--answer-timeout`` of the stop;
* ``{"event": "stopped", "batches", "t"}``: once ``--stop`` exists, nothing more is sent;
* ``{"event": "done", "t"}``: every batch answered or given up; then the process exits 0.

``offsets``: prints the broker's LIST_OFFSETS answer for the partition (as JSON), asked
of that one broker (no routing): used on the cut host, where only it is reachable.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceHandle
from broker_core.errors import IdemlogError
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.wire import Action


def rows(first_id: int, n: int) -> pa.RecordBatch:
    """``n`` rows of ids from ``first_id``: the schema the test's other producer uses."""
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return pa.RecordBatch.from_pydict({"id": ids, "key": ids % 7, "value": ids.astype(np.float64)})


class Events:
    """The JSON-lines event file, written by the sending and the answering thread."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in close()
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields, "t": time.monotonic()})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def _answers(
    handles: queue.Queue[tuple[int, ProduceHandle] | None],
    events: Events,
    stopped: threading.Event,
    answer_timeout_s: float,
) -> None:
    """Record each batch's answer, in send order (the order the broker answers in)."""
    deadline: float | None = None
    while True:
        item = handles.get()
        if item is None:
            return
        batch, handle = item
        while True:
            if deadline is None and stopped.is_set():
                deadline = time.monotonic() + answer_timeout_s
            wait = 0.2 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                response = handle.result(wait)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    events.write("failed", batch=batch, code=-1, error="no answer")
                    break
                continue
            except IdemlogError as exc:
                events.write("failed", batch=batch, code=exc.code, error=str(exc))
                break
            if response.ok:
                events.write(
                    "acked",
                    batch=batch,
                    base_offset=response.base_offset,
                    duplicate=response.duplicate,
                )
            else:
                events.write(
                    "failed",
                    batch=batch,
                    code=response.error_code,
                    error=response.error_message,
                )
            break


def produce(args: argparse.Namespace) -> int:
    events = Events(args.events)
    client = BrokerClient(args.address, retries=0, timeout_s=10)
    producer_id, producer_epoch = client.init_producer_id()
    stream = client.produce_stream(args.topic, args.partition, acks=ACKS_ALL)
    if stream.address != args.address:
        print(f"{args.topic}-{args.partition} is led by {stream.address}", file=sys.stderr)
        return 2
    events.write(
        "start", producer_id=producer_id, producer_epoch=producer_epoch, address=stream.address
    )
    handles: queue.Queue[tuple[int, ProduceHandle] | None] = queue.Queue()
    stopped = threading.Event()
    answerer = threading.Thread(
        target=_answers,
        args=(handles, events, stopped, args.answer_timeout),
        name="answers",
        daemon=True,
    )
    answerer.start()
    batch = 0
    while not args.stop.exists():
        first = batch * args.rows
        events.write("sent", batch=batch)
        try:
            handle = stream.send(
                rows(first, args.rows),
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=first,
                transactional=False,
            )
        except IdemlogError as exc:  # the stream failed: nothing more can be sent on it
            events.write("failed", batch=batch, code=exc.code, error=str(exc))
            batch += 1
            break
        handles.put((batch, handle))
        batch += 1
        time.sleep(args.every)  # the stream's pace, not a synchronisation
    events.write("stopped", batches=batch)
    stopped.set()
    handles.put(None)
    answerer.join()
    stream.close(timeout=5)
    client.close()
    events.write("done")
    events.close()
    return 0


def offsets(args: argparse.Namespace) -> int:
    with BrokerClient(args.address, retries=0, timeout_s=10) as client:
        body = {"topic": args.topic, "partition": args.partition}
        print(json.dumps(client.action(args.address, Action.LIST_OFFSETS, body)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("produce", "offsets"):
        command = sub.add_parser(name)
        command.add_argument("--address", required=True)
        command.add_argument("--topic", required=True)
        command.add_argument("--partition", type=int, default=0)
    prod = sub.choices["produce"]
    prod.add_argument("--events", type=Path, required=True)
    prod.add_argument("--stop", type=Path, required=True)
    prod.add_argument("--rows", type=int, default=10)
    prod.add_argument("--every", type=float, default=0.02)
    prod.add_argument("--answer-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    return produce(args) if args.command == "produce" else offsets(args)


if __name__ == "__main__":
    sys.exit(main())
