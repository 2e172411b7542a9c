"""The broker: one process serving a LogStore over Arrow Flight, wired into the cluster.

``Broker(config).start()`` runs its named steps in order, each opening one part: the
metrics endpoint (``metrics.port``), the data-directory lock (``<log.dir>/.lock``, held
until the end of ``close()``: a second process on the same ``log.dir`` is refused with
LogDirLockedError before it reads or writes a file there), the producer-id block source
and the producer tokens' key (ZooKeeper's session, or the files
``<log.dir>/__producer_id_block`` and ``__producer_id_key``), the
:class:`LogStore`, the Flight server (bound, so the real port is known), the Kafka
listener when ``kafka.listener`` is set (bound likewise: its address is registered), the cluster
(registering this broker, opening and recovering its partitions), the transaction
coordinator (and, with the Kafka listener, the group coordinators) and the background
tasks. A step that raises has ``_release`` close what the
earlier ones opened, in reverse. Requests arriving before the start finished wait for it.

``close()`` (also on SIGTERM/SIGINT through the CLI) stops accepting requests, stops the
tasks and the coordinator, closes the store (snapshots and the clean-shutdown marker in
every partition), deregisters and, last, drops the data-directory lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from enum import Enum
from typing import TYPE_CHECKING, Any

from broker_core.cluster.cluster_id import ClusterId, embedded_cluster_id, zk_cluster_id
from broker_core.cluster.embedded import EmbeddedCluster
from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo
from broker_core.cluster.zk import ZkCluster
from broker_core.errors import (
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidConfigError,
    LogDirLockedError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)
from broker_core.fileutil import DirectoryLock
from broker_core.log.dir_identity import DirIdentity, mark_clean_shutdown, open_identity
from broker_core.log.dir_lock import lock_data_dir
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.producer_ids.block import IssuedProducerIds
from broker_core.producer_ids.file_source import FileProducerIdBlockSource
from broker_core.producer_ids.manager import ProducerIdManager
from broker_core.producer_ids.zk_source import ZkProducerIdBlockSource
from broker_core.protocol.metrics import MetricsRequest
from broker_core.security import producer_token
from broker_core.security.producer_token import ProducerTokens
from broker_core.security.tls import ClientAuth, Side, TlsMaterial, warn_if_exposed
from broker_core.server.config.broker_config import NEVER, ZK_ROOT, BrokerConfig
from broker_core.server.coordination.coordinators import Coordinators
from broker_core.server.coordination.group_coordinators import GroupCoordinators
from broker_core.server.coordination.marker_client import RoutingMarkerWriter
from broker_core.server.coordination.roles import ClusterStableOffsets, CoordinatorRole
from broker_core.server.coordination.state_coordinator import StateLeaderCoordinatorRole
from broker_core.server.coordination.txn_verifier import TxnVerifier
from broker_core.server.hooks import BrokerHooks, load_hooks
from broker_core.server.observability.metrics import Metrics, partition_gauges
from broker_core.server.process.idle import IdleWatch
from broker_core.server.process.tasks import TaskGroup
from broker_core.server.process.zk_session import connect_zookeeper
from broker_core.server.replication.local_topics import LocalTopics, StartedTopics
from broker_core.server.replication.replica_fetcher import FetcherConfig
from broker_core.server.replication.replica_manager import ReplicaManager, ReplicationConfig
from broker_core.txn.coordinator.coordinator import LocalMarkerWriter
from broker_core.txn.coordinator.expiry import ExpiryPolicy

if TYPE_CHECKING:
    from broker_core.server.access.authentication import ScramUsers
    from broker_core.server.access.authorization import RequestAuthorizer
    from broker_core.server.kafka.listener import KafkaListener
    from broker_core.server.observability.prometheus import MetricsEndpoint
    from broker_core.server.requests.handlers import ActionHandlers

log = logging.getLogger("idemlog.broker")

PID_BLOCK_FILE = "__producer_id_block"
CLUSTER_FILE = "__cluster.json"
READY_TIMEOUT_S = 30.0  # how long an early request waits for the start to finish
SHUTDOWN_GRACE_S = 5.0  # open client streams get this long before the store closes anyway


class BrokerState(Enum):
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


_TRANSITIONS: dict[BrokerState, frozenset[BrokerState]] = {
    BrokerState.CREATED: frozenset({BrokerState.STARTING, BrokerState.STOPPED}),
    BrokerState.STARTING: frozenset({BrokerState.RUNNING, BrokerState.STOPPING}),
    BrokerState.RUNNING: frozenset({BrokerState.STOPPING}),
    BrokerState.STOPPING: frozenset({BrokerState.STOPPED}),
    BrokerState.STOPPED: frozenset(),
}


class Broker:
    """One broker process: its store served over Arrow Flight, in a cluster.

    Constructing opens nothing; :meth:`start` opens everything (see the module's
    docstring for the order) and :meth:`close` releases it. A broker starts once: its
    state goes CREATED -> STARTING -> RUNNING -> STOPPING -> STOPPED.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.metrics = Metrics()
        self.metrics_endpoint: MetricsEndpoint | None = None  # metrics.port's, when set
        self._state = BrokerState.CREATED
        self._state_lock = threading.Lock()
        self._ready = threading.Event()
        self._dir_lock: DirectoryLock | None = None
        self.identity: DirIdentity | None = None
        self._zk: Any = None
        self._pid_source: FileProducerIdBlockSource | ZkProducerIdBlockSource | None = None
        self.pids: ProducerIdManager | None = None
        self._producer_tokens: ProducerTokens | None = None
        self.store: LogStore | None = None
        self.cluster: ClusterMetadata | None = None
        self.info: BrokerInfo | None = None
        self._server: Any = None
        self._actions: ActionHandlers | None = None  # the Flight actions, once built
        self._kafka: KafkaListener | None = None  # kafka.listener's, when set
        # Built with the Flight listener, shared by the Kafka listener.
        self._users: ScramUsers | None = None  # with SASL on either listener
        self._authorizer: RequestAuthorizer | None = None  # authorizer.enable's
        self._verifier: TxnVerifier | None = None
        self._stable_offsets: ClusterStableOffsets | None = None  # the coordinators' LSO source
        self._tasks = TaskGroup()
        # idle.shutdown.ms: the listener's gate of calls that says when to stop (None: off).
        self._idle: IdleWatch | None = None
        self.markers: RoutingMarkerWriter | None = None
        # Built by start() once the store and the cluster they are made of are open.
        self._topics: LocalTopics | None = None
        self.replicas: ReplicaManager | None = None
        self._coordinator_role: CoordinatorRole | StateLeaderCoordinatorRole | None = None
        # The handlers' routing to the coordinator of a key's state partition.
        self.coordinators = Coordinators(
            config.broker_id,
            lambda: self._coordinator_role,
            self.require_cluster,
            embedded=config.embedded,
        )
        # The Kafka listener's group coordinators (started with the listener only).
        self.groups = GroupCoordinators(config.broker_id, config, self.require_cluster)
        self._groups_started = False

    # -- state ---------------------------------------------------------------------------
    @property
    def state(self) -> BrokerState:
        """Where the broker is in its life (CREATED .. STOPPED)."""
        return self._state

    def _transition(self, new: BrokerState) -> None:
        with self._state_lock:
            if new not in _TRANSITIONS[self._state]:
                raise RuntimeError(f"broker {self.broker_id}: cannot go {self._state} -> {new}")
            self._state = new
        log.info("broker %d is %s", self.broker_id, new.value)

    def gate(self) -> None:
        """Called first by every request: wait for the start, refuse during shutdown.

        Raises RequestTimedOutError when the start has not finished within
        ``READY_TIMEOUT_S``, NotLeaderOrFollowerError once the broker stops serving (both
        retriable: the client tries again or elsewhere).
        """
        if not self._ready.is_set() and not self._ready.wait(READY_TIMEOUT_S):
            raise RequestTimedOutError(
                f"broker {self.broker_id} did not finish starting within {READY_TIMEOUT_S:g}s"
            )
        if self._state is not BrokerState.RUNNING:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} is shutting down")

    # -- start ---------------------------------------------------------------------------
    def start(self) -> BrokerInfo:
        """Open everything and serve; returns the address actually bound.

        When it returns, the store is open and recovered, the broker is registered in the
        cluster, its partitions are open and, if it is the controller in embedded mode,
        the transaction coordinator runs; requests are answered from then on. Raises
        RuntimeError if called twice, and what opening a part raises (LogDirLockedError
        when another live process holds ``log.dir``, InvalidConfigError, StorageError,
        DuplicateBrokerRegistrationError, a ZooKeeper timeout...): the parts already open
        are released first, in reverse order (:meth:`_release`), and the broker is
        STOPPED.
        """
        self._transition(BrokerState.STARTING)
        try:
            tls, hooks = self._load_settings()
            self._open_metrics_endpoint()
            self._lock_data_dir()
            self._open_producer_ids()
            self._open_store()
            info = self._open_listener(tls, hooks)
            info = self._open_kafka_listener(info)
            self._join_cluster(info, tls, hooks)
            self._start_coordinator(tls)
            self._start_tasks()
        except LogDirLockedError:
            # An operator's mistake, said in one line by the CLI: no traceback.
            self._transition(BrokerState.STOPPING)
            self._release()
            raise
        except BaseException as exc:
            # The exception goes on to the caller, who reports it (the CLI in one line):
            # its traceback here only when debugging, not twice in every log.
            log.error(
                "broker %d failed to start: %s",
                self.broker_id,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            self._transition(BrokerState.STOPPING)
            self._release()
            raise
        self._transition(BrokerState.RUNNING)
        self._ready.set()
        return info

    def _load_settings(self) -> tuple[TlsMaterial, BrokerHooks]:
        """Its TLS files (a bad one refuses the start) and the test hooks, built here
        once from ``test.hooks.class`` (an inherited variable alone never arms one; a
        class that cannot be loaded refuses the start). Opens nothing."""
        cfg = self.config
        tls = cfg.tls.load(Side.SERVER)
        warn_if_exposed(cfg.listener_host, cfg.tls)
        return tls, load_hooks(cfg.test_hooks_class)

    def _open_metrics_endpoint(self) -> None:
        """Bind ``metrics.port`` (if set) before the directory is touched, so a taken port
        refuses the start at once. Opens the endpoint's socket and thread; ``_release``
        stops them."""
        if self.config.metrics.enabled:
            # Imported only here: prometheus_client (with urllib, http.server) is ~0.07 s
            # of CPU at every start, and the endpoint is off by default.
            from broker_core.server.observability.prometheus import MetricsEndpoint

            self.metrics_endpoint = MetricsEndpoint(self.config.metrics, self.metrics_document)
            self.metrics_endpoint.start()

    def _lock_data_dir(self) -> None:
        """Create ``log.dir`` (0700: rows are readable by the broker's user only; an
        existing one keeps the mode its operator gave it) and take its lock before
        anything in it is read or written (recovery may truncate). Opens the lock;
        ``_release`` drops it, last."""
        self.config.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._dir_lock = lock_data_dir(self.config.log_dir)
        # Which copy of data this is: the registration carries it (log/dir_identity.py).
        self.identity = open_identity(self.config.log_dir, self.broker_id)

    def _open_producer_ids(self) -> None:
        """The producer-id block source and the key that binds an idempotent producer id
        to its principal (``security.producer_token``): the embedded files, or ZooKeeper
        (whose session every later ZooKeeper user shares). Opens the ZooKeeper session;
        ``_release`` closes the source, then the session."""
        cfg = self.config
        if cfg.embedded:
            self._pid_source = FileProducerIdBlockSource(cfg.log_dir / PID_BLOCK_FILE)
            key = producer_token.file_key(cfg.log_dir / producer_token.KEY_FILE)
        else:
            self._zk = connect_zookeeper(cfg)
            self._pid_source = ZkProducerIdBlockSource(self._zk)
            key = producer_token.zk_key(
                self._zk,
                f"{ZK_ROOT}/{producer_token.KEY_ZNODE}",
                cfg.zookeeper_session_timeout_ms / 1000.0,
            )
        self._producer_tokens = ProducerTokens(key)
        self.pids = ProducerIdManager(self.broker_id, self._pid_source)

    def _open_store(self) -> None:
        """The :class:`LogStore` on ``log.dir`` (each partition recovered as it opens).
        ``_release`` closes it (snapshots and the clean-shutdown marker)."""
        cfg = self.config
        assert self._pid_source is not None  # _open_producer_ids ran
        self.store = LogStore(
            cfg.log_dir,
            cfg.log_defaults,
            producer_id_known=IssuedProducerIds(self._pid_source.latest_block),
        )

    def _replication(self) -> ReplicationConfig:
        cfg = self.config
        return ReplicationConfig(
            cfg.replica_lag_time_max_ms,
            FetcherConfig(
                cfg.replica_fetch_max_bytes,
                cfg.replica_fetch_wait_max_ms,
                cfg.replica_fetch_backoff_ms / 1000.0,
            ),
        )

    def _middleware(self) -> dict[str, Any]:
        """The listener's middleware: the embedded broker's token check, then (last, so a
        call it counts is one no other middleware refused) the idle watch."""
        from broker_core.server.access.authentication import local_token_middleware

        middleware: dict[str, Any] = dict(local_token_middleware(self.config))
        if self.config.idle_shutdown_ms != NEVER:
            self._idle = IdleWatch(self.config.idle_shutdown_ms)
            middleware["idle-shutdown"] = self._idle
        return middleware

    def idle_expired(self) -> bool:
        """Whether ``idle.shutdown.ms`` has passed with no call and no transaction open
        (``broker_core/server/process/idle.py``); when True, the listener refuses every call from
        now on and the caller stops the broker. Always False with the key at 0."""
        if self._idle is None or self._state is not BrokerState.RUNNING:
            return False
        return self._idle.close_if_idle(self.open_transactions)

    def open_transactions(self) -> int:
        """Transactions not finished here: the coordinators' ONGOING and PREPARE_* ones and
        pending sink commits, and local partitions holding an open transaction's rows."""
        described = self.coordinators.describe()
        unfinished = 0
        if described is not None:
            states = described.get("by_state", {})
            unfinished += sum(
                states.get(s, 0) for s in ("ONGOING", "PREPARE_COMMIT", "PREPARE_ABORT")
            )
            unfinished += int(described.get("sinks_pending", 0))
        logs = self._local_logs()
        return unfinished + sum(
            1 for _t, _p, log_ in logs if log_.state.first_unstable_offset() is not None
        )

    def _open_listener(self, tls: TlsMaterial, hooks: BrokerHooks) -> BrokerInfo:
        """The handlers and the Flight server, bound (so the real port is known), and what
        clients are told: ``listener.advertised.*`` when set (NAT, a proxy, a container).
        Requests wait at :meth:`gate`. Built before the parts they reach (the cluster
        registration needs the bound port): hence the late-bound topics, store, pids,
        markers and replicas. ``_release`` shuts the server down."""
        from broker_core.server.access.authentication import scram_users, server_auth
        from broker_core.server.access.authorization import request_authorizer
        from broker_core.server.requests.flight_server import IdemlogFlightServer
        from broker_core.server.requests.handlers import ActionHandlers

        cfg = self.config
        assert self._producer_tokens is not None  # _open_producer_ids ran
        # One set of users and one authorizer for the Flight and the Kafka listeners.
        if cfg.security.sasl or cfg.kafka.sasl:
            self._users = scram_users(cfg, self._zk)
        self._authorizer = request_authorizer(cfg, self._zk, self.metrics.record_refusal)
        started_topics = StartedTopics(lambda: self.topics)
        actions = ActionHandlers(
            broker_id=self.broker_id,
            config=cfg,
            topics=started_topics,
            store=lambda: self.store,
            cluster=self.require_cluster,
            coordinators=self.coordinators,
            pids=lambda: self.pids,
            producer_tokens=self._producer_tokens,
            markers=lambda: self.markers,
            metrics_document=self.metrics_document,
            replicas=lambda: self.replicas,
        )
        self._actions = actions  # the Kafka listener's admin APIs create topics through them
        self._server = IdemlogFlightServer(
            cfg.listener_host,
            cfg.listener_port,
            tls=tls,
            actions=actions,
            gate=self.gate,
            topics=started_topics,
            store=lambda: self.store,
            metrics=self.metrics,
            max_request_bytes=cfg.max_request_bytes,
            ack_timeout_s=self._replication().ack_timeout_s,
            auth_handler=server_auth(cfg, self._users, tls),
            middleware=self._middleware(),
            authorizer=self._authorizer,
            verifier=self._txn_verifier(tls),
            producer_tokens=self._producer_tokens,
            hooks=hooks,
        )
        assert self.identity is not None  # _lock_data_dir ran
        self.info = BrokerInfo(
            self.broker_id,
            cfg.advertised_host,
            cfg.advertised_port or int(self._server.port),
            directory_id=self.identity.directory_id,
        )
        return self.info

    def _open_kafka_listener(self, info: BrokerInfo) -> BrokerInfo:
        """With ``kafka.listener`` set, Kafka's protocol (server/kafka/), bound before the
        registration that carries its advertised address (``kafka.advertised.listener``
        or the bound one) to the other brokers' Metadata answers; ``info`` as it was
        without. Its TLS is the broker's ``ssl.*`` files, its SASL the Flight listener's
        users, its ACLs the Flight listener's authorizer (docs/security.md, "The Kafka
        listener"). Requests wait at :meth:`gate`. ``_release`` stops it."""
        from broker_core.security.principal import Principal
        from broker_core.security.tls import SecurityProtocol, server_ssl_context
        from broker_core.server.coordination.stable_cuts import StableCuts
        from broker_core.server.kafka.admin import AdminApis
        from broker_core.server.kafka.apis import KafkaApis
        from broker_core.server.kafka.authorize import KafkaAuthorizer
        from broker_core.server.kafka.consume import ConsumeApis
        from broker_core.server.kafka.groups import GroupApis
        from broker_core.server.kafka.init_producer_id import InitProducerIdApi
        from broker_core.server.kafka.listener import KafkaListener
        from broker_core.server.kafka.metadata import MetadataApi
        from broker_core.server.kafka.produce import ProduceApi
        from broker_core.server.kafka.sasl import SaslApis

        cfg = self.config
        if not cfg.kafka.enabled:
            return info
        ssl_context = mapper = None
        if cfg.kafka.encrypted:
            # The broker's ssl.* keys, loaded (and checked) as an SSL listener's whatever
            # the Flight listener's security.protocol.
            tls = dataclasses.replace(cfg.tls, protocol=SecurityProtocol.SSL).load(Side.SERVER)
            ssl_context = server_ssl_context(tls)
            if cfg.tls.client_auth is ClientAuth.REQUIRED:
                mapper = cfg.security.principal_mapper
        authorizer = KafkaAuthorizer(self._authorizer)
        topics = StartedTopics(lambda: self.topics)
        assert self._actions is not None  # _open_listener ran
        cluster_id = ClusterId(self._load_cluster_id)
        apis = KafkaApis(
            [
                SaslApis(self._users if cfg.kafka.sasl else None, cfg.security.mechanisms),
                MetadataApi(self.require_cluster, cluster_id, authorizer=authorizer),
                ConsumeApis(
                    topics,
                    self.require_cluster,
                    StableCuts(self._stable_ends),
                    authorizer=authorizer,
                ),
                ProduceApi(topics, lambda: self.store, self.metrics, authorizer=authorizer),
                InitProducerIdApi(lambda: self.pids, authorizer=authorizer),
                GroupApis(self.groups, self.require_cluster, authorizer=authorizer),
                AdminApis(
                    self.broker_id,
                    cfg,
                    self._actions,
                    self.require_cluster,
                    cluster_id,
                    authorizer=authorizer,
                ),
            ]
        )
        kafka = self._kafka = KafkaListener(
            cfg.kafka,
            apis,
            gate=self.gate,
            max_request_bytes=cfg.max_request_bytes,
            metrics=self.metrics,
            ssl_context=ssl_context,
            principal_mapper=mapper,
        )
        if self._users is not None:

            def end_sessions(user: str) -> None:
                ended = kafka.end_sessions_of(Principal.user(user))
                if ended:
                    log.info("User:%s changed or removed: %d Kafka connections closed", user, ended)

            self._users.on_change(end_sessions)
        port = kafka.start()
        advertised = (cfg.kafka.advertised_host, cfg.kafka.advertised_port or port)
        self.info = dataclasses.replace(info, kafka_listener=advertised)
        return self.info

    def _load_cluster_id(self) -> str:
        """The cluster's id (cluster/cluster_id.py): ZooKeeper's, or this directory's."""
        if self.config.embedded:
            return embedded_cluster_id(self.config.log_dir)
        timeout_s = self.config.zookeeper_session_timeout_ms / 1000.0
        return zk_cluster_id(self.zookeeper_client(), ZK_ROOT, timeout_s)

    def _stable_ends(self, topic: str) -> dict[int, int]:
        """``topic``'s stable cut across every coordinator, as idemlog's readers read it
        (``BrokerClient.stable_ends``), asked with this broker's own credentials. The
        embedded broker's one coordinator is its own, asked in place: its Flight listener
        may require a principal (SASL, a client certificate, ACLs) that the broker has no
        credentials or super user rights for (it has no other broker to serve)."""
        offsets = self._stable_offsets
        if offsets is None:
            raise CoordinatorNotAvailableError(f"broker {self.broker_id} is still starting")
        if self.config.embedded:
            return dict(self.coordinators.for_partition(0).stable_ends(topic))
        return offsets.client().stable_ends(topic)

    def _txn_verifier(self, tls: TlsMaterial) -> TxnVerifier:
        """Asks coordinators before a transactional batch's first append here (KIP-890):
        this broker's own directly, another's over its inter-broker credentials."""
        cfg = self.config
        self._verifier = TxnVerifier(
            self.broker_id,
            self.coordinators,
            self.require_cluster,
            embedded=cfg.embedded,
            timeout_s=self._replication().ack_timeout_s,
            tls=tls,
            sasl=cfg.security.inter_broker,
        )
        return self._verifier

    def _join_cluster(self, info: BrokerInfo, tls: TlsMaterial, hooks: BrokerHooks) -> None:
        """The cluster metadata, the replica manager, the local partitions and the marker
        writer; then registers this broker and opens the partitions it holds (recovering
        each), following topic changes. ``_release`` closes the partitions with the store,
        leaves the cluster and closes the marker writer's connections."""
        cfg = self.config
        store = self.store
        assert store is not None  # _open_store ran
        inter_broker = cfg.security.inter_broker  # this broker's own credentials, or None
        self.cluster = cluster = self._open_cluster(info)
        self.replicas = ReplicaManager(
            self.broker_id,
            store,
            cluster,
            self._replication(),
            tls,
            sasl=inter_broker,
            hooks=hooks,
        )
        topics = self._topics = LocalTopics(
            self.broker_id,
            store,
            cluster,
            self.replicas,
            embedded=cfg.embedded,
            serving=lambda: self.serving,
            forget_topic=self.metrics.forget_topic,
        )
        self.markers = RoutingMarkerWriter(
            self.broker_id,
            topics,
            LocalMarkerWriter(store),
            cluster.brokers,
            replicated=self.replicas.wait_replicated,
            call_timeout_s=cfg.marker_call_timeout_s,
            tls=tls,
            sasl=inter_broker,
            hooks=hooks,
        )
        cluster.register(info)
        # Subscribed before the first sync: a state the controller writes for this new
        # process (its broker epoch) may land while that sync runs, and must not be missed.
        cluster.on_topics_change(topics.sync)
        topics.sync()

    def _start_coordinator(self, tls: TlsMaterial) -> None:
        """The transaction coordinator role: embedded, one coordinator loaded now; with
        ZooKeeper, one per ``__transaction_state`` partition this broker leads, loaded in
        the background. With the Kafka listener, the group coordinators likewise (of
        ``__consumer_offsets``). ``_release`` stops them."""
        cfg = self.config
        store, pids, markers = self.store, self.pids, self.markers
        assert store is not None and pids is not None and markers is not None
        assert self.cluster is not None and self.replicas is not None  # _join_cluster ran
        offsets = self._stable_offsets = ClusterStableOffsets(
            self.broker_id, self.topics, self.cluster.brokers, tls, cfg.security.inter_broker
        )
        expiry = ExpiryPolicy(cfg.transactional_id_expiration_ms, cfg.sink_stream_expiration_ms)
        retry_deadline_s = cfg.transaction_marker_retry_deadline_ms / 1000.0
        role: CoordinatorRole | StateLeaderCoordinatorRole
        if cfg.embedded:
            role = CoordinatorRole(
                self.broker_id,
                self.cluster,
                store=store,
                pids=pids,
                markers=markers,
                offsets=offsets,
                max_timeout_ms=cfg.transaction_max_timeout_ms,
                state_segment_bytes=cfg.transaction_state_log_segment_bytes,
                state_delete_retention_ms=cfg.transaction_state_log_delete_retention_ms,
                marker_retry_deadline_s=retry_deadline_s,
                expiry=expiry,
            )
        else:
            role = StateLeaderCoordinatorRole(
                self.broker_id,
                self.replicas,
                pids=pids,
                markers=markers,
                offsets=offsets,
                max_timeout_ms=cfg.transaction_max_timeout_ms,
                marker_retry_deadline_s=retry_deadline_s,
                expiry=expiry,
                ack_timeout_s=self._replication().ack_timeout_s,
                cluster=self.cluster,
                zookeeper=self._zk,
            )
        self._coordinator_role = role
        role.start(synchronous=cfg.embedded)
        if cfg.kafka.enabled:
            # Kafka clients' consumer groups: the embedded broker's one local partition of
            # __consumer_offsets at this run's controller epoch, loaded now; with
            # ZooKeeper, each partition's leader's coordinator.
            if cfg.embedded:
                self.groups.start_embedded(store, self.cluster.controller_epoch())
            else:
                self.groups.start_replicated(self.replicas, self._replication().ack_timeout_s)
            self._groups_started = True

    def _start_tasks(self) -> None:
        """The background tasks; ``_release`` stops them, first."""
        assert self.store is not None and self._coordinator_role is not None
        self._add_tasks(self.store, self._coordinator_role)
        self._tasks.start()

    def _open_cluster(self, info: BrokerInfo) -> ClusterMetadata:
        if self.config.embedded:
            return EmbeddedCluster(info, self.config.log_dir / CLUSTER_FILE)
        return ZkCluster(
            self.zookeeper_client(),
            ZK_ROOT,
            default_replication_factor=self.config.default_replication_factor,
        )

    def zookeeper_client(self) -> Any:
        """The started KazooClient; InvalidConfigError in embedded mode (no ZooKeeper)."""
        if self._zk is None:
            raise InvalidConfigError(f"broker {self.broker_id} runs without zookeeper.connect")
        return self._zk

    def _add_tasks(
        self, store: LogStore, role: CoordinatorRole | StateLeaderCoordinatorRole
    ) -> None:
        cfg = self.config
        self._tasks.add(
            "log-retention", cfg.log_retention_check_interval_ms, store.enforce_retention
        )
        self._tasks.add(
            "producer-expiry", cfg.producer_id_expiration_check_interval_ms, self.expire_producers
        )
        self._tasks.add("log-flush", cfg.log_flush_scheduler_interval_ms, self.flush_idle_logs)
        if cfg.log_cleaner_enable:
            # Every open log, leader or follower, internal topics too (Kafka cleans each
            # replica on its own); logs not compacted return at once.
            self._tasks.add("log-cleaner", cfg.log_cleaner_backoff_ms, store.clean)
        self._tasks.add(
            "transaction-timeouts",
            cfg.transaction_cleanup_interval_ms,
            role.abort_timed_out,
        )
        self._tasks.add(
            "transactional-id-expiry",
            cfg.expired_transaction_cleanup_interval_ms,
            role.expire_idle,
        )

    # -- local partitions ----------------------------------------------------------------
    @property
    def topics(self) -> LocalTopics:
        """The partitions this broker leads.

        Raises NotLeaderOrFollowerError (retriable) before :meth:`start` opened them.
        """
        if self._topics is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} has no open store")
        return self._topics

    def require_cluster(self) -> ClusterMetadata:
        """The cluster metadata; NotLeaderOrFollowerError (retriable) before it is open."""
        if self.cluster is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} is not in the cluster yet")
        return self.cluster

    def _local_logs(self) -> list[tuple[str, int, PartitionLog]]:
        return [] if self._topics is None else self._topics.logs()

    # -- coordinator access --------------------------------------------------------------
    @property
    def serving(self) -> bool:
        """Starting or running: local topics may still be opened."""
        return self._state in (BrokerState.STARTING, BrokerState.RUNNING)

    # -- background work -----------------------------------------------------------------
    def expire_producers(self) -> int:
        """Forget producers idle past ``producer.id.expiration.ms`` in every local partition
        (logged and counted in the metrics); returns how many were forgotten."""
        total = 0
        for topic, partition, log_ in self._local_logs():
            expired = log_.expire_producers()
            if expired:
                log.info("%s-%d: expired idle producers %s", topic, partition, expired)
                self.metrics.record_expired(topic, partition, expired)
                total += len(expired)
        return total

    def flush_idle_logs(self) -> int:
        """fsync every local partition whose ``flush.ms`` is due; returns how many were."""
        return sum(1 for _t, _p, log_ in self._local_logs() if log_.flush_if_due())

    def metrics_document(self, request: MetricsRequest | None = None) -> dict[str, Any]:
        """This broker's answer to a METRICS request (default: ``MetricsRequest()``): the
        bounded document (request counters, per-partition offsets and producer counts, the
        top producers by duplicates, replication, the coordinator's state if it runs here,
        else ``transactions`` None), or one page of the per-producer detail."""
        request = request or MetricsRequest()
        if request.detail is not None:
            page = self.metrics.producer_page(self.broker_id, request.after(), request.page_size)
            return page.to_doc()
        gauges = partition_gauges(self._local_logs())
        transactions = self.coordinators.describe()
        document = self.metrics.document(self.broker_id, gauges, transactions, request.top)
        if self.replicas is not None:
            document["replication"] = self.replicas.describe()
        if self._groups_started:
            document["groups"] = self.groups.describe(self._high_watermark)
        return document

    def _high_watermark(self, topic: str, partition: int) -> int | None:
        """This broker's replica's high watermark of a partition, None without one."""
        if self.replicas is None:
            return None
        try:
            return self.replicas.partition(topic, partition).log.high_watermark
        except IdemlogError:
            return None

    # -- shutdown ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving, close the store cleanly (snapshots + marker), deregister.

        Idempotent and safe on a broker never started. Requests waiting for the start are
        refused; client streams still open after ``SHUTDOWN_GRACE_S`` find the store
        closed. Failures while releasing a part are logged, never raised, so every other
        part is still released.
        """
        with self._state_lock:
            state = self._state
        if state in (BrokerState.STOPPING, BrokerState.STOPPED):
            return
        if state is BrokerState.CREATED:
            self._transition(BrokerState.STOPPED)
            return
        self._move_leadership_away()
        self._transition(BrokerState.STOPPING)
        self._ready.set()  # waiting requests are released and refused
        self._release()

    def _move_leadership_away(self) -> None:
        """A clean shutdown's first step (Kafka's controlled shutdown): every partition
        this broker leads with another live in-sync replica gets that one as leader, so
        its producers and readers move on at once instead of after the session expires."""
        cluster, topics = self.cluster, self._topics
        if cluster is None or topics is None or self.config.embedded:
            return
        try:
            moved = cluster.move_leadership_away(self.broker_id)
        except IdemlogError as exc:
            log.warning("broker %d: leadership not moved before shutdown: %s", self.broker_id, exc)
            return
        if moved:
            log.info("broker %d moved the leadership of %d partitions", self.broker_id, moved)
            topics.sync()  # our replicas follow now: appends are refused, waiters answered

    def _release(self) -> None:
        """Close what the start's steps opened (each part only if it was), the last opened
        first; what serves requests (tasks, endpoint, server) stops before what it reads."""
        self._tasks.stop()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
        if self._kafka is not None:
            self._kafka.stop()
        if self._server is not None:
            self._shutdown_server()
        if self._coordinator_role is not None:
            self._coordinator_role.stop()
        if self._groups_started:
            self.groups.stop()
        if self.store is not None:
            try:
                # Through the topics when they exist: no partition opens while it closes.
                if self._topics is not None:
                    self._topics.close_store()
                else:
                    if self.replicas is not None:
                        self.replicas.close()
                    self.store.close()
            except Exception:
                log.exception("broker %d: closing the store failed", self.broker_id)
            else:
                mark_clean_shutdown(self.config.log_dir)  # all on disk: the id stays valid
        if self.cluster is not None:
            try:
                self.cluster.close()
            except Exception:
                log.exception("broker %d: leaving the cluster failed", self.broker_id)
        if self.markers is not None:
            self.markers.close()
        if self._verifier is not None:
            self._verifier.close()
        if isinstance(self._pid_source, ZkProducerIdBlockSource):
            self._pid_source.close()
        if self._zk is not None:
            try:
                self._zk.stop()
                self._zk.close()
            except Exception:
                log.exception("broker %d: closing the ZooKeeper client failed", self.broker_id)
        if self._dir_lock is not None:
            self._dir_lock.release()  # last: nothing of this broker touches the directory now
        with self._state_lock:
            self._state = BrokerState.STOPPED
        log.info("broker %d is stopped", self.broker_id)

    def _shutdown_server(self) -> None:
        # Flight's shutdown waits for every open call, and a client may keep a produce
        # stream open indefinitely: give them a grace period, then close the store anyway
        # (later appends on those streams fail with a storage error).
        done = threading.Event()

        def shutdown() -> None:
            try:
                self._server.shutdown()
            finally:
                done.set()

        threading.Thread(target=shutdown, name="idemlog-flight-shutdown", daemon=True).start()
        if not done.wait(SHUTDOWN_GRACE_S):
            log.warning(
                "broker %d: client calls still open after %.0fs; closing the store anyway",
                self.broker_id,
                SHUTDOWN_GRACE_S,
            )
