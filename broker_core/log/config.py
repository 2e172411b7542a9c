"""Per-topic log configuration (Kafka's topic-level names where Kafka has the setting)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum

from broker_core.config import INT_MAX, LONG_MAX, ConfigDef, ConfigKey
from broker_core.errors import InvalidConfigError
from broker_core.protocol.wire import DEFAULT_BATCH_WINDOW

DAY_MS = 24 * 60 * 60 * 1000
MAX_REPLICATION_FACTOR = 32767  # Kafka's replication factor is an int16

LOG_CONFIG = ConfigDef(
    [
        ConfigKey(
            "segment.bytes",
            int,
            1024**3,
            "Roll to a new segment file when the active one would grow past this size.",
            min=1024,
            max=INT_MAX,
        ),
        ConfigKey(
            "segment.ms",
            int,
            7 * DAY_MS,
            "Roll to a new segment once the active one's first batch is this old.",
            min=1,
        ),
        ConfigKey(
            "retention.bytes",
            int,
            -1,
            "Delete the oldest segments while the partition is larger than this; -1: no limit.",
            min=-1,
        ),
        ConfigKey(
            "retention.ms",
            int,
            7 * DAY_MS,
            "Delete segments whose newest batch is older than this; -1: keep forever.",
            min=-1,
        ),
        ConfigKey(
            "index.interval.bytes",
            int,
            4096,
            "Add an offset-index entry after at least this many bytes of batches.",
            min=0,
        ),
        ConfigKey(
            "flush.messages",
            int,
            LONG_MAX,
            "fsync the log after this many batches. 1 = fsync every append; the default "
            "leaves flushing to the OS (durability by the page cache, as in Kafka).",
            min=1,
        ),
        ConfigKey(
            "flush.ms",
            int,
            LONG_MAX,
            "fsync the log when this many ms have passed since the last fsync.",
            min=0,
        ),
        ConfigKey(
            "flush.writeback.bytes",
            int,
            1024**2,
            "Start writing appended batches to disk, without waiting, each time this many "
            "bytes have accumulated since the last start (Linux sync_file_range), so that an "
            "fsync -- a transaction marker's, or flush.messages/flush.ms's -- finds little left "
            "to write. 0: leave the writing to the OS until an fsync. Durability is the same "
            "either way: only an fsync makes a batch durable.",
            min=0,
        ),
        ConfigKey(
            "max.message.bytes",
            int,
            64 * 1024**2,
            "Largest record batch (header + Arrow payload) the log accepts.",
            min=1024,
            max=INT_MAX,
        ),
        ConfigKey(
            "producer.id.expiration.ms",
            int,
            DAY_MS,
            "Forget a producer's sequence state after this long without a write, unless it "
            "has an open transaction.",
            min=1,
        ),
        ConfigKey(
            "producer.state.batch.window",
            int,
            DEFAULT_BATCH_WINDOW,
            "How many of a producer's latest batches per partition are cached to answer a "
            "retried batch with its original offsets (Kafka's fixed 5). A producer must not "
            "keep more batches in flight per partition than this.",
            min=1,
            max=1000,
        ),
        ConfigKey(
            "replication.factor",
            int,
            1,
            "Copies of each partition, on distinct brokers (the first the preferred leader); "
            "more than the live brokers is refused (INVALID_REPLICATION_FACTOR). The leader "
            "serves; followers copy its log (docs/replication.md).",
            min=1,
            max=MAX_REPLICATION_FACTOR,
        ),
        ConfigKey(
            "min.insync.replicas",
            int,
            1,
            "With acks=all, a batch is refused (NOT_ENOUGH_REPLICAS, retriable) while fewer "
            "replicas than this are in sync, so an acknowledged batch is on at least this "
            "many brokers.",
            min=1,
            max=MAX_REPLICATION_FACTOR,
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            bool,
            False,
            "When no in-sync replica of a partition is alive, elect a live replica that is "
            "not in sync rather than wait for one. Availability at a price: the acknowledged "
            "batches it lacks are lost, and the returning replicas truncate them.",
        ),
        ConfigKey(
            "cleanup.policy",
            str,
            "delete",
            "What happens to old segments: delete (retention.ms / retention.bytes delete "
            "whole segments), compact (the log cleaner keeps the newest row of each key; "
            "retention deletes nothing) or compact,delete (both). See docs/storage.md, "
            "Compaction.",
            choices=("delete", "compact", "compact,delete", "delete,compact"),
        ),
        ConfigKey(
            "compaction.key.columns",
            str,
            "key",
            "Comma-separated columns whose values together are a row's key in a compacted "
            "topic; the topic's schema must have every one of them. A row whose other "
            "columns are all null is a tombstone (it deletes its key).",
        ),
        ConfigKey(
            "kafka.format",
            str,
            "json",
            "How the Kafka listener serves the rows of a topic that is not Kafka-shaped (key, "
            "value, timestamp, headers): json, each row a JSON object, its kafka.key.columns "
            "the record's key. A Kafka-shaped topic is served as it is. See docs/kafka.md.",
            choices=("json",),
        ),
        ConfigKey(
            "kafka.key.columns",
            str,
            "",
            "Comma-separated columns that make a row's Kafka record key when the topic is "
            "served in kafka.format (one string or binary column: its bytes; otherwise JSON); "
            "empty: null keys.",
        ),
        ConfigKey(
            "delete.retention.ms",
            int,
            DAY_MS,
            "How long a tombstone, or a transaction marker with no data left before it, is "
            "kept after the log cleaner first reached it (readers have this long to see it).",
            min=0,
        ),
        ConfigKey(
            "min.cleanable.dirty.ratio",
            float,
            0.5,
            "Clean a compacted partition once the bytes written since its last clean are at "
            "least this share of its cleanable bytes.",
            min=0.0,
            max=1.0,
        ),
        ConfigKey(
            "min.compaction.lag.ms",
            int,
            0,
            "A segment is cleaned only once its newest batch is at least this old.",
            min=0,
        ),
    ],
    what="topic",
)


class CleanupPolicy(Enum):
    """``cleanup.policy``: which of retention and compaction apply to a topic."""

    DELETE = "delete"
    COMPACT = "compact"
    COMPACT_DELETE = "compact,delete"

    @classmethod
    def parse(cls, text: str) -> CleanupPolicy:
        names = sorted(part.strip() for part in text.split(","))
        return cls.COMPACT_DELETE if names == ["compact", "delete"] else cls(",".join(names))

    @property
    def compacts(self) -> bool:
        return self is not CleanupPolicy.DELETE

    @property
    def deletes(self) -> bool:
        return self is not CleanupPolicy.COMPACT


def parse_key_columns(text: str, key: str = "compaction.key.columns") -> tuple[str, ...]:
    """``key``'s value ``text`` as column names; InvalidConfigError for an empty or
    repeated one."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise InvalidConfigError(
            f"{key}={text!r}: a column name is empty (expected names separated by commas)"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidConfigError(f"{key}={text!r} names {', '.join(repeated)} more than once")
    return names


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int
    segment_ms: int
    retention_bytes: int
    retention_ms: int
    index_interval_bytes: int
    flush_messages: int
    flush_ms: int
    flush_writeback_bytes: int
    max_message_bytes: int
    producer_id_expiration_ms: int
    producer_state_batch_window: int
    replication_factor: int
    min_insync_replicas: int
    unclean_leader_election_enable: bool
    cleanup_policy: str
    compaction_key_columns: str
    kafka_format: str
    kafka_key_columns: str
    delete_retention_ms: int
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int

    @classmethod
    def from_mapping(cls, values: Mapping[str, object] | None = None) -> LogConfig:
        parsed = LOG_CONFIG.parse(values)
        kwargs = {name.replace(".", "_"): value for name, value in parsed.items()}
        config = cls(**kwargs)  # type: ignore[arg-type]
        if config.max_message_bytes > config.segment_bytes:
            raise InvalidConfigError(
                f"max.message.bytes={config.max_message_bytes} is larger than "
                f"segment.bytes={config.segment_bytes}: a batch must fit in one segment"
            )
        parse_key_columns(config.compaction_key_columns)
        if config.kafka_key_columns.strip():
            parse_key_columns(config.kafka_key_columns, "kafka.key.columns")
        return config

    @property
    def policy(self) -> CleanupPolicy:
        return CleanupPolicy.parse(self.cleanup_policy)

    @property
    def key_columns(self) -> tuple[str, ...]:
        return parse_key_columns(self.compaction_key_columns)

    @property
    def kafka_keys(self) -> tuple[str, ...]:
        """``kafka.key.columns`` as names (none when empty)."""
        if not self.kafka_key_columns.strip():
            return ()
        return parse_key_columns(self.kafka_key_columns, "kafka.key.columns")

    def to_mapping(self) -> dict[str, int | bool | str | float]:
        return {f.name.replace("_", "."): getattr(self, f.name) for f in fields(self)}

    def overlaid(self, overrides: Mapping[str, object] | None) -> LogConfig:
        merged: dict[str, object] = dict(self.to_mapping())
        merged.update(overrides or {})
        return LogConfig.from_mapping(merged)
