"""A local SparkSession shared by every test under tests/spark.

One JVM per test run: starting Spark costs seconds, so the session is
session-scoped and generic (no data source registered here; tests register what they
use, which is idempotent). It is stopped at the end, which also ends its Python
worker daemons.
"""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator["object"]:
    """``local[2]`` SparkSession: 2 shuffle partitions, UI off, this interpreter on workers.

    Built with :data:`spark_datasource.RECOMMENDED_SPARK_CONF`, as the docs tell users
    to. The jobs of ``tests/helpers/torture.py``, ``tests/helpers/cluster_job.py`` and
    the operator-command tests keep Spark's defaults, so both transports are run.
    """
    from pyspark.sql import SparkSession

    from spark_datasource import RECOMMENDED_SPARK_CONF

    session = (
        SparkSession.builder.config(map=dict(RECOMMENDED_SPARK_CONF))
        .master("local[2]")
        .appName("clickhouse-tx-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()


@pytest.fixture(scope="module")
def sp(spark):
    """The session with this project's data sources registered (idempotent)."""
    import spark_datasource

    spark_datasource.register(spark)
    return spark


@pytest.fixture(scope="module")
def broker() -> Iterator[tuple[str, str]]:
    """A dev Kafka broker of the test module's own (one module cuts its consumers'
    connections): (bootstrap, control URL)."""
    from server_patches.kafka_broker import start_broker, stop_broker

    proc, bootstrap, control = start_broker()
    try:
        yield bootstrap, control
    finally:
        stop_broker(proc)
