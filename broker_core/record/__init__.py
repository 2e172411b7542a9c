"""The record batch: its byte layout, written atop Arrow IPC, and its checksum.

The bottom layer: the log stores these bytes, the client and producer build them, the
broker validates them. Imports nothing of broker_core but the base modules."""
