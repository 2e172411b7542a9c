"""EmbeddedCluster: a single file-backed broker that is always the controller."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from broker_core.cluster.embedded import EmbeddedCluster
from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.cluster.topic_creation import assign_partitions
from broker_core.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tests.harness.waiting import Recorder

WAIT_S = 10.0
BROKER = BrokerInfo(1, "127.0.0.1", 9092)
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())]).serialize().to_pybytes()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "cluster.json"


@pytest.fixture
def open_cluster(path: Path) -> Iterator[Callable[..., EmbeddedCluster]]:
    made: list[EmbeddedCluster] = []

    def make(broker: BrokerInfo = BROKER, at: Path = path) -> EmbeddedCluster:
        made.append(EmbeddedCluster(broker, at))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


def test_single_broker_is_live_and_the_controller_once_registered(
    open_cluster: Callable[..., EmbeddedCluster],
) -> None:
    cluster = open_cluster()
    control = Recorder(WAIT_S)
    cluster.on_controller_change(control)
    assert (cluster.brokers(), cluster.controller(), cluster.is_controller()) == ([], None, False)

    bound = BrokerInfo(1, "127.0.0.1", 40123)  # the port the server really bound
    cluster.register(bound)

    assert cluster.brokers() == [bound]
    assert cluster.controller() == bound
    assert cluster.is_controller()
    control.wait(lambda v: v == [True], "the gain")
    late = Recorder(WAIT_S)
    cluster.on_controller_change(late)
    late.wait(lambda v: v == [True], "the gain, for a late subscriber")
    with pytest.raises(InvalidConfigError, match=r"broker id 2.*broker id 1"):
        cluster.register(BrokerInfo(2, "127.0.0.1", 1))

    cluster.close()

    assert control.values == [True, False]  # close() returns after the callbacks ran
    assert late.values == [True, False]
    assert (cluster.brokers(), cluster.controller(), cluster.is_controller()) == ([], None, False)
    cluster.close()  # idempotent
    assert control.values == [True, False]


def test_topics_persist_across_instances(
    open_cluster: Callable[..., EmbeddedCluster], path: Path
) -> None:
    first = open_cluster()
    first.register(BROKER)
    payments = first.create_topic("payments", 4, SCHEMA, {"retention.ms": "60000"})
    first.create_topic("audit", 1, None, {})
    first.create_topic("scratch", 2, None, {})
    first.delete_topic("scratch")
    first.close()

    again = open_cluster()

    audit_id = again.topic("audit").topic_id
    assert len({payments.topic_id, audit_id}) == 2  # one id per topic, kept across starts
    assert payments == TopicAssignment(
        "payments",
        {0: 1, 1: 1, 2: 1, 3: 1},
        SCHEMA,
        {"retention.ms": "60000"},
        topic_id=payments.topic_id,
    )
    assert again.topics() == {
        "payments": payments,
        "audit": TopicAssignment("audit", {0: 1}, None, {}, topic_id=audit_id),
    }
    assert again.topic("payments").schema == SCHEMA
    assert pa.ipc.read_schema(pa.py_buffer(again.topic("payments").schema)).names == ["id", "v"]
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["broker_id"] == 1
    assert doc["topics"]["audit"] == {
        "version": 2,
        "partitions": {"0": {"replicas": [1], "leader": 1, "leader_epoch": 0, "isr": [1]}},
        "schema": None,
        "config": {},
        "topic_id": audit_id,
    }
    assert sorted(p.name for p in path.parent.iterdir()) == ["cluster.json"]  # no temp file


def test_topic_callbacks_fire_on_create_and_delete(
    open_cluster: Callable[..., EmbeddedCluster],
) -> None:
    cluster = open_cluster()
    seen = Recorder(WAIT_S)
    third = Recorder(WAIT_S)

    def broken() -> None:
        raise RuntimeError("a subscriber's bug")

    cluster.on_topics_change(broken)  # must not keep the others from the news
    cluster.on_topics_change(lambda: seen(set(cluster.topics())))
    cluster.on_topics_change(third)

    cluster.create_topic("a", 1, None, {})
    cluster.create_topic("b", 1, None, {})
    cluster.delete_topic("a")

    seen.wait(lambda v: len(v) == 3, "three changes")
    assert seen.values[-1] == {"b"}
    third.wait(lambda v: len(v) == 3, "the third subscriber too")


def test_bad_requests_are_refused_and_change_nothing(
    open_cluster: Callable[..., EmbeddedCluster], path: Path
) -> None:
    cluster = open_cluster()
    cluster.create_topic("dup", 2, None, {})
    before = path.read_bytes()

    with pytest.raises(TopicAlreadyExistsError, match="'dup' already exists"):
        cluster.create_topic("dup", 3, None, {})
    with pytest.raises(InvalidTopicError, match="'a b'"):
        cluster.create_topic("a b", 1, None, {})
    with pytest.raises(InvalidTopicError, match="over the limit of 249"):
        cluster.create_topic("x" * 250, 1, None, {})
    for bad in (0, -1, 10_001, True, "3"):
        with pytest.raises(InvalidPartitionsError, match="partitions="):
            cluster.create_topic("p", bad, None, {})  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match=r"unknown topic config key 'retention.msec'"):
        cluster.create_topic("c", 1, None, {"retention.msec": "1"})
    with pytest.raises(InvalidConfigError, match=r"segment.bytes='tiny' is not an integer"):
        cluster.create_topic("c", 1, None, {"segment.bytes": "tiny"})
    with pytest.raises(InvalidRequestError, match="'s': schema is not a serialized Arrow"):
        cluster.create_topic("s", 1, b"\x00garbage", {})
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope' does not exist"):
        cluster.topic("nope")
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope' does not exist"):
        cluster.delete_topic("nope")
    with pytest.raises(InvalidTopicError):
        cluster.topic("no/such")

    assert path.read_bytes() == before
    assert set(cluster.topics()) == {"dup"}
    cluster.close()
    with pytest.raises(InvalidRequestError, match="closed"):
        cluster.create_topic("late", 1, None, {})


def test_assignment_helpers() -> None:
    topic = TopicAssignment("t", {0: 5, 1: 6, 2: 5}, None, {})
    assert topic.leader(1) == 6
    assert topic.partitions_of(5) == [0, 2]
    for bad in (3, -1, True):
        with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0..2"):
            topic.leader(bad)
    with pytest.raises(BrokerNotAvailableError, match=r"no live broker.*topic 't'") as excinfo:
        assign_partitions("t", 3, [])
    assert excinfo.value.code == 8 and excinfo.value.retriable
    with pytest.raises(InvalidConfigError, match="port=70000"):
        BrokerInfo(1, "h", 70000)
    with pytest.raises(InvalidConfigError, match="broker id -1"):
        BrokerInfo(-1, "h", 1)


def test_data_directory_of_another_broker_id_is_refused(
    open_cluster: Callable[..., EmbeddedCluster], path: Path
) -> None:
    first = open_cluster()
    first.create_topic("t", 2, None, {})
    first.close()

    with pytest.raises(InvalidConfigError) as excinfo:
        open_cluster(BrokerInfo(2, "127.0.0.1", 9092))

    message = str(excinfo.value)
    assert "broker.id=2 does not match broker id 1" in message
    assert str(path) in message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"version": 9, "broker_id": 1, "topics": {}}', "version 9"),
        (b'{"version": 1, "broker_id": "one", "topics": {}}', "broker id 'one'"),
        (b'{"version": 1, "broker_id": 1, "topics": []}', "'topics' is not a JSON object"),
        (b'{"version": 1, "broker_id": 1, "topics": {"bad/name": {}}}', "'bad/name'"),
        (
            b'{"version": 1, "broker_id": 1, "topics": {"t": {"version": 1, '
            b'"partitions": {"0": 1, "2": 1}, "schema": null, "config": {}}}}',
            "partitions [0, 2] are not 0..1",
        ),
        (
            b'{"version": 1, "broker_id": 1, "topics": {"t": {"version": 1, '
            b'"partitions": {"0": 1}, "schema": "%%%", "config": {}}}}',
            "schema that is not base64",
        ),
    ],
)
def test_corrupt_file_is_refused_naming_it(
    open_cluster: Callable[..., EmbeddedCluster], path: Path, content: bytes, problem: str
) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(content)

    with pytest.raises(CorruptRecordError) as excinfo:
        open_cluster()

    assert str(path) in str(excinfo.value)
    assert problem in str(excinfo.value)


def test_a_version_1_file_is_read_as_single_replicas_and_rewritten_as_version_2(
    open_cluster: Callable[..., EmbeddedCluster], path: Path
) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b'{"version": 1, "broker_id": 1, "controller_epoch": 4, "topics": {"t": {"version": 1,'
        b' "partitions": {"0": 1, "1": 1}, "schema": null, "config": {"retention.ms": "5"}}}}'
    )
    cluster = open_cluster()
    topic = cluster.topic("t")

    assert topic.leader(1) == 1 and topic.partitions == {0: 1, 1: 1}
    assert topic.state(0) == PartitionState((1,), 1, 0, (1,))
    assert topic.config == {"retention.ms": "5"}
    cluster.register(BROKER)  # a change: the file is written again, in the new form
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["controller_epoch"] == 5
    assert doc["topics"]["t"]["partitions"]["1"] == {
        "replicas": [1],
        "leader": 1,
        "leader_epoch": 0,
        "isr": [1],
    }
    cluster.close()
    assert open_cluster().topics() == {"t": topic}


def test_replication_factor_above_the_one_broker_is_refused(
    open_cluster: Callable[..., EmbeddedCluster],
) -> None:
    cluster = open_cluster()
    cluster.register(BROKER)
    with pytest.raises(InvalidReplicationFactorError, match="number of live brokers, 1") as excinfo:
        cluster.create_topic("t", 1, None, {"replication.factor": "2"})
    assert excinfo.value.code == 38 and not excinfo.value.retriable
    assert "replication.factor=2" in excinfo.value.message
    assert cluster.topics() == {}
    one = cluster.create_topic("t", 2, None, {"replication.factor": 1})
    assert one.state(1) == PartitionState((1,), 1, 0, (1,))


def test_a_topic_stored_before_ids_gets_one_written_at_load_and_kept(
    open_cluster: Callable[..., EmbeddedCluster], path: Path
) -> None:
    first = open_cluster()
    first.register(BROKER)
    first.create_topic("legacy", 1, None, {})
    first.close()
    doc = json.loads(path.read_text())
    del doc["topics"]["legacy"]["topic_id"]  # as a broker from before ids wrote it
    path.write_text(json.dumps(doc))

    loaded = open_cluster()
    topic_id = loaded.topic("legacy").topic_id
    assert len(topic_id) == 32
    # Written at load, before any start or request: a crash now cannot pick another.
    assert json.loads(path.read_text())["topics"]["legacy"]["topic_id"] == topic_id
    loaded.close()
    assert open_cluster().topic("legacy").topic_id == topic_id
