"""An idempotent producer id is bound to the principal it was issued to (issue 36, finding
2): InitProducerId answers a producer token, each non-transactional batch carries it, and
the partition leader checks it before the validator, so another principal (even with
IdempotentWrite) is refused without learning the id's sequence or epoch, and the owner's
batch lands once. Real broker processes: the embedded SASL broker with the authorizer and
real second principals (``test_acls``), and a plain one whose key file is replaced
(docs/security.md, "Idempotent produce")."""

from __future__ import annotations

import os

import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidProducerIdMappingError
from broker_core.producer import Producer
from broker_core.protocol.wire import ProduceRequestMeta, ProduceResponse
from broker_core.security.producer_token import KEY_FILE
from tests.broker.helpers import SCHEMA, ids, rows
from tests.broker.test_acls import TOPIC, acl_broker, acl_users, admin, allow, client_of
from tests.harness.broker import BrokerProcess

__all__ = ["acl_broker", "acl_users", "admin"]  # fixtures, used by name

# Words a refusal must not hold: the owner's state (its expected sequence, its epoch).
LEAKS = ("expected", "sequence", "epoch")


def _send_with_token(
    client: BrokerClient, pid: int, epoch: int, seq: int, token: bytes, batch: pa.RecordBatch
) -> ProduceResponse:
    """One non-transactional batch carrying ``token`` as its producer token."""
    with client.produce_stream(TOPIC, 0, SCHEMA) as stream:
        meta = ProduceRequestMeta(pid, epoch, seq, False, 0, token)
        return stream.send_raw(batch, meta.encode(), 0).result(10)


def _refused(answer: ProduceResponse) -> str:
    error = answer.error()
    assert isinstance(error, InvalidProducerIdMappingError), answer
    assert error.code == 49 and not error.retriable
    assert not any(word in error.message for word in LEAKS), error.message
    return error.message


def test_another_principals_idempotent_producer_id_is_refused_and_the_owner_lands_once(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """Finding 2 replayed with IdempotentWrite and Write for both: alice under bob's
    producer id with a wrong sequence, then with the right one, then with her own token
    and with a made-up one, then with bob's own token: each refused (49) naming none of
    his state, nothing written; bob's next batch is appended once, not a duplicate."""
    for user in ("bob", "alice"):
        allow(acl_broker, f"User:{user}", "Write")
        allow(acl_broker, f"User:{user}", "IdempotentWrite", resource=("--cluster",))
    with client_of(acl_broker, "bob") as bob, client_of(acl_broker, "alice") as alice:
        pid, epoch = bob.init_producer_id()
        with bob.produce_stream(TOPIC, 0, SCHEMA) as stream:
            stream.send(rows(3), producer_id=pid, producer_epoch=epoch, base_sequence=0).offsets(10)
        end = admin.list_offsets(TOPIC, 0)["log_end_offset"]
        assert end == 3
        with alice.produce_stream(TOPIC, 0, SCHEMA) as stream:
            # A wrong sequence, then the one the refusal named before issue 36 (3).
            answers = [
                stream.send(
                    rows(1, start=666), producer_id=pid, producer_epoch=epoch, base_sequence=seq
                ).result(10)
                for seq in (7, 3)
            ]
        for answer in answers:
            assert "carries no producer token to User:alice" in _refused(answer)
        alice_pid, _ = alice.init_producer_id()
        own = alice.producer_tokens.token_for(alice_pid)  # hers, for her own id
        stolen = bob.producer_tokens.token_for(pid)  # bob's, bound to User:bob
        assert len(own) == len(stolen) == 32 and own != stolen
        for token in (own, os.urandom(32), stolen):
            answer = _send_with_token(alice, pid, epoch, 3, token, rows(1, start=667))
            assert "carries a token not issued to User:alice" in _refused(answer)
        # bob's token with alice's id (his principal, her id): refused too.
        answer = _send_with_token(bob, alice_pid, 0, 0, stolen, rows(1, start=668))
        assert "not issued to User:bob" in _refused(answer)
        assert admin.list_offsets(TOPIC, 0)["log_end_offset"] == end  # nothing written
        with bob.produce_stream(TOPIC, 0, SCHEMA) as stream:
            answer = stream.send(
                rows(2, start=3), producer_id=pid, producer_epoch=epoch, base_sequence=3
            ).result(10)
        assert answer.ok and not answer.duplicate and answer.base_offset == 3, answer
    assert ids(admin, TOPIC, isolation="read_uncommitted") == [0, 1, 2, 3, 4]


def test_a_transactional_producer_id_in_a_non_transactional_batch_is_refused(
    acl_broker: BrokerProcess, admin: BrokerClient
) -> None:
    """Its token is never issued, so even its owner (a super user) cannot write under it
    outside its transactions; nothing written."""
    pid, epoch = admin.init_producer_id("owner-txn", None)
    assert admin.producer_tokens.token_for(pid) == b""
    with admin.produce_stream(TOPIC, 0, SCHEMA) as stream:
        answer = stream.send(rows(1), producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert "carries no producer token to User:admin" in _refused(answer.result(10))
    assert admin.list_offsets(TOPIC, 0)["log_end_offset"] == 0


def test_a_replaced_key_makes_the_producer_reinitialise_and_its_rows_land_once(
    broker: BrokerProcess,
) -> None:
    """The embedded broker's key file deleted while it is down (as a wiped ZooKeeper
    would replace the cluster's): the producer's old token is refused (49), the producer
    takes a new producer id (one epoch bump) and every row is readable exactly once."""
    key_file = broker.log_dir / KEY_FILE
    with BrokerClient(broker.address) as client:
        client.create_topic("rekeyed", 1)
        with Producer(broker.address, **{"linger.ms": 2, "retry.backoff.ms": 20}) as producer:
            producer.send("rekeyed", pa.table({"id": list(range(10))})).result(10)
            first_pid = producer.metrics_snapshot()["producer_id"]
            old_key = key_file.read_bytes()
            assert oct(key_file.stat().st_mode & 0o777) == "0o600"
            broker.stop()
            key_file.unlink()
            broker.restart()
            assert key_file.read_bytes() != old_key  # the fault fired: a new key
            producer.send("rekeyed", pa.table({"id": list(range(10, 20))})).result(30)
            producer.flush(30)
            metrics = producer.metrics_snapshot()
        assert metrics["epoch_bumps"] == 1 and metrics["producer_id"] != first_pid, metrics
        assert sorted(ids(client, "rekeyed")) == list(range(20))
