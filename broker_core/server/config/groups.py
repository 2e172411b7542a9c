"""The consumer groups' keys (declared here, beside ``broker_config.py``, which lists them
with the others): ``__consumer_offsets`` and the group coordinator's timers, Kafka's
names and defaults (docs/kafka.md, "Consumer groups").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_core.config import INT_MAX, ConfigKey, ConfigValue
from broker_core.errors import InvalidConfigError
from broker_core.groups.coordinator import GroupConfig

MINUTE_MS = 60_000

GROUP_KEYS = [
    ConfigKey(
        "offsets.topic.num.partitions",
        int,
        8,
        "Partitions of __consumer_offsets (ZooKeeper mode), fixed when a Kafka client first "
        "asks for a group's coordinator: a group's coordinator is the leader of partition "
        "crc32(group id) mod this. An existing topic keeps its count (a change would move "
        "groups between coordinators, as in Kafka). Default 8, as "
        "transaction.state.log.num.partitions (Kafka's 50 serves far larger clusters). The "
        "embedded broker always has 1.",
        min=1,
        max=1000,
    ),
    ConfigKey(
        "offsets.topic.replication.factor",
        int,
        -1,
        "Replicas of each __consumer_offsets partition, set when the topic is created. -1: "
        "min(3, live brokers). More than the live brokers is refused at creation "
        "(INVALID_REPLICATION_FACTOR: FindCoordinator answers COORDINATOR_NOT_AVAILABLE and "
        "the client asks again). Kafka's key.",
        min=-1,
        max=32767,
    ),
    ConfigKey(
        "offsets.topic.segment.bytes",
        int,
        100 * 1024 * 1024,
        "Segment size of __consumer_offsets, set when the topic is created. The topic is "
        "compacted on (kind, key): the cleaner keeps each group's newest record and each "
        "partition's newest committed offset, in closed segments only. Kafka's key and "
        "default (100 MiB).",
        min=1024 * 1024,
        max=INT_MAX,
    ),
    ConfigKey(
        "offsets.retention.minutes",
        int,
        10_080,
        "How long a group's committed offsets are kept once the group has no members "
        "(counted from when it became empty; for offsets committed without a group "
        "membership, from the commit). Then each gets a tombstone, and the group goes with "
        "its last. Kafka's key and default (7 days).",
        min=1,
    ),
    ConfigKey(
        "offsets.retention.check.interval.ms",
        int,
        600_000,
        "How often each group coordinator looks for expired offsets. Kafka's key and default.",
        min=1,
    ),
    ConfigKey(
        "group.min.session.timeout.ms",
        int,
        6_000,
        "Shortest session.timeout.ms a consumer may ask for (shorter: "
        "INVALID_SESSION_TIMEOUT). Kafka's key and default.",
        min=1,
    ),
    ConfigKey(
        "group.max.session.timeout.ms",
        int,
        1_800_000,
        "Longest session.timeout.ms a consumer may ask for (longer: INVALID_SESSION_TIMEOUT). "
        "Kafka's key and default.",
        min=1,
    ),
    ConfigKey(
        "group.initial.rebalance.delay.ms",
        int,
        3_000,
        "How long the first rebalance of an empty group waits for more members before it "
        "ends (at most the members' rebalance timeout), so consumers started together get "
        "one generation rather than one each. 0: none. Kafka's key and default.",
        min=0,
    ),
]


@dataclass(frozen=True)
class OffsetsTopicConfig:
    """``__consumer_offsets``' creation keys and the coordinators' :class:`GroupConfig`."""

    num_partitions: int
    replication_factor: int  # -1: min(3, live brokers)
    segment_bytes: int
    groups: GroupConfig

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, ConfigValue]) -> OffsetsTopicConfig:
        """InvalidConfigError naming both keys when the session bounds cross."""
        low = int(parsed["group.min.session.timeout.ms"])
        high = int(parsed["group.max.session.timeout.ms"])
        if low > high:
            raise InvalidConfigError(
                f"group.min.session.timeout.ms={low} is above group.max.session.timeout.ms={high}"
            )
        return cls(
            int(parsed["offsets.topic.num.partitions"]),
            int(parsed["offsets.topic.replication.factor"]),
            int(parsed["offsets.topic.segment.bytes"]),
            GroupConfig(
                min_session_timeout_ms=low,
                max_session_timeout_ms=high,
                initial_rebalance_delay_ms=int(parsed["group.initial.rebalance.delay.ms"]),
                offsets_retention_ms=int(parsed["offsets.retention.minutes"]) * MINUTE_MS,
                offsets_retention_check_interval_ms=int(
                    parsed["offsets.retention.check.interval.ms"]
                ),
            ),
        )
