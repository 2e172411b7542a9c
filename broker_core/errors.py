"""One error hierarchy for the store, the wire protocol and the clients.

Every error carries a numeric code (Kafka's number where Kafka has the same error, so the
protocol reads familiar; numbers from 10000 up where Kafka has no equivalent) and a
``retriable`` flag. Retry logic reads the flag; it never matches on message text.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class ErrorCode(Enum):
    """Numeric error codes with their retriable flag and a short meaning."""

    def __init__(self, code: int, retriable: bool, meaning: str) -> None:
        self.code = code
        self.retriable = retriable
        self.meaning = meaning

    UNKNOWN_SERVER_ERROR = (-1, False, "unexpected server error")
    NONE = (0, False, "no error")
    OFFSET_OUT_OF_RANGE = (1, False, "offset outside the range the log holds")
    CORRUPT_MESSAGE = (2, True, "record batch failed its CRC or is malformed")
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, "no such topic or partition")
    NOT_LEADER_OR_FOLLOWER = (6, True, "this broker does not lead the partition")
    REQUEST_TIMED_OUT = (7, True, "request timed out")
    BROKER_NOT_AVAILABLE = (8, True, "no live broker to serve the request")
    MESSAGE_TOO_LARGE = (10, False, "record batch larger than max.message.bytes")
    NETWORK_EXCEPTION = (13, True, "the connection to the broker failed")
    COORDINATOR_LOAD_IN_PROGRESS = (
        14,
        True,
        "the (transaction or group) coordinator is still loading its partition",
    )
    NOT_ENOUGH_REPLICAS = (19, True, "fewer in-sync replicas than min.insync.replicas")
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (
        20,
        True,
        "appended, but the in-sync replicas fell below min.insync.replicas before it was copied",
    )
    COORDINATOR_NOT_AVAILABLE = (
        15,
        True,
        "the (transaction or group) coordinator is not available",
    )
    NOT_COORDINATOR = (16, True, "this broker is not the (transaction or group) coordinator")
    INVALID_TOPIC_EXCEPTION = (17, False, "topic name is not legal")
    INVALID_REQUIRED_ACKS = (21, False, "invalid acks value")
    TOPIC_ALREADY_EXISTS = (36, False, "topic already exists")
    INVALID_PARTITIONS = (37, False, "invalid number of partitions")
    INVALID_REPLICATION_FACTOR = (38, False, "replication factor not possible")
    INVALID_CONFIG = (40, False, "invalid configuration")
    INVALID_REQUEST = (42, False, "malformed request")
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False, "sequence number out of order")
    DUPLICATE_SEQUENCE_NUMBER = (46, False, "batch is a duplicate of one already written")
    INVALID_PRODUCER_EPOCH = (47, False, "producer epoch is older than the current one")
    INVALID_TXN_STATE = (48, False, "operation not valid in the transaction's state")
    INVALID_PRODUCER_ID_MAPPING = (49, False, "transactional id is not mapped to this producer")
    INVALID_TRANSACTION_TIMEOUT = (50, False, "transaction timeout out of range")
    CONCURRENT_TRANSACTIONS = (51, True, "transaction state is being changed concurrently")
    TRANSACTION_COORDINATOR_FENCED = (52, False, "a newer transaction coordinator has taken over")
    KAFKA_STORAGE_ERROR = (56, True, "disk error while accessing the log")
    SASL_AUTHENTICATION_FAILED = (58, False, "SASL authentication failed")
    UNKNOWN_PRODUCER_ID = (59, False, "producer id was never issued by this cluster")
    FENCED_LEADER_EPOCH = (74, True, "the request's leader epoch is older than the broker's")
    UNKNOWN_LEADER_EPOCH = (75, True, "the request's leader epoch is newer than the broker's")
    STALE_BROKER_EPOCH = (77, False, "a broker's request from a process replaced since")
    INVALID_RECORD = (87, False, "record batch is invalid for this topic")
    PRODUCER_FENCED = (90, False, "a newer producer with the same transactional id exists")
    UNKNOWN_TOPIC_ID = (
        100,
        False,
        "the request's topic id is not the topic's: the topic was deleted (and recreated)",
    )
    DUPLICATE_BROKER_REGISTRATION = (101, False, "broker id is already in use")
    # Authorization (docs/security.md): the principal lacks the ACL; asking again is
    # refused again until an operator adds one.
    TOPIC_AUTHORIZATION_FAILED = (29, False, "not authorized to access the topic")
    GROUP_AUTHORIZATION_FAILED = (30, False, "not authorized to access the group")
    CLUSTER_AUTHORIZATION_FAILED = (31, False, "not authorized for the cluster operation")
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (
        53,
        False,
        "not authorized to use the transactional id",
    )
    # Consumer groups (broker_core/groups/): Kafka's numbers and retriable flags.
    ILLEGAL_GENERATION = (22, False, "the request's group generation is not the group's")
    INCONSISTENT_GROUP_PROTOCOL = (
        23,
        False,
        "the member's protocol type or protocols do not match the group's",
    )
    INVALID_GROUP_ID = (24, False, "the group id is empty or null")
    UNKNOWN_MEMBER_ID = (25, False, "the member id is not a member of the group")
    INVALID_SESSION_TIMEOUT = (
        26,
        False,
        "session timeout outside group.min.session.timeout.ms..group.max.session.timeout.ms",
    )
    REBALANCE_IN_PROGRESS = (27, False, "the group is rebalancing: rejoin")
    UNSUPPORTED_VERSION = (35, False, "the request or a feature of it is not served")
    NON_EMPTY_GROUP = (68, False, "the group still has members")
    GROUP_ID_NOT_FOUND = (69, False, "no such group")
    # idemlog-only codes (no Kafka equivalent).
    SCHEMA_MISMATCH = (10001, False, "batch schema differs from the topic's schema")
    PRODUCER_ID_ALLOCATION_FAILED = (10002, True, "could not lease a producer id block")
    PRODUCER_ID_SPACE_EXHAUSTED = (10003, False, "producer id space exhausted")
    LOG_DIR_LOCKED = (10004, False, "the data directory is held by another process")
    STALE_TRACKED_BATCHES = (
        10005,
        True,
        "a coordinator's tracked sink batches moved past what the reader's cut can use: ask again",
    )
    # Security: 10100 and up (Kafka reports a failed TLS handshake on the client only,
    # as SslAuthenticationException, with no wire code).
    SSL_HANDSHAKE_FAILED = (
        10101,
        False,
        "the TLS handshake with the broker failed: protocol, CA, certificate or host name",
    )

    @classmethod
    def from_code(cls, code: int) -> ErrorCode:
        try:
            return _BY_CODE[code]
        except KeyError:
            return cls.UNKNOWN_SERVER_ERROR


_BY_CODE: dict[int, ErrorCode] = {e.code: e for e in ErrorCode}


# "1": a developer asks for Python tracebacks after idemlog's one-line errors (the CLI's
# failures, the Spark side's errors reported by Spark's Python workers).
DEBUG_ENV = "IDEMLOG_DEBUG"


class IdemlogError(Exception):
    """Root of every error idemlog raises on purpose."""

    error_code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.error_code.meaning)
        self.message = message or self.error_code.meaning

    @property
    def code(self) -> int:
        return self.error_code.code

    @property
    def retriable(self) -> bool:
        return self.error_code.retriable

    def __str__(self) -> str:
        return f"{self.error_code.name} ({self.code}): {self.message}"


class UnknownServerError(IdemlogError):
    error_code = ErrorCode.UNKNOWN_SERVER_ERROR


class OffsetOutOfRangeError(IdemlogError):
    error_code = ErrorCode.OFFSET_OUT_OF_RANGE


class CorruptRecordError(IdemlogError):
    error_code = ErrorCode.CORRUPT_MESSAGE


class UnknownTopicOrPartitionError(IdemlogError):
    error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class NotLeaderOrFollowerError(IdemlogError):
    error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class NetworkError(IdemlogError):
    error_code = ErrorCode.NETWORK_EXCEPTION


class NotEnoughReplicasError(IdemlogError):
    error_code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(IdemlogError):
    error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class FencedLeaderEpochError(IdemlogError):
    error_code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(IdemlogError):
    error_code = ErrorCode.UNKNOWN_LEADER_EPOCH


class CoordinatorNotAvailableError(IdemlogError):
    error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class CoordinatorLoadInProgressError(IdemlogError):
    """This broker leads the key's state partition and is loading it (in the
    background): ask again shortly (docs/design.md §10)."""

    error_code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class NotCoordinatorError(IdemlogError):
    error_code = ErrorCode.NOT_COORDINATOR


class IllegalGenerationError(IdemlogError):
    error_code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocolError(IdemlogError):
    error_code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class InvalidGroupIdError(IdemlogError):
    error_code = ErrorCode.INVALID_GROUP_ID


class UnknownMemberIdError(IdemlogError):
    error_code = ErrorCode.UNKNOWN_MEMBER_ID


class InvalidSessionTimeoutError(IdemlogError):
    error_code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgressError(IdemlogError):
    error_code = ErrorCode.REBALANCE_IN_PROGRESS


class UnsupportedVersionError(IdemlogError):
    error_code = ErrorCode.UNSUPPORTED_VERSION


class NonEmptyGroupError(IdemlogError):
    error_code = ErrorCode.NON_EMPTY_GROUP


class GroupIdNotFoundError(IdemlogError):
    error_code = ErrorCode.GROUP_ID_NOT_FOUND


class RequestTimedOutError(IdemlogError):
    error_code = ErrorCode.REQUEST_TIMED_OUT


class BrokerNotAvailableError(IdemlogError):
    error_code = ErrorCode.BROKER_NOT_AVAILABLE


class MessageTooLargeError(IdemlogError):
    error_code = ErrorCode.MESSAGE_TOO_LARGE


class InvalidTopicError(IdemlogError):
    error_code = ErrorCode.INVALID_TOPIC_EXCEPTION


class InvalidRequiredAcksError(IdemlogError):
    error_code = ErrorCode.INVALID_REQUIRED_ACKS


class TopicAlreadyExistsError(IdemlogError):
    error_code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidPartitionsError(IdemlogError):
    error_code = ErrorCode.INVALID_PARTITIONS


class InvalidConfigError(IdemlogError):
    error_code = ErrorCode.INVALID_CONFIG


class InvalidReplicationFactorError(InvalidConfigError):
    """A replication factor below 1, not an integer, or larger than the live brokers
    (docs/replication.md). A config error, so it is caught as one."""

    error_code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidRequestError(IdemlogError):
    error_code = ErrorCode.INVALID_REQUEST


class OutOfOrderSequenceError(IdemlogError):
    error_code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceError(IdemlogError):
    """The batch was certainly written before, but its offsets are no longer cached.

    Clients treat it as success: the data is in the log exactly once.
    """

    error_code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidProducerEpochError(IdemlogError):
    error_code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(IdemlogError):
    error_code = ErrorCode.INVALID_TXN_STATE


class InvalidProducerIdMappingError(IdemlogError):
    error_code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


class InvalidTransactionTimeoutError(IdemlogError):
    error_code = ErrorCode.INVALID_TRANSACTION_TIMEOUT


class ConcurrentTransactionsError(IdemlogError):
    error_code = ErrorCode.CONCURRENT_TRANSACTIONS


class TransactionCoordinatorFencedError(IdemlogError):
    """A request from a coordinator older than one already seen (a lower coordinator epoch)."""

    error_code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class StorageError(IdemlogError):
    error_code = ErrorCode.KAFKA_STORAGE_ERROR


class SaslAuthenticationFailedError(IdemlogError):
    """No valid session on a SASL listener, or a handshake that failed: the message names
    the principal and mechanism, never the password."""

    error_code = ErrorCode.SASL_AUTHENTICATION_FAILED


class UnknownProducerIdError(IdemlogError):
    error_code = ErrorCode.UNKNOWN_PRODUCER_ID


class InvalidRecordError(IdemlogError):
    error_code = ErrorCode.INVALID_RECORD


class ProducerFencedError(IdemlogError):
    error_code = ErrorCode.PRODUCER_FENCED


class UnknownTopicIdError(IdemlogError):
    """A request (or a replica's log) names a topic by an id that is not the topic's
    now: the topic it meant was deleted, and the name may have been reused. Asking again
    under that id is refused again (docs/failure-model.md)."""

    error_code = ErrorCode.UNKNOWN_TOPIC_ID

    @classmethod
    def recreated(cls, topic: str, old_id: str, new_id: str) -> UnknownTopicIdError:
        """The one line for a topic known by ``old_id`` that is now ``new_id``."""
        if not new_id:
            return cls(f"topic {topic!r} was deleted: id {old_id} no longer exists")
        return cls(f"topic {topic!r} was recreated: id {old_id} is now {new_id}")


class DuplicateBrokerRegistrationError(IdemlogError):
    error_code = ErrorCode.DUPLICATE_BROKER_REGISTRATION


class StaleBrokerEpochError(IdemlogError):
    """A broker-to-broker request carrying the epoch of a process of that broker since
    replaced (docs/protocol.md): never answered."""

    error_code = ErrorCode.STALE_BROKER_EPOCH


class TopicAuthorizationFailedError(IdemlogError):
    """A request the principal's ACLs do not allow on a topic (docs/security.md,
    Authorization): the message names the principal, host, operation and resource and
    the ``idemlog acls add`` that would allow it. So do the two below. Never retriable."""

    error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(IdemlogError):
    error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(IdemlogError):
    error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class TransactionalIdAuthorizationFailedError(IdemlogError):
    error_code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class SchemaMismatchError(IdemlogError):
    error_code = ErrorCode.SCHEMA_MISMATCH


class ProducerIdAllocationError(IdemlogError):
    error_code = ErrorCode.PRODUCER_ID_ALLOCATION_FAILED


class ProducerIdSpaceExhaustedError(IdemlogError):
    error_code = ErrorCode.PRODUCER_ID_SPACE_EXHAUSTED


class LogDirLockedError(IdemlogError):
    """A broker's ``log.dir`` is locked by another live process (``<log.dir>/.lock``,
    docs/storage.md): two processes must never recover, append to or delete one log."""

    error_code = ErrorCode.LOG_DIR_LOCKED


class StaleTrackedBatchesError(IdemlogError):
    """A reader's cut across coordinators cannot account for every sink batch (a
    coordinator restarted, or dropped more batches than its ring holds, between the
    reader's questions): start the cut over (docs/design.md §7)."""

    error_code = ErrorCode.STALE_TRACKED_BATCHES


class SslHandshakeError(IdemlogError):
    """A link could not be set up: plaintext against a TLS listener, a certificate of
    another CA, an expired one, a host name it does not name, or a client certificate
    the broker refused. Not retriable: the same files give the same answer
    (docs/security.md)."""

    error_code = ErrorCode.SSL_HANDSHAKE_FAILED


# The refusals of the ACLs, to catch them together.
AUTHORIZATION_ERRORS: tuple[type[IdemlogError], ...] = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)

_CLASS_BY_CODE: dict[ErrorCode, type[IdemlogError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, IdemlogError) and _cls is not IdemlogError:
        _CLASS_BY_CODE.setdefault(_cls.error_code, _cls)


def error_for_code(code: int, message: str = "") -> IdemlogError:
    """Rebuild the typed error for a numeric code received over the wire."""
    error_code = ErrorCode.from_code(code)
    cls = _CLASS_BY_CODE.get(error_code, UnknownServerError)
    return cls(message)
