"""Kafka's authorization model: who (a principal, from a host) may do what (an operation)
to which resource, and the pure decision over a set of ACLs (docs/security.md,
Authorization).

A binding is ``(resource pattern, principal, host, operation, permission)``. A resource
pattern is a type (``Topic``, ``Group``, ``TransactionalId``, ``Cluster``), a pattern type
(``LITERAL``: the name, or ``*`` for every resource of the type; ``PREFIXED``: every
name starting with it) and a name. The decision, as Kafka's ``AclAuthorizer``:

1. a super user (``super.users``) may do anything;
2. a DENY binding that matches wins over every ALLOW;
3. else an ALLOW binding that matches allows; ALLOW of ``Read``, ``Write``, ``Delete``
   or ``Alter`` implies ``Describe``, ``AlterConfigs`` implies ``DescribeConfigs``,
   ``All`` is every operation;
4. else, when no binding at all names the resource and ``allow.everyone.if.no.acl.found``
   is on, allowed; otherwise denied.

A binding matches a request when its principal is the request's or ``User:*``, its host
is the request's or ``*``, and its pattern covers the resource's name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from broker_core.security.principal import Principal

WILDCARD = "*"  # a literal name, principal name or host meaning "every"
WILDCARD_PRINCIPAL = Principal("User", WILDCARD)
CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource's name, as Kafka's


class ResourceType(StrEnum):
    TOPIC = "Topic"
    GROUP = "Group"  # a Kafka consumer group (its offsets and membership)
    TRANSACTIONAL_ID = "TransactionalId"
    CLUSTER = "Cluster"

    @classmethod
    def parse(cls, text: str) -> ResourceType:
        for member in cls:
            if member.value.lower() == text.strip().lower():
                return member
        raise ValueError(f"resource type {text!r} is not one of {', '.join(cls)}")


class PatternType(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"

    @classmethod
    def parse(cls, text: str) -> PatternType:
        try:
            return cls(text.strip().upper())
        except ValueError:
            raise ValueError(f"pattern type {text!r} is not literal or prefixed") from None


class Operation(StrEnum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"

    @classmethod
    def parse(cls, text: str) -> Operation:
        key = text.strip().replace("_", "").replace("-", "").lower()
        for member in cls:
            if member.value.lower() == key:
                return member
        raise ValueError(f"operation {text!r} is not one of {', '.join(cls)}")


class Permission(StrEnum):
    ALLOW = "Allow"
    DENY = "Deny"


# An ALLOW of the key allows these too (Kafka's implied operations).
_IMPLIED_BY_ALLOW: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}

# The operations that mean something for each resource type (Kafka's); a binding of
# another is refused when written, so that it never silently allows nothing.
VALID_OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset(
        {
            Operation.ALL,
            Operation.READ,
            Operation.WRITE,
            Operation.CREATE,
            Operation.DELETE,
            Operation.ALTER,
            Operation.DESCRIBE,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset(
        {Operation.ALL, Operation.READ, Operation.DESCRIBE, Operation.DELETE}
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.ALL, Operation.WRITE, Operation.DESCRIBE}),
    ResourceType.CLUSTER: frozenset(
        {
            Operation.ALL,
            Operation.CREATE,
            Operation.CLUSTER_ACTION,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
            Operation.IDEMPOTENT_WRITE,
            Operation.ALTER,
            Operation.DESCRIBE,
        }
    ),
}


@dataclass(frozen=True)
class Resource:
    """One concrete resource a request touches (``Topic:payments``)."""

    type: ResourceType
    name: str

    def __str__(self) -> str:
        return f"{self.type.value}:{self.name}"


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True)
class ResourcePattern:
    """What a binding names: a type, LITERAL or PREFIXED, and a name."""

    type: ResourceType
    pattern: PatternType
    name: str

    def covers(self, resource: Resource) -> bool:
        if resource.type is not self.type:
            return False
        if self.pattern is PatternType.PREFIXED:
            return resource.name.startswith(self.name)
        return self.name == WILDCARD or self.name == resource.name

    def __str__(self) -> str:
        return f"{self.type.value}:{self.pattern.value}:{self.name}"


@dataclass(frozen=True)
class AclEntry:
    """The part of a binding that is not its resource (how a store groups them)."""

    principal: Principal
    host: str
    operation: Operation
    permission: Permission


@dataclass(frozen=True)
class AclBinding:
    """One ACL. Build it with :meth:`of` to have it checked."""

    pattern: ResourcePattern
    entry: AclEntry

    @classmethod
    def of(
        cls,
        pattern: ResourcePattern,
        principal: Principal,
        operation: Operation,
        permission: Permission = Permission.ALLOW,
        host: str = WILDCARD,
    ) -> AclBinding:
        """A checked binding; ValueError naming the field: an operation the resource type
        does not have, an empty name, a PREFIXED ``*``, a Cluster not named
        ``kafka-cluster``, an empty host."""
        if operation not in VALID_OPERATIONS[pattern.type]:
            valid = ", ".join(sorted(VALID_OPERATIONS[pattern.type]))
            raise ValueError(
                f"operation {operation.value} does not apply to a {pattern.type.value} "
                f"(valid: {valid})"
            )
        if not pattern.name:
            raise ValueError(f"{pattern.type.value}: the resource name is empty")
        if pattern.pattern is PatternType.PREFIXED and pattern.name == WILDCARD:
            raise ValueError("a PREFIXED pattern of '*' is not a pattern: use LITERAL '*'")
        if pattern.type is ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
            raise ValueError(f"the Cluster resource is named {CLUSTER_NAME!r}")
        if not host.strip():
            raise ValueError("host is empty: an IP address or '*'")
        return cls(pattern, AclEntry(principal, host.strip(), operation, permission))

    def __str__(self) -> str:
        e = self.entry
        return (
            f"{e.permission.value} {e.principal} {e.operation.value} on {self.pattern} "
            f"from host {e.host}"
        )


def _allows(binding_op: Operation, asked: Operation) -> bool:
    if binding_op is Operation.ALL or binding_op is asked:
        return True
    return binding_op in _IMPLIED_BY_ALLOW.get(asked, frozenset())


def _denies(binding_op: Operation, asked: Operation) -> bool:
    return binding_op is Operation.ALL or binding_op is asked


class AclIndex:
    """A set of bindings indexed by resource: a check reads the literal bindings of its
    resource's name and of ``*`` by dict look-up and scans only the prefixed ones of its
    type, instead of every binding. Built once per set (the stores replace theirs whole)."""

    def __init__(self, bindings: Iterable[AclBinding]) -> None:
        self.bindings = tuple(bindings)
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        for b in self.bindings:
            if b.pattern.pattern is PatternType.PREFIXED:
                self._prefixed.setdefault(b.pattern.type, []).append(b)
            else:
                self._literal.setdefault((b.pattern.type, b.pattern.name), []).append(b)

    def covering(self, resource: Resource) -> list[AclBinding]:
        """Every binding whose pattern covers ``resource``."""
        found = list(self._literal.get((resource.type, resource.name), ()))
        if resource.name != WILDCARD:
            found.extend(self._literal.get((resource.type, WILDCARD), ()))
        found.extend(b for b in self._prefixed.get(resource.type, ()) if b.pattern.covers(resource))
        return found


class Authorizer:
    """The decision over a set of bindings: pure, so a broker asks it with its cached
    bindings at every request and a test with any it likes."""

    def __init__(self, super_users: Iterable[Principal], *, allow_if_no_acl: bool) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl

    def authorize(
        self,
        bindings: AclIndex | Iterable[AclBinding],
        principal: Principal,
        host: str,
        operation: Operation,
        resource: Resource,
    ) -> bool:
        """Whether ``principal`` calling from ``host`` may do ``operation`` on
        ``resource`` (the rules of the module's docstring). ``operation`` is never
        ``All``: a request asks for one operation."""
        if principal in self.super_users:
            return True
        if isinstance(bindings, AclIndex):
            covering: Iterable[AclBinding] = bindings.covering(resource)
        else:
            covering = (b for b in bindings if b.pattern.covers(resource))
        allowed = False
        any_for_resource = False
        for binding in covering:
            any_for_resource = True
            entry = binding.entry
            if entry.principal != principal and entry.principal != WILDCARD_PRINCIPAL:
                continue
            if entry.host != WILDCARD and entry.host != host:
                continue
            if entry.permission is Permission.DENY:
                if _denies(entry.operation, operation):
                    return False  # deny wins, whatever else allows
            elif _allows(entry.operation, operation):
                allowed = True
        return allowed or (not any_for_resource and self.allow_if_no_acl)


def parse_super_users(text: str) -> list[Principal]:
    """``super.users``: principals separated by ``;`` (Kafka's form, since a principal
    may hold a ``,``); ValueError naming the one that is not ``Type:name``."""
    return [Principal.parse(p.strip()) for p in text.split(";") if p.strip()]
