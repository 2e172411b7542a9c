"""The Kafka APIs this broker serves: the families it is handed, and ApiVersions.

:attr:`KafkaApis.served` is what ApiVersions advertises and what the listener decodes:
an API or a version outside it is never advertised, so a client never sends it (one that
does is disconnected, as Kafka does, but for ApiVersions itself, answered at v0 with
UNSUPPORTED_VERSION and the list, so the client can pick). Each other API is one
family's (``metadata.py``, ``consume.py``, ``produce.py``…: docs/kafka.md lists them with
their versions).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i16

from broker_core.server.kafka.framing import KafkaRequest, UnsupportedVersion
from broker_core.server.kafka.messages import (
    NO_THROTTLE,
    ApiFamily,
    ServedApi,
    build,
    nested,
)

log = logging.getLogger("idemlog.kafka")

API_VERSIONS = 18


class KafkaApis:
    """Serves ApiVersions (v0-v4) and every API of ``families``; ValueError when two
    families (or one and ApiVersions) claim the same key."""

    def __init__(self, families: Sequence[ApiFamily]) -> None:
        own = ServedApi(API_VERSIONS, 0, 4, "kafka_api_versions", self.api_versions)
        self._apis: dict[int, ServedApi] = {API_VERSIONS: own}
        for family in families:
            for api in family.apis():
                if api.key in self._apis:
                    raise ValueError(f"Kafka API key {api.key} is served twice")
                self._apis[api.key] = api
        # api key -> (min, max) version served
        self.served: Mapping[int, tuple[int, int]] = {
            key: (api.min_version, api.max_version) for key, api in sorted(self._apis.items())
        }

    def kind(self, api_key: int) -> str:
        """The request kind the metrics count ``api_key`` as (a served key)."""
        return self._apis[api_key].kind

    def handle(self, request: KafkaRequest) -> Any:
        """The response to ``request`` (a kio response of the request's version), or None
        for none (a Produce with acks=0, which Kafka never answers)."""
        response = load_response_schema(request.api_key, request.api_version)
        return self._apis[request.api_key].handle(request, response)

    # -- ApiVersions ---------------------------------------------------------------------
    def api_versions(self, request: KafkaRequest, response: type[Any]) -> Any:
        return self._api_versions(response, KafkaErrorCode.none)

    def unsupported_api_versions(self, refused: UnsupportedVersion) -> Any:
        """ApiVersions at a version not served: answered at v0 with UNSUPPORTED_VERSION
        and the versions served, from which the client picks (KIP-511)."""
        log.info("kafka: ApiVersions v%d asked; answered at v0", refused.api_version)
        return self._api_versions(
            load_response_schema(API_VERSIONS, 0), KafkaErrorCode.unsupported_version
        )

    def _api_versions(self, response: type[Any], error: KafkaErrorCode) -> Any:
        version = nested(response, "ApiVersion")
        keys = tuple(
            version(api_key=i16(key), min_version=i16(low), max_version=i16(high))
            for key, (low, high) in self.served.items()
        )
        return build(response, error_code=error, api_keys=keys, throttle_time=NO_THROTTLE)
