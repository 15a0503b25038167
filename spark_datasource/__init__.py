"""Spark Python Data Sources of clickhouse-tx.

>>> import spark_datasource
>>> spark_datasource.register(spark)   # registers "clickhouse_tx" and "kafka_py"

Exactly-once ``foreachBatch`` (:mod:`spark_datasource.foreach.helper`):

>>> fn = spark_datasource.clickhouse_tx_batch(url=url, table="db.events", app_id="events-to-ch")
>>> df.writeStream.foreachBatch(fn).option("checkpointLocation", chk).start()

Spark settings the data sources run best with are in :data:`RECOMMENDED_SPARK_CONF`;
they must be given when the session is built (``SparkSession.builder.config``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "RECOMMENDED_SPARK_CONF",
    "ClickHouseTxDataSource",
    "KafkaDataSource",
    "clickhouse_tx_batch",
    "clickhouse_tx_transaction",
    "register",
]

#: Spark settings for sessions that use these data sources (set when the session is
#: built; Spark reads them once, at start).
#:
#: - ``spark.python.unix.domain.socket.enabled``: the JVM talks to its Python workers
#:   over Unix domain sockets instead of loopback TCP. Over TCP, the small messages
#:   that start a Python task wait for a delayed ACK (Nagle's algorithm on the JVM's
#:   side), which delays the start of every ``kafka_py`` task; over a Unix socket
#:   there is no such wait (measured in docs/performance.md, "Unix domain sockets").
#: - ``spark.python.worker.reuse`` (Spark's default, kept explicit): pooled Kafka
#:   consumers, cached table checks and ``gc.freeze`` live in reused Python workers,
#:   and a worker's imports (pyspark, pyarrow, these packages) are paid once, when it
#:   starts; without it every task and every driver-side call of every micro-batch
#:   starts a fresh worker. Spark still closes workers idle for a minute
#:   (docs/performance.md, "Python workers: per process, not per micro-batch").
RECOMMENDED_SPARK_CONF: Mapping[str, str] = MappingProxyType(
    {
        "spark.python.unix.domain.socket.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
)


def __getattr__(name: str) -> object:
    """The two DataSource classes and the ``foreachBatch`` helpers, imported on first use:
    importing this package needs no pyspark."""
    if name == "ClickHouseTxDataSource":
        from spark_datasource.datasource import ClickHouseTxDataSource

        return ClickHouseTxDataSource
    if name == "KafkaDataSource":
        from spark_datasource.kafka.reader import KafkaDataSource

        return KafkaDataSource
    if name in ("clickhouse_tx_batch", "clickhouse_tx_transaction"):
        from spark_datasource.foreach import helper as foreach

        return getattr(foreach, name)
    raise AttributeError(f"module 'spark_datasource' has no attribute {name!r}")


def register(spark: "SparkSession") -> None:
    """Register every data source of this package with ``spark`` (driver, once per session)."""
    from spark_datasource.datasource import ClickHouseTxDataSource
    from spark_datasource.kafka.reader import KafkaDataSource

    spark.dataSource.register(ClickHouseTxDataSource)
    spark.dataSource.register(KafkaDataSource)
