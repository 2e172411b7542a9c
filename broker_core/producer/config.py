"""Producer configuration: every key declared once with its type, default and doc.

Keys use Kafka's names where Kafka has the same setting. ``ProducerConfig.from_mapping``
rejects unknown keys by name (``broker_core.config.ConfigDef``), range-checks each value
and then rejects bad *combinations*, naming every key involved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_core.config import INT_MAX, ConfigDef, ConfigKey
from broker_core.errors import InvalidConfigError
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from broker_core.protocol.wire import DEFAULT_BATCH_WINDOW
from broker_core.security.client_config import CLIENT_SASL_KEYS, sasl_credentials
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT, TLS_KEYS, TlsSettings

# The broker caches the last ``producer.state.batch.window`` batches per producer and
# partition; a retried batch older than that cannot be answered with its offsets, so an
# idempotent producer must not keep more than this many in flight per partition.
BROKER_BATCH_WINDOW = DEFAULT_BATCH_WINDOW

PARTITIONERS = ("hash", "round_robin")

# The acks key's spellings and their wire values (broker_core.protocol.requests).
ACKS_VALUES = {"all": ACKS_ALL, "-1": ACKS_ALL, "1": ACKS_LEADER}

PRODUCER_CONFIG = ConfigDef(
    [
        ConfigKey(
            "bootstrap.servers",
            str,
            "",
            "Brokers to bootstrap from, host:port[,host:port]; the producer learns the rest "
            "from the cluster metadata.",
        ),
        ConfigKey(
            "linger.ms",
            int,
            5,
            "How long a partition's batch waits for more rows before it is sent when it is "
            "not full yet.",
            min=0,
        ),
        ConfigKey(
            "batch.size",
            int,
            1 << 20,
            "Target size in bytes (Arrow buffers) of one produced batch: small appends are "
            "merged up to it, larger ones split into batches of about this size.",
            min=1,
        ),
        ConfigKey(
            "buffer.memory",
            int,
            64 << 20,
            "Bytes of Arrow data the producer may hold unsent or unacknowledged; send() "
            "blocks (up to max.block.ms) while the buffer is full.",
            min=1,
        ),
        ConfigKey(
            "max.block.ms",
            int,
            60_000,
            "How long send() may block waiting for buffer.memory, and how long "
            "init_transactions / commit / abort / flush wait for the cluster: a bound on "
            "each call as a whole, its requests' timeouts and retries included.",
            min=0,
        ),
        ConfigKey(
            "max.in.flight.requests.per.connection",
            int,
            5,
            "Batches per partition sent and not yet answered. With idempotence on it must "
            "not exceed the broker's producer.state.batch.window (5); while a partition "
            "retries, only one of its batches is in flight.",
            min=1,
        ),
        ConfigKey(
            "retries",
            int,
            INT_MAX,
            "How many times a batch that failed with a retriable error is resent (with the "
            "same producer id, epoch and sequence) before it fails; delivery.timeout.ms "
            "bounds the total time as well.",
            min=0,
        ),
        ConfigKey(
            "retry.backoff.ms",
            int,
            100,
            "Wait before resending a failed batch.",
            min=0,
        ),
        ConfigKey(
            "request.timeout.ms",
            int,
            30_000,
            "How long a sent batch may go unanswered before its stream is dropped and the "
            "batch counts as failed (retriably).",
            min=1,
        ),
        ConfigKey(
            "delivery.timeout.ms",
            int,
            120_000,
            "Upper bound on the time from send() to the batch's success or failure, retries "
            "included; must be at least linger.ms + request.timeout.ms.",
            min=1,
        ),
        ConfigKey(
            "enable.idempotence",
            bool,
            True,
            "Give every batch a producer id, epoch and sequence so retries are never "
            "written twice. Required by transactional.id.",
        ),
        ConfigKey(
            "acks",
            str,
            "all",
            "When the broker answers a batch. all (or -1): once every in-sync replica has "
            "it, so an acknowledged batch outlives its leader (the topic's "
            "min.insync.replicas says how few in-sync replicas will do); 1: once the "
            "leader has written it, sooner, but a batch acknowledged just before the leader "
            "fails can be lost. 1 requires enable.idempotence=false, and a transactional "
            "producer requires all; 0 (no answer at all) is not supported.",
        ),
        ConfigKey(
            "transactional.id",
            str,
            "",
            "Stable name of a transactional producer (init_transactions fences every older "
            "producer with the same id). Empty: not transactional.",
        ),
        ConfigKey(
            "transaction.timeout.ms",
            int,
            60_000,
            "How long a transaction may stay open before the coordinator aborts it.",
            min=1,
            max=INT_MAX,
        ),
        ConfigKey(
            "partitioner",
            str,
            "hash",
            "hash: rows with a key go to pandas.util.hash_array(key) % partitions (see "
            "broker_core.producer.partitioner); round_robin: every send goes whole to the "
            "next partition, keys ignored. Sends without a key are always round-robin.",
            choices=PARTITIONERS,
        ),
        ConfigKey(
            "key.column",
            str,
            "",
            "Default key column of send() when none is given; empty: no key.",
        ),
        # security.protocol and ssl.*: declared once in broker_core/security/tls.py; sasl.*
        # in broker_core/security/client_config.py.
        *TLS_KEYS,
        *CLIENT_SASL_KEYS,
    ],
    what="producer",
)


@dataclass(frozen=True)
class ProducerConfig:
    bootstrap_servers: str
    linger_ms: int
    batch_size: int
    buffer_memory: int
    max_block_ms: int
    max_in_flight: int
    retries: int
    retry_backoff_ms: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    enable_idempotence: bool
    acks: int  # the wire value: ACKS_ALL (-1) or ACKS_LEADER (1)
    transactional_id: str | None
    transaction_timeout_ms: int
    partitioner: str
    key_column: str | None
    tls: TlsSettings = PLAINTEXT  # its links' protocol and files (docs/security.md)
    sasl: SaslCredentials | None = None  # every connection's credentials; None: no SASL

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, object] | None = None, *, broker_window: int = BROKER_BATCH_WINDOW
    ) -> ProducerConfig:
        """Parse, then reject bad combinations with the keys named."""
        v = PRODUCER_CONFIG.parse(values)
        config = cls(
            bootstrap_servers=str(v["bootstrap.servers"]),
            linger_ms=int(v["linger.ms"]),
            batch_size=int(v["batch.size"]),
            buffer_memory=int(v["buffer.memory"]),
            max_block_ms=int(v["max.block.ms"]),
            max_in_flight=int(v["max.in.flight.requests.per.connection"]),
            retries=int(v["retries"]),
            retry_backoff_ms=int(v["retry.backoff.ms"]),
            request_timeout_ms=int(v["request.timeout.ms"]),
            delivery_timeout_ms=int(v["delivery.timeout.ms"]),
            enable_idempotence=bool(v["enable.idempotence"]),
            acks=parse_acks(v["acks"]),
            transactional_id=str(v["transactional.id"]) or None,
            transaction_timeout_ms=int(v["transaction.timeout.ms"]),
            partitioner=str(v["partitioner"]),
            key_column=str(v["key.column"]) or None,
            tls=TlsSettings.from_values(v),
            sasl=sasl_credentials(v if values is None else {k: v[k] for k in values}),
        )
        config._check(broker_window)
        return config

    def _check(self, broker_window: int) -> None:
        if self.enable_idempotence and self.max_in_flight > broker_window:
            raise InvalidConfigError(
                f"max.in.flight.requests.per.connection={self.max_in_flight} exceeds the "
                f"broker's producer.state.batch.window ({broker_window}) with "
                "enable.idempotence=true: a retried batch could leave the broker's cache "
                "and be written twice"
            )
        if self.acks != ACKS_ALL and self.transactional_id is not None:
            raise InvalidConfigError(
                f"acks={self.acks} with transactional.id={self.transactional_id!r}: a "
                "transactional producer requires acks=all (a commit must not count batches "
                "that only the leader holds)"
            )
        if self.acks != ACKS_ALL and self.enable_idempotence:
            # Kafka refuses the same: a batch acknowledged by the leader alone can vanish
            # with it, and the new leader's sequences then no longer match the producer's.
            raise InvalidConfigError(
                f"acks={self.acks} requires enable.idempotence=false: an idempotent "
                "producer requires acks=all (enable.idempotence is true by default)"
            )
        if self.transactional_id is not None and not self.enable_idempotence:
            raise InvalidConfigError(
                f"transactional.id={self.transactional_id!r} requires enable.idempotence=true"
            )
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise InvalidConfigError(
                f"delivery.timeout.ms={self.delivery_timeout_ms} must be at least linger.ms "
                f"({self.linger_ms}) + request.timeout.ms ({self.request_timeout_ms})"
            )
        if self.batch_size > self.buffer_memory:
            raise InvalidConfigError(
                f"batch.size={self.batch_size} is larger than buffer.memory={self.buffer_memory}"
            )


def parse_acks(raw: object) -> int:
    """The wire value of an ``acks`` setting: ``ACKS_ALL`` (-1) for ``all`` or ``-1``,
    ``ACKS_LEADER`` (1) for ``1`` (strings from a file or a Spark option, or ints).

    Raises InvalidConfigError naming the key and the value for ``0`` (the producer's
    retries, idempotence and transactions all need the broker's answer) and for anything
    else.
    """
    # A bool is refused, not read: True is an int, and would pass for 1.
    readable = isinstance(raw, (str, int)) and not isinstance(raw, bool)
    text = str(raw).strip().lower() if readable else ""
    if text in ACKS_VALUES:
        return ACKS_VALUES[text]
    if text == "0":
        raise InvalidConfigError(
            f"acks={raw!r} is not supported: the producer needs the broker's answer to every "
            "batch (retries, idempotence and transactions depend on it); use acks=all or "
            "acks=1"
        )
    raise InvalidConfigError(f"acks={raw!r} is not one of {', '.join(ACKS_VALUES)}")


def describe() -> list[tuple[str, str, str, str]]:
    """(name, type, default, doc) rows, for documentation."""
    return PRODUCER_CONFIG.describe()


PROPERTIES_HEADER = """\
# Producer client configuration: every key with its default. Pass them to
#   broker_core.producer.Producer(bootstrap="host:port", **{"key": value})
# Generated from broker_core/producer/config.py (the one place each key is declared) by
# `render_properties()` in that module; tests/producer/test_config.py checks that this
# file and the code agree. Unknown keys are rejected by name.
"""


def render_properties() -> str:
    """The commented default ``conf/producer.properties``."""
    parts = [PROPERTIES_HEADER]
    for name, _type, default, doc in describe():
        value = default.lower() if default in ("True", "False") else default
        parts.append(f"\n# {doc}\n{name}={value}\n")
    return "".join(parts)
