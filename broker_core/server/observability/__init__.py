"""What a broker tells about itself: the bounded metrics document of the METRICS action
and the Prometheus endpoint (docs/operations.md)."""
