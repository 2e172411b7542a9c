"""Issue 25, test 1: the cluster tests' guarantees on a secured cluster, each part on a
host of its own (``tests/cluster/stack.py`` with ``tests/cluster/secured.py``): brokers
under ``SASL_SSL`` with ``ssl.client.auth=required`` (TLS with client certificates on
every link, the brokers' own too, SCRAM on every connection, ``User:broker`` between
brokers), the authorizer on with only the documented minimal ACLs of the writing job
(``User:writer``) and the reading one (``User:reader``), ZooKeeper over TLS only with node
ACLs (``zookeeper.set.acl``, the brokers' digest identity), the Spark job with its user's
options.

* a client without TLS, one without a client certificate, one with a wrong password and
  a plaintext ZooKeeper session are refused; the admin's CLI is served;
* the authorizer and ZooKeeper's ACLs are on: the reader's produce and the writer's
  topic outside its prefix are refused with TOPIC_AUTHORIZATION_FAILED; a ZooKeeper client
  past TLS (a certificate of the CA) without the brokers' identity can change no node of
  the tree (broker registrations, topics, users, ACLs, ...) nor read the users';
* one Spark application: a stream during which a partition leader's broker is SIGKILLed
  and a worker's host is cut off mid-write, then a ``df.write``, then a ``spark.read`` as
  the reader: every row once in per-key order, read back by the broker client as the
  reader.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    ErrorCode,
    SaslAuthenticationFailedError,
    SslHandshakeError,
    TopicAuthorizationFailedError,
)
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import Side, TlsSettings
from spark_sink.verify import verify_exactly_once
from tests.broker.helpers import SCHEMA, rows
from tests.cluster.secured import (
    MECHANISM,
    PROTOCOL,
    STREAM_QUERY_ID,
    TOPIC_PREFIX,
    ZK_CHROOT,
    ZK_USER,
    Security,
    fix_query_id,
)
from tests.cluster.stack import (
    Stack,
    StreamRun,
    fired_by,
    host_of,
    leader_moved,
    partition_leaders,
    running_stack,
    sink_coordinators,
)
from tests.harness import zk_acl
from tests.harness.broker import BrokerProcess
from tests.harness.cluster import ZK_PORT, read_back, spark_events
from tests.harness.waiting import wait_until
from tests.spark.helpers import (
    DriverLauncher,
    assert_succeeded,
    batch_spec,
    make_input,
    stream_spec,
)
from tests.spark.test_faults import fired

FILES, ROWS = 4, 5000
STREAM, BATCH = f"{TOPIC_PREFIX}stream", f"{TOPIC_PREFIX}batch"
FAILPOINTS = (
    "mid_write@1/1=sleep:20",  # the test SIGKILLs a partition leader's broker meanwhile
    "mid_write@2/2=sleep:30",  # the test cuts this task's worker host off for 20 s
)
CONF = {
    # Lost executors are noticed in seconds, not the default two minutes.
    "spark.network.timeout": "15s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.heartbeatInterval": "2s",
}
WORKER_CUT_S = 20.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The secured stack (this module's own: the other cluster tests' is plaintext)."""
    work = tmp_path_factory.mktemp("secured")
    with running_stack(work, security=Security.create(work / "security")) as built:
        yield built


def _security(stack: Stack) -> Security:
    assert stack.security is not None
    return stack.security


def test_plaintext_no_certificate_and_wrong_password_are_refused(stack: Stack) -> None:
    security = _security(stack)
    reader = security.reader
    address = stack.brokers.brokers[0].address
    with stack.client(reader) as client:  # the right files and password: served
        client.describe_topics()
    described = security.idemlog(stack.brokers.bootstrap, "topics", "describe")
    assert described.returncode == 0, described.stderr

    # No TLS at all: refused at the TLS handshake, before SASL.
    with (
        BrokerClient(address, sasl=reader.credentials, retries=0) as plaintext,
        pytest.raises(SslHandshakeError, match="speaks TLS"),
    ):
        plaintext.describe_topics()
    # TLS without a client certificate: refused by mutual TLS.
    no_cert = TlsSettings.from_values(
        {"security.protocol": PROTOCOL, "ssl.ca.location": str(security.ca)}
    ).load(Side.CLIENT)
    with (
        BrokerClient(address, tls=no_cert, sasl=reader.credentials, retries=0) as anonymous,
        pytest.raises(SslHandshakeError, match="requires a client certificate"),
    ):
        anonymous.describe_topics()
    # The certificate, a wrong password: refused by SASL, naming the user, not retried.
    wrong = SaslCredentials(MECHANISM, reader.name, reader.password + "x")
    with (
        BrokerClient(address, tls=security.tls(reader), sasl=wrong, retries=0) as guesser,
        pytest.raises(SaslAuthenticationFailedError, match="User:reader") as refused,
    ):
        guesser.describe_topics()
    assert not refused.value.retriable
    assert reader.password not in refused.value.message

    # ZooKeeper serves the network TLS only: a plaintext session never starts.
    zk = KazooClient(hosts=f"{stack.brokers.zk_host.address}:{ZK_PORT}", timeout=3)
    try:
        with pytest.raises(KazooTimeoutError):
            zk.start(timeout=3)
    finally:
        zk.stop()
        zk.close()


def _zookeeper_client(security: Security, auth: list[tuple[str, str]] | None) -> KazooClient:
    """A ZooKeeper session over TLS with the reader's certificate (one of the CA's, so
    ZooKeeper's ``ssl.clientAuth=need`` lets it in), authenticated with ``auth``."""
    assert security.zk is not None
    cert = security.reader.cert
    client = KazooClient(
        hosts=security.zk.network_address,
        use_ssl=True,
        ca=str(security.ca),
        certfile=str(cert.cert),
        keyfile=str(cert.key),
        check_hostname=True,
        auth_data=auth,
        timeout=10,
    )
    client.start(timeout=20)
    return client


def test_the_authorizer_and_zookeeper_acls_are_on(stack: Stack) -> None:
    security = _security(stack)
    topic = f"{TOPIC_PREFIX}acl"
    with stack.client() as admin:  # User:broker, a super user
        admin.create_topic(topic, 1, schema=SCHEMA)
        # The reader may Read the prefix, not Write: its produce is refused.
        with (
            stack.client(security.reader) as reader,
            pytest.raises(TopicAuthorizationFailedError) as refused,
            reader.produce_stream(topic, 0, SCHEMA) as stream,
        ):
            stream.send(rows(1)).offsets(10)
        error = refused.value
        assert error.error_code is ErrorCode.TOPIC_AUTHORIZATION_FAILED and not error.retriable
        for part in ("User:reader", "Write", f"Topic:{topic}"):
            assert part in error.message, error.message
        # The writer may create topics under its prefix only.
        with (
            stack.client(security.writer) as writer,
            pytest.raises(TopicAuthorizationFailedError, match=r"User:writer.*Create"),
        ):
            writer.create_topic("unprefixed", 1, schema=SCHEMA)
        counted = sum(
            doc["counters"]["authorization_refusals"].get("TOPIC_AUTHORIZATION_FAILED", 0)
            for doc in admin.metrics_per_broker()
        )
        assert counted >= 2
        assert "unprefixed" not in {t.name for t in admin.describe_topics()}

    # ZooKeeper: past TLS with a certificate of the CA, but without the brokers' digest
    # identity, no client can change any node of the tree nor read the users' nodes.
    owner = _zookeeper_client(security, [("digest", f"{ZK_USER}:{security.zk_password}")])
    outsiders = [_zookeeper_client(security, auth) for auth in zk_acl.outsider_auths(ZK_USER)]
    try:
        nodes = zk_acl.assert_secured(owner, outsiders, ZK_CHROOT, ZK_USER)
    finally:
        for client in (owner, *outsiders):
            client.stop()
            client.close()
    base = f"{ZK_CHROOT}/idemlog"
    expected = {
        *(f"{base}/brokers/ids/{b.config['broker.id']}" for b in stack.brokers.brokers),
        f"{base}/controller",
        f"{base}/topics/{topic}",
        f"{base}/config/users/{security.writer.name}",
    }  # (the producer-id block's node appears with the first producer id, not yet here)
    assert expected <= set(nodes), sorted(expected - set(nodes))
    assert any(n.startswith(f"{base}/acls/") for n in nodes), nodes
    print(f"ZooKeeper: {len(nodes)} nodes walked, each change refused to 3 outsiders")


def assert_exactly_once(stack: Stack, topic: str, ids: list[int]) -> None:
    """Every row of ``topic`` once, in per-key order, read as the reader."""
    with stack.client(_security(stack).reader) as client:
        table = read_back(client, topic)
    verdict = verify_exactly_once(table, id_column="id", key_column="account", expected_ids=ids)
    assert verdict.ok and verdict.order_violations == 0, f"{topic}: {verdict.line()}"


def kill_a_partition_leader(stack: Stack, topic: str) -> BrokerProcess:
    """SIGKILL a broker leading a partition of ``topic`` (not a sink's coordinator: the
    commits need it) and wait until each of its partitions has another leader at a higher
    epoch; the broker killed."""
    with stack.client() as admin:
        coordinators = wait_until(
            lambda: sink_coordinators(admin), "the sink's ids listed", timeout=60
        )
        before = partition_leaders(admin, topic)
        victims = sorted({leader for leader, _ in before.values()} - coordinators)
        assert victims, f"every partition led by the coordinator: {before} {coordinators}"
        victim = stack.brokers.brokers[victims[0] - 1]
        killed_at = time.monotonic()
        victim.kill(signal.SIGKILL)
        wait_until(
            lambda: leader_moved(admin, topic, before, victims[0]),
            f"{topic}: broker {victims[0]}'s partitions led by another at a higher epoch",
            timeout=60,
        )
        moved = partition_leaders(admin, topic)
    print(
        f"SIGKILLed {victim.name} (coordinators {sorted(coordinators)}); leaders {before} -> "
        f"{moved} within {time.monotonic() - killed_at:.1f} s"
    )
    return victim


def test_stream_with_a_leader_killed_and_a_host_cut_then_batch_and_read_exactly_once(
    stack: Stack, drivers: DriverLauncher, tmp_path: Path
) -> None:
    src, marks, events = tmp_path / "src", tmp_path / "failpoints", tmp_path / "events"
    ids = make_input(src, FILES, ROWS)
    out = tmp_path / "read.parquet"
    fix_query_id(tmp_path / "ck")  # the sink id its ACL names (secured.py, grant)
    steps = [
        stream_spec(src, "", STREAM, tmp_path / "ck", FILES),
        batch_spec(src, "", BATCH),
        {
            "mode": "read",
            "topic": STREAM,
            "out": str(out),
            "sink_options": stack.sink_options(_security(stack).reader),
        },
    ]
    spec = stack.spec(
        events,
        steps=steps,
        conf={**CONF, **stack.failpoint_conf(FAILPOINTS, marks)},
        # The run's transactions outlive a lost host until Spark has retried its task
        # (docs/failure-model.md, "On a cluster").
        sink_options={"transaction.timeout.ms": "60000"},
    )
    run = stack.start(drivers, spec, failpoints=FAILPOINTS, failpoints_dir=marks)
    stream = StreamRun(run, spec, ids, events, marks, FAILPOINTS)

    # 1. A partition leader's broker SIGKILLed while a task sleeps mid-write. It stays
    # down until the application has ended: a broker restarted under SASL has none of
    # its clients' sessions, and their next call on the old channel is refused
    # (docs/failure-model.md, the secured row).
    fired_by(marks, FAILPOINTS[0], run)
    killed = kill_a_partition_leader(stack, STREAM)
    try:
        _run_to_the_end(stack, drivers, stream, marks)
    finally:
        killed.restart()  # the stack whole again
    run = stream.run
    assert_succeeded(run)
    assert sum(line.startswith("DONE") for line in run.lines) == len(steps)
    assert fired(marks) == set(FAILPOINTS)
    removed = spark_events(events, "SparkListenerExecutorRemoved")
    assert removed, "Spark lost the cut-off host's executor"
    assert_exactly_once(stack, STREAM, ids)
    assert_exactly_once(stack, BATCH, ids)
    table = pq.read_table(out)  # spark.read as the reader
    verdict = verify_exactly_once(table, id_column="id", key_column="account", expected_ids=ids)
    assert verdict.ok and verdict.order_violations == 0, f"spark.read: {verdict.line()}"
    # The writer wrote under the sink ids its ACLs name, and under no other.
    with stack.client() as admin:
        sinks = {t.transactional_id.split("/")[0] for t in admin.list_transactions(every_id=True)}
    assert STREAM_QUERY_ID in sinks, sinks
    assert any(s.startswith("batch-") for s in sinks), sinks
    assert all(s == STREAM_QUERY_ID or s.startswith("batch-") for s in sinks), sinks


def _run_to_the_end(stack: Stack, drivers: DriverLauncher, stream: StreamRun, marks: Path) -> None:
    """The worker host's cut (the second failpoint), then the application to its end
    (the stream restarted from its checkpoint if it failed with a clear error)."""
    run = stream.run

    # 2. The host of another task, asleep mid-write, cut off (all its links) and healed.
    worker_host = host_of(stack, fired_by(marks, FAILPOINTS[1], run))
    assert worker_host in stack.spark.worker_hosts
    worker_host.cut()
    try:
        time.sleep(WORKER_CUT_S)  # the fault: the host stays cut off this long
    finally:
        worker_host.heal()

    if run.wait() != 0:  # allowed: the stream failed with a clear error; restart it
        failed = [line for line in run.lines if line.startswith("FAILED")]
        assert failed, run.describe()
        # Only the stream may be restarted: a df.write run twice is two jobs.
        assert not any(line.startswith("DONE") for line in run.lines), run.describe()
        print(f"query failed: {failed[0]}; restarting from its checkpoint")
        stack.restart(drivers, stream).wait()
