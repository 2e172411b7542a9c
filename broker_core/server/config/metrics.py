"""The broker's Prometheus endpoint keys (declared here, beside ``config.py``, which lists
them with the others): whether the endpoint runs, and where (docs/operations.md).

Off by default, embedded or not: Kafka always exposes JMX, but an HTTP port that answers
anyone who asks is the operator's choice to open, as the Flight listener's TLS is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_core.config import ConfigKey, ConfigValue

METRICS_OFF = -1  # metrics.port's value for "no endpoint"

METRICS_KEYS = [
    ConfigKey(
        "metrics.port",
        int,
        METRICS_OFF,
        "Port of the Prometheus/OpenMetrics endpoint (GET /metrics: the same figures as "
        "idemlog metrics, docs/operations.md). -1: no endpoint (the default, embedded or "
        "not); 0: any free port, logged at start.",
        min=METRICS_OFF,
        max=65535,
    ),
    ConfigKey(
        "metrics.host",
        str,
        "127.0.0.1",
        "Address the Prometheus endpoint binds to when metrics.port is set (0.0.0.0: every "
        "interface, for a scraper on another host).",
    ),
]


@dataclass(frozen=True)
class MetricsEndpointConfig:
    """The parsed keys; ``enabled`` is False with ``metrics.port=-1``."""

    port: int
    host: str

    @property
    def enabled(self) -> bool:
        return self.port != METRICS_OFF

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, ConfigValue]) -> MetricsEndpointConfig:
        return cls(port=int(parsed["metrics.port"]), host=str(parsed["metrics.host"]))
