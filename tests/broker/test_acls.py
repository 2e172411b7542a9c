"""Authorization on a real embedded SASL broker process (authorizer.enable): each refusal
seen by a real client with Kafka's code and a message naming principal, operation and
resource; deny over allow, prefixed and host ACLs, super users, an ACL removed while a
producer runs, and nothing partial visible after a refusal (docs/security.md,
Authorization). ACLs are written with the real ``idemlog acls`` command."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    AUTHORIZATION_ERRORS,
    ClusterAuthorizationFailedError,
    ErrorCode,
    IdemlogError,
    NotLeaderOrFollowerError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from broker_core.protocol.wire import Action
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from testkit.broker_failpoints import ENV, UNVERIFIED_TXN_PRODUCE
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import SCHEMA, TEST_BROKER_CONFIG, ids, rows
from tests.broker.test_sasl import add_user, idemlog
from tests.harness.broker import TEST_HOOKS, BrokerFactory, BrokerProcess
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

PASSWORDS = {"admin": "admin-Secret-11aa", "alice": "alice-Secret-22bb", "bob": "bob-Secret-33cc"}
TOPIC = "payments"


def creds(user: str) -> SaslCredentials:
    return SaslCredentials(Mechanism.SCRAM_SHA_256, user, PASSWORDS[user])


@pytest.fixture(scope="module")
def acl_users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory holding only the users of ``PASSWORDS``, added once per module with
    the real ``idemlog users add``: each test's broker starts on a copy of it (3 command
    runs per module instead of per test; no test changes a user)."""
    data = tmp_path_factory.mktemp("acl-users")
    for user, password in PASSWORDS.items():
        add_user(["--data-dir", str(data)], user, password)
    return data


def start_acl_broker(
    broker_factory: BrokerFactory, tmp_path: Path, users: Path, hook: str | None = None
) -> BrokerProcess:
    """The embedded SASL broker with the authorizer on, the users of ``PASSWORDS`` (a copy
    of ``users``, the ``acl_users`` directory) and the topic ``TOPIC``; ``hook``: a test
    hook armed in it (``testkit.broker_failpoints``)."""
    data = tmp_path / "acl-data"
    shutil.copytree(users, data)  # modes kept: the users file stays owner-only
    config = {
        **TEST_BROKER_CONFIG,
        "log.dir": str(data),
        "security.protocol": "SASL_PLAINTEXT",
        "authorizer.enable": "true",
        "super.users": "User:admin",
    }
    env = None if hook is None else {ENV: hook}
    if hook is not None:
        config.update(TEST_HOOKS)
    broker = broker_factory(config, name="acl", env=env)
    with BrokerClient(broker.address, sasl=creds("admin")) as admin:
        admin.create_topic(TOPIC, 1, schema=SCHEMA)
    return broker


@pytest.fixture
def acl_broker(broker_factory: BrokerFactory, tmp_path: Path, acl_users: Path) -> BrokerProcess:
    return start_acl_broker(broker_factory, tmp_path, acl_users)


def acls(broker: BrokerProcess, action: str, *args: str) -> None:
    done = idemlog("acls", action, "--data-dir", str(broker.log_dir), *args)
    assert done.returncode == 0, done.stderr


def rule(
    principal: str,
    *operations: str,
    resource: tuple[str, ...] = ("--topic", TOPIC),
    permission: str = "allow",
    host: str | None = None,
) -> tuple[str, ...]:
    """The arguments of one ``idemlog acls add|remove`` rule (the topic ``TOPIC`` unless
    ``resource`` names another, as ``idemlog acls`` options)."""
    args = (f"--{permission}-principal", principal)
    if host is not None:
        args += (f"--{permission}-host", host)
    for operation in operations:
        args += ("--operation", operation)
    return args + resource


def allow(broker: BrokerProcess, principal: str, *operations: str, **rule_keys: Any) -> None:
    """``idemlog acls add`` of :func:`rule`'s rule on ``broker``'s ACL file."""
    acls(broker, "add", *rule(principal, *operations, **rule_keys))


def authorizer_cluster(
    zk: ZooKeeperHarness, broker_factory: BrokerFactory, passwords: Mapping[str, str]
) -> ReplicatedCluster:
    """3 brokers on ``zk`` with SASL listeners and ``authorizer.enable``, replication
    factor 3; the users ``passwords`` (among them ``broker``, the brokers' own, and
    ``admin``: both super users) added first with ``idemlog users --zookeeper``; the
    cluster's client is ``admin``. The caller closes it."""
    where = ["--zookeeper", zk.hosts]
    for user, password in passwords.items():
        add_user(where, user, password)
    return ReplicatedCluster(
        zk,
        broker_factory,
        extra={
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.inter.broker.username": "broker",
            "sasl.inter.broker.password": passwords["broker"],
            "authorizer.enable": "true",
            "super.users": "User:broker;User:admin",
            "default.replication.factor": 3,
        },
        sasl=SaslCredentials(Mechanism.SCRAM_SHA_256, "admin", passwords["admin"]),
    )


@pytest.fixture
def admin(acl_broker: BrokerProcess) -> Iterator[BrokerClient]:
    with BrokerClient(acl_broker.address, sasl=creds("admin")) as client:
        yield client


def client_of(broker: BrokerProcess, user: str) -> BrokerClient:
    return BrokerClient(broker.address, sasl=creds(user), retries=0)


def check_refusal(
    error: IdemlogError, code: ErrorCode, principal: str, operation: str, resource: str
) -> None:
    assert error.error_code is code and not error.retriable
    for part in (principal, operation, resource, "idemlog acls add"):
        assert part in error.message, (part, error.message)


def produce_one(client: BrokerClient, topic: str = TOPIC, start: int = 0) -> tuple[int, int]:
    with client.produce_stream(topic, 0, SCHEMA) as stream:
        return stream.send(rows(1, start=start)).offsets(10)


def test_produce_without_write_is_refused_and_nothing_is_written(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    with (
        client_of(acl_broker, "alice") as alice,
        pytest.raises(TopicAuthorizationFailedError) as err,
    ):
        produce_one(alice)
    check_refusal(
        err.value, ErrorCode.TOPIC_AUTHORIZATION_FAILED, "User:alice", "Write", f"Topic:{TOPIC}"
    )
    assert err.value.code == 29
    assert ids(admin, TOPIC, isolation="read_uncommitted") == []
    allow(acl_broker, "User:alice", "Write")
    with client_of(acl_broker, "alice") as alice:
        produce_one(alice)
    assert ids(admin, TOPIC) == [0]
    refusals = admin.metrics_per_broker()[0]["counters"]["authorization_refusals"]
    assert refusals == {  # every code, from 0
        "CLUSTER_AUTHORIZATION_FAILED": 0,
        "GROUP_AUTHORIZATION_FAILED": 0,
        "TOPIC_AUTHORIZATION_FAILED": 1,
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 0,
    }


def test_a_refusal_naming_a_huge_resource_keeps_its_code(acl_broker: BrokerProcess) -> None:
    # gRPC carries the message in a header capped at 16 KiB: the broker cuts it, so the
    # caller still gets code 29, not RESOURCE_EXHAUSTED.
    with (
        client_of(acl_broker, "alice") as alice,
        pytest.raises(TopicAuthorizationFailedError) as err,
    ):
        alice.fetch_once("é" * 10_000, 0, 0)
    assert err.value.code == 29
    assert "User:alice" in err.value.message and "bytes cut)" in err.value.message


def test_read_create_delete_without_acl_are_refused(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    produce_one(admin)
    admin.create_topic("hidden", 1, schema=SCHEMA)
    with client_of(acl_broker, "alice") as alice:
        with pytest.raises(TopicAuthorizationFailedError) as err:
            alice.fetch_once(TOPIC, 0, 0)  # the fetch itself (fetch() asks offsets first)
        check_refusal(
            err.value, ErrorCode.TOPIC_AUTHORIZATION_FAILED, "User:alice", "Read", f"Topic:{TOPIC}"
        )
        with pytest.raises(TopicAuthorizationFailedError) as err:
            alice.create_topic("alices", 1, schema=SCHEMA)
        check_refusal(
            err.value, ErrorCode.TOPIC_AUTHORIZATION_FAILED, "User:alice", "Create", "Topic:alices"
        )
        with pytest.raises(TopicAuthorizationFailedError) as err:
            alice.delete_topic(TOPIC)
        check_refusal(
            err.value,
            ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            "User:alice",
            "Delete",
            f"Topic:{TOPIC}",
        )
        with pytest.raises(ClusterAuthorizationFailedError) as cerr:
            alice.metrics()
        check_refusal(
            cerr.value,
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "User:alice",
            "Describe",
            "Cluster:kafka-cluster",
        )
    assert [t.name for t in admin.describe_topics()] == ["hidden", TOPIC]  # none deleted
    assert ids(admin, TOPIC) == [0]
    allow(acl_broker, "User:alice", "Read")
    allow(
        acl_broker,
        "User:alice",
        "Create",
        "Delete",
        resource=("--topic", "alice", "--resource-pattern-type", "prefixed"),
    )
    with client_of(acl_broker, "alice") as alice:
        assert ids(alice, TOPIC) == [0]
        alice.create_topic("alices", 1, schema=SCHEMA)
        # Describe is implied by Read and Delete: a listing shows her these, not "hidden".
        assert [t.name for t in alice.describe_topics()] == ["alices", TOPIC]
        alice.delete_topic("alices")


def test_init_and_abort_of_anothers_transactional_id_are_refused_and_leave_it_open(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    pid, epoch = admin.init_producer_id("payroll", None)
    admin.add_partitions_to_txn("payroll", pid, epoch, [(TOPIC, 0)])
    with admin.produce_stream(TOPIC, 0, SCHEMA, transactional_id="payroll") as stream:
        stream.send(
            rows(3), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
        ).offsets(10)
    allow(acl_broker, "User:bob", "Write", resource=("--transactional-id", "bobs"))
    with client_of(acl_broker, "bob") as bob:
        bob.init_producer_id("bobs", None)  # his own: allowed
        with pytest.raises(TransactionalIdAuthorizationFailedError) as err:
            bob.init_producer_id("payroll", None)
        check_refusal(
            err.value,
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "User:bob",
            "Write",
            "TransactionalId:payroll",
        )
        assert err.value.code == 53
        with pytest.raises(TransactionalIdAuthorizationFailedError) as err:
            bob.abort_transaction("payroll")
        check_refusal(
            err.value,
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "User:bob",
            "Write",
            "TransactionalId:payroll",
        )
        with pytest.raises(ClusterAuthorizationFailedError):
            bob.init_producer_id(None, None)  # idempotent: IdempotentWrite on the Cluster
        # The listing leaves out what he may not Describe: payroll is not his.
        assert [t.transactional_id for t in bob.list_transactions()] == []
    listed = [t.transactional_id for t in admin.list_transactions()]
    assert listed == ["payroll"]  # still open: the refused abort touched nothing
    admin.end_txn("payroll", pid, epoch, True)
    assert ids(admin, TOPIC) == [0, 1, 2]


def test_deny_overrides_allow(acl_broker: BrokerProcess) -> None:
    allow(acl_broker, "User:*", "All", resource=("--topic", "*"))
    acls(acl_broker, "add", *rule("User:alice", "Write", permission="deny"))
    with client_of(acl_broker, "bob") as bob:
        produce_one(bob)
    with client_of(acl_broker, "alice") as alice:
        with pytest.raises(TopicAuthorizationFailedError):
            produce_one(alice)
        assert ids(alice, TOPIC) == [0]  # Read is not denied


def test_prefixed_acl_covers_the_names_it_starts(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    admin.create_topic("pay-eu", 1, schema=SCHEMA)
    admin.create_topic("other", 1, schema=SCHEMA)
    allow(
        acl_broker,
        "User:alice",
        "Write",
        resource=("--topic", "pay", "--resource-pattern-type", "prefixed"),
    )
    with client_of(acl_broker, "alice") as alice:
        produce_one(alice, TOPIC)
        produce_one(alice, "pay-eu")
        with pytest.raises(TopicAuthorizationFailedError):
            produce_one(alice, "other")
        # Metadata without names lists only the topics she may Describe (Write implies it).
        assert sorted(alice.metadata(refresh=True).topics) == ["pay-eu", TOPIC]


def test_host_acl_holds_for_its_host_only(acl_broker: BrokerProcess) -> None:
    allow(acl_broker, "User:alice", "Write", host="10.9.9.9")
    with client_of(acl_broker, "alice") as alice:
        with pytest.raises(TopicAuthorizationFailedError) as err:
            produce_one(alice)
        assert "from host 127.0.0.1" in err.value.message
    allow(acl_broker, "User:alice", "Write", host="127.0.0.1")
    with client_of(acl_broker, "alice") as alice:
        produce_one(alice)


def test_super_user_needs_no_acl(acl_broker: BrokerProcess, admin: BrokerClient) -> None:
    produce_one(admin)
    assert ids(admin, TOPIC) == [0]
    admin.metrics()
    admin.create_topic("t2", 1, schema=SCHEMA)
    admin.delete_topic("t2")


def test_acl_removed_mid_stream_refuses_the_next_batch(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    grant = rule("User:alice", "Write")
    acls(acl_broker, "add", *grant)
    counter = itertools.count()
    with client_of(acl_broker, "alice") as alice, alice.produce_stream(TOPIC, 0, SCHEMA) as stream:
        for _ in range(5):
            stream.send(rows(1, start=next(counter))).offsets(10)
        acls(acl_broker, "remove", *grant)

        def refused() -> IdemlogError | None:
            try:
                stream.send(rows(1, start=next(counter))).offsets(10)
            except AUTHORIZATION_ERRORS as exc:
                return exc
            return None

        # The file is re-read at the next batch after its change: the first batch after
        # the removal is refused (the poll only guards against a coarse mtime).
        error = wait_until(refused, "a batch refused after the removal", timeout=5)
        assert error.error_code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
    written = ids(admin, TOPIC)
    assert written[:5] == [0, 1, 2, 3, 4] and len(written) <= 6


def test_refused_transaction_leaves_nothing_readable(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """A transactional producer whose ACL on its id goes between its writes and its
    commit: the commit is refused, and no row of the transaction is ever readable."""
    grant = rule("User:alice", "Write", resource=("--transactional-id", "alice-txn"))
    acls(acl_broker, "add", *grant)
    allow(acl_broker, "User:alice", "Write")
    with client_of(acl_broker, "alice") as alice:
        pid, epoch = alice.init_producer_id("alice-txn", 2000)
        alice.add_partitions_to_txn("alice-txn", pid, epoch, [(TOPIC, 0)])
        with alice.produce_stream(TOPIC, 0, SCHEMA, transactional_id="alice-txn") as stream:
            stream.send(
                rows(4), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
            ).offsets(10)
        acls(acl_broker, "remove", *grant)
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            alice.end_txn("alice-txn", pid, epoch, True)
    assert ids(admin, TOPIC, isolation="read_uncommitted") == [0, 1, 2, 3]
    assert ids(admin, TOPIC) == []
    # The coordinator's timeout aborts it: still nothing readable, and the LSO moves on.
    wait_until(
        lambda: not admin.list_transactions(), "the refused transaction timed out", timeout=15
    )
    assert ids(admin, TOPIC) == []
    assert admin.list_offsets(TOPIC, 0)["last_stable_offset"] >= 4


def test_acls_command_errors_are_one_line(acl_broker: BrokerProcess) -> None:
    where = ("--data-dir", str(acl_broker.log_dir))
    bad = idemlog(
        "acls", "add", *where, "--allow-principal", "alice", "--operation", "Write", "--topic", "t"
    )
    assert bad.returncode == 2 and "Type:name" in bad.stderr and "Traceback" not in bad.stderr
    bad = idemlog(
        "acls",
        "add",
        *where,
        "--allow-principal",
        "User:a",
        "--operation",
        "Read",
        "--transactional-id",
        "x",
    )
    assert bad.returncode == 2 and "Read does not apply to a TransactionalId" in bad.stderr
    bad = idemlog("acls", "add", *where, "--allow-principal", "User:a", "--operation", "Write")
    assert bad.returncode == 2 and "--topic, --group, --transactional-id or --cluster" in bad.stderr
    gone = idemlog(
        "acls",
        "remove",
        *where,
        "--allow-principal",
        "User:a",
        "--operation",
        "Write",
        "--topic",
        "t",
    )
    assert gone.returncode == 1 and "no such ACL" in gone.stderr
    listed = idemlog("acls", "list", *where)
    assert listed.returncode == 0 and listed.stdout.strip() == "no ACLs"


def test_cluster_acl_change_reaches_every_broker_within_a_second(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """On a 3-broker SASL cluster the ACLs live in ZooKeeper: an ACL added or removed with
    ``idemlog acls --zookeeper`` holds at the next request on every broker, within a
    second, without a restart; the brokers replicate as User:broker, a super user."""
    where = ["--zookeeper", zk_chroot.hosts]
    cluster = authorizer_cluster(
        zk_chroot, broker_factory, {**PASSWORDS, "broker": "broker-Secret-44dd"}
    )
    try:
        cluster.create_topic(TOPIC, 1)
        produce_one(cluster.client)
        cluster.wait_in_sync(TOPIC, 0)  # the followers fetched as User:broker
        alice = BrokerClient(cluster.bootstrap, sasl=creds("alice"), retries=0)
        body = {"topic": TOPIC, "partition": 0}
        leader = cluster.client.leader(TOPIC, 0).address

        def served(address: str) -> bool:
            try:
                alice.action(address, Action.LIST_OFFSETS, body)
            except TopicAuthorizationFailedError:
                return False
            except NotLeaderOrFollowerError:
                return True  # checked and passed: only the leader answers offsets
            return True

        assert not any(served(b.address) for b in cluster.brokers.values())
        grant = rule("User:alice", "Describe")
        done = idemlog("acls", "add", *where, *grant)
        assert done.returncode == 0, done.stderr
        for b in cluster.brokers.values():
            wait_until(lambda a=b.address: served(a), f"{b.name} allows alice", timeout=1.0)
        assert alice.action(leader, Action.LIST_OFFSETS, body)["log_end_offset"] == 1
        done = idemlog("acls", "remove", *where, *grant)
        assert done.returncode == 0, done.stderr
        for b in cluster.brokers.values():
            wait_until(lambda a=b.address: not served(a), f"{b.name} refuses alice", timeout=1.0)
        alice.close()
    finally:
        cluster.close()


def test_producer_fails_at_once_on_a_refusal_and_writes_nothing(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """The standalone producer treats the refusals as fatal: an idempotent producer
    without IdempotentWrite fails at its start, one with it but without Write on the topic
    fails its send well before its delivery timeout, never retrying into a write."""
    from broker_core.producer.producer import Producer

    keys = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": PASSWORDS["alice"],
        "delivery.timeout.ms": 60_000,
    }
    with pytest.raises(ClusterAuthorizationFailedError, match="IdempotentWrite"):
        Producer(acl_broker.address, **keys)
    allow(acl_broker, "User:alice", "IdempotentWrite", resource=("--cluster",))
    allow(acl_broker, "User:alice", "Describe")
    started = time.monotonic()
    with Producer(acl_broker.address, **keys) as producer:
        future = producer.send(TOPIC, rows(4))
        with pytest.raises(TopicAuthorizationFailedError, match="Write on Topic:payments"):
            future.result(30)
    assert time.monotonic() - started < 30  # failed at the refusal, not at the timeout
    assert ids(admin, TOPIC, isolation="read_uncommitted") == []


def test_hanging_transaction_tools_need_read_then_write_on_the_topic(
    broker_factory: BrokerFactory, tmp_path: Path, acl_users: Path
) -> None:
    """describe_producers needs Read on the topic; abort_hanging_transaction Write on it
    (or Alter on the Cluster): refused without, naming the ACL, the transaction untouched.
    The hanging transaction is written as before issue 36 (the test hook)."""
    acl_broker = start_acl_broker(broker_factory, tmp_path, acl_users, UNVERIFIED_TXN_PRODUCE)
    with BrokerClient(acl_broker.address, sasl=creds("admin")) as admin:
        pid, epoch = admin.init_producer_id()
        with admin.produce_stream(TOPIC, 0, SCHEMA) as stream:
            stream.send(
                rows(2), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
            ).offsets(10)
        with client_of(acl_broker, "alice") as alice:
            with pytest.raises(TopicAuthorizationFailedError) as err:
                alice.describe_producers(TOPIC, 0)
            check_refusal(
                err.value,
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "User:alice",
                "Read",
                f"Topic:{TOPIC}",
            )
        allow(acl_broker, "User:alice", "Read")
        with client_of(acl_broker, "alice") as alice:
            (described,) = alice.describe_producers(TOPIC, 0).producers
            assert (described.producer_id, described.txn_start_offset) == (pid, 0)
            with pytest.raises(TopicAuthorizationFailedError) as err:
                alice.abort_hanging_transaction(TOPIC, 0, producer_id=pid)
            check_refusal(
                err.value,
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "User:alice",
                "Write",
                f"Topic:{TOPIC}",
            )
        assert admin.list_offsets(TOPIC, 0)["last_stable_offset"] == 0  # still open
        allow(acl_broker, "User:alice", "Write")
        with client_of(acl_broker, "alice") as alice:
            done = alice.abort_hanging_transaction(TOPIC, 0, producer_id=pid, producer_epoch=epoch)
        assert done.last_stable_offset == admin.list_offsets(TOPIC, 0)["log_end_offset"] == 3
