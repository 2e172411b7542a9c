"""idemlog on the Spark side: ``format("idemlog")`` and the producer client.

    from spark_sink import register
    register(spark)
    (df.writeStream.format("idemlog").option("topic", "payments")
       .option("checkpointLocation", ck).start())

``local_session()`` builds a local SparkSession with it registered.
"""

from spark_sink.datasource import FORMAT, IdemlogDataSource, register
from spark_sink.session import local_session

__all__ = ["FORMAT", "IdemlogDataSource", "local_session", "register"]
