"""Kafka's SASL APIs: SaslHandshake chooses the mechanism, SaslAuthenticate carries its
messages (KIP-152), with SCRAM-SHA-256 and SCRAM-SHA-512 against the broker's SCRAM users
(the Flight listener's: ``access.authentication.scram_users``), by the Flight side's own
SCRAM exchange (``security.flight_auth.ScramExchange``).

A connection's state is its :class:`~broker_core.server.kafka.connection.KafkaConnection`.
A refused exchange is answered (SASL_AUTHENTICATION_FAILED with a message naming the user
and the mechanism, never why the proof failed), then the connection is closed, as Kafka
does; so are a mechanism not enabled (UNSUPPORTED_SASL_MECHANISM, with the enabled ones)
and a handshake out of turn (ILLEGAL_SASL_STATE). A session lasts as long as its
connection: ``session_lifetime`` is answered 0 (KIP-368's "no re-authentication"), and a
user removed or whose credential changes has its connections closed by the listener.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker_core.errors import SaslAuthenticationFailedError
from broker_core.security.flight_auth import ScramMechanism, scram_mechanisms
from broker_core.security.scram import Mechanism
from broker_core.server.access.authentication import ScramUsers
from broker_core.server.kafka.connection import AuthState
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import ServedApi, build

log = logging.getLogger("idemlog.kafka")

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class SaslApis:
    """SaslHandshake v1 (v0 carried the mechanism's messages unframed, without
    SaslAuthenticate; Kafka 4 dropped it, KIP-896) and SaslAuthenticate v0-v2, offering
    ``mechanisms`` (``sasl.enabled.mechanisms``) over ``users``. None: a listener without
    SASL, whose connections are authenticated from the start; a SaslHandshake there is
    out of turn."""

    def __init__(self, users: ScramUsers | None, mechanisms: Collection[Mechanism]) -> None:
        self._users = users
        self._mechanisms: dict[str, ScramMechanism] = (
            {}
            if users is None
            else {m.name: m for m in scram_mechanisms(users.lookup, mechanisms, users.secret)}
        )

    def apis(self) -> Sequence[ServedApi]:
        return (
            ServedApi(SASL_HANDSHAKE, 1, 1, "kafka_sasl_handshake", self.handshake),
            ServedApi(SASL_AUTHENTICATE, 0, 2, "kafka_sasl_authenticate", self.authenticate),
        )

    def handshake(self, request: KafkaRequest, response: type[Any]) -> Any:
        connection = request.connection
        offered = tuple(sorted(self._mechanisms))
        error = KafkaErrorCode.none
        asked = str(request.body.mechanism)
        if connection.state is not AuthState.HANDSHAKE:
            log.info(
                "kafka: SaslHandshake from %s %s; closing the connection",
                connection.host,
                connection.state.value,
            )
            error = KafkaErrorCode.illegal_sasl_state
        elif asked not in self._mechanisms:
            log.info(
                "kafka: SaslHandshake from %s asks %r, not enabled (%s); closing the connection",
                connection.host,
                asked,
                ", ".join(offered),
            )
            error = KafkaErrorCode.unsupported_sasl_mechanism
        if error != KafkaErrorCode.none:
            connection.fail()
        else:
            connection.begin(self._mechanisms[asked].exchange())
        return build(response, error_code=error, mechanisms=offered)

    def authenticate(self, request: KafkaRequest, response: type[Any]) -> Any:
        connection = request.connection
        exchange = connection.exchange
        if connection.state is not AuthState.AUTHENTICATE or exchange is None:
            connection.fail()
            return self._answer(
                response,
                KafkaErrorCode.illegal_sasl_state,
                f"SaslAuthenticate {connection.state.value}: send SaslHandshake first",
            )
        assert self._users is not None  # a mechanism was chosen, so users exist
        self._users.refresh()  # the embedded file: a user just added or removed is seen
        try:
            answer = exchange.step(bytes(request.body.auth_bytes))
        except SaslAuthenticationFailedError as exc:
            connection.fail()
            return self._answer(response, KafkaErrorCode.sasl_authentication_failed, exc.message)
        if exchange.principal is not None:
            log.info(
                "kafka: %s from %s authenticated (%s)",
                exchange.principal,
                connection.host,
                exchange.name,
            )
            connection.authenticated_as(exchange.principal)
        return self._answer(response, KafkaErrorCode.none, None, answer.encode("utf-8"))

    @staticmethod
    def _answer(
        response: type[Any], error: KafkaErrorCode, message: str | None, auth: bytes = b""
    ) -> Any:
        return build(response, error_code=error, error_message=message, auth_bytes=auth)
