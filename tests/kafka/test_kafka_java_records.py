"""Kafka's record batch v2 as Kafka's own Java code writes and reads it: kafka-clients'
MemoryRecordsBuilder and withEndTransactionMarker (jars/kafka-broker, from Maven Central by
``make kafka-jars``) driven by KafkaRecordBatches.java, in one JVM for the whole module.

idemlog's bytes equal Kafka's for the same records and markers, Kafka's reader (with its
CRC check) reads every field idemlog wrote, and idemlog decodes what Kafka wrote."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.kafka_node import broker_jars
from broker_core.kafka.record_batch import HEADERS_TYPE, decode_batches, encode_batch
from broker_core.kafka.record_batch import encode_control_batch as marker
from broker_core.record.batch import ControlRecord, ControlType

pytestmark = pytest.mark.slow  # a JVM compiles and runs the program (~5 s)

PROGRAM = Path(__file__).with_name("KafkaRecordBatches.java")
Row = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]
ROWS: list[Row] = [
    (b"k0", b"v0", 1_700_000_000_000, []),
    (None, b"no key", 1_700_000_000_005, [("trace", b"abc"), ("empty", b"")]),
    (b"null value", None, 1_699_999_999_000, [("n", None)]),  # a negative timestamp delta
    (b"", b"", 1_700_000_000_001, []),
    (b"big", bytes(range(256)) * 80, 1_700_000_000_002, [("h" * 200, b"x" * 20_000)]),
    (None, None, 1_700_000_000_002, [("\u00e9t\u00e9", b"\x00\xff")]),
]
PRODUCER = {"producer_id": 42, "producer_epoch": 3}
MARKER_TIME = 1_700_000_000_100


def _hex(value: bytes | None) -> str:
    return "-" if value is None else value.hex()


def _headers(headers: list[tuple[str, bytes | None]]) -> str:
    return ",".join(f"{k.encode().hex()}:{_hex(v)}" for k, v in headers)


def _batch(rows: list[Row]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([r[0] for r in rows], pa.binary()),
            "value": pa.array([r[1] for r in rows], pa.binary()),
            "timestamp": pa.array([r[2] for r in rows], pa.timestamp("ms")),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r[3]] for r in rows], HEADERS_TYPE
            ),
        }
    )


@dataclass(frozen=True)
class Run:
    ours: dict[str, bytes]
    kafkas: dict[str, bytes]
    dumps: dict[str, list[str]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    work = tmp_path_factory.mktemp("kafka-java")
    ours = {
        "data": encode_batch(
            _batch(ROWS),
            base_offset=1000,
            partition_leader_epoch=7,
            base_sequence=17,
            is_transactional=True,
            **PRODUCER,
        ),
        "abort": marker(
            ControlType.ABORT,
            base_offset=1006,
            partition_leader_epoch=7,
            coordinator_epoch=11,
            timestamp=MARKER_TIME,
            **PRODUCER,
        ),
        "commit": marker(
            ControlType.COMMIT,
            base_offset=1007,
            partition_leader_epoch=8,
            coordinator_epoch=12,
            timestamp=MARKER_TIME,
            **PRODUCER,
        ),
    }
    for name, blob in ours.items():
        (work / f"ours-{name}.bin").write_bytes(blob)
    (work / "ours-all.bin").write_bytes(ours["data"] + ours["abort"] + ours["commit"])
    (work / "rows.tsv").write_text(
        "".join(f"{t}\t{_hex(k)}\t{_hex(v)}\t{_headers(h)}\n" for k, v, t, h in ROWS)
    )
    commands = [
        f"write {work / 'rows.tsv'} {work / 'kafka-data.bin'} 1000 7 42 3 17 1",
        f"marker {work / 'kafka-abort.bin'} 0 1006 7 42 3 11 {MARKER_TIME}",
        f"marker {work / 'kafka-commit.bin'} 1 1007 8 42 3 12 {MARKER_TIME}",
        f"dump {work / 'ours-all.bin'}",
    ]
    (work / "commands").write_text("\n".join(commands) + "\n")
    classpath = ":".join(str(p) for p in broker_jars())
    result = subprocess.run(
        ["java", "-cp", classpath, str(PROGRAM), str(work / "commands")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == f"dump {work / 'ours-all.bin'}", result.stdout[-2000:]
    return Run(
        ours=ours,
        kafkas={n: (work / f"kafka-{n}.bin").read_bytes() for n in ("data", "abort", "commit")},
        dumps={"all": lines[1:]},
    )


def test_idemlogs_bytes_equal_kafkas_for_the_same_records_and_markers(run: Run) -> None:
    assert run.ours["data"] == run.kafkas["data"]
    assert run.ours["abort"] == run.kafkas["abort"]
    assert run.ours["commit"] == run.kafkas["commit"]


def test_kafka_reads_every_field_idemlog_wrote(run: Run) -> None:
    max_timestamp = max(r[2] for r in ROWS)
    expected = [
        f"batch base=1000 last=1005 epoch=7 magic=2 compression=none tstype=CreateTime "
        f"transactional=true control=false pid=42 pepoch=3 seq=17 max={max_timestamp} count=6",
        *(
            f"record {1000 + i} {t} {_hex(k)} {_hex(v)} {_headers(h)}"
            for i, (k, v, t, h) in enumerate(ROWS)
        ),
        "batch base=1006 last=1006 epoch=7 magic=2 compression=none tstype=CreateTime "
        f"transactional=true control=true pid=42 pepoch=3 seq=-1 max={MARKER_TIME} count=1",
        f"record 1006 {MARKER_TIME} 00000000 00000000000b ",
        "batch base=1007 last=1007 epoch=8 magic=2 compression=none tstype=CreateTime "
        f"transactional=true control=true pid=42 pepoch=3 seq=-1 max={MARKER_TIME} count=1",
        f"record 1007 {MARKER_TIME} 00000001 00000000000c ",
    ]
    assert run.dumps["all"] == expected


def test_idemlog_decodes_what_kafka_wrote(run: Run) -> None:
    data, abort, commit = (decode_batches(run.kafkas[n])[0] for n in ("data", "abort", "commit"))
    columns = data.rows.to_pydict()
    millis = data.rows.column("timestamp").cast(pa.int64()).to_pylist()
    assert [
        (k, v, t, [(h["key"], h["value"]) for h in hs])
        for k, v, t, hs in zip(
            columns["key"], columns["value"], millis, columns["headers"], strict=True
        )
    ] == ROWS
    assert (data.base_offset, data.partition_leader_epoch, data.base_sequence) == (1000, 7, 17)
    assert (data.producer_id, data.producer_epoch, data.is_transactional) == (42, 3, True)
    assert abort.control == ControlRecord(ControlType.ABORT, 11)
    assert commit.control == ControlRecord(ControlType.COMMIT, 12)
    assert (commit.base_offset, commit.partition_leader_epoch, commit.base_sequence) == (
        1007,
        8,
        -1,
    )
