"""Broker configuration: every key declared once, with its type, default, range and doc.

A broker reads a ``.properties`` file (``conf/broker.properties`` holds the defaults with
their docs) plus ``--override key=value`` pairs. Besides its own keys it accepts
``log.<key>`` for every topic key of :data:`broker_core.log.config.LOG_CONFIG`: the
broker-wide defaults a topic's own overrides are laid over (``log.flush.messages=1``
makes every topic fsync each append unless the topic says otherwise).
"""

from __future__ import annotations

import textwrap
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_core.config import (
    INT_MAX,
    LONG_MAX,
    ConfigDef,
    ConfigKey,
    ConfigValue,
    load_properties,
)
from broker_core.errors import InvalidConfigError
from broker_core.log.config import LOG_CONFIG, LogConfig
from broker_core.security.tls import ClientAuth, TlsSettings
from broker_core.security.zk_acl import ZK_ACL_KEYS, ZkAuth
from broker_core.security.zk_tls import SECURITY_KEYS
from broker_core.server.config.acl import ACL_KEYS, AuthorizationConfig, brokers_principal
from broker_core.server.config.groups import GROUP_KEYS, OffsetsTopicConfig
from broker_core.server.config.kafka import KAFKA_KEYS, KAFKA_LISTENER, KafkaListenerConfig
from broker_core.server.config.metrics import METRICS_KEYS, MetricsEndpointConfig
from broker_core.server.config.security import SASL_KEYS, SecurityConfig
from broker_core.server.config.timeouts import (
    ack_timeout_ms,
    check_timeouts,
    marker_call_timeout_ms,
)
from broker_core.server.hooks import HOOKS_CLASS_KEY

IDLE_SHUTDOWN_KEY = "idle.shutdown.ms"  # the idle shutdown: server/process/idle.py
NEVER = 0  # idle.shutdown.ms: the broker never stops on its own

LOG_PREFIX = "log."
# The znode under which a ZooKeeper cluster keeps its metadata and the coordinator its state.
ZK_ROOT = "/idemlog"

_BROKER_KEYS = [
    ConfigKey(
        "broker.id",
        int,
        0,
        "This broker's id, unique in the cluster; the leader of partitions assigned to it.",
        min=0,
        max=INT_MAX,
    ),
    ConfigKey(
        "listener.host",
        str,
        "127.0.0.1",
        "Address the Arrow Flight server binds to (0.0.0.0: every interface), and advertises "
        "to clients unless listener.advertised.host is set.",
    ),
    ConfigKey(
        "listener.port",
        int,
        9092,
        "Port of the Arrow Flight server; 0 picks a free one.",
        min=0,
        max=65535,
    ),
    ConfigKey(
        "listener.advertised.host",
        str,
        "",
        "Host clients and other brokers are told to connect to (Kafka's advertised.listeners), "
        "when it differs from the bind address: behind NAT, a proxy or in a container. Empty: "
        "listener.host, which must then not be a wildcard address.",
    ),
    ConfigKey(
        "listener.advertised.port",
        int,
        0,
        "Port clients and other brokers are told to connect to; 0: the bound port. The "
        "LISTENING line prints the advertised host:port.",
        min=0,
        max=65535,
    ),
    ConfigKey(
        "log.dir",
        str,
        "/tmp/idemlog-logs",
        "Directory of the broker's topics; in embedded mode also the cluster metadata, "
        "the producer id block record and the transaction state. Created with mode 0700 "
        "when missing; an existing one keeps its mode.",
    ),
    ConfigKey(
        "zookeeper.connect",
        str,
        "",
        "ZooKeeper connection string (host:port[,host:port][/chroot]). Empty: embedded "
        "single-broker mode, with all metadata in files under log.dir.",
    ),
    ConfigKey(
        "zookeeper.session.timeout.ms",
        int,
        18000,
        "ZooKeeper session timeout; a broker silent this long loses its registration.",
        min=1000,
        max=600_000,
    ),
    ConfigKey(
        "max.request.bytes",
        int,
        100 * 1024**2,
        "Largest produce batch (Arrow buffers) or action body a request may carry; larger "
        "ones are answered with MESSAGE_TOO_LARGE.",
        min=1024,
        max=INT_MAX,
    ),
    ConfigKey(
        "transaction.max.timeout.ms",
        int,
        900_000,
        "Largest transaction timeout a producer may ask for in InitProducerId.",
        min=1,
        max=INT_MAX,
    ),
    ConfigKey(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        int,
        2_000,
        "How often the coordinator looks for transactions open longer than their timeout "
        "and aborts them.",
        min=1,
    ),
    ConfigKey(
        "transaction.state.log.segment.bytes",
        int,
        100 * 1024 * 1024,
        "Segment size of the internal topic __transaction_state, set when the topic is "
        "created (an existing topic keeps its own). The topic is compacted: the log cleaner "
        "keeps the newest record per transactional id and sink, and only closed segments are "
        "cleaned, so this bounds the state on disk above what is alive. Kafka's key and "
        "default (100 MiB); at least 1 MiB, since a record must fit in one segment.",
        min=1024 * 1024,
        max=INT_MAX,
    ),
    ConfigKey(
        "transaction.state.log.num.partitions",
        int,
        8,
        "Partitions of __transaction_state (ZooKeeper mode), fixed when the cluster first "
        "needs it: an id's coordinator is the leader of partition crc32(id's part before the "
        "first '/') mod this, so coordination is spread over the brokers and a failover "
        "stalls only its partitions' ids. An existing topic keeps its count whatever this "
        "says (a change would move ids between coordinators, as in Kafka). Default 8: spread "
        "over up to 8 brokers at the cost of a load, a thread and a reader's question per "
        "partition (Kafka's 50 serves far larger clusters); at most 1000. The embedded "
        "broker always has 1 (one process: nothing to spread).",
        min=1,
        max=1000,
    ),
    ConfigKey(
        "transaction.state.log.replication.factor",
        int,
        -1,
        "Replicas of each __transaction_state partition, set when the topic is created. "
        "-1: min(3, live brokers). More than the live brokers is refused at creation "
        "(INVALID_REPLICATION_FACTOR). Kafka's key.",
        min=-1,
        max=32767,
    ),
    ConfigKey(
        "transaction.state.log.min.isr",
        int,
        2,
        "min.insync.replicas of __transaction_state (capped at its replication factor): "
        "a coordinator's state change is an acks=all append, refused while fewer replicas "
        "are in sync. Kafka's key and default.",
        min=1,
    ),
    ConfigKey(
        "transaction.state.log.delete.retention.ms",
        int,
        86_400_000,
        "How long a tombstone of an expired transactional id or sink stays in "
        "__transaction_state after the log cleaner first reached it (the topic's "
        "delete.retention.ms, set when it is created). A replica that was away longer may "
        "keep a removed id's last record (Kafka's rule for compacted topics).",
        min=1,
    ),
    ConfigKey(
        "transactional.id.expiration.ms",
        int,
        604_800_000,
        "How long the coordinator keeps a transactional id no producer used (state EMPTY or "
        "COMPLETE_*, no pending sink commit naming it, no task of its run alive): then it "
        "goes DEAD and its record is removed (a tombstone in __transaction_state, a deleted "
        "znode). A producer still holding it gets INVALID_PRODUCER_ID_MAPPING and must "
        "initialise again (a new producer id). A df.write job's sink record goes with its "
        "last id. Kafka's key and default (7 days).",
        min=1,
        max=INT_MAX,
    ),
    ConfigKey(
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        int,
        3_600_000,
        "How often the coordinator removes transactional ids and sink records past their "
        "expiry (transactional.id.expiration.ms, sink.stream.expiration.ms). Kafka's key and "
        "default (1 hour).",
        min=1,
        max=INT_MAX,
    ),
    ConfigKey(
        "sink.stream.expiration.ms",
        int,
        -1,
        "How long a streaming query's sink record (its last committed batch id) is kept "
        "once the query's transactional ids expired and it committed nothing. -1: forever "
        "(one small record per query ever run). A query restarted from its checkpoint "
        "after its record expired may write its last batch twice (docs/failure-model.md, "
        "'Expiry'): set it only longer than any query stays stopped.",
        min=-1,
        max=LONG_MAX,
    ),
    ConfigKey(
        "producer.id.expiration.check.interval.ms",
        int,
        600_000,
        "How often producers idle past producer.id.expiration.ms are dropped from the "
        "partitions' state (opening a partition, as at a restart, drops them too).",
        min=1,
    ),
    ConfigKey(
        "log.retention.check.interval.ms",
        int,
        300_000,
        "How often segments past retention.ms / retention.bytes are deleted.",
        min=1,
    ),
    ConfigKey(
        "log.cleaner.enable",
        bool,
        True,
        "Run the log cleaner: compact the partitions of topics whose cleanup.policy "
        "includes compact (docs/storage.md, Compaction). Off: they are never compacted.",
    ),
    ConfigKey(
        "log.cleaner.backoff.ms",
        int,
        15_000,
        "How often the log cleaner looks for partitions due a pass (dirty ratio, "
        "delete.retention.ms).",
        min=1,
        max=LONG_MAX,
    ),
    ConfigKey(
        "default.replication.factor",
        int,
        -1,
        "Replicas of a topic created without replication.factor. -1: min(3, live brokers) "
        "with ZooKeeper, 1 embedded (a single broker). More than the live brokers is "
        "refused at creation (INVALID_REPLICATION_FACTOR).",
        min=-1,
        max=32767,
    ),
    ConfigKey(
        "replica.lag.time.max.ms",
        int,
        30_000,
        "A follower that has not caught up with the leader's log end for this long is "
        "dropped from the in-sync replicas (acks=all stops waiting for it); it rejoins "
        "once it catches up.",
        min=1,
        max=LONG_MAX,
    ),
    ConfigKey(
        "transaction.marker.retry.deadline.ms",
        int,
        90_000,
        "How long the coordinator retries a transaction's markers that failed retriably "
        "(a leader down or being replaced) before it gives up the call (the transaction "
        "stays PREPARE_x and is finished by its cleanup pass). Must exceed the marker "
        "call's timeout, 2 x replica.lag.time.max.ms + 10 s, and "
        "zookeeper.session.timeout.ms (docs/failure-model.md, the commit path's timeouts).",
        min=1,
        max=INT_MAX,
    ),
    ConfigKey(
        "replica.fetch.wait.max.ms",
        int,
        500,
        "How long a follower's fetch waits at the leader for new batches before it is "
        "answered empty (a long poll: new batches are sent at once).",
        min=0,
        max=INT_MAX,
    ),
    ConfigKey(
        "replica.fetch.max.bytes",
        int,
        1024**2,
        "Bytes of batches a follower's fetch asks for (at least one whole batch is sent).",
        min=1024,
        max=INT_MAX,
    ),
    ConfigKey(
        "replica.fetch.backoff.ms",
        int,
        200,
        "How long a follower waits before fetching again after a failed fetch.",
        min=0,
        max=INT_MAX,
    ),
    ConfigKey(
        "log.flush.scheduler.interval.ms",
        int,
        1000,
        "How often logs without appends are checked against flush.ms.",
        min=1,
        max=LONG_MAX,
    ),
    ConfigKey(
        IDLE_SHUTDOWN_KEY,
        int,
        NEVER,
        "Stop cleanly, as on SIGTERM, once this long has passed since the last call ended, "
        "with none in flight and no transaction open; 0 never. The Spark sink's embedded "
        "broker is started with the sink option embedded.idle.shutdown.ms (30 minutes by "
        "default).",
        min=0,
        max=LONG_MAX,
    ),
    ConfigKey(
        HOOKS_CLASS_KEY,
        str,
        "",
        "Never in production. The test hooks this broker asks at its failure-injection "
        "points, as module:Class (a subclass of broker_core.server.hooks.BrokerHooks), "
        "built at start; a class that cannot be loaded refuses the start. The fault tests' "
        "testkit.broker_failpoints:BrokerFailpoints (a checkout's, never in the wheel) lets "
        "IDEMLOG_TEST_FAILPOINT kill or stall the broker at a named point (docs/security.md, "
        "Test hooks). Empty: none, and that variable is ignored, with one warning naming it.",
    ),
]


def _topic_default_keys() -> list[ConfigKey]:
    return [
        ConfigKey(
            LOG_PREFIX + key.name,
            key.type,
            key.default,
            f"Broker-wide default of the topic key {key.name}: {key.doc}",
            min=key.min,
            max=key.max,
            choices=key.choices,
        )
        for key in LOG_CONFIG
        # The factor is the cluster's choice at creation (default.replication.factor),
        # not a property of a log that a broker-wide default could change.
        if key.name != "replication.factor"
    ]


# Bind addresses that mean "every interface": never an address to hand to a client.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

BROKER_CONFIG = ConfigDef(
    [
        *_BROKER_KEYS,
        *SECURITY_KEYS,
        *SASL_KEYS,
        *ZK_ACL_KEYS,  # zookeeper.set.acl, zookeeper.auth.digest.*: security/zk_acl.py
        *METRICS_KEYS,  # metrics.port, metrics.host: server/config/metrics.py
        *ACL_KEYS,  # authorizer.enable, super.users: server/config/acl.py
        *KAFKA_KEYS,  # kafka.listener, kafka.advertised.listener: server/config/kafka.py
        *GROUP_KEYS,  # offsets.*, group.*: server/config/groups.py
        *_topic_default_keys(),
    ],
    what="broker",
)


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: int
    listener_host: str
    listener_port: int
    advertised_host: str  # what clients are told: listener.advertised.host or listener.host
    advertised_port: int  # 0: the bound port
    log_dir: Path
    zookeeper_connect: str  # as given: hosts and chroot, what the broker's client connects to
    zookeeper_hosts: str  # host:port[,host:port], without the chroot
    zookeeper_chroot: str  # the chroot, checked ("/a/b"); "" for none
    zookeeper_session_timeout_ms: int
    max_request_bytes: int
    transaction_max_timeout_ms: int
    transaction_cleanup_interval_ms: int
    transactional_id_expiration_ms: int
    transaction_state_log_segment_bytes: int
    transaction_state_log_delete_retention_ms: int
    transaction_state_log_num_partitions: int
    transaction_state_log_replication_factor: int  # -1: min(3, live brokers)
    transaction_state_log_min_isr: int
    expired_transaction_cleanup_interval_ms: int
    sink_stream_expiration_ms: int  # -1: a stream's sink record never expires
    producer_id_expiration_check_interval_ms: int
    log_retention_check_interval_ms: int
    log_flush_scheduler_interval_ms: int
    log_cleaner_enable: bool
    log_cleaner_backoff_ms: int
    test_hooks_class: str  # module:Class of its test hooks; "": none (server/hooks.py)
    idle_shutdown_ms: int  # 0: never stops on its own (broker_core/server/process/idle.py)
    default_replication_factor: int  # -1: min(3, live brokers) with ZooKeeper, 1 embedded
    replica_lag_time_max_ms: int
    transaction_marker_retry_deadline_ms: int
    replica_fetch_wait_max_ms: int
    replica_fetch_max_bytes: int
    replica_fetch_backoff_ms: int
    log_defaults: LogConfig  # the log.<key> values, as a topic's base config
    tls: TlsSettings  # security.protocol and ssl.*: the listener's and the broker's links
    security: SecurityConfig  # sasl.*: the listener's authentication, the broker's principal
    metrics: MetricsEndpointConfig  # metrics.*: the Prometheus endpoint (off by default)
    authorization: AuthorizationConfig  # authorizer.enable, super.users (acl_config.py)
    kafka: KafkaListenerConfig  # kafka.listener: Kafka's protocol (off by default)
    offsets: OffsetsTopicConfig  # offsets.*, group.*: consumer groups (server/config/groups.py)
    values: Mapping[str, ConfigValue]  # every key, typed, for display

    @property
    def embedded(self) -> bool:
        return not self.zookeeper_connect

    @property
    def ack_timeout_s(self) -> float:
        return ack_timeout_ms(self.replica_lag_time_max_ms) / 1000.0

    @property
    def marker_call_timeout_s(self) -> float:
        return marker_call_timeout_ms(self.replica_lag_time_max_ms) / 1000.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, object] | None = None) -> BrokerConfig:
        parsed = BROKER_CONFIG.parse(values)
        topic_defaults = {
            name[len(LOG_PREFIX) :]: value
            for name, value in parsed.items()
            if name.startswith(LOG_PREFIX) and name[len(LOG_PREFIX) :] in LOG_CONFIG
        }
        try:
            log_defaults = LogConfig.from_mapping(topic_defaults)
        except InvalidConfigError as exc:
            # The topic-level check names topic keys; say which broker keys they came from.
            # Same type: a refused log.replication.factor stays INVALID_REPLICATION_FACTOR.
            raise type(exc)(f"broker topic defaults (log.*): {exc.message}") from exc
        check_timeouts(parsed)
        if parsed["default.replication.factor"] == 0:
            raise InvalidConfigError(
                "default.replication.factor=0: a topic needs at least one replica (-1 lets "
                "the cluster choose)"
            )
        bind_host = str(parsed["listener.host"])
        advertised_host = str(parsed["listener.advertised.host"]).strip() or bind_host
        if advertised_host in _WILDCARD_HOSTS:
            raise InvalidConfigError(
                f"listener.host={bind_host!r} binds every interface, which no client can "
                "connect to: set listener.advertised.host to the address clients use"
            )
        if not str(parsed["log.dir"]).strip():
            raise InvalidConfigError(f"log.dir={parsed['log.dir']!r} must name a directory")
        zookeeper_connect = str(parsed["zookeeper.connect"]).strip()
        ZkAuth.from_values(parsed)  # checked at load; the broker's ZooKeeper clients use it
        zookeeper_hosts, zookeeper_chroot = split_zookeeper_connect(zookeeper_connect)
        security = SecurityConfig.from_parsed(parsed, embedded=not zookeeper_connect)
        tls = TlsSettings.from_values(parsed)
        authorization = AuthorizationConfig.from_parsed(
            parsed,
            embedded=not zookeeper_connect,
            broker_principal=brokers_principal(parsed, security, tls),
        )
        kafka = KafkaListenerConfig.from_parsed(parsed)
        _check_kafka_listener_opens_nothing_closed(kafka, security, tls)
        return cls(
            broker_id=int(parsed["broker.id"]),
            listener_host=str(parsed["listener.host"]),
            listener_port=int(parsed["listener.port"]),
            advertised_host=advertised_host,
            advertised_port=int(parsed["listener.advertised.port"]),
            log_dir=Path(str(parsed["log.dir"])),
            zookeeper_connect=zookeeper_connect,
            zookeeper_hosts=zookeeper_hosts,
            zookeeper_chroot=zookeeper_chroot,
            zookeeper_session_timeout_ms=int(parsed["zookeeper.session.timeout.ms"]),
            max_request_bytes=int(parsed["max.request.bytes"]),
            transaction_max_timeout_ms=int(parsed["transaction.max.timeout.ms"]),
            transaction_cleanup_interval_ms=int(
                parsed["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
            ),
            transactional_id_expiration_ms=int(parsed["transactional.id.expiration.ms"]),
            transaction_state_log_segment_bytes=int(parsed["transaction.state.log.segment.bytes"]),
            transaction_state_log_delete_retention_ms=int(
                parsed["transaction.state.log.delete.retention.ms"]
            ),
            transaction_state_log_num_partitions=int(
                parsed["transaction.state.log.num.partitions"]
            ),
            transaction_state_log_replication_factor=int(
                parsed["transaction.state.log.replication.factor"]
            ),
            transaction_state_log_min_isr=int(parsed["transaction.state.log.min.isr"]),
            expired_transaction_cleanup_interval_ms=int(
                parsed["transaction.remove.expired.transaction.cleanup.interval.ms"]
            ),
            sink_stream_expiration_ms=int(parsed["sink.stream.expiration.ms"]),
            producer_id_expiration_check_interval_ms=int(
                parsed["producer.id.expiration.check.interval.ms"]
            ),
            log_retention_check_interval_ms=int(parsed["log.retention.check.interval.ms"]),
            log_flush_scheduler_interval_ms=int(parsed["log.flush.scheduler.interval.ms"]),
            log_cleaner_enable=bool(parsed["log.cleaner.enable"]),
            log_cleaner_backoff_ms=int(parsed["log.cleaner.backoff.ms"]),
            test_hooks_class=str(parsed[HOOKS_CLASS_KEY]).strip(),
            idle_shutdown_ms=int(parsed[IDLE_SHUTDOWN_KEY]),
            default_replication_factor=int(parsed["default.replication.factor"]),
            replica_lag_time_max_ms=int(parsed["replica.lag.time.max.ms"]),
            transaction_marker_retry_deadline_ms=int(
                parsed["transaction.marker.retry.deadline.ms"]
            ),
            replica_fetch_wait_max_ms=int(parsed["replica.fetch.wait.max.ms"]),
            replica_fetch_max_bytes=int(parsed["replica.fetch.max.bytes"]),
            replica_fetch_backoff_ms=int(parsed["replica.fetch.backoff.ms"]),
            log_defaults=log_defaults,
            tls=tls,
            security=security,
            metrics=MetricsEndpointConfig.from_parsed(parsed),
            authorization=authorization,
            kafka=kafka,
            offsets=OffsetsTopicConfig.from_parsed(parsed),
            values=parsed,
        )

    @classmethod
    def load(cls, path: str | Path | None, overrides: Sequence[str] = ()) -> BrokerConfig:
        """The file's keys (none if ``path`` is None), then ``key=value`` overrides."""
        values: dict[str, object] = dict(load_properties(path)) if path is not None else {}
        values.update(parse_overrides(overrides))
        return cls.from_mapping(values)


def _check_kafka_listener_opens_nothing_closed(
    kafka: KafkaListenerConfig,
    security: SecurityConfig,
    tls: TlsSettings,
) -> None:
    """The Kafka listener may not open what the Flight listener closes: without TLS when
    the Flight listener encrypts, it would carry the rows in clear; without authentication
    (SASL, or SSL with ssl.client.auth=required) when the Flight listener authenticates or
    takes a local token, anyone reaching it would be served as User:ANONYMOUS, and with
    the authorizer off, everything. Refused naming the keys. ACLs need no check: the Kafka
    listener asks the same authorizer."""
    if not kafka.enabled:
        return
    kafka_authenticates = kafka.sasl or (kafka.encrypted and tls.client_auth is ClientAuth.REQUIRED)
    flight_authenticates = security.sasl or (
        tls.encrypted and tls.client_auth is ClientAuth.REQUIRED
    )
    problem = None
    if tls.encrypted and not kafka.encrypted:
        problem = (
            f"security.protocol={tls.protocol.value} encrypts the Flight listener, and "
            f"{kafka.protocol.value} would not: use SSL:// or SASL_SSL://"
        )
    elif flight_authenticates and not kafka_authenticates:
        problem = (
            f"security.protocol={security.protocol} authenticates the Flight listener's "
            f"clients, and {kafka.protocol.value} would not: use SASL_SSL:// (or "
            "SASL_PLAINTEXT://, or SSL:// with ssl.client.auth=required)"
        )
    elif security.token_file and not kafka_authenticates:
        problem = (
            "listener.token.file keeps other local users out of the Flight listener, and "
            f"{kafka.protocol.value} would let them in: use SASL_PLAINTEXT:// or SASL_SSL://"
        )
    if problem is not None:
        raise InvalidConfigError(
            f"{KAFKA_LISTENER}={kafka.protocol.value}://...: {problem} (docs/security.md, "
            "'The Kafka listener')"
        )


def split_zookeeper_connect(connect: str) -> tuple[str, str]:
    """``host:port[,host:port...][/chroot]`` -> (the hosts, the chroot); ``("", "")`` if empty.

    The chroot is checked as ZooKeeper checks a path (kazoo would quietly turn ``/a/`` or
    ``/a//b`` into another path than the one written): absolute, no trailing ``/``, no
    empty, ``.`` or ``..`` level, no control character; ``/`` alone means no chroot, as in
    ZooKeeper. A ``,`` in it is refused too: the chroot comes once, after the last
    host:port. Every error is an InvalidConfigError naming ``zookeeper.connect``.
    """
    if not connect:
        return "", ""
    hosts, slash, path = connect.partition("/")
    chroot = slash + path if path else ""

    def bad(problem: str) -> InvalidConfigError:
        return InvalidConfigError(f"zookeeper.connect={connect!r}: {problem}")

    for entry in hosts.split(","):
        try:
            parsed = urllib.parse.urlsplit("zk://" + entry.strip())
            port = parsed.port  # ValueError if not a number in 0..65535
        except ValueError:
            parsed, port = None, None
        if parsed is None or not parsed.hostname or port == 0 or parsed.query or parsed.fragment:
            raise bad(f"{entry!r} is not host[:port] (the form is host:port[,host:port][/chroot])")
    if chroot.endswith("/"):
        raise bad(f"the chroot {chroot!r} must not end with '/'")
    levels = chroot.split("/")[1:]
    if "" in levels:
        raise bad(f"the chroot {chroot!r} has an empty level ('//')")
    if "." in levels or ".." in levels:
        raise bad(f"the chroot {chroot!r} has a relative level ('.' or '..')")
    if "," in chroot:
        raise bad(f"the chroot {chroot!r} holds a ',': it comes once, after the last host:port")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in chroot):
        raise bad(f"the chroot {chroot!r} has a control character")
    return hosts, chroot


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``["key=value", ...]`` from the command line; a pair without '=' is an error."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidConfigError(f"override {pair!r} must be key=value")
        result[key.strip()] = value.strip()
    return result


def render_properties() -> str:
    """The commented default file ``conf/broker.properties``, generated from the keys."""
    lines = [
        "# Broker configuration: every key with its default. Start a broker with",
        "#   idemlog broker start --config conf/broker.properties [--override key=value ...]",
        "# Generated from broker_core/server/config/broker_config.py (the one place each key is",
        "# declared) by `idemlog config broker --properties`; tests/broker/test_broker_config.py",
        "# checks that this file and the code agree. Unknown keys are rejected by name.",
    ]
    for key in BROKER_CONFIG:
        lines.append("")
        lines.extend(
            textwrap.wrap(
                key.doc, 88, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False
            )
        )
        lines.append(f"{key.name}={key.default}")
    return "\n".join(lines) + "\n"


def render_markdown_table() -> str:
    """The README's broker key table (``| key | default | type | meaning |``)."""
    lines = ["| key | default | type | meaning |", "|---|---|---|---|"]
    for key in BROKER_CONFIG:
        shown = '""' if key.default == "" else key.default
        lines.append(f"| `{key.name}` | `{shown}` | {key.type.__name__} | {key.doc} |")
    return "\n".join(lines) + "\n"
