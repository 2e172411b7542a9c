"""Transactional ids and sink records expire (docs/design.md §5 "Expiry", docs/failure-model.md),
against a real LogStore and ``__transaction_state``: what expires, what never does, what a
restart sees, and what a producer holding an expired id is told.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker_core.errors import (
    IdemlogError,
    InvalidConfigError,
    InvalidProducerIdMappingError,
    StorageError,
)
from broker_core.protocol.txn_inputs import batch_job_sink_id
from broker_core.protocol.wire import SinkTxnStatus
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.txn.coordinator.expiry import ExpiryPolicy
from broker_core.txn.state_topic.records import SinkCommitState, TransactionState
from broker_core.txn.state_topic.schema import read_rows
from broker_core.txn.state_topic.store import TXN_STATE_TOPIC, LogTxnStateStore
from testkit.state_store import local_state_store
from tests.store.test_txn_coordinator import (
    P0,
    P1,
    Broker,
    FailingPuts,
    FlakyMarkers,
    Producer,
    attempt,
    start_broker,
)

S = TransactionState
EXPIRY_MS = 60_000
POLICY = ExpiryPolicy(id_expiration_ms=EXPIRY_MS)


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return start_broker(tmp_path, expiry=POLICY)


def ids(broker: Broker) -> dict[str, str]:
    """transactional id -> state, as ``idemlog transactions list --all`` shows them."""
    rows = broker.coordinator.list_transactions(every_id=True)
    return {r["transactional_id"]: r["state"] for r in rows}


def restart(broker: Broker) -> Broker:
    broker.store.close()
    return start_broker(broker.path, clock=broker.clock, expiry=POLICY)


def test_an_idle_id_expires_and_a_restart_does_not_bring_it_back(broker: Broker) -> None:
    c = broker.coordinator
    p = Producer(broker, "app-1").init()
    p.send(P0, range(5))
    p.commit()
    keep = Producer(broker, "app-2").init()
    broker.clock.advance(EXPIRY_MS)
    keep.send(P1, range(3))
    keep.commit()  # app-2 was used since: it stays
    assert c.expire_idle().transactional_ids == []  # app-1 is idle exactly the limit
    broker.clock.advance(1)
    assert c.expire_idle().transactional_ids == ["app-1"]
    assert ids(broker) == {"app-2": "COMPLETE_COMMIT"}
    described = c.describe()
    assert described["transactional_ids"] == 1 and described["transactional_ids_expired"] == 1
    # Kafka's way: DEAD durably, then a tombstone (a row with a null value).
    last = [row for _, row in read_rows(broker.store.partition(TXN_STATE_TOPIC, 0))][-2:]
    assert [r[:2] for r in last] == [("transaction", "app-1")] * 2
    assert b'"state":"DEAD"' in (last[0][2] or b"") and last[1][2] is None

    b = restart(broker)
    assert ids(b) == {"app-2": "COMPLETE_COMMIT"}
    assert "app-1" not in local_state_store(b.store).load()[0]
    # The late producer of app-1: a clear, non-retriable error naming the setting.
    with pytest.raises(InvalidProducerIdMappingError) as late:
        b.coordinator.add_partitions("app-1", p.producer_id, p.epoch, [P0])
    assert "transactional.id.expiration.ms=60000" in late.value.message
    assert "app-1" in late.value.message and not late.value.retriable
    # Initialising again works, with a new producer id (never the old one: epochs are
    # per producer id, so the old holder's appends can never pass as the new one's).
    again = Producer(b, "app-1").init()
    assert again.producer_id != p.producer_id and again.epoch == 0
    again.send(P0, range(5, 8))
    again.commit()
    assert b.committed(P0) == list(range(8))


def test_open_and_prepared_transactions_never_expire(tmp_path: Path) -> None:
    flaky: list[FlakyMarkers] = []

    def markers(store: object) -> FlakyMarkers:
        flaky.append(FlakyMarkers(store, 0))  # type: ignore[arg-type]
        return flaky[0]

    broker = start_broker(tmp_path, markers, expiry=POLICY, marker_retry_deadline_s=0.01)
    c = broker.coordinator
    ongoing = Producer(broker, "open").init()
    ongoing.send(P0, range(3))
    prepared = Producer(broker, "prepared").init()
    prepared.send(P1, range(3))
    flaky[0].failures_left = 10**6
    with pytest.raises(IdemlogError):
        prepared.commit()
    assert broker.stored("prepared").state is S.PREPARE_COMMIT
    broker.clock.advance(10 * EXPIRY_MS)
    # The timeout pass would abort "open"; the expiry pass alone must leave both be.
    assert c.expire_idle().transactional_ids == []
    assert ids(broker) == {"open": "ONGOING", "prepared": "PREPARE_COMMIT"}
    flaky[0].failures_left = 0
    prepared.commit()  # the retry finishes the decided commit
    assert broker.committed(P1) == [0, 1, 2]


def test_ids_named_by_a_pending_sink_commit_never_expire(tmp_path: Path) -> None:
    """A sink record left PREPARE (the store failed after it) names transactions the
    commit must still finish: neither they nor the record expire, however old."""
    failing: list[FailingPuts] = []

    def wrap(state: LogTxnStateStore) -> FailingPuts:
        failing.append(FailingPuts(state))
        return failing[0]

    broker = start_broker(tmp_path, wrap_state=wrap, expiry=POLICY)
    # Two tasks of batch 1 that had no rows: prepared, EMPTY (a state that may expire).
    tasks = [Producer(broker, f"s/{i}").init_sink(1, "run-1") for i in range(2)]
    for task in tasks:
        task.prepare()
    failing[0].arm(succeed=1)  # the PREPARE record lands, the next put fails
    with pytest.raises(StorageError):
        broker.coordinator.commit_sink_batch("s", 1, [t.txn for t in tasks], "run-1")
    assert broker.state.load()[1]["s"].state == SinkCommitState.PREPARE
    assert ids(broker) == {"s/0": "EMPTY", "s/1": "EMPTY"}
    broker.clock.advance(10 * EXPIRY_MS)
    result = broker.coordinator.expire_idle()
    assert result.transactional_ids == [] and result.sinks == []
    assert ids(broker) == {"s/0": "EMPTY", "s/1": "EMPTY"}
    broker.coordinator.abort_timed_out()  # finishes the decided commit instead
    assert broker.state.load()[1]["s"].state == SinkCommitState.COMPLETE
    assert broker.coordinator.last_committed_batch("s") == 1


def test_a_finished_jobs_ids_and_sink_record_expire_together(broker: Broker) -> None:
    c = broker.coordinator
    run = "0123456789abcdef0123456789abcdef"
    job = batch_job_sink_id(run)
    txns = attempt(broker, job, 0, 0, run)
    assert c.commit_sink_batch(job, 0, txns, run) is True
    assert c.commit_sink_batch(job, 0, txns, run) is False  # the driver's retry: no-op
    assert broker.state.load()[1][job].batch_job
    broker.clock.advance(EXPIRY_MS + 1)
    result = c.expire_idle()
    assert result.transactional_ids == [f"{job}/0", f"{job}/1"] and result.sinks == [job]
    assert c.describe()["sinks"] == 0 and c.describe()["sinks_expired"] == 1
    assert c.last_committed_batch(job) is None
    b = restart(broker)
    assert b.state.load() == ({}, {})
    assert b.committed(P0) == list(range(5)) and b.committed(P1) == list(range(5, 10))


def test_a_running_stream_keeps_its_ids_and_a_stopped_one_keeps_its_record(
    broker: Broker,
) -> None:
    """A query committing a batch every half expiry: its ids never expire. Stopped, its
    ids go but its record stays (sink.stream.expiration.ms=-1), so a restart that
    re-runs its last batch finds it committed and writes nothing."""
    c = broker.coordinator
    query = "6f1c2d3e-aaaa-bbbb-cccc-0123456789ab"
    for batch in range(4):
        txns = attempt(broker, query, batch * 10, batch, "run-1")
        assert c.commit_sink_batch(query, batch, txns, "run-1") is True
        broker.clock.advance(EXPIRY_MS // 2 + 1)
        assert c.expire_idle().transactional_ids == []
    assert not broker.state.load()[1][query].batch_job
    broker.clock.advance(EXPIRY_MS)
    result = c.expire_idle()
    assert result.transactional_ids == [f"{query}/0", f"{query}/1"] and result.sinks == []
    b = restart(broker)
    b.clock.advance(100 * EXPIRY_MS)
    assert b.coordinator.expire_idle().sinks == []
    rerun = Producer(b, f"{query}/0").init_sink(3, "run-2")
    assert rerun.status is SinkTxnStatus.COMMITTED
    fresh = Producer(b, f"{query}/0").init_sink(4, "run-2")
    assert fresh.status is SinkTxnStatus.NEW


def test_a_streams_record_expires_after_sink_stream_expiration(tmp_path: Path) -> None:
    policy = ExpiryPolicy(id_expiration_ms=EXPIRY_MS, stream_sink_expiration_ms=5 * EXPIRY_MS)
    broker = start_broker(tmp_path, expiry=policy)
    txns = attempt(broker, "q", 0, 0, "run-1")
    broker.coordinator.commit_sink_batch("q", 0, txns, "run-1")
    broker.clock.advance(EXPIRY_MS + 1)
    assert broker.coordinator.expire_idle().sinks == []  # ids gone, the record stays
    broker.clock.advance(4 * EXPIRY_MS)
    assert broker.coordinator.expire_idle().sinks == ["q"]


def test_an_attempt_alive_by_heartbeats_does_not_expire(broker: Broker) -> None:
    """A task that took its id and writes for longer than the expiry (a long batch)
    beats for its run: its id stays, so its later requests are not refused."""
    c = broker.coordinator
    task = Producer(broker, "q/0").init_sink(0, "run-1")
    for _ in range(3):
        broker.clock.advance(EXPIRY_MS // 2)
        c.sink_heartbeat("q", "run-1")
        assert c.expire_idle().transactional_ids == []
    task.send(P0, range(3))
    task.prepare()
    assert c.commit_sink_batch("q", 0, [task.txn], "run-1") is True


def test_a_crash_between_dead_and_the_tombstone_is_finished_later(tmp_path: Path) -> None:
    failing: list[FailingPuts] = []

    def wrap(state: LogTxnStateStore) -> FailingPuts:
        failing.append(FailingPuts(state))
        return failing[-1]

    broker = start_broker(tmp_path, wrap_state=wrap, expiry=POLICY)
    Producer(broker, "gone").init()
    Producer(broker, "back").init()
    broker.clock.advance(EXPIRY_MS + 1)
    failing[0].arm(succeed=1)  # "back": DEAD lands, its tombstone fails
    assert broker.coordinator.expire_idle().transactional_ids == ["gone"]
    dead = broker.state.load()[0]["back"]
    assert dead.state is S.DEAD
    broker.crash()
    b = start_broker(tmp_path, clock=broker.clock, expiry=POLICY)
    assert ids(b) == {}  # a DEAD id is no id
    assert b.coordinator.describe()["transactional_ids_dead"] == 1
    again = Producer(b, "back").init()  # a new init replaces the DEAD record
    assert ids(b) == {"back": "EMPTY"} and b.coordinator.describe()["transactional_ids_dead"] == 0
    assert again.producer_id != dead.producer_id
    b.clock.advance(EXPIRY_MS + 1)
    assert b.coordinator.expire_idle().transactional_ids == ["back"]
    assert b.state.load()[0] == {}


def test_a_task_whose_id_expired_mid_run_fails_and_its_retry_writes_once(
    broker: Broker,
) -> None:
    """A task took its id, then stalled past the expiry without writing or beating (its
    run silent): the id expires. Its first request is refused (the task fails); Spark's
    retry of the task initialises the id again and writes the rows once."""
    c = broker.coordinator
    stalled = Producer(broker, "q/0").init_sink(0, "run-1")
    broker.clock.advance(EXPIRY_MS + 1)
    assert c.expire_idle().transactional_ids == ["q/0"]
    with pytest.raises(InvalidProducerIdMappingError, match=r"transactional\.id\.expiration\.ms"):
        stalled.send(P0, range(5))
    assert broker.uncommitted(P0) == []  # refused before any row was appended
    retry = Producer(broker, "q/0").init_sink(0, "run-1")
    assert retry.status is SinkTxnStatus.NEW and retry.producer_id != stalled.producer_id
    retry.send(P0, range(5))
    retry.prepare()
    assert c.commit_sink_batch("q", 0, [retry.txn], "run-1") is True
    assert broker.committed(P0) == list(range(5)) and broker.stable(P0)


def test_bad_expiry_settings_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"sink\.stream\.expiration\.ms"):
        BrokerConfig.from_mapping({"sink.stream.expiration.ms": "-2"})
    with pytest.raises(InvalidConfigError, match=r"transactional\.id\.expiration\.ms"):
        BrokerConfig.from_mapping({"transactional.id.expiration.ms": "0"})
    config = BrokerConfig.from_mapping(
        {"transactional.id.expiration.ms": "5000", "sink.stream.expiration.ms": "9000"}
    )
    assert (config.transactional_id_expiration_ms, config.sink_stream_expiration_ms) == (
        5000,
        9000,
    )
    assert config.expired_transaction_cleanup_interval_ms == 3_600_000  # Kafka's default
    with pytest.raises(InvalidConfigError, match=r"transactional\.id\.expiration\.ms=0"):
        start_broker(tmp_path, expiry=ExpiryPolicy(id_expiration_ms=0))


def test_expired_jobs_are_compacted_out_of_the_state_topic(tmp_path: Path) -> None:
    """__transaction_state is compacted (docs/storage.md): once finished jobs' ids and sink
    records expired, cleaning leaves the live keys only, and a restart loads the same."""
    b = start_broker(tmp_path, expiry=POLICY, state_segment_bytes=16 * 1024)
    stream = "stream-q"
    for batch in range(3):
        txns = attempt(b, stream, batch * 10, batch, "run-1")
        assert b.coordinator.commit_sink_batch(stream, batch, txns, "run-1")
    b.clock.advance(EXPIRY_MS + 1)
    for n in range(40):
        run = f"{n:032x}"
        job = batch_job_sink_id(run)
        assert b.coordinator.commit_sink_batch(job, 0, attempt(b, job, 100 + n * 10, 0, run), run)
    b.clock.advance(EXPIRY_MS + 1)
    # The stream's record stays (streams never expire by default); its ids are idle too.
    txns = attempt(b, stream, 30, 3, "run-1")
    assert b.coordinator.commit_sink_batch(stream, 3, txns, "run-1")
    expired = b.coordinator.expire_idle()
    assert len(expired.sinks) == 40 and len(expired.transactional_ids) == 80
    live = b.state.load()
    state = b.store.partition(TXN_STATE_TOPIC, 0)

    def size() -> int:
        return sum(seg.size for seg in state.segments)

    before = size()
    assert len(state.segments) > 3  # rolled: closed segments to clean
    # Every row in a closed segment, so the first pass reaches every tombstone (how many
    # the active segment would hold depends on how the commits' rows filled them).
    state.roll()
    first = state.clean(force=True)
    assert first is not None and size() < before
    # Tombstones go delete.retention.ms (one day) after the cleaner first reached them.
    state.roll()
    # The partition's own clock stamps its batches (wall time), not the coordinator's.
    second = state.clean(now_ms=int(time.time() * 1000) + 86_400_001, force=True)
    assert second is not None
    after = size()
    assert after * 4 < before, (before, after)
    assert b.state.load() == live
    rows = [row for _, row in read_rows(state)]
    assert not any(key.startswith("batch-") for _, key, _ in rows[:-10])
    again = restart(b)
    assert again.state.load() == live
    assert again.committed(P0)[-5:] == b.committed(P0)[-5:]
