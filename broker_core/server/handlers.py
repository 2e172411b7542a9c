"""DoAction handlers: one function per ``protocol.Action``, JSON body in, JSON document out.

Every field is read with ``protocol.field``, so a missing or mistyped one is an
``INVALID_REQUEST`` naming it. Bodies (``?`` marks an optional field):

=====================  ===================================================================
create_topic           {name, partitions, schema?: b64 Arrow IPC, config?: {key: value}}
                       -> {name, partitions: [leader broker id per partition]}
delete_topic           {name} -> {}
describe_topics        {names?: [..]} -> {topics: [{name, partitions: [{partition,
                       leader}], schema: b64|null, config}]}
list_offsets           {topic, partition} -> {log_start_offset, log_end_offset,
                       high_watermark, last_stable_offset}
metadata               {topics?: [..]} -> {brokers: [{broker_id, host, port}],
                       controller: id|null, topics: {name: [leader per partition]}}
find_coordinator       {transactional_id?} -> {broker_id, host, port}
init_producer_id       {transactional_id?, transaction_timeout_ms?, sink_batch_id?,
                       sink_id?, sink_run_id?} -> {producer_id, producer_epoch,
                       sink_status?: new|prepared|committed} (sink_*: an attempt of a
                       Spark task, docs/design.md)
prepare_sink_txn       {transactional_id, producer_id, producer_epoch, batch_id,
                       ranges?: [[topic, partition, first, last], ..]} -> {}
add_partitions_to_txn  {transactional_id, producer_id, producer_epoch, partitions:
                       [[topic, partition], ..]} -> {}
end_txn                {transactional_id, producer_id, producer_epoch, commit} -> {}
write_txn_markers      {producer_id, producer_epoch, commit, coordinator_epoch?,
                       partitions: [[topic, partition], ..]} -> {last_stable_offsets:
                       [{topic, partition, lso}, ..]}  (broker to broker; lso: just after
                       the marker, which is fsynced)
commit_sink_batch      {sink_id, batch_id, transactions: [[transactional_id, producer_id,
                       producer_epoch], ..], run_id?} -> {committed, last_committed_batch}
abort_sink_batch       same body -> {last_committed_batch}
abort_sink_run         {run_id? | sink_id?, batch_id} -> {aborted: [transactional_id, ..]}
sink_heartbeat         {sink_id, run_id} -> {}
stable_ends            {topic} -> {ends: {partition: offset}} (read_committed ends that
                       hold every sink batch whole or not at all)
list_transactions      {min_age_ms?} -> {transactions: [{transactional_id, age_ms, ..}]}
abort_transaction      {transactional_id} -> {aborted}
metrics                {} -> the metrics document (broker_core.server.metrics)
ping                   {} -> {broker_id, version}
=====================  ===================================================================

Without a transactional id, InitProducerId is served by any broker from its own leased
producer-id block (as Kafka does); everything transactional goes to the coordinator,
which runs on the controller (``NOT_COORDINATOR`` elsewhere, retriable).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_core.cluster.metadata import validate_new_topic
from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.wire import PROTOCOL_VERSION, Action, SinkAttempt, field
from broker_core.record.batch import MAX_PRODUCER_EPOCH
from broker_core.server.marker_client import STABLE_OFFSETS_FIELD, stable_offsets_doc

if TYPE_CHECKING:
    from broker_core.server.broker import Broker

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def _partitions_field(body: dict[str, Any], what: str) -> list[tuple[str, int]]:
    raw = field(body, "partitions", list, what)
    result: list[tuple[str, int]] = []
    for i, item in enumerate(raw):
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], int)
            or isinstance(item[1], bool)
        ):
            raise InvalidRequestError(
                f"{what}: field 'partitions[{i}]' must be [topic: str, partition: int], "
                f"got {item!r}"
            )
        result.append((item[0], item[1]))
    return result


def _transactions_field(body: dict[str, Any], what: str) -> list[tuple[str, int, int]]:
    raw = field(body, "transactions", list, what)
    result: list[tuple[str, int, int]] = []
    for i, item in enumerate(raw):
        ok = (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in item[1:])
        )
        if not ok:
            raise InvalidRequestError(
                f"{what}: field 'transactions[{i}]' must be [transactional_id: str, "
                f"producer_id: int, producer_epoch: int], got {item!r}"
            )
        result.append((item[0], item[1], item[2]))
    return result


def _producer_fields(body: dict[str, Any], what: str) -> tuple[int, int]:
    producer_id = field(body, "producer_id", int, what)
    producer_epoch = field(body, "producer_epoch", int, what)
    if producer_id < 0:
        raise InvalidRequestError(f"{what}: field 'producer_id' must be >= 0, got {producer_id}")
    if not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise InvalidRequestError(
            f"{what}: field 'producer_epoch' must be in 0..{MAX_PRODUCER_EPOCH}, "
            f"got {producer_epoch}"
        )
    return producer_id, producer_epoch


def _broker_doc(info: Any) -> dict[str, Any]:
    return {"broker_id": info.broker_id, "host": info.host, "port": info.port}


class ActionHandlers:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.table: dict[Action, Handler] = {
            Action.CREATE_TOPIC: self.create_topic,
            Action.DELETE_TOPIC: self.delete_topic,
            Action.DESCRIBE_TOPICS: self.describe_topics,
            Action.LIST_OFFSETS: self.list_offsets,
            Action.METADATA: self.metadata,
            Action.FIND_COORDINATOR: self.find_coordinator,
            Action.INIT_PRODUCER_ID: self.init_producer_id,
            Action.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            Action.END_TXN: self.end_txn,
            Action.PREPARE_SINK_TXN: self.prepare_sink_txn,
            Action.WRITE_TXN_MARKERS: self.write_txn_markers,
            Action.COMMIT_SINK_BATCH: self.commit_sink_batch,
            Action.ABORT_SINK_BATCH: self.abort_sink_batch,
            Action.ABORT_SINK_RUN: self.abort_sink_run,
            Action.SINK_HEARTBEAT: self.sink_heartbeat,
            Action.STABLE_ENDS: self.stable_ends,
            Action.LIST_TRANSACTIONS: self.list_transactions,
            Action.ABORT_TRANSACTION: self.abort_transaction,
            Action.METRICS: self.metrics,
            Action.PING: self.ping,
        }

    def handle(self, action_type: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            action = Action(action_type)
        except ValueError:
            known = ", ".join(a.value for a in Action)
            raise InvalidRequestError(
                f"unknown action {action_type!r}; known actions: {known}"
            ) from None
        return self.table[action](body)

    # -- topics --------------------------------------------------------------------------
    def create_topic(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "create_topic"
        name = field(body, "name", str, what)
        partitions = field(body, "partitions", int, what)
        config = field(body, "config", dict, what, {})
        raw_schema = field(body, "schema", str, what, None)
        schema: bytes | None = None
        if raw_schema is not None:
            try:
                schema = base64.b64decode(raw_schema, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequestError(f"{what}: field 'schema' is not base64 ({exc})") from exc
        if name.startswith("__"):
            raise InvalidTopicError(
                f"topic name {name!r}: names starting with '__' are reserved for internal topics"
            )
        name, partitions, schema, overrides = validate_new_topic(name, partitions, schema, config)
        broker = self._broker
        broker.config.log_defaults.overlaid(overrides)  # e.g. max.message.bytes > segment
        assignment = broker.require_cluster().create_topic(name, partitions, schema, overrides)
        if assignment.partitions_of(broker.broker_id):
            broker.topics.ensure(assignment)
        return {
            "name": name,
            "partitions": [assignment.partitions[p] for p in sorted(assignment.partitions)],
        }

    def delete_topic(self, body: dict[str, Any]) -> dict[str, Any]:
        name = field(body, "name", str, "delete_topic")
        self._broker.topics.assignment(name)  # unknown -> UNKNOWN_TOPIC_OR_PARTITION
        self._broker.require_cluster().delete_topic(name)
        self._broker.topics.delete(name)
        return {}

    def describe_topics(self, body: dict[str, Any]) -> dict[str, Any]:
        names = field(body, "names", list, "describe_topics", None)
        broker = self._broker
        if names is None:
            assignments = list(broker.require_cluster().topics().values())
        else:
            for i, n in enumerate(names):
                if not isinstance(n, str):
                    raise InvalidRequestError(
                        f"describe_topics: field 'names[{i}]' must be str, got {type(n).__name__}"
                    )
            assignments = [broker.topics.assignment(n) for n in names]
        topics = []
        for a in sorted(assignments, key=lambda a: a.name):
            schema = a.schema
            if schema is None and broker.store is not None:
                # The first append fixes a schema-less topic's schema in the leader's store.
                try:
                    local = broker.store.topic(a.name).schema
                except UnknownTopicOrPartitionError:
                    local = None  # this broker leads none of its partitions
                if local is not None:
                    schema = local.serialize().to_pybytes()
            topics.append(
                {
                    "name": a.name,
                    "partitions": [
                        {"partition": p, "leader": a.partitions[p]} for p in sorted(a.partitions)
                    ],
                    "schema": None if schema is None else base64.b64encode(schema).decode(),
                    "config": dict(a.config),
                }
            )
        return {"topics": topics}

    def list_offsets(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "list_offsets"
        topic = field(body, "topic", str, what)
        partition = field(body, "partition", int, what)
        log = self._broker.topics.leader_log(topic, partition)
        return {
            "topic": topic,
            "partition": partition,
            "log_start_offset": log.log_start_offset,
            "log_end_offset": log.log_end_offset,
            "high_watermark": log.high_watermark,
            "last_stable_offset": log.last_stable_offset,
        }

    def metadata(self, body: dict[str, Any]) -> dict[str, Any]:
        names = field(body, "topics", list, "metadata", None)
        cluster = self._broker.require_cluster()
        assignments = cluster.topics()
        if names is not None:
            assignments = {n: assignments[n] for n in names if n in assignments}
        controller = cluster.controller()
        return {
            "brokers": [
                _broker_doc(b) for b in sorted(cluster.brokers(), key=lambda b: b.broker_id)
            ],
            "controller": None if controller is None else controller.broker_id,
            "topics": {
                name: [a.partitions[p] for p in sorted(a.partitions)]
                for name, a in sorted(assignments.items())
            },
        }

    def find_coordinator(self, body: dict[str, Any]) -> dict[str, Any]:
        field(body, "transactional_id", str, "find_coordinator", None)
        controller = self._broker.require_cluster().controller()
        if controller is None:
            raise CoordinatorNotAvailableError("no controller is elected right now")
        return _broker_doc(controller)

    # -- producers and transactions ------------------------------------------------------
    def init_producer_id(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "init_producer_id"
        txn_id = field(body, "transactional_id", str, what, None)
        timeout_ms = field(body, "transaction_timeout_ms", int, what, None)
        sink_batch_id = field(body, "sink_batch_id", int, what, None)
        if txn_id is None:
            if sink_batch_id is not None:
                raise InvalidRequestError(f"{what}: field 'sink_batch_id' needs a transactional_id")
            if timeout_ms is not None:
                raise InvalidRequestError(
                    f"{what}: field 'transaction_timeout_ms' needs a transactional_id"
                )
            pids = self._broker.pids
            assert pids is not None
            return {"producer_id": pids.generate_producer_id(), "producer_epoch": 0}
        if not txn_id:
            raise InvalidRequestError(f"{what}: field 'transactional_id' must not be empty")
        coordinator = self._broker.coordinator()
        if sink_batch_id is not None:
            attempt = SinkAttempt.from_doc(
                {**body, "batch_id": sink_batch_id, "run_id": body.get("sink_run_id")}, what
            )
            pid, epoch, status = coordinator.init_sink_producer(txn_id, timeout_ms, attempt)
            return {"producer_id": pid, "producer_epoch": epoch, "sink_status": str(status)}
        pid, epoch = coordinator.init_producer_id(txn_id, timeout_ms)
        return {"producer_id": pid, "producer_epoch": epoch}

    def prepare_sink_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "prepare_sink_txn"
        txn_id = field(body, "transactional_id", str, what)
        pid, epoch = _producer_fields(body, what)
        batch_id = field(body, "batch_id", int, what)
        ranges = field(body, "ranges", list, what, [])
        self._broker.coordinator().prepare_sink_txn(txn_id, pid, epoch, batch_id, ranges)
        return {}

    def sink_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "sink_heartbeat"
        self._broker.coordinator().sink_heartbeat(
            field(body, "sink_id", str, what), field(body, "run_id", str, what)
        )
        return {}

    def abort_sink_run(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "abort_sink_run"
        aborted = self._broker.coordinator().abort_sink_run(
            field(body, "run_id", str, what, None),
            field(body, "batch_id", int, what),
            sink_id=field(body, "sink_id", str, what, None),
        )
        return {"aborted": aborted}

    def stable_ends(self, body: dict[str, Any]) -> dict[str, Any]:
        topic = field(body, "topic", str, "stable_ends")
        ends = self._broker.coordinator().stable_ends(topic)
        return {"ends": {str(p): offset for p, offset in sorted(ends.items())}}

    def list_transactions(self, body: dict[str, Any]) -> dict[str, Any]:
        min_age_ms = field(body, "min_age_ms", int, "list_transactions", 0)
        return {"transactions": self._broker.coordinator().list_transactions(min_age_ms)}

    def abort_transaction(self, body: dict[str, Any]) -> dict[str, Any]:
        txn_id = field(body, "transactional_id", str, "abort_transaction")
        return {"aborted": self._broker.coordinator().abort_transaction(txn_id)}

    def add_partitions_to_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "add_partitions_to_txn"
        txn_id = field(body, "transactional_id", str, what)
        pid, epoch = _producer_fields(body, what)
        partitions = _partitions_field(body, what)
        for topic, partition in partitions:
            self._broker.topics.assignment(topic).leader(partition)  # exists?
        self._broker.coordinator().add_partitions(txn_id, pid, epoch, partitions)
        return {}

    def end_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "end_txn"
        txn_id = field(body, "transactional_id", str, what)
        pid, epoch = _producer_fields(body, what)
        commit = field(body, "commit", bool, what)
        self._broker.coordinator().end_txn(txn_id, pid, epoch, commit)
        return {}

    def write_txn_markers(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "write_txn_markers"
        pid, epoch = _producer_fields(body, what)
        commit = field(body, "commit", bool, what)
        coordinator_epoch = field(body, "coordinator_epoch", int, what, 0)
        partitions = _partitions_field(body, what)
        markers = self._broker.markers
        assert markers is not None
        stable = markers.write_local(pid, epoch, commit, coordinator_epoch, partitions)
        # The coordinator's RoutingMarkerWriter reads this back (parse_stable_offsets).
        return {STABLE_OFFSETS_FIELD: stable_offsets_doc(stable)}

    def _sink_fields(self, body: dict[str, Any], what: str) -> tuple[str, int, list[Any]]:
        sink_id = field(body, "sink_id", str, what)
        batch_id = field(body, "batch_id", int, what)
        if not sink_id:
            raise InvalidRequestError(f"{what}: field 'sink_id' must not be empty")
        if batch_id < 0:
            raise InvalidRequestError(f"{what}: field 'batch_id' must be >= 0, got {batch_id}")
        return sink_id, batch_id, _transactions_field(body, what)

    def commit_sink_batch(self, body: dict[str, Any]) -> dict[str, Any]:
        sink_id, batch_id, transactions = self._sink_fields(body, "commit_sink_batch")
        coordinator = self._broker.coordinator()
        run_id = field(body, "run_id", str, "commit_sink_batch", None)
        committed = coordinator.commit_sink_batch(sink_id, batch_id, transactions, run_id)
        return {
            "committed": bool(committed),
            "last_committed_batch": coordinator.last_committed_batch(sink_id),
        }

    def abort_sink_batch(self, body: dict[str, Any]) -> dict[str, Any]:
        sink_id, batch_id, transactions = self._sink_fields(body, "abort_sink_batch")
        coordinator = self._broker.coordinator()
        coordinator.abort_sink_batch(sink_id, batch_id, transactions)
        return {"last_committed_batch": coordinator.last_committed_batch(sink_id)}

    # -- operations ----------------------------------------------------------------------
    def metrics(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._broker.metrics_document()

    def ping(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"broker_id": self._broker.broker_id, "version": PROTOCOL_VERSION}
