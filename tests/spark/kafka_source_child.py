"""A Spark driver reading one topic three ways, run as its own process by
``tests/spark/test_kafka_source.py``: Spark's own Kafka source from ``jars/spark-kafka``
must be on the driver's classpath when its JVM starts, which a pytest process that
already ran another Spark session (a JVM without them) cannot give.

One JSON argument: ``{"bootstrap": Kafka listener host:port, "brokers": the Flight
address, "topic", "since_ms": a timestamp, "checkpoint": a directory, "out": a JSON
file}``. Writes to ``out`` ``{"kafka_batch": rows, "kafka_since": rows, "kafka_stream":
rows, "idemlog": rows}``, each row ``[partition, offset, key, value, timestamp ms]`` (key
and value as latin-1 text), read as:

* ``spark.read.format("kafka")``, earliest to latest, ``kafka.isolation.level`` read_committed;
* the same from ``startingTimestamp`` ``since_ms`` (ListOffsets by timestamp);
* ``spark.readStream.format("kafka")`` from earliest, ``Trigger.AvailableNow``, into a
  memory table;
* ``spark.read.format("idemlog")`` with ``includeMetadata`` (its ``_partition`` and
  ``_offset``), read_committed (its default).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SPARK_KAFKA_JARS = REPO / "jars" / "spark-kafka"


def rows_of(df: Any, partition: str, offset: str) -> list[list[Any]]:
    picked = df.selectExpr(
        f"cast({partition} as int) AS p",
        f"cast({offset} as long) AS o",
        "key",
        "value",
        "cast(unix_millis(timestamp) as long) AS ts",
    ).collect()
    return sorted(
        [
            r.p,
            r.o,
            None if r.key is None else bytes(r.key).decode("latin-1"),
            None if r.value is None else bytes(r.value).decode("latin-1"),
            r.ts,
        ]
        for r in picked
    )


def timed(phase: str, started: float) -> float:
    """Says on stderr how long ``phase`` took (the test's figures); the time now."""
    now = time.monotonic()
    print(f"TIMED {phase} {now - started:.1f}s", file=sys.stderr, flush=True)
    return now


def main(spec: dict[str, Any]) -> None:
    from spark_sink import local_session

    started = time.monotonic()
    jars = sorted(str(p) for p in SPARK_KAFKA_JARS.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise SystemExit(f"Spark's Kafka source is not in {SPARK_KAFKA_JARS}: make kafka-jars")
    spark = local_session(
        "kafka-source", cores=2, max_failures=1, conf={"spark.jars": ",".join(jars)}, quiet=True
    )
    started = timed("session", started)
    kafka = {
        "kafka.bootstrap.servers": spec["bootstrap"],
        "kafka.isolation.level": "read_committed",
        "subscribe": spec["topic"],
    }
    batch = (
        spark.read.format("kafka")
        .options(**kafka)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    kafka_batch = rows_of(batch, "partition", "offset")
    started = timed("kafka_batch", started)
    # From a time on: Spark asks ListOffsets by timestamp for each partition's start.
    since = (
        spark.read.format("kafka")
        .options(**kafka)
        .option("startingTimestamp", str(spec["since_ms"]))
        .option("endingOffsets", "latest")
        .load()
    )
    kafka_since = rows_of(since, "partition", "offset")
    started = timed("kafka_since", started)

    stream = (
        spark.readStream.format("kafka").options(**kafka).option("startingOffsets", "earliest")
    ).load()
    query = (
        stream.writeStream.format("memory")
        .queryName("kafka_stream")
        .option("checkpointLocation", spec["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the stream failed: {query.exception()}")
    kafka_stream = rows_of(spark.table("kafka_stream"), "partition", "offset")
    started = timed("kafka_stream", started)

    own = (
        spark.read.format("idemlog")
        .option("brokers", spec["brokers"])
        .option("topic", spec["topic"])
        .option("includeMetadata", "true")
        .load()
    )
    idemlog = rows_of(own, "_partition", "_offset")
    timed("idemlog", started)
    Path(spec["out"]).write_text(
        json.dumps(
            {
                "kafka_batch": kafka_batch,
                "kafka_since": kafka_since,
                "kafka_stream": kafka_stream,
                "idemlog": idemlog,
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
