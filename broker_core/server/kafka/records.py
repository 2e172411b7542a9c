"""A partition's stored batches as Kafka's record batches, for the Kafka listener's Fetch.

Each stored batch becomes one Kafka batch at the same offsets, with its producer id,
epoch, base sequence, transactional flag and leader epoch from the stored header; a
marker becomes Kafka's control batch. Consecutive data batches of one schema are encoded
in one column-wise call (``kafka.record_batch.encode_batches``), never record by record.
A row without a timestamp takes its batch's (the time it was appended).

A Kafka-shaped topic (``key``, ``value`` binary or string, optional ``timestamp`` and
``headers``, as Spark's Kafka sink writes them) is served as it is; rows of any other
schema in the topic's ``kafka.format`` (``kafka.json_records``: the row as a JSON object,
``kafka.key.columns`` the key), column-wise too. A column a Kafka-shaped batch cannot
carry raises InvalidRecordError naming it, which the handler answers as
UNSUPPORTED_FOR_MESSAGE_FORMAT for that partition.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from broker_core.kafka.json_records import JsonRecords
from broker_core.kafka.record_batch import (
    BatchToEncode,
    encode_batches,
    encode_control_batch,
    is_kafka_shaped,
    record_timestamps,
)
from broker_core.log.config import LogConfig
from broker_core.log.partition_log import WholeBatch

LARGEST = -3  # ListOffsets: the record with the largest timestamp (KIP-734)


def kafka_rows(rows: pa.RecordBatch, config: LogConfig) -> pa.RecordBatch:
    """``rows`` as Kafka-shaped columns: as they are, or in the topic's ``kafka.format``."""
    if is_kafka_shaped(rows.schema):
        return rows
    return JsonRecords(rows.schema, config.kafka_keys).to_kafka(rows)


def kafka_records(batches: Sequence[WholeBatch], config: LogConfig) -> bytes:
    """``batches`` (in log order) of a topic configured ``config``, as Kafka's record
    batches back to back."""
    out: list[bytes] = []
    run: list[BatchToEncode] = []

    def flush() -> None:
        if run:
            out.append(encode_batches(run))
            run.clear()

    for batch in batches:
        h = batch.header
        if batch.control is not None:
            flush()
            out.append(
                encode_control_batch(
                    batch.control.control_type,
                    base_offset=h.base_offset,
                    partition_leader_epoch=h.leader_epoch,
                    producer_id=h.producer_id,
                    producer_epoch=h.producer_epoch,
                    coordinator_epoch=batch.control.coordinator_epoch,
                    timestamp=h.max_timestamp,
                )
            )
            continue
        assert batch.rows is not None
        rows = kafka_rows(batch.rows, config)
        if run and not run[0].rows.schema.equals(rows.schema):
            flush()
        run.append(
            BatchToEncode(
                rows,
                h.base_offset,
                h.leader_epoch,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.is_transactional,
                h.max_timestamp,
            )
        )
    flush()
    return b"".join(out)


def by_timestamp(
    batches: Sequence[WholeBatch], target: int, start: int, found: tuple[int, int] | None
) -> tuple[tuple[int, int] | None, bool]:
    """ListOffsets by timestamp over ``batches`` (in log order; records below ``start``,
    the log start, not counted), continuing ``found`` from earlier batches: ((offset,
    timestamp) or None, whether it is final). ``target`` >= 0: the first record whose
    timestamp is at or after it (final once found); :data:`LARGEST`: the first record
    with the largest timestamp (final only at the end). Column-wise per batch, with
    the timestamps Fetch gives the records."""
    for batch in batches:
        if batch.rows is None:
            continue  # a marker: no record a client sees
        h = batch.header
        times = record_timestamps(batch.rows, h.max_timestamp)
        skip = max(0, start - h.base_offset)
        times = times[skip:]
        if times.size == 0:
            continue
        if target >= 0:
            hits = np.flatnonzero(times >= target)
            if hits.size:
                i = int(hits[0])
                return (h.base_offset + skip + i, int(times[i])), True
        else:
            i = int(np.argmax(times))
            if found is None or int(times[i]) > found[1]:
                found = (h.base_offset + skip + i, int(times[i]))
    return found, False
