"""The wire protocol end to end against a real broker process (embedded mode)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow.flight as flight
import pytest

from broker_core.cli.main import main as cli_main
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    InvalidReplicationFactorError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.store import LogStore
from broker_core.protocol.admin_requests import PartitionInfo
from broker_core.protocol.wire import (
    Action,
    FetchTrailer,
    SinkAttempt,
    decode_fetch_meta,
    encode_json,
)
from tests.broker.helpers import SCHEMA, ids, prepared_attempt, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]


@pytest.fixture
def client(shared_broker: BrokerProcess, client_for: ClientFor) -> BrokerClient:
    return client_for(shared_broker)


def test_create_describe_list_offsets(client: BrokerClient) -> None:
    leaders = client.create_topic(
        "orders", 3, schema=SCHEMA, config={"retention.ms": -1, "flush.messages": 1}
    )
    assert leaders == [0, 0, 0]
    (described,) = client.describe_topics(["orders"])
    assert [p.partition for p in described.partitions] == [0, 1, 2]
    assert {p.leader for p in described.partitions} == {0}
    # One replica each (replication is not served yet): the leader, in sync, epoch 0.
    assert [(p.replicas, p.isr, p.leader_epoch) for p in described.partitions] == [
        ((0,), (0,), 0)
    ] * 3
    assert described.config == {"retention.ms": "-1", "flush.messages": "1"}
    assert described.schema is not None and described.schema.equals(SCHEMA)
    assert client.list_offsets("orders", 2) == {
        "partition": 2,
        "log_start_offset": 0,
        "log_end_offset": 0,
        "high_watermark": 0,
        "last_stable_offset": 0,
    }
    with pytest.raises(TopicAlreadyExistsError, match="'orders' already exists") as info:
        client.create_topic("orders", 1)
    assert info.value.code == 36
    view = client.refresh_metadata()
    assert view.topics["orders"] == [0, 0, 0] and view.controller == 0


def test_empty_fetch_carries_the_schema_and_a_trailer(
    client: BrokerClient, shared_broker: BrokerProcess
) -> None:
    client.create_topic("empty", 1, schema=SCHEMA)
    response = client.fetch_once("empty", 0, 0)
    assert response.schema.equals(SCHEMA) and response.batches == []
    assert response.trailer == FetchTrailer(0, 0, 0, 0)
    # The raw stream, as any Flight client sees it.
    raw = flight.connect(f"grpc://{shared_broker.address}")
    ticket = {"op": "fetch", "topic": "empty", "partition": 0, "offset": 0}
    table = raw.do_get(flight.Ticket(encode_json(ticket))).read_all()
    assert table.schema.equals(SCHEMA) and table.num_rows == 0
    raw.close()


def test_200_pipelined_batches_answered_in_order(client: BrokerClient) -> None:
    client.create_topic("pipelined", 1)
    pid, epoch = client.init_producer_id()
    handles = []
    most_in_flight = 0
    with client.produce_stream("pipelined", 0) as stream:
        for i in range(200):
            handles.append(
                stream.send(
                    rows(10, start=10 * i),
                    producer_id=pid,
                    producer_epoch=epoch,
                    base_sequence=10 * i,
                )
            )
            most_in_flight = max(most_in_flight, stream.in_flight())
        responses = [h.result(30) for h in handles]
    assert most_in_flight > 1, "sends waited for answers: the stream is not pipelined"
    assert [r.correlation_id for r in responses] == [h.correlation_id for h in handles]
    assert [(r.error_code, r.base_offset, r.last_offset) for r in responses] == [
        (0, 10 * i, 10 * i + 9) for i in range(200)
    ]
    assert not any(r.duplicate for r in responses)
    assert ids(client, "pipelined") == list(range(2000))


def test_duplicates_and_sequence_errors_over_the_wire(client: BrokerClient) -> None:
    client.create_topic("dups", 2)
    pid, epoch = client.init_producer_id()
    with client.produce_stream("dups", 1) as stream:

        def send(seq: int, n: int = 5) -> tuple[int, int, bool]:
            r = stream.send(
                rows(n, start=seq), producer_id=pid, producer_epoch=epoch, base_sequence=seq
            ).result(10)
            error = r.error()
            if error is not None:
                raise error
            return r.base_offset, r.last_offset, r.duplicate

        originals = [send(5 * i) for i in range(7)]  # seqs 0..34, offsets 0..34
        assert send(30) == (30, 34, True)  # the tail, retried: original offsets
        assert send(10) == (10, 14, True)  # oldest batch still in the window of 5
        with pytest.raises(DuplicateSequenceError, match="already written") as dup:
            send(0)  # left the window: certain duplicate, offsets unknown
        assert dup.value.code == 46 and not dup.value.retriable
        with pytest.raises(OutOfOrderSequenceError, match="expected sequence 35") as oos:
            send(40)  # a gap
        assert oos.value.code == 45
        with pytest.raises(OutOfOrderSequenceError):
            send(33, 4)  # partial overlap with the tail
    assert originals[6] == (30, 34, False)
    assert ids(client, "dups", 1) == list(range(35))
    doc = client.metrics()
    (part,) = [p for p in doc["partitions"] if (p["topic"], p["partition"]) == ("dups", 1)]
    assert part["batches_appended"] == 7 and part["records_appended"] == 35
    assert part["duplicates_in_window"] == 2
    assert part["duplicates_beyond_window"] == 1
    assert part["out_of_order"] == 2
    assert part["log_end_offset"] == 35 and part["lso_lag"] == 0
    (producer,) = [p for p in doc["producers"] if p["producer_id"] == pid]
    assert (producer["duplicates_in_window"], producer["out_of_order"]) == (2, 2)


def test_init_producer_id_with_and_without_transactional_id(client: BrokerClient) -> None:
    plain = {client.init_producer_id() for _ in range(3)}
    assert len({pid for pid, _ in plain}) == 3 and {e for _, e in plain} == {0}
    pid, epoch = client.init_producer_id("app-1")
    assert epoch == 0 and pid not in {p for p, _ in plain}
    assert client.init_producer_id("app-1") == (pid, 1)  # same id, bumped epoch
    assert client.init_producer_id("app-1", transaction_timeout_ms=5000) == (pid, 2)
    other, _ = client.init_producer_id("app-2")
    assert other != pid


def _produce_txn(
    client: BrokerClient, txn_id: str, topic: str, start: int, partitions: list[int]
) -> tuple[int, int]:
    pid, epoch = client.init_producer_id(txn_id)
    client.add_partitions_to_txn(txn_id, pid, epoch, [(topic, p) for p in partitions])
    for p in partitions:
        with client.produce_stream(topic, p, transactional_id=txn_id) as stream:
            stream.send(
                rows(4, start=start + 100 * p),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=True,
            ).offsets(10)
    return pid, epoch


def test_transaction_across_two_partitions_committed_and_one_aborted(
    client: BrokerClient,
) -> None:
    client.create_topic("txns", 2)
    a = _produce_txn(client, "txn-a", "txns", 1000, [0, 1])
    b = _produce_txn(client, "txn-b", "txns", 2000, [0, 1])
    for p in (0, 1):  # both open: nothing is stable yet
        assert ids(client, "txns", p) == []
        assert client.list_offsets("txns", p)["last_stable_offset"] == 0
        assert len(ids(client, "txns", p, "read_uncommitted")) == 8
    client.end_txn("txn-a", *a, commit=True)
    client.end_txn("txn-b", *b, commit=False)
    for p in (0, 1):
        a_rows = list(range(1000 + 100 * p, 1004 + 100 * p))
        b_rows = list(range(2000 + 100 * p, 2004 + 100 * p))
        assert ids(client, "txns", p) == a_rows
        assert ids(client, "txns", p, "read_uncommitted") == a_rows + b_rows
        offsets = client.list_offsets("txns", p)
        assert offsets["last_stable_offset"] == offsets["log_end_offset"] == 10  # 8 + 2 markers
    # The raw fetch stream says which batches are transactional, and where to go on.
    response = client.fetch_once("txns", 0, 0, isolation="read_uncommitted")
    assert [m.transactional for m, _ in response.batches] == [True, True]
    assert [m.producer_id for m, _ in response.batches] == [a[0], b[0]]
    assert response.trailer.next_offset == 10 and response.trailer.last_stable_offset == 10
    txns = client.metrics()["transactions"]
    assert txns["transactions_committed"] >= 1 and txns["transactions_aborted"] >= 1
    assert txns["open_transactions"] == 0


def test_sink_commit_is_idempotent_over_the_wire(client: BrokerClient) -> None:
    client.create_topic("sink", 2)

    def attempt(batch: int, start: int) -> list[tuple[str, int, int]]:
        """One Spark batch: each task fences its predecessors and writes a transaction."""
        run = SinkAttempt("query-1", f"run-{start}", batch)
        return [
            prepared_attempt(
                client, run, p, "sink", {p: [range(start + 100 * p, start + 100 * p + 4)]}
            )
            for p in (0, 1)
        ]

    first = attempt(0, 0)
    assert client.commit_sink_batch("query-1", 0, first) is True
    assert client.commit_sink_batch("query-1", 0, first) is False  # the commit, retried
    replay = attempt(0, 5000)  # the driver restarted and re-ran batch 0
    assert client.commit_sink_batch("query-1", 0, replay) is False  # aborted instead
    for p in (0, 1):
        assert ids(client, "sink", p) == list(range(100 * p, 100 * p + 4))
    nxt = attempt(1, 7000)
    assert client.commit_sink_batch("query-1", 1, nxt) is True
    for p in (0, 1):
        assert ids(client, "sink", p)[-4:] == list(range(7000 + 100 * p, 7004 + 100 * p))
        offsets = client.list_offsets("sink", p)
        assert offsets["last_stable_offset"] == offsets["log_end_offset"]


def test_zombie_append_and_end_txn_are_fenced(client: BrokerClient) -> None:
    """docs/design.md §9 scenario 12 over the wire."""
    client.create_topic("zombie", 1)
    old_pid, old_epoch = _produce_txn(client, "app-z", "zombie", 0, [0])
    new_pid, new_epoch = client.init_producer_id("app-z")  # a new instance takes over
    assert (new_pid, new_epoch) == (old_pid, old_epoch + 1)
    # The zombie's open transaction was aborted: its rows never become visible.
    assert ids(client, "zombie") == []
    offsets = client.list_offsets("zombie", 0)
    assert offsets["last_stable_offset"] == offsets["log_end_offset"]
    with client.produce_stream("zombie", 0, transactional_id="app-z") as stream:
        response = stream.send(
            rows(2, start=50),
            producer_id=old_pid,
            producer_epoch=old_epoch,
            base_sequence=4,
            transactional=True,
        ).result(10)
    assert response.error_code == 47
    assert isinstance(response.error(), InvalidProducerEpochError)
    with pytest.raises(ProducerFencedError) as fenced:
        client.end_txn("app-z", old_pid, old_epoch, commit=True)
    assert fenced.value.code == 90 and "epoch" in fenced.value.message
    # The new instance works normally.
    client.add_partitions_to_txn("app-z", new_pid, new_epoch, [("zombie", 0)])
    with client.produce_stream("zombie", 0, transactional_id="app-z") as stream:
        stream.send(
            rows(3, start=900),
            producer_id=new_pid,
            producer_epoch=new_epoch,
            base_sequence=0,
            transactional=True,
        ).offsets(10)
    client.end_txn("app-z", new_pid, new_epoch, commit=True)
    assert ids(client, "zombie") == [900, 901, 902]
    part = next(p for p in client.metrics()["partitions"] if p["topic"] == "zombie")
    assert part["fenced_appends"] == 1


def test_actions_are_listed_and_ping_answers(
    client: BrokerClient, shared_broker: BrokerProcess
) -> None:
    raw = flight.connect(f"grpc://{shared_broker.address}")
    listed = {a.type for a in raw.list_actions()}
    raw.close()
    assert listed == {a.value for a in Action}
    assert client.ping() == {"broker_id": 0, "version": 1}
    fetched = decode_fetch_meta(FetchTrailer(1, 2, 3, 4).encode())
    assert fetched == FetchTrailer(1, 2, 3, 4)


def test_replication_factor_above_the_live_brokers_is_refused_over_the_wire(
    client: BrokerClient, shared_broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidReplicationFactorError) as info:
        client.create_topic("replicated", 2, config={"replication.factor": 3})
    assert info.value.code == 38 and not info.value.retriable
    assert "replication.factor=3" in info.value.message
    assert "number of live brokers, 1" in info.value.message
    args = ["topics", "create", "--bootstrap", shared_broker.address, "--topic", "replicated"]
    assert cli_main([*args, "--partitions", "1", "--config", "replication.factor=2"]) == 2
    assert "INVALID_REPLICATION_FACTOR (38)" in capsys.readouterr().err
    with pytest.raises(UnknownTopicOrPartitionError):
        client.describe_topics(["replicated"])
    client.create_topic("replicated", 1, config={"replication.factor": 1})
    (described,) = client.describe_topics(["replicated"])
    assert described.config == {"replication.factor": "1"}
    assert described.partitions == (PartitionInfo(0, 0, (0,), (0,), 0),)


def test_cli_topics_consume_and_metrics(
    client: BrokerClient, shared_broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = ["--bootstrap", shared_broker.address]
    assert (
        cli_main(
            [
                *("topics", "create", *bootstrap, "--topic", "cli", "--partitions", "2"),
                *("--schema", "id:int64,key:int32,value:string", "--config", "retention.ms=-1"),
            ]
        )
        == 0
    )
    assert "created topic cli with 2 partitions" in capsys.readouterr().out
    for p in (0, 1):
        with client.produce_stream("cli", p) as stream:
            stream.send(rows(3 + p, start=10 * p)).offsets(10)
    assert cli_main(["topics", "describe", *bootstrap, "--topic", "cli"]) == 0
    out = capsys.readouterr().out
    assert "topic cli  schema [id: int64, key: int32, value: string]" in out
    assert "retention.ms" in out and "end          4" in out
    for p in (0, 1):
        assert (
            f"partition    {p}  leader   0  replicas 0         isr 0         leader epoch   0"
            in out
        )
    # Nothing arrives after the 7 rows: --timeout-ms ends the consumer (0) after them.
    follow = ["consume", *bootstrap, "--topic", "cli", "--from-beginning", "--timeout-ms", "300"]
    assert cli_main([*follow, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["partition"], r["offset"], r["value"]["id"]) for r in lines] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 10), (1, 1, 11), (1, 2, 12), (1, 3, 13),
    ]  # fmt: skip
    args = [*follow, "--count-only"]
    assert cli_main([*args, "--isolation", "read_committed"]) == 0
    assert "total_rows=7 isolation=read_committed" in capsys.readouterr().out
    assert cli_main(["metrics", *bootstrap, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cli_rows = {
        p["partition"]: p["records_appended"] for p in doc["partitions"] if p["topic"] == "cli"
    }
    assert cli_rows == {0: 3, 1: 4}
    assert cli_main(["metrics", *bootstrap]) == 0
    table = capsys.readouterr().out
    assert "partitions" in table and "legend:" in table and "cli" in table
    # The coordinator's nested counters are JSON, as --json has them, never Python's repr.
    section = table[table.index("\ntransactions\n") + 1 :].split("\n\n")[0].splitlines()[1:]
    nested = {k.strip(): v for k, v in (line.split(": ", 1) for line in section)}
    assert json.loads(nested["by_state"]) == doc["transactions"]["by_state"]
    assert json.loads(nested["state_partitions"]) == doc["transactions"]["state_partitions"]
    assert "{'" not in table and "['" not in table, table
    assert cli_main(["topics", "delete", *bootstrap, "--topic", "cli"]) == 0
    capsys.readouterr()
    assert cli_main(["topics", "describe", *bootstrap, "--topic", "cli"]) == 1  # refused
    assert "topic 'cli' does not exist" in capsys.readouterr().err


def test_store_written_directory_is_adopted_and_deleted_topics_leave_disk(
    broker_factory: BrokerFactory, client_for: ClientFor, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with LogStore(data) as store:  # written before there was a broker
        store.create_topic("legacy", 2, config={"retention.ms": -1})
        store.partition("legacy", 1).append(rows(4), producer_id=-1)
    broker = broker_factory({"log.dir": data})
    client = client_for(broker)
    (described,) = client.describe_topics(["legacy"])
    assert len(described.partitions) == 2 and described.config == {"retention.ms": "-1"}
    assert ids(client, "legacy", 1) == [0, 1, 2, 3]
    client.delete_topic("legacy")
    assert not (data / "legacy").exists()
    broker.stop()
    broker.restart()
    assert client.describe_topics() == []


def test_metrics_show_lso_lag_and_expired_producers(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(
        {"log.producer.id.expiration.ms": 300, "producer.id.expiration.check.interval.ms": 50}
    )
    client = client_for(broker)
    client.create_topic("gauges", 1)
    pid, epoch = client.init_producer_id("gauges-app")
    client.add_partitions_to_txn("gauges-app", pid, epoch, [("gauges", 0)])
    plain_pid, _ = client.init_producer_id()
    with client.produce_stream("gauges", 0, transactional_id="gauges-app") as stream:
        stream.send(rows(2), producer_id=plain_pid, producer_epoch=0, base_sequence=0).offsets(10)
        stream.send(
            rows(3, start=2), producer_id=pid, producer_epoch=epoch, base_sequence=0,
            transactional=True,
        ).offsets(10)  # fmt: skip

    def partition() -> dict[str, int]:
        doc = client.metrics()
        return next(p for p in doc["partitions"] if p["topic"] == "gauges")

    # The plain producer expires; the one with an open transaction is kept (docs/design.md §9.9).
    wait_until(lambda: partition()["expired_producers"] == 1, "the idle producer to expire")
    gauges = partition()
    assert (gauges["log_end_offset"], gauges["last_stable_offset"], gauges["lso_lag"]) == (5, 2, 3)
    assert (gauges["producers"], gauges["open_transactions"]) == (1, 1)
    doc = client.metrics()
    # The per-producer detail (paged): the expired one's counters are gone.
    assert [p["producer_id"] for p in client.producer_metrics()] == [pid]
    assert doc["transactions"]["open_transactions"] == 1
    client.end_txn("gauges-app", pid, epoch, commit=True)
    assert partition()["lso_lag"] == 0
