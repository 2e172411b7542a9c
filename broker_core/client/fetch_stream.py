"""A fetch read as it arrives: batches one by one as the Flight stream delivers them.

A fetch answer is a stream of record batches, each with its ``FetchBatchMeta``, then an
empty batch carrying the ``FetchTrailer`` (next offset, watermarks). ``BrokerClient``'s
``fetch_once`` collects it whole; ``fetch_stream`` hands out a :class:`FetchStream`, whose
batches are yielded as they are received, so a reader hands rows on while the rest of
the fetch is still on its way (gRPC keeps receiving into its flow-control window in the
meantime). The memory a stream holds is one batch plus gRPC's window, not the fetch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

import pyarrow as pa
import pyarrow.flight as flight

from broker_core.errors import IdemlogError, InvalidRequestError, NetworkError
from broker_core.protocol.wire import FetchBatchMeta, FetchTrailer, decode_fetch_meta

__all__ = ["FetchStream", "FetchedBatches"]

FetchedBatch = tuple[FetchBatchMeta, pa.RecordBatch]
Chunk = FetchTrailer | FetchedBatch
# A failure of the stream as the client's typed error (``Connections.failure``).
Failure = Callable[[BaseException], IdemlogError]


class FetchedBatches(Protocol):
    """What a reader needs of one fetch, whole (``FetchResponse``) or streamed."""

    @property
    def batches(self) -> Iterator[FetchedBatch] | list[FetchedBatch]: ...

    @property
    def trailer(self) -> FetchTrailer: ...

    def close(self) -> None: ...


def _read_fetch(reader: flight.FlightStreamReader, what: str, failure: Failure) -> Iterator[Chunk]:
    """The stream's chunks, decoded, in order; the trailer last. A batch without metadata
    raises ``InvalidRequestError``; a transport failure the typed error ``failure`` makes
    (a ``NetworkError`` naming ``what`` for a broken link)."""
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise failure(exc) from exc
        if chunk.app_metadata is None:
            raise InvalidRequestError(f"{what}: a fetched batch without metadata")
        meta = decode_fetch_meta(chunk.app_metadata)
        if isinstance(meta, FetchTrailer):
            yield meta
        else:
            yield meta, chunk.data


class FetchStream:
    """One fetch's batches as they arrive, then its trailer.

    :attr:`batches` is single-use: iterate it to the end, then read :attr:`trailer`
    (before that it raises ``InvalidRequestError``; a stream that ended without one raises
    ``NetworkError``). Errors on the way are the client's typed errors and are raised from
    the iteration: nothing is retried here, as only the caller knows which batches it has
    already used. :meth:`close` cancels what is left unread (idempotent).
    """

    def __init__(
        self,
        reader: flight.FlightStreamReader,
        what: str,
        failure: Failure,
        first: Chunk | None,
        chunks: Iterator[Chunk],
    ) -> None:
        self.schema = reader.schema
        self._reader = reader
        self._what = what
        self._failure = failure
        self._first = first
        self._chunks = chunks
        self._trailer: FetchTrailer | None = None
        self._done = False

    @classmethod
    def open(cls, reader: flight.FlightStreamReader, what: str, failure: Failure) -> FetchStream:
        """Read the first chunk now, so the broker's refusal of the request (an error it
        raises before sending anything) is raised here, where the call can be retried."""
        chunks = _read_fetch(reader, what, failure)
        first = next(chunks, None)
        return cls(reader, what, failure, first, chunks)

    @property
    def batches(self) -> Iterator[FetchedBatch]:
        return self._batches()

    def _batches(self) -> Iterator[FetchedBatch]:
        pending = self._first
        self._first = None
        if pending is None and not self._done:
            pending = next(self._chunks, None)
        while pending is not None:
            if isinstance(pending, FetchTrailer):
                self._trailer = pending
            else:
                yield pending
            pending = next(self._chunks, None)
        self._done = True

    @property
    def trailer(self) -> FetchTrailer:
        if self._trailer is not None:
            return self._trailer
        if not self._done:
            raise InvalidRequestError(f"{self._what}: the trailer is read after every batch")
        raise NetworkError(f"{self._what}: the stream ended without its trailer")

    def close(self) -> None:
        if not self._done:
            self._done = True
            # Cancelling a stream already broken: nothing is left to release.
            with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
                self._reader.cancel()
