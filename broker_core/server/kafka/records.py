"""A partition's stored batches as Kafka's record batches, for the Kafka listener's Fetch.

Each stored batch becomes one Kafka batch at the same offsets, with its producer id,
epoch, base sequence, transactional flag and leader epoch from the stored header; a
marker becomes Kafka's control batch. Consecutive data batches of one schema are encoded
in one column-wise call (``kafka.record_batch.encode_batches``), never record by record.
A row without a timestamp takes its batch's (the time it was appended).

Only Kafka-shaped topics are served (``key``, ``value`` binary or string, optional
``timestamp`` and ``headers``, as Spark's Kafka sink writes them): rows of any other
schema raise InvalidRecordError naming the columns, which the handler answers as
UNSUPPORTED_FOR_MESSAGE_FORMAT for that partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_core.kafka.record_batch import BatchToEncode, encode_batches, encode_control_batch
from broker_core.log.partition_log import WholeBatch


def kafka_records(batches: Sequence[WholeBatch]) -> bytes:
    """``batches`` (in log order) as Kafka's record batches back to back."""
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
        if run and not run[0].rows.schema.equals(batch.rows.schema):
            flush()
        run.append(
            BatchToEncode(
                batch.rows,
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
