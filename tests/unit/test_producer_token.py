"""The producer token (``security.producer_token``): an unambiguous HMAC input, the check's
refusal, the embedded key file, the token on the wire and in the client's book."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from broker_core.client.producer_tokens import ProducerTokenBook
from broker_core.errors import InvalidProducerIdMappingError, InvalidRequestError
from broker_core.protocol.txn_requests import InitProducerIdResponse
from broker_core.protocol.wire import ProduceRequestMeta
from broker_core.security.producer_token import (
    KEY_BYTES,
    CorruptProducerIdKeyError,
    ProducerTokens,
    file_key,
    token_input,
)
from broker_core.security.zk_acl import is_sensitive

KEY = bytes(range(KEY_BYTES))


def test_the_input_is_length_prefixed_so_no_two_pairs_share_it() -> None:
    pairs = [(1, "User:a"), (1, "User:ab"), (256, "User:a"), (1, "User:a\x00"), (0, "")]
    inputs = {token_input(pid, principal) for pid, principal in pairs}
    assert len(inputs) == len(pairs)
    # The id is 8 bytes, then the principal's length, then its UTF-8.
    name = "User:é".encode()  # 7 bytes
    assert token_input(1, "User:é").endswith(
        (1).to_bytes(8, "big") + len(name).to_bytes(4, "big") + name
    )


def test_a_token_is_bound_to_its_id_principal_and_key() -> None:
    tokens = ProducerTokens(KEY)
    token = tokens.issue(1000, "User:bob")
    assert len(token) == 32 and token == tokens.issue(1000, "User:bob")
    tokens.check(1000, "User:bob", token, "produce to t-0")  # the owner: passes
    cases = [
        (1000, "User:alice", token, "carries a token not issued to User:alice"),
        (1001, "User:bob", token, "carries a token not issued to User:bob"),
        (1000, "User:bob", b"", "carries no producer token to User:bob"),
        (1000, "User:bob", token[:-1] + bytes([token[-1] ^ 1]), "not issued"),
    ]
    for pid, principal, presented, message in cases:
        with pytest.raises(InvalidProducerIdMappingError, match=message) as refused:
            tokens.check(pid, principal, presented, "produce to t-0")
        assert refused.value.code == 49 and not refused.value.retriable
        assert "produce to t-0" in refused.value.message
        assert "sequence" not in refused.value.message and "epoch" not in refused.value.message
    other = ProducerTokens(bytes(KEY_BYTES))  # a replaced key: the old token is refused
    with pytest.raises(InvalidProducerIdMappingError):
        other.check(1000, "User:bob", token, "produce to t-0")
    with pytest.raises(ValueError, match="32 bytes"):
        ProducerTokens(b"short")


def test_the_embedded_key_file_is_created_once_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "__producer_id_key"
    keys: list[bytes] = []
    start = threading.Barrier(4)

    def create() -> None:
        start.wait()
        keys.append(file_key(path))

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 4 and len(set(keys)) == 1  # one winner, read by all
    assert len(keys[0]) == KEY_BYTES
    assert path.stat().st_mode & 0o777 == 0o600
    assert file_key(path) == keys[0]  # a restart reads it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["__producer_id_key"]  # no tmp left
    path.write_bytes(b"torn")
    with pytest.raises(CorruptProducerIdKeyError, match="holds 4 bytes, not 32"):
        file_key(path)
    path.unlink()
    assert file_key(path) != keys[0]  # deleted: a new key (old tokens refused)


def test_the_token_travels_after_the_fixed_metadata_and_in_the_init_answer() -> None:
    token = os.urandom(32)
    meta = ProduceRequestMeta(1000, 2, 7, False, 5, token)
    encoded = meta.encode()
    assert len(encoded) == 24 + 32 and ProduceRequestMeta.decode(encoded) == meta
    plain = ProduceRequestMeta(-1, -1, -1, False, 0)
    assert ProduceRequestMeta.decode(plain.encode()) == plain
    with pytest.raises(InvalidRequestError, match="24 bytes, or 56 with a producer token, got 40"):
        ProduceRequestMeta.decode(encoded[:40])
    answer = InitProducerIdResponse(1000, 0, producer_token=token)
    assert answer.to_doc()["producer_token"] == token.hex()
    assert InitProducerIdResponse.from_doc(answer.to_doc()) == answer
    assert "producer_token" not in InitProducerIdResponse(7, 1).to_doc()  # transactional
    with pytest.raises(InvalidRequestError, match="'producer_token' is not hex"):
        InitProducerIdResponse.from_doc(
            {"producer_id": 1, "producer_epoch": 0, "producer_token": "zz"}
        )


def test_the_clients_book_keeps_the_newest_tokens() -> None:
    book = ProducerTokenBook(max_tokens=2)
    for pid in (1, 2, 3):
        book.remember(pid, bytes([pid]) * 32)
    assert book.token_for(1) == b"" and book.token_for(3) == b"\x03" * 32
    assert book.token_for(2) == b"\x02" * 32


def test_the_key_znode_is_private_like_the_users() -> None:
    assert is_sensitive("/idemlog/config/producer_id_key")
    assert is_sensitive("/chroot/idemlog/config/users/alice")
    assert not is_sensitive("/idemlog/config") and not is_sensitive("/idemlog/producer_id_key")
