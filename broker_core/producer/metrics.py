"""Producer metrics: counters, the in-flight gauge, batch sizes and latency percentiles."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

LATENCY_WINDOW = 10_000  # most recent acknowledgements kept for the percentiles


class ProducerMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records_sent = 0  # rows acknowledged (duplicates included)
        self.batches_sent = 0  # batches acknowledged
        self.bytes_sent = 0
        self.send_attempts = 0  # batches put on the wire, retries included
        self.retries = 0  # resends after a retriable error
        self.out_of_order_resends = 0  # resends after OUT_OF_ORDER caused by an earlier batch
        self.duplicates = 0  # acks flagged duplicate, or DUPLICATE_SEQUENCE_NUMBER
        self.record_errors = 0  # rows whose batch failed for good
        self.batch_errors = 0
        self.epoch_bumps = 0
        self.in_flight = 0
        self._batch_rows: deque[int] = deque(maxlen=LATENCY_WINDOW)
        self._batch_bytes: deque[int] = deque(maxlen=LATENCY_WINDOW)
        self._latency_ms: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def sent(self) -> None:
        with self._lock:
            self.send_attempts += 1
            self.in_flight += 1

    def answered(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def acked(self, rows: int, size: int, latency_ms: float, duplicate: bool) -> None:
        with self._lock:
            self.records_sent += rows
            self.batches_sent += 1
            self.bytes_sent += size
            self.duplicates += int(duplicate)
            self._batch_rows.append(rows)
            self._batch_bytes.append(size)
            self._latency_ms.append(latency_ms)

    def retried(self, out_of_order: bool) -> None:
        with self._lock:
            if out_of_order:
                self.out_of_order_resends += 1
            else:
                self.retries += 1

    def failed(self, rows: int) -> None:
        with self._lock:
            self.record_errors += rows
            self.batch_errors += 1

    def bumped(self) -> None:
        with self._lock:
            self.epoch_bumps += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            latencies = np.asarray(self._latency_ms, dtype=np.float64)
            rows = np.asarray(self._batch_rows, dtype=np.float64)
            sizes = np.asarray(self._batch_bytes, dtype=np.float64)
            total = self.records_sent + self.record_errors
            doc: dict[str, Any] = {
                "records_sent": self.records_sent,
                "batches_sent": self.batches_sent,
                "bytes_sent": self.bytes_sent,
                "send_attempts": self.send_attempts,
                "retries": self.retries,
                "out_of_order_resends": self.out_of_order_resends,
                "duplicates": self.duplicates,
                "record_errors": self.record_errors,
                "batch_errors": self.batch_errors,
                "record_error_rate": self.record_errors / total if total else 0.0,
                "epoch_bumps": self.epoch_bumps,
                "in_flight": self.in_flight,
            }
        doc["batch_rows_avg"] = float(rows.mean()) if rows.size else 0.0
        doc["batch_bytes_avg"] = float(sizes.mean()) if sizes.size else 0.0
        doc["batch_bytes_max"] = float(sizes.max()) if sizes.size else 0.0
        for q in (50, 95, 99):
            value = float(np.percentile(latencies, q)) if latencies.size else 0.0
            doc[f"latency_ms_p{q}"] = value
        return doc
