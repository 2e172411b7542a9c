"""The Kafka listener's security on one real embedded broker process (module-wide:
``kafka.listener=SASL_SSL://``, its TLS from the broker's ``ssl.*`` keys, its users the
Flight listener's SCRAM users, ``authorizer.enable`` with the ACLs written by the real
``idemlog acls``), asked by Kafka clients no one on this project wrote (confluent-kafka's
librdkafka, kafka-python) and, for what one connection is answered, by requests written
with kio (``tests/harness/kafka_wire.py``): consumers read a topic over SASL_SSL with
SCRAM-SHA-512; a connection without SASL is answered ApiVersions and closed at its next
request; a wrong password is SASL_AUTHENTICATION_FAILED with a message, then closed; a
principal without Read is TOPIC_AUTHORIZATION_FAILED in Fetch, one without Describe in
Metadata (and left out of "every topic"), one without Write in Produce, without
IdempotentWrite in InitProducerId; a group consumer is refused until a Group ACL allows
it, then reads and commits; a user removed has its connections closed; each refusal is
counted in the broker's metrics. And an ``SSL://`` listener requiring client
certificates, on a broker of its own: a consumer's principal is its certificate's mapped
subject, allowed by an ACL (docs/security.md, "The Kafka listener")."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as CkPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from cryptography import x509
from cryptography.x509.oid import NameOID
from kafka import KafkaConsumer
from kafka import TopicPartition as KpPartition
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequestTopic as MdTopic
from kio.static.primitive import i8, i16, i32, i64

from broker_core.client.broker_client import BrokerClient
from broker_core.producer.producer import Producer
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism, ScramClient
from broker_core.security.tls import Side, TlsMaterial, TlsSettings
from broker_core.server.kafka.apis import API_VERSIONS
from broker_core.server.kafka.consume import FETCH
from broker_core.server.kafka.init_producer_id import INIT_PRODUCER_ID
from broker_core.server.kafka.metadata import METADATA
from broker_core.server.kafka.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE
from testkit.tls import TlsCerts, issue_client
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.broker.test_kafka_fetch import KAFKA_SCHEMA, kafka_rows
from tests.broker.test_sasl import add_user, idemlog
from tests.harness import kafka_wire as wire
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

PASSWORDS = {
    "admin": "admin-Secret-11aa",  # a super user: creates and writes the topics
    "reader": "reader-Secret-22bb",  # Read on TOPIC
    "viewer": "viewer-Secret-33cc",  # Describe on TOPIC only
}
TOPIC = "secured"
HIDDEN = "hidden"  # no ACL but the super user's: only admin may Describe it
ROWS = 40
DEADLINE_S = 20.0
NO_TXN = {
    "transactional_id": None,
    "transaction_timeout": datetime.timedelta(seconds=60),
    "producer_id": i64(-1),
    "producer_epoch": i16(-1),
}


def kafka_address(broker: BrokerProcess) -> str:
    """The Kafka listener's bound address, from the broker's log (port 0: any free one)."""
    found = [
        line.rsplit(":", 1)[1]
        for line in broker.log_text().splitlines()
        if "kafka listener: SASL_SSL://127.0.0.1:" in line
    ]
    assert found, broker.log_tail()
    return f"127.0.0.1:{found[-1].strip()}"


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, tls_certs: TlsCerts
) -> Iterator[tuple[BrokerProcess, str]]:
    """(the broker, its Kafka address): users, topics, rows and ACLs made once."""
    data = tmp_path_factory.mktemp("kafka-security") / "data"
    data.mkdir(mode=0o700)
    for user, password in PASSWORDS.items():
        add_user(["--data-dir", str(data)], user, password)
    factory = BrokerFactory(tmp_path_factory.mktemp("kafka-security-brokers"))
    try:
        broker = factory(
            {
                **TEST_BROKER_CONFIG,
                "log.dir": str(data),
                "security.protocol": "SASL_PLAINTEXT",  # the Flight listener
                "authorizer.enable": "true",
                "super.users": "User:admin",
                "kafka.listener": "SASL_SSL://127.0.0.1:0",
                "ssl.ca.location": str(tls_certs.ca),
                "ssl.certificate.location": str(tls_certs.broker.cert),
                "ssl.key.location": str(tls_certs.broker.key),
            },
            name="kafka-security",
        )
        admin = SaslCredentials(Mechanism.SCRAM_SHA_256, "admin", PASSWORDS["admin"])
        with BrokerClient(broker.address, sasl=admin) as client:
            client.create_topic(TOPIC, 1, schema=KAFKA_SCHEMA)
            client.create_topic(HIDDEN, 1, schema=KAFKA_SCHEMA)
        with Producer(
            broker.address,
            **{
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "admin",
                "sasl.password": PASSWORDS["admin"],
            },
        ) as producer:
            producer.send(TOPIC, kafka_rows("s", ROWS))
            producer.flush()
        for user, operation in (("reader", "Read"), ("viewer", "Describe")):
            done = idemlog(
                "acls", "add", "--data-dir", str(data), "--allow-principal", f"User:{user}",
                "--operation", operation, "--topic", TOPIC,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        yield broker, kafka_address(broker)
    finally:
        factory.close()


def producer_tls(keys: dict[str, str]) -> TlsMaterial:
    return TlsSettings.from_values(keys).load(Side.CLIENT)


def sasl_keys(user: str, tls_certs: TlsCerts, password: str | None = None) -> dict[str, Any]:
    """librdkafka's keys of ``user`` over SASL_SSL with SCRAM-SHA-512."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user] if password is None else password,
        "ssl.ca.location": str(tls_certs.ca),
    }


def consumer(bootstrap: str, user: str, tls_certs: TlsCerts) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-security",  # librdkafka wants one; nothing is committed
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 200,
            **sasl_keys(user, tls_certs),
        }
    )


def refusals(broker: BrokerProcess) -> tuple[int, int, int]:
    """(TOPIC_AUTHORIZATION_FAILED refusals, SaslAuthenticate errors, SaslAuthenticate
    answered) from the broker's metrics."""
    admin = SaslCredentials(Mechanism.SCRAM_SHA_256, "admin", PASSWORDS["admin"])
    with BrokerClient(broker.address, sasl=admin) as client:
        doc = client.metrics_per_broker()[0]
    sasl = doc["requests"]["kafka_sasl_authenticate"]
    topic = doc["counters"]["authorization_refusals"]["TOPIC_AUTHORIZATION_FAILED"]
    return int(topic), int(sasl["errors"]), int(sasl["count"])


def metadata(*names: str) -> Any:
    """Metadata v12 of ``names`` (none: every topic)."""
    topics = tuple(MdTopic(name=n, topic_id=None) for n in names) if names else None
    return wire.request(
        METADATA, 12, topics=topics, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )  # fmt: skip


def authenticated(address: str, ca: str, user: str, password: str) -> wire.Connection:
    """A connection through SaslHandshake and SaslAuthenticate (SCRAM-SHA-512) as
    ``user``; AssertionError if refused."""
    connection = wire.Connection(address, ca)
    handshake = connection.ask(wire.request(SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-512"))
    assert handshake.error_code == ErrorCode.none
    assert set(handshake.mechanisms) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    scram = ScramClient(Mechanism.SCRAM_SHA_512, user, password)
    first = connection.ask(wire.request(SASL_AUTHENTICATE, 2, auth_bytes=scram.first().encode()))
    assert first.error_code == ErrorCode.none, first.error_message
    final = scram.final(first.auth_bytes.decode())
    answer = connection.ask(wire.request(SASL_AUTHENTICATE, 2, auth_bytes=final.encode()))
    assert answer.error_code == ErrorCode.none, answer.error_message
    scram.verify(answer.auth_bytes.decode())  # the broker proved it holds the credential
    return connection


def test_confluent_and_kafka_python_read_over_sasl_ssl_with_scram_sha_512(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    started = time.monotonic()
    ck = consumer(address, "reader", tls_certs)
    try:
        ck.assign([CkPartition(TOPIC, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < ROWS and time.monotonic() < deadline:
            message = ck.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        ck.close()
    confluent_s = time.monotonic() - started
    assert values == [f"s-v{i}".encode() for i in range(ROWS)]

    started = time.monotonic()
    kp = KafkaConsumer(
        bootstrap_servers=address,
        group_id=None,
        enable_auto_commit=False,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="reader",
        sasl_plain_password=PASSWORDS["reader"],
        ssl_cafile=str(tls_certs.ca),
        fetch_max_wait_ms=200,
    )
    try:
        tp = KpPartition(TOPIC, 0)
        kp.assign([tp])
        kp.seek(tp, 0)
        read: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(read) < ROWS and time.monotonic() < deadline:
            for records in kp.poll(timeout_ms=500).values():
                read.extend(r.value for r in records)
    finally:
        kp.close()
    print(
        f"{ROWS} rows read over SASL_SSL/SCRAM-SHA-512: confluent-kafka {confluent_s:.2f}s, "
        f"kafka-python {time.monotonic() - started:.2f}s"
    )
    assert read == values
    assert "kafka: User:reader from 127.0.0.1 authenticated (SCRAM-SHA-512)" in broker.log_text()


def test_a_connection_without_sasl_is_answered_api_versions_then_closed(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    _, address = secured
    with wire.Connection(address, str(tls_certs.ca)) as connection:
        versions = connection.ask(
            wire.request(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
        )
        assert versions.error_code == ErrorCode.none
        served = {int(k.api_key) for k in versions.api_keys}
        assert {SASL_HANDSHAKE, SASL_AUTHENTICATE} <= served
        with pytest.raises(AssertionError, match="closed the connection"):
            connection.ask(metadata())
    # librdkafka with TLS and no SASL: never gets the topics (its Metadata closes the
    # connection), and says so.
    admin = AdminClient(
        {
            "bootstrap.servers": address,
            "security.protocol": "SSL",
            "ssl.ca.location": str(tls_certs.ca),
        }
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)


def test_a_mechanism_not_enabled_and_a_request_before_the_exchange_ends_are_closed(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    _, address = secured
    ca = str(tls_certs.ca)
    with wire.Connection(address, ca) as connection:
        answer = connection.ask(wire.request(SASL_HANDSHAKE, 1, mechanism="PLAIN"))
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert sorted(answer.mechanisms) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert connection.closed_by_peer()
    with wire.Connection(address, ca) as connection:
        connection.ask(wire.request(SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256"))
        scram = ScramClient(Mechanism.SCRAM_SHA_256, "reader", PASSWORDS["reader"])
        connection.ask(wire.request(SASL_AUTHENTICATE, 2, auth_bytes=scram.first().encode()))
        with pytest.raises(AssertionError, match="closed the connection"):
            connection.ask(metadata())  # half way through SCRAM: not authenticated yet


def test_a_wrong_password_is_sasl_authentication_failed_then_closed(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    _, errors_before, _ = refusals(broker)
    with wire.Connection(address, str(tls_certs.ca)) as connection:
        connection.ask(wire.request(SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-512"))
        scram = ScramClient(Mechanism.SCRAM_SHA_512, "reader", "not-the-password")
        first = connection.ask(
            wire.request(SASL_AUTHENTICATE, 2, auth_bytes=scram.first().encode())
        )
        final = scram.final(first.auth_bytes.decode()).encode()
        answer = connection.ask(wire.request(SASL_AUTHENTICATE, 2, auth_bytes=final))
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert answer.error_message == (
            "authentication of User:reader with SCRAM-SHA-512 failed: invalid credentials "
            "(unknown user or wrong password)"
        )
        assert connection.closed_by_peer()
    # librdkafka shows the broker's message (and tries again, every 2 s here).
    errors: list[KafkaError] = []
    admin = AdminClient(
        {
            "bootstrap.servers": address,
            **sasl_keys("reader", tls_certs, password="wrong"),
            "error_cb": errors.append,
            "reconnect.backoff.ms": 2000,
            "reconnect.backoff.max.ms": 2000,
        }
    )

    def told() -> bool:
        admin.poll(0.2)  # serves error_cb
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_until(told, "librdkafka's authentication error")
    assert any("invalid credentials (unknown user or wrong password)" in e.str() for e in errors)
    wait_until(lambda: refusals(broker)[1] >= errors_before + 2, "the failures counted")


def test_without_read_fetch_is_topic_authorization_failed(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    before, _, _ = refusals(broker)
    fetch = wire.request(
        FETCH, 12, replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1),
        max_bytes=i32(1 << 20), isolation_level=i8(0), session_id=i32(0),
        session_epoch=i32(-1), forgotten_topics_data=(), rack_id="",
        topics=(
            FetchTopic(
                topic=TOPIC,
                partitions=(
                    FetchPartition(
                        partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
                    ),
                ),
            ),
        ),
    )  # fmt: skip
    with authenticated(address, str(tls_certs.ca), "viewer", PASSWORDS["viewer"]) as viewer:
        answer = viewer.ask(fetch)
    partition = answer.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.topic_authorization_failed
    assert partition.records in (None, b"")
    with authenticated(address, str(tls_certs.ca), "reader", PASSWORDS["reader"]) as reader:
        assert reader.ask(fetch).responses[0].partitions[0].error_code == ErrorCode.none
    # librdkafka's consumer sees the refusal as a consume error (and, its group.id having
    # no Group ACL, GROUP_AUTHORIZATION_FAILED from its coordinator look-up, not asserted).
    ck = consumer(address, "viewer", tls_certs)
    seen: list[int] = []
    try:
        ck.assign([CkPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + DEADLINE_S
        while KafkaError.TOPIC_AUTHORIZATION_FAILED not in seen and time.monotonic() < deadline:
            message = ck.poll(0.2)
            if message is not None and message.error() is not None:
                seen.append(message.error().code())
    finally:
        ck.close()
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in seen, seen
    assert refusals(broker)[0] >= before + 2
    assert "User:viewer from host 127.0.0.1 is not allowed Read on Topic:secured" in (
        broker.log_text()
    )


def test_without_describe_metadata_refuses_the_topic_and_lists_it_not(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    before, _, _ = refusals(broker)
    with authenticated(address, str(tls_certs.ca), "viewer", PASSWORDS["viewer"]) as viewer:
        every = viewer.ask(metadata())
        named = viewer.ask(metadata(HIDDEN, "never"))
    assert [t.name for t in every.topics] == [TOPIC]
    # Whether it exists or not, a topic the caller may not Describe is refused alike.
    assert [(t.name, t.error_code) for t in named.topics] == [
        (HIDDEN, ErrorCode.topic_authorization_failed),
        ("never", ErrorCode.topic_authorization_failed),
    ]
    listed = AdminClient({"bootstrap.servers": address, **sasl_keys("viewer", tls_certs)})
    shown = listed.list_topics(topic=HIDDEN, timeout=10)
    assert shown.topics[HIDDEN].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert refusals(broker)[0] >= before + 3


def test_without_write_produce_is_refused_and_init_producer_id_without_idempotent_write(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    before, _, _ = refusals(broker)
    with authenticated(address, str(tls_certs.ca), "reader", PASSWORDS["reader"]) as reader:
        answer = reader.ask(wire.request(INIT_PRODUCER_ID, 4, **NO_TXN))
    assert answer.error_code == ErrorCode.cluster_authorization_failed
    delivered: list[Any] = []
    producer = KafkaProducer(
        {
            "bootstrap.servers": address,
            **sasl_keys("reader", tls_certs),
            "enable.idempotence": False,
            "acks": 1,
            "retries": 0,
        }
    )
    producer.produce(TOPIC, b"refused", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(DEADLINE_S) == 0
    assert [e.code() for e in delivered] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert refusals(broker)[0] >= before + 1
    assert "User:reader from host 127.0.0.1 is not allowed Write on Topic:secured" in (
        broker.log_text()
    )


def test_a_consumer_group_needs_read_on_its_group(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured

    def subscribed(group: str) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": address,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **sasl_keys("reader", tls_certs),
            }
        )
        consumer.subscribe([TOPIC])
        return consumer

    refused = subscribed("not-allowed")
    try:
        seen = None
        deadline = time.monotonic() + DEADLINE_S
        while seen is None and time.monotonic() < deadline:
            message = refused.poll(0.2)
            if message is not None and message.error() is not None:
                seen = message.error()
    finally:
        refused.close()
    assert seen is not None and seen.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, seen
    done = idemlog(
        "acls", "add", "--data-dir", str(broker.log_dir), "--allow-principal", "User:reader",
        "--operation", "Read", "--group", "readers",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    allowed = subscribed("readers")
    try:
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < ROWS and time.monotonic() < deadline:
            message = allowed.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
        allowed.commit(asynchronous=False)
        committed = allowed.committed([CkPartition(TOPIC, 0)], timeout=10)
    finally:
        allowed.close()
    assert values == [f"s-v{i}".encode() for i in range(ROWS)]
    assert committed[0].offset == ROWS
    assert "User:reader from host 127.0.0.1 is not allowed Describe on Group:not-allowed" in (
        broker.log_text()
    )


def test_admin_apis_need_create_delete_and_describe_configs(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    viewer = AdminClient({"bootstrap.servers": address, **sasl_keys("viewer", tls_certs)})
    created = viewer.create_topics([NewTopic("viewer-made", 1, 1)])["viewer-made"]
    with pytest.raises(KafkaException) as refused:
        created.result(timeout=10)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    deleted = viewer.delete_topics([TOPIC])[TOPIC]
    with pytest.raises(KafkaException) as refused:
        deleted.result(timeout=10)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    described = viewer.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, TOPIC)])
    with pytest.raises(KafkaException) as refused:
        next(iter(described.values())).result(timeout=10)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert TOPIC in viewer.list_topics(timeout=10).topics  # nothing was deleted
    assert "User:viewer from host 127.0.0.1 is not allowed Create on Topic:viewer-made" in (
        broker.log_text()
    )


def test_a_user_removed_has_its_kafka_connections_closed(
    secured: tuple[BrokerProcess, str], tls_certs: TlsCerts
) -> None:
    broker, address = secured
    ca = str(tls_certs.ca)
    add_user(["--data-dir", str(broker.log_dir)], "leaving", "leaving-Secret-44dd")
    with authenticated(address, ca, "leaving", "leaving-Secret-44dd") as leaving:
        assert leaving.ask(metadata()).topics == ()  # served: no topic is allowed to it
        done = idemlog("users", "remove", "leaving", "--data-dir", str(broker.log_dir))
        assert done.returncode == 0, done.stderr
        # The embedded file is looked at by the next authentication, anyone's.
        authenticated(address, ca, "reader", PASSWORDS["reader"]).close()
        assert leaving.closed_by_peer()
    broker.wait_for_log("User:leaving changed or removed: 1 Kafka connections closed")


def test_an_ssl_listener_takes_the_client_certificates_principal(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    """``SSL://`` with ``ssl.client.auth=required``: the principal is the certificate's
    subject mapped by ``ssl.principal.mapping.rules``, as on the Flight listener; the
    super user ``User:CN=client`` writes, ``User:spark-job`` reads once allowed."""
    rules = "RULE:^CN=(.*?),OU=data$/$1/L,DEFAULT"
    broker = broker_factory(
        {
            **TEST_BROKER_CONFIG,
            **tls_certs.broker_keys(client_auth="required"),
            "ssl.principal.mapping.rules": rules,
            "authorizer.enable": "true",
            "super.users": "User:CN=client",
            "kafka.listener": "SSL://127.0.0.1:0",
        },
        name="kafka-mtls",
    )
    admin_keys = {
        **tls_certs.client_keys(),
        "ssl.certificate.location": str(tls_certs.client.cert),
        "ssl.key.location": str(tls_certs.client.key),
    }
    with BrokerClient(broker.address, tls=producer_tls(admin_keys)) as admin:
        admin.create_topic("mtls", 1, schema=KAFKA_SCHEMA)
    with Producer(broker.address, **admin_keys) as producer:
        producer.send("mtls", kafka_rows("m", 10))
        producer.flush()
    job = issue_client(
        tls_certs,
        "kafka-spark-job",
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "data"),
                x509.NameAttribute(NameOID.COMMON_NAME, "Spark-Job"),
            ]
        ),
    )
    done = idemlog(
        "acls", "add", "--data-dir", str(broker.log_dir), "--allow-principal", "User:spark-job",
        "--operation", "Read", "--topic", "mtls",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    address = [
        line.rsplit(":", 1)[1].strip()
        for line in broker.log_text().splitlines()
        if "kafka listener: SSL://127.0.0.1:" in line
    ][-1]
    ck = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{address}",
            "group.id": "kafka-mtls",
            "enable.auto.commit": False,
            "security.protocol": "SSL",
            "ssl.ca.location": str(tls_certs.ca),
            "ssl.certificate.location": str(job.cert),
            "ssl.key.location": str(job.key),
        }
    )
    try:
        ck.assign([CkPartition("mtls", 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < 10 and time.monotonic() < deadline:
            message = ck.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
    finally:
        ck.close()
    assert values == [f"m-v{i}".encode() for i in range(10)]
    broker.wait_for_log("kafka: User:spark-job from 127.0.0.1 authenticated (certificate)")
