"""Producer configuration: every key declared once with its type, default and doc
(:data:`PRODUCER_CONFIG`), and :class:`ProducerConfig`, the typed settings built from it.

Keys use Kafka's names where Kafka has the same setting. ``ProducerConfig(linger_ms=10)``
takes them typed, one field per key with its declared default;
``ProducerConfig.from_mapping({"linger.ms": 10})`` takes the dotted keys (a
``.properties`` file, Spark options), rejecting unknown ones by name
(``broker_core.config.ConfigDef``). Either way each value is range-checked, then bad
*combinations* are rejected, naming every key involved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from broker_core.config import INT_MAX, ConfigDef, ConfigKey, ConfigValue
from broker_core.errors import InvalidConfigError
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from broker_core.protocol.wire import DEFAULT_BATCH_WINDOW
from broker_core.security.client_config import CLIENT_SASL_KEYS, sasl_credentials, uses_sasl
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT, SECURITY_PROTOCOL, TLS_KEYS, TlsSettings

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


def _declared(name: str) -> ConfigValue:
    return PRODUCER_CONFIG.key(name).default


def _int(name: str) -> int:
    """The declared default of int key ``name``: a field's default, never restated."""
    value = _declared(name)
    assert isinstance(value, int) and not isinstance(value, bool), name
    return value


def _bool(name: str) -> bool:
    value = _declared(name)
    assert isinstance(value, bool), name
    return value


def _str(name: str) -> str:
    value = _declared(name)
    assert isinstance(value, str), name
    return value


def _str_or_none(name: str) -> str | None:
    """The declared default of a text key whose empty value means "none"."""
    return _str(name) or None


# Fields that are not one key each: TLS and SASL settings of their own, typed there.
_GROUPED_FIELDS = ("tls", "sasl")


def key_of(field_name: str) -> str:
    """The key of a :class:`ProducerConfig` field: its name with dots for underscores
    (``linger_ms`` -> ``linger.ms``); no producer key has an underscore."""
    return field_name.replace("_", ".")


@dataclass(frozen=True)
class ProducerConfig:
    """The producer's settings, typed; one field per key of :data:`PRODUCER_CONFIG`
    (the field is the key with underscores for dots), its default the key's declared
    default, plus ``tls`` and ``sasl`` for the security keys.

    ``ProducerConfig(linger_ms=10, transactional_id="job-7/3")`` checks its values as
    :meth:`from_mapping` checks the keys' (range, choices, the rules between keys) and
    raises InvalidConfigError naming the key and the value. ``acks`` holds the wire value,
    ``ACKS_ALL`` (-1) or ``ACKS_LEADER`` (1) of ``broker_core.protocol.requests``;
    ``transactional_id`` and ``key_column`` are None when unset (an empty string is read as
    None).
    """

    bootstrap_servers: str = _str("bootstrap.servers")
    linger_ms: int = _int("linger.ms")
    batch_size: int = _int("batch.size")
    buffer_memory: int = _int("buffer.memory")
    max_block_ms: int = _int("max.block.ms")
    max_in_flight_requests_per_connection: int = _int("max.in.flight.requests.per.connection")
    retries: int = _int("retries")
    retry_backoff_ms: int = _int("retry.backoff.ms")
    request_timeout_ms: int = _int("request.timeout.ms")
    delivery_timeout_ms: int = _int("delivery.timeout.ms")
    enable_idempotence: bool = _bool("enable.idempotence")
    acks: int = parse_acks(_declared("acks"))
    transactional_id: str | None = _str_or_none("transactional.id")
    transaction_timeout_ms: int = _int("transaction.timeout.ms")
    partitioner: str = _str("partitioner")
    key_column: str | None = _str_or_none("key.column")
    tls: TlsSettings = PLAINTEXT  # the security.protocol and ssl.* keys (docs/security.md)
    sasl: SaslCredentials | None = None  # the sasl.* keys; None: no SASL

    def __post_init__(self) -> None:
        for item in fields(self):
            if item.name not in _GROUPED_FIELDS:
                self._check_value(item.name)
        self._check_security()
        self._check_combinations()

    @classmethod
    def from_mapping(cls, values: Mapping[str, object] | None = None) -> ProducerConfig:
        """The settings of ``values`` ({key: value}, the keys dotted as in
        conf/producer.properties; values typed or as text), defaults for the rest.

        Raises InvalidConfigError naming an unknown key (with the known key it resembles),
        a bad value with its key, or the keys of a bad combination."""
        v = PRODUCER_CONFIG.parse(values)
        return cls(
            bootstrap_servers=str(v["bootstrap.servers"]),
            linger_ms=int(v["linger.ms"]),
            batch_size=int(v["batch.size"]),
            buffer_memory=int(v["buffer.memory"]),
            max_block_ms=int(v["max.block.ms"]),
            max_in_flight_requests_per_connection=int(v["max.in.flight.requests.per.connection"]),
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

    def _check_value(self, name: str) -> None:
        """One field against its key's declaration: its type, range and choices."""
        key = PRODUCER_CONFIG.key(key_of(name))
        value = getattr(self, name)
        if name == "acks":
            if parse_acks(value) != value:
                raise InvalidConfigError(
                    f"acks={value!r}: the field holds the wire value, ACKS_ALL (-1) or "
                    "ACKS_LEADER (1)"
                )
            return
        if value is None and key.type is str and key.default == "":
            return  # transactional.id, key.column: None is the empty default
        if value == "" and name in ("transactional_id", "key_column"):
            object.__setattr__(self, name, None)  # the empty value means none, as a key's
            return
        # A bool is an int to Python; a key of one type takes no value of the other.
        if not isinstance(value, key.type) or isinstance(value, bool) != (key.type is bool):
            raise InvalidConfigError(
                f"{key.name}={value!r} ({name}) must be {key.type.__name__}, got "
                f"{type(value).__name__}"
            )
        key.parse(value)

    def _check_security(self) -> None:
        wants_sasl = uses_sasl(self.tls.protocol.value)
        if wants_sasl and self.sasl is None:
            raise InvalidConfigError(
                f"{SECURITY_PROTOCOL}={self.tls.protocol.value} needs sasl credentials "
                "(sasl.mechanism, sasl.username, sasl.password)"
            )
        if self.sasl is not None and not wants_sasl:
            raise InvalidConfigError(
                f"sasl credentials set but {SECURITY_PROTOCOL}={self.tls.protocol.value}: set "
                f"{SECURITY_PROTOCOL}=SASL_PLAINTEXT or SASL_SSL to authenticate"
            )

    def _check_combinations(self) -> None:
        in_flight = self.max_in_flight_requests_per_connection
        if self.enable_idempotence and in_flight > BROKER_BATCH_WINDOW:
            raise InvalidConfigError(
                f"max.in.flight.requests.per.connection={in_flight} exceeds the "
                f"broker's producer.state.batch.window ({BROKER_BATCH_WINDOW}) with "
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


def describe() -> list[tuple[str, str, str, str]]:
    """(name, type, default, doc) rows, for documentation."""
    return PRODUCER_CONFIG.describe()


PROPERTIES_HEADER = """\
# Producer client configuration: every key with its default. Load them with
#   Producer(config=ProducerConfig.from_mapping(load_properties(path)))
# (ProducerConfig: broker_core.producer; load_properties: broker_core.config).
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
