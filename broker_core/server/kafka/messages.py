"""What the Kafka listener's API families share: how an API is declared, and how a
response is built for the version asked.

Each family (``metadata``, ``consume``, ``produce``…) declares the APIs it serves as
:class:`ServedApi` rows: Kafka's key, the versions served, the request kind the metrics
count it as, its handler. :class:`~broker_core.server.kafka.apis.KafkaApis` composes the
families the broker hands it, so ApiVersions advertises exactly what some family
handles.

Responses are built for the version asked from the fields that version has: kio's
classes for each version differ only in which fields exist, so one handler serves them
all (:func:`build`). An idemlog error becomes the Kafka error with the same number
(``broker_core/errors.py`` uses Kafka's numbers where Kafka has the error).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker_core.errors import IdemlogError
from broker_core.server.kafka.framing import KafkaRequest

NO_EPOCH = -1
NO_THROTTLE = datetime.timedelta(0)

# A request and the kio response class of its version -> the response, or None for none
# (a Produce with acks=0, which Kafka never answers).
Handler = Callable[[KafkaRequest, type[Any]], Any]


@dataclass(frozen=True)
class ServedApi:
    """One Kafka API served: Kafka's ``key``, the versions ``min_version`` to
    ``max_version`` (both served), the request ``kind`` the metrics time it as (one of
    ``observability.metrics.KAFKA_REQUEST_KINDS``) and its ``handle``r."""

    key: int
    min_version: int
    max_version: int
    kind: str
    handle: Handler


class ApiFamily(Protocol):
    """Kafka APIs served together, over the same broker parts."""

    def apis(self) -> Sequence[ServedApi]: ...


def kafka_error(exc: IdemlogError) -> KafkaErrorCode:
    """The Kafka error of ``exc``: its own number when Kafka has it, else
    UNKNOWN_SERVER_ERROR (idemlog's own codes, 10000 and up, mean nothing to a client)."""
    try:
        return KafkaErrorCode(exc.error_code.code)
    except ValueError:
        return KafkaErrorCode.unknown_server_error


def build(cls: type[Any], **values: Any) -> Any:
    """``cls`` (a kio class of one version) from the ``values`` it has fields for."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def nested(response: type[Any], name: str) -> type[Any]:
    """The nested class ``name`` of the same version as ``response``."""
    found: type[Any] = getattr(sys.modules[response.__module__], name)
    return found
