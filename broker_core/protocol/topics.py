"""Topic naming and sizing rules, checked alike by the client, the server and the store."""

from __future__ import annotations

import re
import uuid

from broker_core.errors import InvalidRequestError, InvalidTopicError
from broker_core.fileutil import LOCK_FILE, META_FILE, RUNNING_FILE

MAX_TOPIC_NAME_LENGTH = 249  # Kafka's limit, so names move between the two unchanged
INTERNAL_TOPIC_PREFIX = "__"  # reserved: __transaction_state lives beside users' topics
MAX_PARTITIONS = 10_000
_LEGAL_NAME = re.compile(r"[A-Za-z0-9._-]+")
_TOPIC_ID = re.compile(r"[0-9a-f]{32}")
_IDENTITY_FILES = frozenset(f for n in (META_FILE, RUNNING_FILE) for f in (n, n + ".tmp"))


def validate_topic_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"topic name {name!r} must be a non-empty string")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if name == LOCK_FILE:  # a topic is a directory of log.dir, where this is the lock file
        raise InvalidTopicError(f"topic name {name!r} is reserved (the data-directory lock)")
    if name in _IDENTITY_FILES:  # likewise the directory's identity files
        raise InvalidTopicError(f"topic name {name!r} is reserved (the data directory's identity)")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name {name[:40]!r}... is {len(name)} characters, over the limit of "
            f"{MAX_TOPIC_NAME_LENGTH}"
        )
    if not _LEGAL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL_NAME.fullmatch(c)})
        raise InvalidTopicError(
            f"topic name {name!r} contains {''.join(bad)!r}: only ASCII letters, digits, "
            f"'.', '_' and '-' are allowed"
        )
    return name


def is_internal_topic(name: str) -> bool:
    return name.startswith(INTERNAL_TOPIC_PREFIX)


def validate_user_topic_name(name: object) -> str:
    """:func:`validate_topic_name`, and not an internal topic's name (a user's topic may
    not start with ``__``). Raises InvalidTopicError naming the name."""
    name = validate_topic_name(name)
    if is_internal_topic(name):
        raise InvalidTopicError(
            f"topic name {name!r}: names starting with {INTERNAL_TOPIC_PREFIX!r} are reserved "
            "for internal topics"
        )
    return name


def new_topic_id() -> str:
    """A topic's id, chosen once when it is created (Kafka's KIP-516): a random UUID as
    32 lowercase hex digits. A topic deleted and created again under its name gets
    another, so a replica, a request or a reader of the old one can tell."""
    return uuid.uuid4().hex


def validate_topic_id(value: object, what: str) -> str:
    """``value`` if it is a topic id (32 lowercase hex digits), else an
    InvalidRequestError naming ``what``."""
    if not isinstance(value, str) or not _TOPIC_ID.fullmatch(value):
        raise InvalidRequestError(f"{what}: {value!r} is not a topic id (32 lowercase hex digits)")
    return value
