"""ProduceStream.close() never half-closes a Flight call the response reader already closed.

Flight aborts the whole process (``Fatal Python error: Aborted``) when ``done_writing()``
runs on a writer that is being or has been closed; the reader thread closes the writer as
soon as the broker ends the stream (a SIGKILLed broker), so close() must check, under the
same lock, that the call is still open.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from broker_core.client.produce_stream import ProduceStream


class _Writer:
    def __init__(self) -> None:
        self.closed = False
        self.calls: list[str] = []

    def done_writing(self) -> None:
        # The real writer aborts the process here; a Python error fails the test instead.
        assert not self.closed, "done_writing() on a closed Flight writer"
        self.calls.append("done_writing")

    def close(self) -> None:
        self.closed = True
        self.calls.append("close")


class _EndedAnswers:
    """The broker went away: the answers end at once."""

    def read(self) -> None:
        return None


class _Client:
    def __init__(self) -> None:
        self.writer = _Writer()

    def do_put(self, descriptor: Any, schema: pa.Schema) -> tuple[_Writer, _EndedAnswers]:
        return self.writer, _EndedAnswers()


def test_close_after_the_reader_ended_the_call_does_not_touch_the_writer_again() -> None:
    client = _Client()
    stream = ProduceStream(client, "t", 0, pa.schema([("x", pa.int64())]))  # type: ignore[arg-type]
    reader = stream._reader_thread
    assert isinstance(reader, threading.Thread)
    reader.join(10)  # the reader saw the end of the answers and closed the call
    assert client.writer.calls == ["close"]
    stream.close()
    assert client.writer.calls == ["close"]  # no done_writing(), no second close()
