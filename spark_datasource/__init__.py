"""Spark Python Data Sources of clickhouse-tx.

>>> import spark_datasource
>>> spark_datasource.register(spark)   # registers "clickhouse_tx" and "kafka_py"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: "SparkSession") -> None:
    """Register every data source of this package with ``spark`` (driver, once per session)."""
    from .kafka_reader import KafkaDataSource
    from .writer import ClickHouseTxDataSource

    spark.dataSource.register(ClickHouseTxDataSource)
    spark.dataSource.register(KafkaDataSource)
