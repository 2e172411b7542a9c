"""A transactional produce names its transactional id, needs Write on it, and is verified
with the id's coordinator before its first append (KIP-890 part 1): issue 36's forged
batch, injection into another principal's transaction and unadded partition, against a
real embedded SASL broker process with the authorizer on and real second principals
(docs/security.md, "Transactional produce")."""

from __future__ import annotations

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    ClusterAuthorizationFailedError,
    ErrorCode,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTxnStateError,
    TransactionalIdAuthorizationFailedError,
)
from broker_core.protocol.txn_requests import AddPartitionsToTxnRequest
from broker_core.protocol.wire import Action
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import SCHEMA, TEST_BROKER_CONFIG, ids, rows
from tests.broker.test_acls import (
    TOPIC,
    acl_broker,
    acl_users,
    admin,
    allow,
    check_refusal,
    client_of,
)
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

__all__ = ["acl_broker", "acl_users", "admin"]  # fixtures, used by name


def _stable(client: BrokerClient, partition: int = 0) -> bool:
    offsets = client.list_offsets(TOPIC, partition)
    return bool(offsets["last_stable_offset"] == offsets["log_end_offset"])


def _committed_txn(admin: BrokerClient, tid: str, start: int, count: int) -> None:
    """Another writer's transaction, committed: rows ``start..start+count-1``."""
    pid, epoch = admin.init_producer_id(tid, None)
    admin.add_partitions_to_txn(tid, pid, epoch, [(TOPIC, 0)])
    with admin.produce_stream(TOPIC, 0, SCHEMA, transactional_id=tid) as stream:
        stream.send(
            rows(count, start=start),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        ).offsets(10)
    admin.end_txn(tid, pid, epoch, True)


def test_a_forged_transactional_batch_is_refused_and_holds_no_reader_back(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """Issue 36 finding 1: Write on the topic only, a made-up producer id in the leased
    block (990 of 0..999): refused, nothing written, the other writer's commit readable."""
    admin.init_producer_id(None, None)  # leases the block 0..999: 990 was "issued"
    allow(acl_broker, "User:alice", "Write")
    end_before = admin.list_offsets(TOPIC, 0)["log_end_offset"]
    with client_of(acl_broker, "alice") as alice:
        # No transactional id on the stream: refused in one line, INVALID_REQUEST.
        with alice.produce_stream(TOPIC, 0, SCHEMA) as stream:
            answer = stream.send(
                rows(1, start=500),
                producer_id=990,
                producer_epoch=0,
                base_sequence=0,
                transactional=True,
            ).result(10)
        error = answer.error()
        assert isinstance(error, InvalidRequestError) and error.code == 42
        assert "names no transactional_id" in error.message and "\n" not in error.message
        # Naming a transactional id she may not Write: refused with Kafka's code 53.
        with (
            pytest.raises(TransactionalIdAuthorizationFailedError) as err,
            alice.produce_stream(TOPIC, 0, SCHEMA, transactional_id="payroll") as stream,
        ):
            stream.send(
                rows(1, start=501),
                producer_id=990,
                producer_epoch=0,
                base_sequence=0,
                transactional=True,
            ).offsets(10)
        check_refusal(
            err.value,
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "User:alice",
            "Write",
            "TransactionalId:payroll",
        )
    # Her own transactional id (never initialised): the coordinator knows no such
    # transaction, so the leader refuses it (INVALID_TXN_STATE), nothing written.
    allow(acl_broker, "User:alice", "Write", resource=("--transactional-id", "alice-forge"))
    with (
        client_of(acl_broker, "alice") as alice,
        alice.produce_stream(TOPIC, 0, SCHEMA, transactional_id="alice-forge") as stream,
    ):
        answer = stream.send(
            rows(1, start=502),
            producer_id=990,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ).result(10)
    error = answer.error()
    assert isinstance(error, InvalidTxnStateError) and error.code == 48, answer
    assert "not verified with its coordinator" in error.message
    # The leaders' own question to a coordinator is for brokers only (ClusterAction).
    verify = AddPartitionsToTxnRequest("alice-forge", 990, 0, ((TOPIC, 0),), verify_only=True)
    with (
        client_of(acl_broker, "alice") as alice,
        pytest.raises(ClusterAuthorizationFailedError, match="ClusterAction"),
    ):
        alice.action(acl_broker.address, Action.ADD_PARTITIONS_TO_TXN, verify.to_doc())
    assert admin.list_offsets(TOPIC, 0)["log_end_offset"] == end_before  # nothing written
    _committed_txn(admin, "ledger-app", 0, 3)
    assert _stable(admin)  # no transaction the coordinator does not know holds readers
    assert ids(admin, TOPIC) == [0, 1, 2]
    assert admin.describe_producers(TOPIC, 0).producers[0].txn_start_offset == -1


def test_injection_into_another_principals_open_transaction_is_refused(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """Issue 36 finding 2: alice writes under bob's producer id and epoch into his open
    transaction: refused whichever way, never told his expected sequence; bob's own batch
    is appended once, and after his commit the log holds his rows only."""
    allow(acl_broker, "User:bob", "Write")
    allow(acl_broker, "User:bob", "Write", resource=("--transactional-id", "bob-txn"))
    allow(acl_broker, "User:alice", "Write")
    allow(acl_broker, "User:alice", "Write", resource=("--transactional-id", "alice-txn"))
    with client_of(acl_broker, "bob") as bob, client_of(acl_broker, "alice") as alice:
        pid, epoch = bob.init_producer_id("bob-txn", None)
        bob.add_partitions_to_txn("bob-txn", pid, epoch, [(TOPIC, 0)])
        with bob.produce_stream(TOPIC, 0, SCHEMA, transactional_id="bob-txn") as stream:
            stream.send(
                rows(3),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=True,
            ).offsets(10)
        # alice's own transaction is open too: her id is verified, but not for his pid.
        apid, aepoch = alice.init_producer_id("alice-txn", None)
        alice.add_partitions_to_txn("alice-txn", apid, aepoch, [(TOPIC, 0)])
        refusals = []
        with alice.produce_stream(TOPIC, 0, SCHEMA, transactional_id="alice-txn") as stream:
            for seq in (0, 3, 7):  # a wrong sequence, the right one, another wrong one
                refusals.append(
                    stream.send(
                        rows(1, start=666),
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=seq,
                        transactional=True,
                    ).result(10)
                )
        for answer in refusals:
            error = answer.error()
            assert isinstance(error, InvalidTxnStateError) and error.code == 48, answer
            assert "expected" not in error.message and "sequence" not in error.message
        # His transactional id on her stream: she may not Write it.
        with (
            pytest.raises(TransactionalIdAuthorizationFailedError),
            alice.produce_stream(TOPIC, 0, SCHEMA, transactional_id="bob-txn") as stream,
        ):
            stream.send(
                rows(1, start=667),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=3,
                transactional=True,
            ).offsets(10)
        # As a plain idempotent batch under his producer id: IdempotentWrite on the Cluster.
        with alice.produce_stream(TOPIC, 0, SCHEMA) as stream:
            plain = stream.send(
                rows(1, start=668), producer_id=pid, producer_epoch=epoch, base_sequence=3
            ).result(10)
        error = plain.error()
        assert isinstance(error, ClusterAuthorizationFailedError), plain
        assert "IdempotentWrite" in error.message and "expected" not in error.message
    # Even with IdempotentWrite: a transactional producer id has no producer token, so a
    # non-transactional batch under it is refused before the validator, naming none of
    # his state (docs/security.md; tests/broker/test_producer_ownership.py).
    allow(acl_broker, "User:alice", "IdempotentWrite", resource=("--cluster",))
    with client_of(acl_broker, "bob") as bob, client_of(acl_broker, "alice") as alice:
        with alice.produce_stream(TOPIC, 0, SCHEMA) as stream:
            plains = [
                stream.send(
                    rows(1, start=669), producer_id=pid, producer_epoch=e, base_sequence=seq
                ).result(10)
                for e, seq in ((epoch, 0), (epoch, 3), (epoch + 1, 0))
            ]
        for answer in plains:
            error = answer.error()
            assert isinstance(error, InvalidProducerIdMappingError) and error.code == 49, answer
            assert "expected" not in error.message and "epoch" not in error.message
        # bob's own next batch: appended, once (not answered as a duplicate).
        with bob.produce_stream(TOPIC, 0, SCHEMA, transactional_id="bob-txn") as stream:
            answer = stream.send(
                rows(2, start=3),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=3,
                transactional=True,
            ).result(10)
        assert answer.ok and not answer.duplicate, answer
        bob.end_txn("bob-txn", pid, epoch, True)
        alice.end_txn("alice-txn", apid, aepoch, False)  # she added the partition: empty
    assert ids(admin, TOPIC) == [0, 1, 2, 3, 4]
    assert ids(admin, TOPIC, isolation="read_uncommitted") == [0, 1, 2, 3, 4]
    assert _stable(admin)


def test_a_batch_to_a_partition_never_added_is_refused_and_holds_no_reader_back(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """A transactional batch to a partition its transaction never added: refused by the
    coordinator's verification (INVALID_TXN_STATE), nothing written, readers not held;
    the same producer's added partition works, and the next transaction re-verifies."""
    pid, epoch = admin.init_producer_id("unadded", None)
    admin.add_partitions_to_txn("unadded", pid, epoch, [(TOPIC, 0)])
    admin.create_topic("other", 1, schema=SCHEMA)
    with admin.produce_stream("other", 0, SCHEMA, transactional_id="unadded") as stream:
        answer = stream.send(
            rows(2),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        ).result(10)
    error = answer.error()
    assert isinstance(error, InvalidTxnStateError) and error.code == 48, answer
    assert "other-0 not added to its ongoing transaction" in error.message
    offsets = admin.list_offsets("other", 0)
    assert offsets["log_end_offset"] == 0 and offsets["last_stable_offset"] == 0
    with admin.produce_stream(TOPIC, 0, SCHEMA, transactional_id="unadded") as stream:
        for seq in (0, 2):  # the second batch rides on the first's verification
            stream.send(
                rows(2, start=seq),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                transactional=True,
            ).offsets(10)
    next_pid, next_epoch = admin.end_txn("unadded", pid, epoch, True)
    assert ids(admin, TOPIC) == [0, 1, 2, 3]
    # The marker ended the verified transaction here: a batch after it opens nothing,
    # neither at the ended transaction's epoch (fenced) nor at the next one's before the
    # producer added the partition again (not verified).
    for batch_pid, batch_epoch, refusal in [
        (pid, epoch, InvalidProducerEpochError),
        (next_pid, next_epoch, InvalidTxnStateError),
    ]:
        with admin.produce_stream(TOPIC, 0, SCHEMA, transactional_id="unadded") as stream:
            late = stream.send(
                rows(1, start=9),
                producer_id=batch_pid,
                producer_epoch=batch_epoch,
                base_sequence=4 if batch_epoch == epoch else 0,
                transactional=True,
            ).result(10)
        assert isinstance(late.error(), refusal), late
    assert _stable(admin) and ids(admin, TOPIC, isolation="read_uncommitted") == [0, 1, 2, 3]


def test_a_leader_verifies_with_a_coordinator_on_another_broker(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """Two ZooKeeper-mode brokers: a partition led by the broker that does not run the
    transactional id's coordinator asks it over the broker-to-broker call
    (add_partitions_to_txn verify_only): refused before the partition is added, nothing
    written; appended after."""
    common = {**TEST_BROKER_CONFIG, "zookeeper.connect": zk_chroot.hosts}
    brokers = [broker_factory({**common, "broker.id": i}, name=f"v{i}") for i in (1, 2)]
    with BrokerClient(",".join(b.address for b in brokers)) as client:
        wait_until(lambda: len(client.refresh_metadata().brokers) == 2, "both brokers")
        leaders = client.create_topic("remote", 2)
        pid, epoch = wait_until(lambda: _init(client, "remote-app"), "the coordinator")
        found = client.action(
            brokers[0].address, Action.FIND_COORDINATOR, {"transactional_id": "remote-app"}
        )
        far = next(p for p, leader in enumerate(leaders) if leader != found["broker_id"])
        client.add_partitions_to_txn("remote-app", pid, epoch, [("remote", 1 - far)])
        with client.produce_stream("remote", far, transactional_id="remote-app") as stream:
            refused = stream.send(
                rows(2),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=True,
            ).result(10)
        error = refused.error()
        assert isinstance(error, InvalidTxnStateError) and error.code == 48, refused
        assert f"remote-{far} not added" in error.message
        assert client.list_offsets("remote", far)["log_end_offset"] == 0
        client.add_partitions_to_txn("remote-app", pid, epoch, [("remote", far)])
        with client.produce_stream("remote", far, transactional_id="remote-app") as stream:
            stream.send(
                rows(2),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=True,
            ).offsets(10)
        client.end_txn("remote-app", pid, epoch, True)
        assert ids(client, "remote", far) == [0, 1]
        offsets = client.list_offsets("remote", far)
        assert offsets["last_stable_offset"] == offsets["log_end_offset"] == 3  # + marker


def _init(client: BrokerClient, tid: str) -> tuple[int, int] | None:
    try:
        return client.init_producer_id(tid, None)
    except IdemlogError as exc:
        if exc.retriable:
            return None  # the state partitions' coordinators still loading
        raise
