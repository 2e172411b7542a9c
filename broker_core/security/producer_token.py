"""Idempotent producer ids bound to the principal they were issued to (issue 36).

A broker that answers an idempotent InitProducerId (no transactional id) also returns
``HMAC-SHA256(key, producer id, principal)``, the producer token; each non-transactional
batch carries it, and the partition leader recomputes it for the batch's producer id and
the stream's authenticated principal before the validator looks at the batch's epoch or
sequence. So a principal can write only under producer ids issued to it, and a refusal
never tells it another producer's expected sequence or epoch. A transactional producer id
never gets a token (its batches are checked by Write on the transactional id and the
coordinator's verification instead), so it cannot be used in a non-transactional batch.

The only state is the key: 32 random bytes, one for the cluster, created once by whichever
broker comes first (create-if-absent, then everyone reads the winner's) in ZooKeeper node
``<root>/config/producer_id_key`` (readable by the brokers' identity only, as the SCRAM
users' nodes: ``security.zk_acl``), or, embedded, in file ``__producer_id_key`` (0600)
beside the producer-id block file. A key replaced (ZooKeeper wiped, the file deleted)
makes every earlier token invalid: its producers are refused and re-initialise.
Checking is a recomputation (one HMAC of about 60 bytes per batch, not per row), so
nothing is cached.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import struct
import tempfile
from pathlib import Path
from typing import Any

from broker_core.errors import (
    InvalidConfigError,
    InvalidProducerIdMappingError,
    UnknownServerError,
)
from broker_core.fileutil import fsync_directory, write_all
from broker_core.security import zk_acl

KEY_BYTES = 32
TOKEN_BYTES = 32  # SHA-256
KEY_FILE = "__producer_id_key"
KEY_ZNODE = "config/producer_id_key"  # under the cluster's root znode
# Versioned, so a future token of another shape can never equal one of this.
_DOMAIN = b"idemlog producer id token v1\x00"
_PID = struct.Struct(">q")
_LENGTH = struct.Struct(">I")


def token_input(producer_id: int, principal: str) -> bytes:
    """What is signed: the domain, the producer id as 8 bytes, the principal's UTF-8
    length-prefixed (so no two (id, principal) pairs share an input)."""
    name = principal.encode("utf-8")
    return _DOMAIN + _PID.pack(producer_id) + _LENGTH.pack(len(name)) + name


class CorruptProducerIdKeyError(UnknownServerError):
    """The stored key is not 32 bytes: refusing to start rather than to sign with it."""


class ProducerTokens:
    """Issues and checks producer tokens under one cluster key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a producer id key is {KEY_BYTES} bytes, got {len(key)}")
        self._key = key

    def issue(self, producer_id: int, principal: str) -> bytes:
        return hmac.digest(self._key, token_input(producer_id, principal), "sha256")

    def check(self, producer_id: int, principal: str, token: bytes, where: str) -> None:
        """Raise INVALID_PRODUCER_ID_MAPPING unless ``token`` is the one issued for
        ``producer_id`` to ``principal``. The message names neither the producer's epoch
        nor its sequence: the caller may not own the id."""
        if hmac.compare_digest(self.issue(producer_id, principal), token):
            return
        problem = "carries no producer token" if not token else "carries a token not issued"
        raise InvalidProducerIdMappingError(
            f"{where}: the non-transactional batch of producer id {producer_id} {problem} "
            f"to {principal} for that id; nothing written (an idempotent producer writes "
            "only under an id an InitProducerId issued to its own principal: initialise "
            "a new one)"
        )


def _check_key(data: bytes, where: str) -> bytes:
    if len(data) != KEY_BYTES:
        raise CorruptProducerIdKeyError(
            f"producer id key {where} holds {len(data)} bytes, not {KEY_BYTES}; refusing to "
            "issue or check producer tokens until it is deleted (producers then re-initialise)"
        )
    return data


def file_key(path: Path) -> bytes:
    """The embedded broker's key at ``path``: created once (0600, written whole to a
    temporary file and linked into place, which fails if another process linked first),
    then read. Raises OSError when the directory cannot be written."""
    with contextlib.suppress(FileNotFoundError):
        return _check_key(path.read_bytes(), f"in file {path}")
    fd, name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)  # created 0600, a name of its own (threads and processes alike)
    try:
        write_all(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with contextlib.suppress(FileExistsError):  # another process's key won: use it
            os.link(tmp, path)
        fsync_directory(path.parent)
    finally:
        tmp.unlink()
    return _check_key(path.read_bytes(), f"in file {path}")


def zk_key(client: Any, path: str, timeout_s: float) -> bytes:
    """The cluster's key in ZooKeeper node ``path``: created once with
    ``security.zk_acl``'s ACL for it (the brokers' identity only, under
    ``zookeeper.set.acl``), a creation that finds the node already there reads it."""
    from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError

    where = f"in ZooKeeper node {path}"
    try:
        with contextlib.suppress(NoNodeError):
            data, _stat = client.get_async(path).get(timeout=timeout_s)
            return _check_key(bytes(data), where)
        zk_acl.ensure_path(client, path.rsplit("/", 1)[0])
        with contextlib.suppress(NodeExistsError):  # another broker created it first
            key = secrets.token_bytes(KEY_BYTES)
            zk_acl.create_async(client, path, key).get(timeout=timeout_s)
        data, _stat = client.get_async(path).get(timeout=timeout_s)
    except NoAuthError:
        raise InvalidConfigError(
            f"the producer id key {where} is readable by the brokers' ZooKeeper identity "
            f"only: set {zk_acl.ZK_DIGEST_USERNAME} and {zk_acl.ZK_DIGEST_PASSWORD} to it"
        ) from None
    return _check_key(bytes(data), where)
