"""spark_sink/metrics_recorder.py (and ``python -m jobs.metrics_recorder``) against a real
broker process: what the validator counted ends up in a Delta table that pandas reads, poll
after poll, and a broker that goes away is a skipped poll, not a dead recorder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from deltalake import DeltaTable

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import DuplicateSequenceError, IdemlogError
from jobs.metrics_recorder import main
from spark_sink import progress_spool
from spark_sink.metrics_recorder import SCHEMA, MetricsRecorder, read_metrics
from tests.broker.helpers import rows
from tests.harness.broker import BrokerFactory
from tests.sink_figures import figures

IDEMLOG = [sys.executable, "-m", "broker_core.cli.main"]


def produce_with_duplicates(client: BrokerClient, topic: str) -> None:
    """7 batches into partition 1, then 2 in-window duplicates and 1 beyond the window."""
    pid, epoch = client.init_producer_id()
    with client.produce_stream(topic, 1) as stream:

        def send(seq: int) -> None:
            r = stream.send(
                rows(5, start=seq), producer_id=pid, producer_epoch=epoch, base_sequence=seq
            ).result(10)
            if r.error() is not None:
                raise r.error()  # type: ignore[misc]

        for i in range(7):
            send(5 * i)
        send(30)
        send(10)
        with pytest.raises(DuplicateSequenceError):
            send(0)


def latest(frame: pd.DataFrame, scope: str, metric: str, **subject: object) -> float:
    rows_ = frame[(frame.scope == scope) & (frame.metric == metric)]
    for column, value in subject.items():
        rows_ = rows_[rows_[column] == value]
    return float(rows_.sort_values("recorded_at").value.iloc[-1])


def test_counters_per_partition_and_producer_land_in_a_delta_table(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = broker_factory()
    table = tmp_path / "metrics"
    with BrokerClient(broker.address) as client:
        client.create_topic("dups", 2)
        recorder = MetricsRecorder(table, broker.address, interval_s=3600)
        assert recorder.record_once() > 0  # before: all zero
        produce_with_duplicates(client, "dups")
        recorder.record_once()
    frame = read_metrics(table)
    assert list(frame.columns) == SCHEMA.names
    assert frame.recorded_at.nunique() == 2
    assert latest(frame, "total", "duplicates_in_window") == 2
    assert latest(frame, "total", "duplicates_beyond_window") == 1
    assert latest(frame, "partition", "duplicates_in_window", topic="dups", partition=1) == 2
    assert latest(frame, "partition", "duplicates_in_window", topic="dups", partition=0) == 0
    assert latest(frame, "partition", "log_end_offset", topic="dups", partition=1) == 35
    producers = frame[(frame.scope == "producer") & (frame.metric == "duplicates_in_window")]
    assert producers.value.max() == 2 and producers.producer_id.notna().all()
    assert latest(frame, "transactions", "transactions_committed") == 0
    first = frame.recorded_at.min()
    assert latest(frame[frame.recorded_at == first], "total", "duplicates_in_window") == 0


def test_the_thread_keeps_polling_across_a_broker_restart(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = broker_factory()
    table = tmp_path / "metrics"
    recorder = MetricsRecorder(table, broker.address, interval_s=0.05)
    polls = threading.Semaphore(0)
    record_once = recorder.record_once

    def counted() -> int:
        try:
            return record_once()
        finally:
            polls.release()

    recorder.record_once = counted  # type: ignore[method-assign]
    recorder.start()
    try:
        broker.kill(signal.SIGKILL)
        for _ in range(3):  # polls against a dead broker: failures, counted
            assert polls.acquire(timeout=30)
        assert recorder.failed_polls >= 2
        broker.restart()  # same port
        ok_before = recorder.polls
        deadline = time.monotonic() + 60  # gRPC may back off reconnecting for a while
        while recorder.polls == ok_before:
            assert polls.acquire(timeout=30) and time.monotonic() < deadline
    finally:
        recorder.stop()
    assert read_metrics(table).recorded_at.nunique() == recorder.polls


def test_sink_batches_from_the_progress_spool_are_recorded_once(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = broker_factory()
    spool = tmp_path / "progress"
    recorder = MetricsRecorder(tmp_path / "m", broker.address, interval_s=3600, progress_dir=spool)
    batch = figures(7, query_id="q1", commit_ms=3.25, committed_at_ms=recorder._since_ms + 1)
    progress_spool.record(batch, spool)
    recorder.record_once()
    recorder.record_once()
    frame = read_metrics(tmp_path / "m")
    sink = frame[frame.scope == "sink_batch"]
    assert set(sink.query_id) == {"q1"} and set(sink.batch_id) == {7}
    assert sink.metric.value_counts().max() == 1  # the second poll did not repeat it
    assert dict(zip(sink.metric, sink.value, strict=True))["commit_ms"] == 3.25
    assert dict(zip(sink.metric, sink.value, strict=True))["committed"] == 1.0


def test_compaction_keeps_every_row_in_fewer_files(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = broker_factory()
    table = tmp_path / "m"
    recorder = MetricsRecorder(table, broker.address, interval_s=3600, compact_every=4)
    for _ in range(3):
        recorder.record_once()
    before = read_metrics(table).sort_values(["recorded_at", "scope", "metric"])
    assert len(DeltaTable(str(table)).file_uris()) == 3 and recorder.compactions == 0
    recorder.record_once()  # the 4th poll compacts
    assert recorder.compactions == 1
    assert len(DeltaTable(str(table)).file_uris()) == 1
    after = read_metrics(table).sort_values(["recorded_at", "scope", "metric"])
    assert len(after) == recorder.rows_written
    pd.testing.assert_frame_equal(
        after[after.recorded_at.isin(before.recorded_at)].reset_index(drop=True),
        before.reset_index(drop=True),
    )


def test_a_wrong_broker_fails_at_start_and_the_cli_names_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = MetricsRecorder(tmp_path / "m", "127.0.0.1:1", interval_s=1)
    with pytest.raises(IdemlogError):
        recorder.start()
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        MetricsRecorder(tmp_path / "m", "127.0.0.1:1", interval_s=0)
    with pytest.raises(ValueError, match="compact_every must be >= 1 poll, got 0"):
        MetricsRecorder(tmp_path / "m", "127.0.0.1:1", compact_every=0)
    with pytest.raises(SystemExit):
        main(["--table", str(tmp_path / "m"), "--interval", "-1"])
    assert "--interval must be > 0, got -1.0" in capsys.readouterr().err


def test_the_cli_records_once(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker = broker_factory()
    assert main(["--table", str(tmp_path / "m"), "--brokers", broker.address, "--once"]) == 0
    frame = read_metrics(tmp_path / "m")
    assert set(frame.scope) >= {"total", "transactions"}
    assert json.loads(json.dumps(frame.day.iloc[0]))  # a YYYY-MM-DD string


def test_idemlog_metrics_record_once_appends_a_poll(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """The installed spelling, ``idemlog metrics record``, in a process of its own."""
    broker = broker_factory()
    table = tmp_path / "m"
    args = ["--table", str(table), "--brokers", broker.address, "--once"]
    done = subprocess.run(
        [*IDEMLOG, "metrics", "record", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("recorded polls=1 failed=0 rows="), done.stdout
    assert set(read_metrics(table).scope) >= {"total", "transactions"}
