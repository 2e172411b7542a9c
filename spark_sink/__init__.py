"""idemlog on the Spark side: ``format("idemlog")`` (the producer client, which needs no
Spark, is ``broker_core.producer``).

    from spark_sink import local_session
    spark = local_session()  # or register(spark) on a session of your own
    df = spark.readStream.format("rate").load()
    query = (df.writeStream.format("idemlog").option("topic", "payments")
             .option("checkpointLocation", "/tmp/payments-checkpoint").start())

``local_session()`` builds a local SparkSession with it registered. What the sink did
for a micro-batch: ``progress(query)`` (the last batch), ``progress_history(query)``, or a
``SinkProgressListener`` added with ``spark.streams.addListener`` (docs/spark.md).

The names below load pyspark on first use, not on ``import spark_sink``: its options and
errors import without pyspark installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_core.lazy import lazy_names

if TYPE_CHECKING:
    from spark_sink.datasource import FORMAT, IdemlogDataSource, register
    from spark_sink.progress_spool import SinkProgress
    from spark_sink.query_progress import SinkProgressListener, progress, progress_history
    from spark_sink.session import local_session

__all__ = [
    "FORMAT",
    "IdemlogDataSource",
    "SinkProgress",
    "SinkProgressListener",
    "local_session",
    "progress",
    "progress_history",
    "register",
]

_HOME = {
    "FORMAT": "spark_sink.datasource",
    "IdemlogDataSource": "spark_sink.datasource",
    "register": "spark_sink.datasource",
    "local_session": "spark_sink.session",
    "SinkProgress": "spark_sink.progress_spool",
    "SinkProgressListener": "spark_sink.query_progress",
    "progress": "spark_sink.query_progress",
    "progress_history": "spark_sink.query_progress",
}


__getattr__ = lazy_names(__name__, _HOME)
