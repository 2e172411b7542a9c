"""Options of ``format("idemlog")``: every option declared once with type, default and doc.

Spark lower-cases option names before the data source sees them, so names are matched
case-insensitively; the README table is generated from :data:`OPTIONS` (and tested
against it). Options are parsed on the driver when the reader or writer is planned, so a
bad one fails the query before any task runs, with the option named. Options Spark itself
adds (``checkpointLocation``) are accepted and only kept; ``producer.<key>`` passes a key
of the producer client's configuration through (validated by that configuration), except
the keys the sink sets itself; ``producer.acks`` may only be ``all`` (or ``-1``), as the
sink writes in transactions.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from broker_core.client.broker_client import parse_bootstrap
from broker_core.config import INT_MAX, LONG_MAX, ConfigDef, ConfigKey, ConfigValue
from broker_core.errors import IdemlogError, InvalidConfigError, InvalidTopicError
from broker_core.producer.config import PRODUCER_CONFIG, ProducerConfig, parse_acks
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.topics import validate_topic_id, validate_user_topic_name
from broker_core.security.client_config import (
    CLIENT_SASL_KEY_NAMES,
    CLIENT_SASL_KEYS,
    sasl_credentials,
)
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT, TLS_KEY_NAMES, TLS_KEYS, TlsSettings
from spark_sink.embedded import (
    DEFAULT_PATH,
    IDLE_SHUTDOWN_DEFAULT_MS,
    IDLE_SHUTDOWN_OPTION,
    METRICS_OFF,
    METRICS_OPTION,
)
from spark_sink.hooks import OPTION as HOOKS_OPTION
from spark_sink.hooks import load_hooks
from spark_sink.read_offsets import (
    ENDING_OPTION,
    STARTING_OPTION,
    OffsetKind,
    OffsetSpec,
    parse_offset_spec,
)


class Scope(StrEnum):
    WRITE = "write"
    READ = "read"
    BOTH = "read, write"


# Producer keys the sink sets itself: a user value would break the protocol.
_SINK_OWNED_PRODUCER_KEYS = frozenset(
    {"bootstrap.servers", "transactional.id", "enable.idempotence", "key.column", "partitioner"}
    | TLS_KEY_NAMES  # the sink's own options of the same names apply to every link
    | CLIENT_SASL_KEY_NAMES
)
PRODUCER_PREFIX = "producer."
# Set by Spark on every streaming writer; not ours to validate, but kept: the driver's
# abort finds the query id in the checkpoint when no task reported.
_CHECKPOINT_OPTION = "checkpointlocation"
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
NO_SPLIT = 0  # minPartitions / maxRecordsPerPartition unset: one task per log partition
# Metadata columns added by includeMetadata=true.
PARTITION_COLUMN = "_partition"
OFFSET_COLUMN = "_offset"
DRIVER_RETRY_OPTION = "driver.retry.timeout.ms"
DRIVER_RETRY_DEFAULT_MS = 120_000  # Kafka's delivery.timeout.ms

_KEYS: list[tuple[ConfigKey, Scope]] = [
    (ConfigKey("topic", str, "", "Topic to write to or read from (required)."), Scope.BOTH),
    (
        ConfigKey(
            "brokers",
            str,
            "",
            "Brokers of a cluster, host:port[,host:port]. Empty: the embedded default, a "
            "local broker serving `path`, started on first use and shared by every task, "
            "commit and session on this machine.",
        ),
        Scope.BOTH,
    ),
    (
        ConfigKey(
            "path",
            str,
            DEFAULT_PATH,
            "Data directory of the embedded broker (only without `brokers`); its log is "
            "`<path>/broker.log`.",
        ),
        Scope.BOTH,
    ),
    (
        ConfigKey(
            METRICS_OPTION,
            int,
            METRICS_OFF,
            "The embedded broker's Prometheus endpoint (its `metrics.port`; only without "
            "`brokers`): -1 none; 0 any free port; else that port, on 127.0.0.1. Taken by "
            "the session that starts the broker; the port bound is in its log, "
            "`<path>/broker.json` and `idemlog broker list`. A broker already running "
            "without the endpoint asked for refuses the query, naming this option "
            "(docs/spark.md).",
            min=METRICS_OFF,
            max=65535,
        ),
        Scope.BOTH,
    ),
    (
        ConfigKey(
            IDLE_SHUTDOWN_OPTION,
            int,
            IDLE_SHUTDOWN_DEFAULT_MS,
            "The embedded broker's idle shutdown (its `idle.shutdown.ms`; only without "
            "`brokers`): it stops cleanly after this long with no call and no open "
            "transaction, and the next query starts it again; 0 never. Taken by the "
            "session that starts the broker (docs/spark.md).",
            min=0,
            max=LONG_MAX,
        ),
        Scope.BOTH,
    ),
    (
        ConfigKey(
            "key",
            str,
            "",
            "Column whose hash routes a row to a log partition (rows of one key stay in "
            "order in one partition). Empty: each Spark task's rows go round-robin.",
        ),
        Scope.WRITE,
    ),
    (
        ConfigKey(
            "partitions",
            int,
            4,
            "Partitions of a topic the writer creates because it does not exist yet.",
            min=1,
            max=10_000,
        ),
        Scope.WRITE,
    ),
    (
        # The producer's key (its type and bounds declared once there), with the sink's
        # default: a batch's transactions stay open no longer than this without a sign
        # of life, so a dead driver holds readers back for less than the producer's 60 s.
        replace(
            PRODUCER_CONFIG.key("transaction.timeout.ms"),
            default=20_000,
            doc="How long the broker keeps a batch's transactions open with no sign of life: "
            "while any task of the batch runs it sends heartbeats (every quarter of this), "
            "so a batch may take as long as it needs; once its tasks are gone and the "
            "driver has not committed within this time (a killed driver or job), the "
            "broker aborts them, so they hold readers back at most this long plus the "
            "broker's transaction.abort.timed.out.transaction.cleanup.interval.ms. At most "
            "the broker's transaction.max.timeout.ms.",
        ),
        Scope.WRITE,
    ),
    (
        ConfigKey(
            DRIVER_RETRY_OPTION,
            int,
            DRIVER_RETRY_DEFAULT_MS,
            "How long the driver's plan of a batch (a write's topic lookup or creation, a "
            "stream read's next offsets) and a write's commit or abort keep asking again "
            "while the brokers do not answer or answer retriably (a broker restarting, a "
            "leader or the coordinator moving), counted from the first failure; then the "
            "query fails with one line naming this option. The default is Kafka's "
            "delivery.timeout.ms, which Spark's Kafka sink rides a restart on; a write's "
            "tasks ride it on producer.delivery.timeout.ms and producer.max.block.ms, a "
            'read\'s tasks fetch again for 30 s (docs/spark.md, "A broker restart").',
            min=0,
            max=INT_MAX,
        ),
        Scope.BOTH,
    ),
    (
        ConfigKey(
            "isolation",
            str,
            "read_committed",
            "read_committed: committed rows only, up to the last stable offset; "
            "read_uncommitted: everything appended, including open and aborted "
            "transactions.",
            choices=ISOLATION_LEVELS,
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            STARTING_OPTION,
            str,
            OffsetKind.EARLIEST.value,
            "Where a read starts, as Spark's Kafka source's option: earliest (the log "
            "start), latest (the readable end; streams only) or per-partition JSON naming "
            'the topic and every partition, `{"payments":{"0":23,"1":-2}}` (-2 earliest, '
            "-1 latest). A batch read starts there; a new streaming query too, and a "
            "restarted one continues from its checkpoint.",
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            ENDING_OPTION,
            str,
            OffsetKind.LATEST.value,
            "Where a batch read ends (exclusive), as Spark's Kafka source's option: latest "
            "(the readable end when the read is planned) or per-partition JSON as "
            "startingOffsets (-1 latest; earliest is refused). Batch reads only: a "
            "streaming query reads on.",
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            "maxOffsetsPerTrigger",
            int,
            0,
            "Most offsets (rows) one micro-batch of a stream reads, split over the "
            "partitions in proportion to their backlog; 0: no limit. With "
            "Trigger.AvailableNow a run reads what was there at its start in such batches "
            '(docs/spark.md "Catching up").',
            min=0,
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            "minPartitions",
            int,
            NO_SPLIT,
            "Minimum number of Spark tasks a read (or a micro-batch) is split into, as "
            "Spark's Kafka source's option: when the log partitions with rows to read are "
            "fewer, the large ones are cut into consecutive offset sub-ranges below the "
            "same planned end, about this many in all (rounding may miss by a few). Unset "
            "(0): one task per log partition. At least 1 if set.",
            min=1,
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            "maxRecordsPerPartition",
            int,
            NO_SPLIT,
            "Most offsets (rows, counting transaction markers) one Spark task reads, as "
            "Spark's Kafka source's option: a log partition's range is cut into even "
            "sub-ranges of at most this many; with minPartitions too, the pieces are then "
            "cut further if fewer than minPartitions. Unset (0): no limit. At least 1 if "
            "set.",
            min=1,
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            "topicId",
            str,
            "",
            "The topic's id (32 hex digits, `idemlog topics describe --json`) the read must find: "
            "a topic deleted and recreated under the name since has another, and the query "
            "fails naming it. Empty: the id the topic has when the read is planned (which "
            "a streaming query then keeps in its checkpoint).",
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            "includeMetadata",
            bool,
            False,
            f"Add the columns `{PARTITION_COLUMN}` (int) and `{OFFSET_COLUMN}` (bigint): "
            "where each row is in the log.",
        ),
        Scope.READ,
    ),
    (
        ConfigKey(
            HOOKS_OPTION,
            str,
            "",
            "A class that observes or disturbs this write, `module:Class` (a subclass of "
            "`spark_sink.hooks.SinkHooks`, built with no arguments once in each Python "
            "process of the write; its module importable on the driver and the executors). "
            "Empty: none. Nothing in idemlog's package is one: the fault tests' failure "
            "injection and the benchmarks' timing spans name their own (docs/spark.md, "
            "Hooks).",
        ),
        Scope.WRITE,
    ),
]

# security.protocol and ssl.*: declared once (broker_core/security/tls.py), sasl.* too
# (broker_core/security/client_config.py); every link of the sink and the source, the
# driver's and each task's, uses them (docs/security.md).
_KEYS += [(key, Scope.BOTH) for key in (*TLS_KEYS, *CLIENT_SASL_KEYS)]

OPTIONS = ConfigDef([k for k, _ in _KEYS], what="idemlog option")
SCOPES: dict[str, Scope] = {k.name: s for k, s in _KEYS}
_BY_LOWER: dict[str, str] = {k.name.lower(): k.name for k, _ in _KEYS}


@dataclass(frozen=True)
class IdemlogOptions:
    """Parsed options; picklable, so executors get the driver's validated copy."""

    topic: str
    brokers: str
    path: str
    key: str | None
    partitions: int
    transaction_timeout_ms: int
    isolation: str
    starting_offsets: OffsetSpec  # the option startingOffsets
    max_offsets_per_trigger: int
    include_metadata: bool
    producer: dict[str, Any]
    # The credentials of every client the job builds (None: no SASL); its repr hides
    # the password, which no message, log line or checkpoint file of the sink holds.
    sasl: SaslCredentials | None
    # Spark's own option, kept for the driver's abort: the checkpoint's metadata file
    # names the streaming query (the sink id) when no task reported.
    checkpoint_location: str = ""
    tls: TlsSettings = PLAINTEXT  # the options security.protocol and ssl.*
    hooks: str = ""  # the option hooks: module:Class of the write's SinkHooks, "" none
    embedded_metrics_port: int = METRICS_OFF  # the option embedded.metrics.port
    # The option embedded.idle.shutdown.ms.
    embedded_idle_shutdown_ms: int = IDLE_SHUTDOWN_DEFAULT_MS
    min_partitions: int = NO_SPLIT  # the option minPartitions (reads)
    max_records_per_partition: int = NO_SPLIT  # the option maxRecordsPerPartition (reads)
    topic_id: str = ""  # the option topicId (reads): "" any, the id found at planning
    # The option endingOffsets (batch reads); None: not given (a stream refuses it).
    ending_offsets: OffsetSpec | None = None
    driver_retry_timeout_ms: int = DRIVER_RETRY_DEFAULT_MS  # the option driver.retry.timeout.ms

    @property
    def embedded(self) -> bool:
        return not self.brokers

    def bootstrap(self) -> str:
        """host:port list of the cluster, starting the embedded broker if it is needed."""
        if self.brokers:
            return self.brokers
        from spark_sink.embedded import ensure_broker

        return ensure_broker(
            self.path,
            metrics_port=self.embedded_metrics_port,
            idle_shutdown_ms=self.embedded_idle_shutdown_ms,
        )


def parse_options(options: Mapping[str, str], scope: Scope) -> IdemlogOptions:
    """Validate Spark's (lower-cased) options for a reader or a writer."""
    values: dict[str, object] = {}
    producer: dict[str, str] = {}
    checkpoint = ""
    for raw_name, value in options.items():
        lower = raw_name.lower()
        if lower == _CHECKPOINT_OPTION:
            checkpoint = value
            continue
        if lower.startswith(PRODUCER_PREFIX):
            if scope is Scope.READ:
                raise InvalidConfigError(f"option {raw_name!r} applies to writes only")
            key = lower[len(PRODUCER_PREFIX) :]
            if key in _SINK_OWNED_PRODUCER_KEYS:
                raise InvalidConfigError(
                    f"option {raw_name!r}: the sink sets producer key {key!r} itself"
                )
            producer[key] = value
            continue
        name = _BY_LOWER.get(lower)
        if name is None:
            hint = difflib.get_close_matches(lower, _BY_LOWER, n=1)
            suggestion = f" (did you mean {_BY_LOWER[hint[0]]!r}?)" if hint else ""
            suggestion = _kafka_hint(lower, scope) or suggestion
            known = ", ".join(k.name for k in OPTIONS)
            raise InvalidConfigError(
                f"unknown idemlog option {raw_name!r}{suggestion}; options: {known}, "
                f"{PRODUCER_PREFIX}<producer key>"
            )
        if scope.value not in SCOPES[name].value:
            raise InvalidConfigError(
                f"option {name!r} applies to {SCOPES[name].value}s only, not to this {scope.value}"
            )
        values[name] = value
    parsed: dict[str, ConfigValue] = OPTIONS.parse(values)
    topic = str(parsed["topic"])
    if not topic:
        raise InvalidConfigError("option 'topic' is required: .option('topic', '<name>')")
    try:
        validate_user_topic_name(topic)
    except InvalidTopicError as exc:
        raise InvalidConfigError(f"option 'topic'={topic!r}: {exc.message}") from None
    brokers = str(parsed["brokers"])
    if brokers:
        try:
            parse_bootstrap(brokers)
        except IdemlogError as exc:
            raise InvalidConfigError(f"option 'brokers'={brokers!r}: {exc.message}") from None
    metrics_port = int(parsed[METRICS_OPTION])
    if brokers and metrics_port != METRICS_OFF:
        raise InvalidConfigError(
            f"option {METRICS_OPTION!r}={metrics_port} applies to the embedded broker only, "
            "not with option 'brokers': a cluster's brokers set metrics.port in their own "
            "config (docs/operations.md)"
        )
    if brokers and IDLE_SHUTDOWN_OPTION in values:
        raise InvalidConfigError(
            f"option {IDLE_SHUTDOWN_OPTION!r} applies to the embedded broker only, not with "
            "option 'brokers': a cluster's brokers set idle.shutdown.ms in their own config"
        )
    topic_id = str(parsed["topicId"])
    if topic_id:
        try:
            validate_topic_id(topic_id, "option 'topicId'")
        except IdemlogError as exc:
            raise InvalidConfigError(exc.message) from None
    tls = TlsSettings.from_values(parsed)
    if tls.encrypted and not brokers:
        raise InvalidConfigError(
            f"option 'security.protocol'={tls.protocol.value} needs option 'brokers': the "
            "embedded broker listens on loopback in plaintext (docs/security.md)"
        )
    if "acks" in producer:
        # Before the producer's own rules: those would ask for enable.idempotence=false,
        # a key the sink sets itself, which would leave the user nothing to do.
        _check_sink_acks(producer["acks"])
    if producer:
        try:
            ProducerConfig.from_mapping(producer)
        except IdemlogError as exc:
            raise InvalidConfigError(f"option {PRODUCER_PREFIX}*: {exc.message}") from None
    sasl = sasl_credentials({k: v for k, v in parsed.items() if k in values})
    if sasl is not None and not brokers:
        raise InvalidConfigError(
            f"option 'security.protocol'={tls.protocol.value} needs 'brokers': the embedded "
            "default broker listens on loopback without authentication"
        )
    hooks = str(parsed[HOOKS_OPTION])
    load_hooks(hooks)  # here, on the driver: a name that cannot be loaded fails the plan
    return IdemlogOptions(
        topic=topic,
        sasl=sasl,
        brokers=brokers,
        path=str(parsed["path"]),
        key=str(parsed["key"]) or None,
        partitions=int(parsed["partitions"]),
        transaction_timeout_ms=int(parsed["transaction.timeout.ms"]),
        driver_retry_timeout_ms=int(parsed[DRIVER_RETRY_OPTION]),
        isolation=str(parsed["isolation"]),
        starting_offsets=parse_offset_spec(STARTING_OPTION, str(parsed[STARTING_OPTION]), topic),
        ending_offsets=(
            parse_offset_spec(ENDING_OPTION, str(parsed[ENDING_OPTION]), topic)
            if ENDING_OPTION in values
            else None
        ),
        max_offsets_per_trigger=int(parsed["maxOffsetsPerTrigger"]),
        include_metadata=bool(parsed["includeMetadata"]),
        min_partitions=int(parsed["minPartitions"]),
        max_records_per_partition=int(parsed["maxRecordsPerPartition"]),
        topic_id=topic_id,
        hooks=hooks,
        embedded_metrics_port=metrics_port,
        embedded_idle_shutdown_ms=int(parsed[IDLE_SHUTDOWN_OPTION]),
        checkpoint_location=checkpoint,
        producer=producer,
        tls=tls,
    )


# Options of Spark's Kafka source and sink a Kafka user types first, lower-cased as
# Spark passes them, and idemlog's own for the same thing.
_KAFKA_OPTIONS = {
    "kafka.bootstrap.servers": "'brokers' (host:port[,host:port]; empty: the embedded broker)",
    "subscribe": "'topic' (one topic)",
    "subscribepattern": "'topic' (one topic; patterns are not supported)",
    "assign": "'topic' with 'startingOffsets'/'endingOffsets' JSON (every partition is read)",
    "failondataloss": "nothing: lost offsets always fail the read, naming them",
    "kafka.isolation.level": "'isolation'",
    "kafka.security.protocol": "'security.protocol'",
    "kafkaconsumer.polltimeoutms": "nothing: reads stream whole ranges",
}


def _kafka_hint(lower: str, scope: Scope) -> str:
    """`` (a Kafka option: idemlog's is ...)`` for an option of Spark's Kafka source or
    sink, else ""."""
    idemlog = _KAFKA_OPTIONS.get(lower)
    if idemlog is None and lower.startswith("kafka."):
        key = lower[len("kafka.") :]
        if key in _BY_LOWER:
            idemlog = repr(_BY_LOWER[key])
        elif scope is Scope.WRITE:
            idemlog = f"'{PRODUCER_PREFIX}{key}' (a producer key)"
        else:
            idemlog = "none (a consumer key: idemlog's reader takes the options below)"
    return f" (an option of Spark's Kafka connector: idemlog's is {idemlog})" if idemlog else ""


def _check_sink_acks(value: str) -> None:
    """Refuse a ``producer.acks`` the sink cannot write with: every task writes its rows
    in a transaction, and a transactional producer requires acks=all (a committed batch
    must be on every in-sync replica, not only on a leader that may fail). Raises
    InvalidConfigError naming the option and the value."""
    try:
        acks: int | None = parse_acks(value)
    except IdemlogError:
        acks = None  # 0 or garbage: the same answer, the only value the sink can take
    if acks != ACKS_ALL:
        raise InvalidConfigError(
            f"option '{PRODUCER_PREFIX}acks'={value!r}: the sink writes every batch in a "
            "transaction, which requires acks=all (or -1, the default)"
        )
