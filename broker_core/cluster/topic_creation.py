"""The rules for a new topic: what a create-topic request may ask, and where its replicas go.

Both cluster implementations create topics through these: the request checked and
normalised (:func:`validate_new_topic`), its replication factor chosen
(:func:`replication_factor_of`, with ``min.insync.replicas`` no larger), and its
partitions' replicas placed round-robin over the live brokers (:func:`assign_partitions`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import pyarrow as pa

from broker_core.cluster.records import PartitionState
from broker_core.errors import (
    BrokerNotAvailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
)
from broker_core.log.config import LOG_CONFIG
from broker_core.protocol.replica import NO_BROKER_EPOCH
from broker_core.protocol.topics import MAX_PARTITIONS, validate_topic_name

__all__ = [
    "DEFAULT_REPLICATION_FACTOR",
    "assign_partitions",
    "check_min_insync_replicas",
    "replication_factor_of",
    "validate_new_topic",
]


def validate_new_topic(
    name: object, partitions: object, schema: object, config: object
) -> tuple[str, int, bytes | None, dict[str, str]]:
    """Check a create-topic request the way ``LogStore.create_topic`` would.

    Returns the values normalised: the config as strings, so it reads back identically
    from ZooKeeper, the embedded file and the broker's ``topic.json``.
    """
    topic = validate_topic_name(name)
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise InvalidPartitionsError(f"partitions={partitions!r} must be an integer")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"partitions={partitions} must be between 1 and {MAX_PARTITIONS}"
        )
    if schema is not None:
        if not isinstance(schema, (bytes, bytearray, memoryview)):
            raise InvalidRequestError(
                f"topic {topic!r}: schema must be Arrow IPC bytes, got {type(schema).__name__}"
            )
        schema = bytes(schema)
        try:
            pa.ipc.read_schema(pa.py_buffer(schema))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            raise InvalidRequestError(
                f"topic {topic!r}: schema is not a serialized Arrow schema ({exc})"
            ) from exc
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise InvalidConfigError(
            f"topic {topic!r}: config must be a mapping, got {type(config).__name__}"
        )
    for key, value in config.items():
        if not isinstance(key, str) or not isinstance(value, (str, int, float)):
            raise InvalidConfigError(f"topic {topic!r}: config entry {key!r}={value!r}")
    parsed = LOG_CONFIG.parse(config)  # unknown keys and bad values, named
    if "replication.factor" in config:
        check_min_insync_replicas(topic, int(parsed["replication.factor"]), config)
    overrides = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()}
    return topic, partitions, schema, overrides


DEFAULT_REPLICATION_FACTOR = -1  # default.replication.factor: the cluster chooses
MAX_DEFAULT_REPLICAS = 3  # what it chooses with enough brokers (Kafka's usual factor)


def replication_factor_of(
    topic: str,
    config: Mapping[str, object],
    live_brokers: int,
    default: int = DEFAULT_REPLICATION_FACTOR,
) -> int:
    """The factor of a new topic: its validated ``replication.factor`` if it has one, else
    ``default`` (``default.replication.factor``), where -1 means min(3, live brokers).
    ``min.insync.replicas`` above it is an InvalidConfigError."""
    key = LOG_CONFIG.key("replication.factor")
    if key.name in config:
        factor = int(key.parse(config[key.name]))
    elif default == DEFAULT_REPLICATION_FACTOR:
        factor = max(1, min(MAX_DEFAULT_REPLICAS, live_brokers))
    else:
        factor = default
    check_min_insync_replicas(topic, factor, config)
    return factor


def check_min_insync_replicas(topic: str, factor: int, config: Mapping[str, object]) -> None:
    """Refuse ``min.insync.replicas`` above the factor: no acks=all batch could pass."""
    key = LOG_CONFIG.key("min.insync.replicas")
    wanted = int(key.parse(config.get(key.name, key.default)))
    if wanted > factor:
        raise InvalidConfigError(
            f"topic {topic!r}: min.insync.replicas={wanted} is larger than its "
            f"replication.factor={factor}: no batch could be acknowledged with acks=all"
        )


def assign_partitions(
    name: str,
    partitions: int,
    broker_ids: Sequence[int],
    replication_factor: int = 1,
    epochs: Mapping[int, int] | None = None,
    dirs: Mapping[int, str | None] | None = None,
) -> dict[int, PartitionState]:
    """Each partition's replicas over ``broker_ids`` sorted, Kafka-style round-robin.

    Partition ``p``'s replicas are the brokers at indexes ``start + p``, ``start + p + 1``,
    ... (mod the number of brokers), the first its leader, so leaders and replicas spread
    evenly. ``start`` is a stable hash (CRC-32, not Python's salted ``hash``) of the name,
    so the first partitions of many small topics do not all land on the lowest broker id.
    A factor above the number of brokers is refused (INVALID_REPLICATION_FACTOR).
    ``epochs``, ``dirs``: the brokers' epochs and directory ids, recorded for the ISR
    members (all replicas).
    """
    live = sorted(set(broker_ids))
    if not live:
        raise BrokerNotAvailableError(
            f"no live broker to assign the {partitions} partition(s) of topic {name!r} to"
        )
    if isinstance(replication_factor, bool) or not isinstance(replication_factor, int):
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication.factor={replication_factor!r} is not an integer"
        )
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication.factor={replication_factor} is below 1"
        )
    if replication_factor > len(live):
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication.factor={replication_factor} is larger than the "
            f"number of live brokers, {len(live)}"
        )
    start = zlib.crc32(name.encode()) % len(live)
    states = {}
    for p in range(partitions):
        replicas = tuple(live[(start + p + j) % len(live)] for j in range(replication_factor))
        known = epochs or {}
        recorded = tuple((b, known[b]) for b in replicas if known.get(b, NO_BROKER_EPOCH) >= 0)
        found = dirs or {}
        directories = tuple((b, d) for b in replicas if (d := found.get(b)) is not None)
        states[p] = PartitionState(replicas, replicas[0], 0, replicas, recorded, directories)
    return states
