"""Broker service tests: real broker processes (tests/harness/broker.py) over Arrow Flight."""
