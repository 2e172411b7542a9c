"""The broker's Prometheus/OpenMetrics endpoint (``metrics.port``, docs/operations.md).

:class:`DocumentCollector` turns one metrics document (the very one ``idemlog metrics``
reads, built by ``Broker.metrics_document`` at each scrape) into metric families with
Kafka-like names, so the endpoint and the command never disagree. It is registered in a
registry of its own (never the process-wide default one) with the process collector,
which gives ``process_start_time_seconds``. The counters live in memory and restart from
zero with the broker; ``rate()`` and ``increase()`` take the drop as a reset, and
``idemlog_broker_start_time_seconds`` says when it happened. A counter's ``_created``
sample (the document's ``started_at``) is served only in the OpenMetrics format, where it
belongs to its counter; the classic text format can only show it as a gauge family of
its own, one per counter with the same value, so the text answer leaves it out
(docs/operations.md, Counters across restarts).

Names follow Prometheus' conventions, which ``promtool check metrics`` checks (the
endpoint's test runs it): base units (``_seconds``, ``_bytes``), ``_total`` on counters,
labels ``topic`` and ``partition`` wherever a figure is a partition's, and every label
value a counter is known to take present from the start, at 0.

Names: every counter of the document's ``totals`` section, and of a ``counters``
section if a broker adds one, is exported under its own name without code here
(``idemlog_broker_<name>_total``; a ``{label_value: n}`` map gets a ``key`` label), so a
new counter appears on the endpoint as soon as it is in the document.

:class:`MetricsEndpoint` serves the registry on its own thread until :meth:`stop`.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    make_wsgi_app,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from broker_core.errors import InvalidConfigError
from broker_core.protocol.coordinator_keys import TXN_STATE_TOPIC
from broker_core.protocol.metrics import COUNTER_NAMES
from broker_core.server.config.metrics import MetricsEndpointConfig
from broker_core.txn.coordinator.counters import COUNTERS as TXN_COUNTERS

log = logging.getLogger("idemlog.metrics")

PREFIX = "idemlog"
GROUP = f"{PREFIX}_consumer_group"  # the consumer groups' (Kafka's exporters: kafka_consumergroup_)
TOPIC = f"{PREFIX}_server_brokertopicmetrics"
# The label of a labelled counter of the document's ``counters`` section ("key" otherwise).
COUNTER_LABELS = {"authorization_refusals": "code"}

# Per-partition append counters: Kafka's BrokerTopicMetrics names where Kafka has them.
PARTITION_COUNTERS = {
    "batches_appended": f"{TOPIC}_batchesin",
    "records_appended": f"{TOPIC}_messagesin",
    "bytes_appended": f"{TOPIC}_bytesin",
    "duplicates_in_window": f"{TOPIC}_duplicates",
    "duplicates_beyond_window": f"{TOPIC}_duplicates_beyond_window",
    "out_of_order": f"{TOPIC}_outofordersequence",
    "fenced_appends": f"{TOPIC}_fenced_producers",
    "unknown_producer_ids": f"{TOPIC}_unknown_producer_ids",
    "invalid_txn_state": f"{TOPIC}_invalid_txn_state",
    "rejected": f"{TOPIC}_rejected",
    "expired_producers": f"{TOPIC}_expired_producers",
}
# Per-partition figures read from the log: counters since the log was opened, and gauges.
LOG_COUNTERS = {
    "cleaner_passes": f"{PREFIX}_log_cleaner_passes",
    "cleaner_cleaned_bytes": f"{PREFIX}_log_cleaner_cleaned_bytes",
    "cleaner_removed_rows": f"{PREFIX}_log_cleaner_removed_rows",
    "cleaner_removed_markers": f"{PREFIX}_log_cleaner_removed_markers",
    "marker_appends": f"{PREFIX}_log_marker_appends",
}
LOG_GAUGES = {
    "log_start_offset": f"{PREFIX}_log_start_offset",
    "log_end_offset": f"{PREFIX}_log_end_offset",
    "last_stable_offset": f"{PREFIX}_log_last_stable_offset",
    "lso_lag": f"{PREFIX}_log_last_stable_offset_lag",
    "producers": f"{PREFIX}_log_producers",
    "open_transactions": f"{PREFIX}_log_open_transactions",
}
# The cleaner's last pass, from the document's epoch milliseconds (-1: none yet) to a
# timestamp in seconds that is absent until the first pass: 0 or -1 would read as a pass
# in 1970 to ``time() - x`` and to min/max; "never" is ``cleaner_passes_total == 0``.
LAST_CLEAN = ("cleaner_last_clean_ms", f"{PREFIX}_log_cleaner_last_clean_timestamp_seconds")
REPLICA = f"{PREFIX}_server_replicamanager"
REQUESTS = f"{PREFIX}_network_requestmetrics"
TXN = f"{PREFIX}_transaction_coordinator"
_TXN_COUNTERS = frozenset({*TXN_COUNTERS, "marker_retries"})
_PARTITION_LABELS = ["topic", "partition"]
OPENMETRICS = "application/openmetrics-text"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class DocumentCollector(Collector):
    """Metric families from ``document()``, called once per scrape."""

    def __init__(self, document: Callable[[], Mapping[str, Any]]) -> None:
        self._document = document

    def collect(self) -> Iterator[Metric]:
        doc = self._document()
        created = float(doc["started_at"])
        info = GaugeMetricFamily(
            f"{PREFIX}_broker_info", "The broker this endpoint belongs to.", labels=["broker_id"]
        )
        info.add_metric([str(doc["broker_id"])], 1)
        yield info
        yield GaugeMetricFamily(
            f"{PREFIX}_broker_start_time_seconds",
            "When this broker's counters started from zero (its process start).",
            value=created,
        )
        yield from self._generic_counters(doc, created)
        for name in ("producers_active", "producers_tracked"):
            yield GaugeMetricFamily(
                f"{PREFIX}_broker_{name}",
                "Producer entries across this broker's partitions (active) and producer ids "
                "with counters (tracked)",
                value=float(doc.get(name, 0)),
            )
        yield from self._partitions(doc.get("partitions") or [], created)
        yield from self._requests(doc.get("requests") or {}, created)
        if doc.get("replication") is not None:
            yield from self._replication(doc["replication"], created)
        if doc.get("transactions") is not None:
            yield from self._transactions(doc["transactions"], created)
        if doc.get("groups") is not None:
            yield from self._groups(doc["groups"])

    def _generic_counters(self, doc: Mapping[str, Any], created: float) -> Iterator[Metric]:
        sections = [doc.get("totals") or {}, doc.get("counters") or {}]
        for section in sections:
            for name, value in sorted(section.items()):
                family = CounterMetricFamily(
                    f"{PREFIX}_broker_{name}",
                    f"{name} on this broker since it started (the document's counters)",
                    labels=[COUNTER_LABELS.get(name, "key")]
                    if isinstance(value, Mapping)
                    else None,
                    created=created,
                )
                if isinstance(value, Mapping):
                    for key, n in sorted(value.items()):
                        if _is_number(n):
                            family.add_metric([str(key)], float(n), created=created)
                elif _is_number(value):
                    family.add_metric([], float(value), created=created)
                else:
                    continue
                yield family

    def _partitions(self, rows: list[Mapping[str, Any]], created: float) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for field, name in {**PARTITION_COUNTERS, **LOG_COUNTERS}.items():
            families[field] = CounterMetricFamily(
                name, f"{field} per partition", labels=_PARTITION_LABELS, created=created
            )
        for field, name in LOG_GAUGES.items():
            families[field] = GaugeMetricFamily(
                name, f"{field} per partition", labels=_PARTITION_LABELS
            )
        last_field, last_name = LAST_CLEAN
        families[last_field] = last_clean = GaugeMetricFamily(
            last_name,
            "When the log cleaner last finished a pass on the partition, in seconds since "
            "the epoch (no sample before its first pass)",
            labels=_PARTITION_LABELS,
        )
        for row in rows:
            labels = [str(row["topic"]), str(row["partition"])]
            for field, value in row.items():
                if field in ("topic", "partition") or not _is_number(value):
                    continue
                if field == last_field:
                    if value >= 0:
                        last_clean.add_metric(labels, value / 1000)
                    continue
                family = families.get(field)
                if family is None:  # a figure added to the document later, by its own name
                    family = families[field] = (
                        CounterMetricFamily(
                            f"{TOPIC}_{field}", field, labels=_PARTITION_LABELS, created=created
                        )
                        if field in COUNTER_NAMES
                        else GaugeMetricFamily(
                            f"{PREFIX}_log_{field}", field, labels=_PARTITION_LABELS
                        )
                    )
                if isinstance(family, CounterMetricFamily):
                    family.add_metric(labels, float(value), created=created)
                else:
                    family.add_metric(labels, float(value))
        yield from families.values()

    def _requests(self, requests: Mapping[str, Any], created: float) -> Iterator[Metric]:
        count = CounterMetricFamily(
            f"{REQUESTS}_requests", "Requests answered, by kind", labels=["request"]
        )
        errors = CounterMetricFamily(
            f"{REQUESTS}_errors", "Requests answered with an error, by kind", labels=["request"]
        )
        latency = HistogramMetricFamily(
            f"{REQUESTS}_latency_seconds",
            "Time to serve one request: a produced batch's append on the leader, a fetch's "
            "read, a Kafka request's answer",
            labels=["request"],
        )
        for kind, figures in sorted(requests.items()):
            count.add_metric([kind], float(figures["count"]), created=created)
            errors.add_metric([kind], float(figures["errors"]), created=created)
            buckets = [(le, float(n)) for le, n in figures["latency_seconds_buckets"].items()]
            latency.add_metric([kind], buckets, float(figures["latency_seconds_sum"]))
        yield from (count, errors, latency)

    def _replication(self, rep: Mapping[str, Any], created: float) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{REPLICA}_leadercount", "Partitions this broker leads", value=rep["leader_partitions"]
        )
        yield GaugeMetricFamily(
            f"{REPLICA}_followercount",
            "Partitions this broker follows",
            value=rep["follower_partitions"],
        )
        yield GaugeMetricFamily(
            f"{REPLICA}_underreplicatedpartitions",
            "Partitions this broker leads with fewer in-sync replicas than replicas",
            value=len(rep["under_replicated_partitions"]),
        )
        for name in ("isr_shrinks", "isr_expands"):
            family = CounterMetricFamily(
                f"{REPLICA}_{name.replace('_', '')}",
                f"ISR {name.split('_')[1]} this broker made as leader (a lagging follower "
                "dropped, a caught-up one added; a dead broker's removal is the controller's)",
                created=created,
            )
            family.add_metric([], float(rep[name]), created=created)
            yield family
        refused = CounterMetricFamily(
            f"{REPLICA}_truncationsrefused",
            "Truncations below this follower's high watermark refused: a leader at an epoch "
            "its log holds lacked acknowledged batches",
            created=created,
        )
        refused.add_metric([], float(rep["truncations_refused"]), created=created)
        yield refused
        unclean = CounterMetricFamily(
            f"{REPLICA}_uncleanleaderelections",
            "Unclean leader elections this broker wrote as the controller (each may lose "
            "acknowledged data; only with unclean.leader.election.enable)",
            created=created,
        )
        unclean.add_metric([], float(rep["unclean_leader_elections"]), created=created)
        yield unclean
        lag = GaugeMetricFamily(
            f"{REPLICA}_follower_lag",
            "A follower's lag in offsets behind this leader's log end",
            labels=[*_PARTITION_LABELS, "follower"],
        )
        for name, followers in sorted(rep["follower_lag"].items()):
            topic, partition = name.rsplit("-", 1)  # the document's "<topic>-<partition>"
            for follower, offsets in sorted(followers.items()):
                lag.add_metric([topic, partition, str(follower)], float(offsets))
        yield lag

    def _transactions(self, txns: Mapping[str, Any], created: float) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_transaction_open",
            "Transactions open (ONGOING) on the coordinators this broker runs",
            value=float(txns.get("open_transactions", 0)),
        )
        by_state = GaugeMetricFamily(
            f"{TXN}_transactional_ids_by_state", "Transactional ids by state", labels=["state"]
        )
        for state, n in sorted((txns.get("by_state") or {}).items()):
            by_state.add_metric([state], float(n))
        yield by_state
        for name, value in sorted(txns.items()):
            if name in ("open_transactions", "coordinator_epoch") or not _is_number(value):
                continue
            if name in _TXN_COUNTERS:
                counter = CounterMetricFamily(
                    f"{TXN}_{name}", f"{name} since the coordinator loaded", created=created
                )
                counter.add_metric([], float(value), created=created)
                yield counter
            else:
                yield GaugeMetricFamily(f"{TXN}_{name}", name, value=float(value))
        epochs = GaugeMetricFamily(
            f"{TXN}_epoch",
            f"The coordinator epoch of each partition of {TXN_STATE_TOPIC} this broker leads",
            labels=_PARTITION_LABELS,
        )
        for partition, epoch in sorted((txns.get("coordinator_epochs") or {}).items()):
            if _is_number(epoch):
                epochs.add_metric([TXN_STATE_TOPIC, str(partition)], float(epoch))
        yield epochs

    def _groups(self, groups: Mapping[str, Any]) -> Iterator[Metric]:
        """The consumer groups this broker coordinates (its ``__consumer_offsets``
        partitions' coordinators): how many, their members and committed partitions,
        the lag in all, and the lag of each of the groups with the largest lag (at most
        ``group_coordinators.TOP_LAGS``: a bounded label set), as Kafka's exporters
        name a group's lag."""
        for name, key, what in (
            ("s", "groups", "Consumer groups coordinated by this broker"),
            ("_members", "members", "Members of the consumer groups this broker coordinates"),
            (
                "_committed_partitions",
                "offsets",
                "Partitions with a committed offset in the groups this broker coordinates",
            ),
            (
                "s_lag",
                "lag",
                "Records not yet consumed, summed over the groups this broker coordinates "
                "(partitions it has a replica of)",
            ),
        ):
            yield GaugeMetricFamily(f"{GROUP}{name}", what, value=float(groups.get(key, 0)))
        lag = GaugeMetricFamily(
            f"{GROUP}_lag",
            "Records not yet consumed by each of the groups with the largest lag",
            labels=["group"],
        )
        for top in groups.get("top") or []:
            if _is_number(top.get("lag")):
                lag.add_metric([str(top["group"])], float(top["lag"]))
        yield lag


class WithoutCreated(Collector):
    """``registry``'s families without their ``_created`` samples: what the classic text
    format serves (see the module's docstring)."""

    def __init__(self, registry: CollectorRegistry, names: Iterable[str] | None = None) -> None:
        self._registry = registry
        self._names = None if names is None else frozenset(names)

    def collect(self) -> Iterator[Metric]:
        names = self._names
        for family in self._registry.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            created = family.name + "_created"
            kept.samples = [
                s
                for s in family.samples
                if s.name != created and (names is None or s.name in names)
            ]
            if names is None or kept.samples:
                yield kept

    def restricted_registry(self, names: Iterable[str]) -> WithoutCreated:
        """The samples a scrape with ``?name[]=...`` asks for (prometheus_client's WSGI app;
        the registry's own restriction needs described collectors, and this one's are not)."""
        return WithoutCreated(self._registry, names)


class MetricsEndpoint:
    """The HTTP endpoint serving a :class:`DocumentCollector` (and the process's figures)
    on a thread of its own: in OpenMetrics to a scraper that asks for it (Prometheus does),
    with the counters' ``_created`` samples, else in the text format without them.
    :meth:`start` binds or raises; :meth:`stop` is idempotent."""

    def __init__(
        self, config: MetricsEndpointConfig, document: Callable[[], Mapping[str, Any]]
    ) -> None:
        self._config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DocumentCollector(document))
        ProcessCollector(registry=self.registry)
        self._openmetrics_app = make_wsgi_app(self.registry)
        self._text_app = make_wsgi_app(WithoutCreated(self.registry))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Serve ``GET /metrics``; returns the bound port. Raises InvalidConfigError naming
        ``metrics.port`` when the port is taken, ``metrics.host`` when the address cannot
        be bound."""
        host, port = self._config.host, self._config.port
        try:
            self._server, self._thread = start_http_server(
                port, host, registry=WithoutCreated(self.registry)
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise InvalidConfigError(
                    f"metrics.port={port}: {host}:{port} is already in use; stop the process "
                    "holding it or choose another metrics.port (0: any free port, -1: none)"
                ) from exc
            raise InvalidConfigError(
                f"metrics.host={host}: cannot serve the metrics endpoint there: {exc.strerror}"
            ) from exc
        # The server starts serving the text answer; the app choosing by format replaces
        # it at once (until then an OpenMetrics scraper gets text, which it reads too).
        self._server.set_app(self._app)
        self._thread.name = "idemlog-metrics-endpoint"
        self.port = int(self._server.server_address[1])
        log.info("metrics endpoint: http://%s:%d/metrics", host, self.port)
        return self.port

    def _app(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """The format prometheus_client picks for the request's Accept header, and with it
        the families with or without ``_created``."""
        _, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
        if content_type.startswith(OPENMETRICS):
            return self._openmetrics_app(environ, start_response)  # type: ignore[no-any-return]
        return self._text_app(environ, start_response)  # type: ignore[no-any-return]

    @property
    def address(self) -> str | None:
        """``host:port`` as bound (``metrics.port=0`` picks the port) once :meth:`start`
        returned; None before."""
        return None if self.port is None else f"{self._config.host}:{self.port}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # returns once serve_forever has
        server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
