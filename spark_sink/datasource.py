"""``format("idemlog")``: the Spark 4.2 Python DataSource tying options, topics, the
writers (``spark_sink.writer``) and the readers (``spark_sink.reader``) together.

Everything is checked here, on the driver, while Spark plans the query: options, the
topic and its schema, the key column. A bad write therefore fails before any task has
written a row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from broker_core.client.broker_client import NoBrokerReachableError
from broker_core.errors import NetworkError

from . import topics
from .connections import sink_client
from .driver_retry import PLAN_REQUEST_TIMEOUT_S, retrying
from .errors import UnsupportedWriteError, one_line_errors
from .hooks import SinkHooks, load_hooks
from .options import IdemlogOptions, Scope, parse_options
from .schema import arrow_schema_for, check_key, spark_schema_for
from .writer import IdemlogBatchWriter, IdemlogStreamWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "idemlog"


@contextmanager
def _naming_brokers(options: IdemlogOptions) -> Iterator[None]:
    """A cluster that does not answer when a read is planned is the option's fault until
    shown otherwise: the error names ``brokers`` and its value first. (A write's plan is
    retried first, ``spark_sink.driver_retry``, whose final error names it too.)"""
    try:
        yield
    except NoBrokerReachableError as exc:
        if not options.brokers:
            raise
        # NetworkError, as its cause: the type crosses no Spark boundary, the line does.
        raise NetworkError(f"option 'brokers'={options.brokers!r}: {exc.message}") from exc


class IdemlogDataSource(DataSource):
    """``format("idemlog")``: reads and writes one topic of an idemlog cluster (the
    ``brokers`` option) or of the embedded broker (the ``path`` option, its default).

    Writes are exactly once: each Spark task's rows are one transaction, committed with
    the batch by the driver (``df.write``: the whole job or nothing; ``writeStream``: each
    micro-batch once, across task retries and query restarts from the checkpoint).
    Reads return committed rows only (the default isolation read_committed), each once,
    in offset order per partition. Every method below runs on the driver while Spark
    plans the query, so a bad option, a missing topic or a schema mismatch fails before
    any task runs: with InvalidConfigError naming the option,
    UnknownTopicOrPartitionError, SchemaMismatchError, or UnsupportedWriteError for a
    mode other than append.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``idemlog``."""
        return FORMAT

    # -- reading ---------------------------------------------------------------------------
    def _read_side(self) -> tuple[IdemlogOptions, topics.TopicInfo]:
        options = parse_options(self.options, Scope.READ)
        with (
            _naming_brokers(options),
            sink_client(options.bootstrap(), options.tls, sasl=options.sasl) as client,
        ):
            return options, topics.require(client, options)

    @one_line_errors
    def schema(self) -> StructType:
        """The topic's schema as Spark's (plus the metadata columns with
        ``includeMetadata``). Raises UnknownTopicOrPartitionError if the topic does not
        exist, SchemaMismatchError if it has no schema."""
        options, info = self._read_side()
        assert info.schema is not None
        return spark_schema_for(info.schema, options.include_metadata)

    @one_line_errors
    def reader(self, schema: StructType) -> DataSourceReader:
        """``spark.read``: the committed rows of the topic as of planning."""
        from .reader import IdemlogBatchReader

        return IdemlogBatchReader(*self._read_side())

    @one_line_errors
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream``: committed rows as they arrive, each once per query."""
        from .reader import IdemlogStreamReader

        return IdemlogStreamReader(*self._read_side())

    # -- writing ---------------------------------------------------------------------------
    def _write_side(self, schema: StructType) -> tuple[IdemlogOptions, pa.Schema, str, SinkHooks]:
        """The options, the Arrow schema, the topic's id, pinned here, on the driver (the
        tasks send it, so a topic recreated between this plan and the write refuses them
        before any row is written), and the write's hooks (the option ``hooks``)."""
        options = parse_options(self.options, Scope.WRITE)
        hooks = load_hooks(options.hooks)
        with hooks.span("plan_writer"):
            arrow = arrow_schema_for(schema)
            check_key(arrow, options.key)
            # Spark plans a stream's writer anew for each micro-batch (and for an abort): a
            # broker restarting then is ridden out, not the query's end. Brokers that never
            # answer are named (option 'brokers') once the retries are spent.
            with hooks.span("topic_check"):
                info = retrying(
                    options,
                    f"plan of the write to topic {options.topic!r}",
                    lambda client: topics.ensure_for_write(client, options, arrow),
                    request_timeout_s=PLAN_REQUEST_TIMEOUT_S,
                )
            return options, arrow, info.topic_id, hooks

    @one_line_errors
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write``: all of the job's rows or none. Creates the topic with the
        DataFrame's schema if it is missing; raises SchemaMismatchError for a topic of
        another schema, UnsupportedWriteError for mode overwrite."""
        if overwrite:
            raise UnsupportedWriteError(
                "mode 'overwrite' is not supported: an idemlog topic is an append-only log "
                "(use mode 'append', or write to a new topic)"
            )
        return IdemlogBatchWriter(*self._write_side(schema))

    @one_line_errors
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream``: each micro-batch exactly once. Creates the topic as
        :meth:`writer` does; raises UnsupportedWriteError for output mode complete."""
        if overwrite:
            raise UnsupportedWriteError(
                "output mode 'complete' is not supported: an idemlog topic is an append-only "
                "log (use outputMode 'append' or 'update')"
            )
        return IdemlogStreamWriter(*self._write_side(schema))


def register(spark: SparkSession, *, patch_progress: bool = False) -> None:
    """Make ``format("idemlog")`` known to ``spark``; a repeat is harmless.

    By default nothing else changes, in this session or in the process: no listener is
    added and no pyspark class is touched. The sink's per-batch figures are read with
    ``spark_sink.progress(query)`` or a ``spark_sink.SinkProgressListener`` the caller adds
    (docs/spark.md, "The sink's figures").

    Args:
        spark: The session (local or on a cluster) to register the data source with.
        patch_progress: Opt in to the enriched ``lastProgress``/``recentProgress``
            (``progress["sink"]["metrics"]`` filled, the sources' offsets as JSON), which
            replaces those two properties of ``StreamingQuery`` for every query of the
            process (``local_session()`` does it by default).

    Raises:
        WorkerPythonError: (``spark_sink.worker_python``; INVALID_CONFIG) A local
            session's Python workers would run an interpreter without idemlog: it names
            the interpreter and what to set (``PYSPARK_PYTHON``), before any query fails
            in a task.
    """
    from .worker_python import check_worker_python

    check_worker_python(spark)
    spark.dataSource.register(IdemlogDataSource)
    if patch_progress:
        from .query_progress import enable_enriched_progress

        enable_enriched_progress()
