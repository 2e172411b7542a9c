"""Checks of what clients hand the transaction coordinator, each error naming the field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

from broker_core.errors import InvalidRequestError, InvalidTransactionTimeoutError
from broker_core.protocol.topics import validate_topic_name
from broker_core.record.batch import MAX_PRODUCER_EPOCH

# Room for "<sink id>/<spark partition id>" with a long sink id; ids are znode names and
# keys of every state record, so they stay bounded.
MAX_TRANSACTIONAL_ID_LENGTH = 512
MAX_SINK_ID_LENGTH = 400


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_name(value: object, field: str, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{field}={value!r} must be a non-empty string")
    if len(value) > limit:
        raise InvalidRequestError(
            f"{field} {value[:40]!r}... is {len(value)} characters, over the limit of {limit}"
        )
    if not value.isprintable():
        raise InvalidRequestError(f"{field}={value!r} contains unprintable characters")
    return value


def check_transactional_id(value: object) -> str:
    return _check_name(value, "transactional_id", MAX_TRANSACTIONAL_ID_LENGTH)


def check_sink_id(value: object) -> str:
    sink_id = _check_name(value, "sink_id", MAX_SINK_ID_LENGTH)
    if "/" in sink_id:
        # Transactional ids are "<sink id>/<partition>": a '/' would make them ambiguous.
        raise InvalidRequestError(f"sink_id={sink_id!r} must not contain '/'")
    return sink_id


MAX_RUN_ID_LENGTH = 200
# A df.write job's sink id is this prefix and its run id (spark_sink/writer.py): a sink
# committed once, by that run. A stream's sink id is its query id, which never has it.
BATCH_JOB_SINK_PREFIX = "batch-"


def batch_job_sink_id(run_id: str) -> str:
    """The sink id of the df.write job of run ``run_id``."""
    return BATCH_JOB_SINK_PREFIX + run_id


def is_batch_job(sink_id: str, run_id: str | None) -> bool:
    """``sink_id`` is the df.write job of ``run_id`` (not a streaming query)."""
    return run_id is not None and sink_id == batch_job_sink_id(run_id)


def check_run_id(value: object) -> str:
    return _check_name(value, "run_id", MAX_RUN_ID_LENGTH)


def check_offset_ranges(ranges: object) -> list[tuple[str, int, int, int]]:
    """(topic, partition, first offset, last offset) per partition, first <= last."""
    if not isinstance(ranges, (list, tuple)):
        raise InvalidRequestError(
            f"ranges={ranges!r} must be a list of (topic, partition, first, last)"
        )
    result: list[tuple[str, int, int, int]] = []
    seen: set[tuple[str, int]] = set()
    for item in ranges:
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise InvalidRequestError(f"range {item!r} is not (topic, partition, first, last)")
        topic, partition, first, last = item
        if not isinstance(topic, str) or not topic:
            raise InvalidRequestError(f"range {item!r}: topic must be a non-empty string")
        if not all(_is_int(v) and v >= 0 for v in (partition, first, last)) or first > last:
            raise InvalidRequestError(
                f"range {item!r}: partition, first and last must be integers >= 0 with "
                "first <= last"
            )
        if (topic, partition) in seen:
            raise InvalidRequestError(f"range {item!r}: partition {topic}-{partition} twice")
        seen.add((topic, partition))
        result.append((topic, partition, first, last))
    return sorted(result)


def check_batch_id(value: object) -> int:
    if not _is_int(value) or value < 0:
        raise InvalidRequestError(f"batch_id={value!r} must be an integer >= 0")
    return value


def check_timeout(value: object, default_ms: int, max_ms: int) -> int:
    if value is None:
        return default_ms
    if not _is_int(value) or not 1 <= value <= max_ms:
        raise InvalidTransactionTimeoutError(
            f"transaction_timeout_ms={value!r} must be an integer between 1 and {max_ms} "
            "(the coordinator's maximum transaction timeout)"
        )
    return value


def check_producer(producer_id: object, producer_epoch: object) -> None:
    if not _is_int(producer_id) or producer_id < 0:
        raise InvalidRequestError(f"producer_id={producer_id!r} must be an integer >= 0")
    if not _is_int(producer_epoch) or not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise InvalidRequestError(
            f"producer_epoch={producer_epoch!r} must be an integer in [0, {MAX_PRODUCER_EPOCH}]"
        )


def check_partitions(partitions: object) -> set[tuple[str, int]]:
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence):
        raise InvalidRequestError(
            f"partitions={partitions!r} must be a list of (topic, partition) pairs"
        )
    if not partitions:
        raise InvalidRequestError("partitions must name at least one (topic, partition)")
    result: set[tuple[str, int]] = set()
    for item in partitions:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidRequestError(f"partition {item!r} is not a (topic, partition) pair")
        topic, partition = item
        validate_topic_name(topic)
        if not _is_int(partition) or partition < 0:
            raise InvalidRequestError(
                f"partition {item!r}: partition number {partition!r} must be an integer >= 0"
            )
        result.add((topic, partition))
    return result


def check_transactions(transactions: object) -> list[tuple[str, int, int]]:
    """(transactional_id, producer_id, producer_epoch) triples, each id at most once."""
    if isinstance(transactions, (str, bytes)) or not isinstance(transactions, Sequence):
        raise InvalidRequestError(
            f"transactions={transactions!r} must be a list of "
            "(transactional_id, producer_id, producer_epoch)"
        )
    result: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for item in transactions:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise InvalidRequestError(
                f"transaction {item!r} is not (transactional_id, producer_id, producer_epoch)"
            )
        transactional_id = check_transactional_id(item[0])
        check_producer(item[1], item[2])
        if transactional_id in seen:
            raise InvalidRequestError(
                f"transactions name transactional_id {transactional_id!r} more than once"
            )
        seen.add(transactional_id)
        result.append((transactional_id, item[1], item[2]))
    return result
