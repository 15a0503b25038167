"""The data sources used from a Spark Connect client (``SparkSession.builder.remote``).

The client is this pytest process (pure Python, gRPC); the session's Connect server is
a separate JVM whose Python workers import this checkout. The sources are registered
from the client and both a streaming Kafka -> ClickHouse query and a batch write must
deliver every record once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import spark_cluster
from tests.helpers.cluster_job import start_stream
from tests.helpers.spark_streams import assert_exactly_once_by_offsets, create_target, make_topic
from tests.helpers.spark_writes import read_committed

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # 239 s for the module here, Connect server start included


@pytest.fixture(scope="module")
def remote(connect_server: spark_cluster.ConnectServer) -> Iterator[object]:
    """A Spark Connect client session with this project's sources registered from the client.

    pyspark marks the whole process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``
    in ``os.environ``, inherited by children); the mark is taken back afterwards so the
    classic sessions of later tests and the drivers they start stay classic.
    """
    from pyspark.sql import SparkSession

    import spark_datasource

    marked = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    session = SparkSession.builder.remote(connect_server.remote).getOrCreate()
    try:
        spark_datasource.register(session)
        yield session
    finally:
        session.stop()
        if not marked:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.mark.timeout(600)
def test_a_stream_started_from_a_spark_connect_client_delivers_every_kafka_record_once(
    remote, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, 2, 1500)
    create_target(clickhouse_url, database)
    args = {
        "bootstrap": kafka_bootstrap,
        "topic": topic,
        "url": clickhouse_url,
        "database": database,
        "chk": str(tmp_path / "chk"),  # absolute: the server resolves it, not the client
        "max_offsets": 1000,
    }
    query = start_stream(remote, args)
    query.awaitTermination(400)
    assert not query.isActive, "the availableNow query did not finish in 400 s"
    assert query.exception() is None, query.exception()
    assert_exactly_once_by_offsets(clickhouse_url, database, expected)
    assert list((tmp_path / "chk" / "clickhouse_tx").iterdir()), "no decision log beside the checkpoint"


@pytest.mark.timeout(300)
def test_a_batch_write_from_a_spark_connect_client_commits_every_row_once(
    remote, clickhouse_url: str, database: str
) -> None:
    create_target(clickhouse_url, database)
    df = remote.range(5000).selectExpr("cast(id % 3 as int) as p", "id as o", "concat('v', id) as v").repartition(3)
    (
        df.write.format("clickhouse_tx")
        .option("url", clickhouse_url)
        .option("database", database)
        .option("table", "events")
        .option("allow_nullable_into_non_nullable", "true")
        .mode("append")
        .save()
    )
    rows = read_committed(clickhouse_url, f"SELECT o, v FROM `{database}`.events ORDER BY o")
    assert rows == [[str(i), f"v{i}"] for i in range(5000)]
