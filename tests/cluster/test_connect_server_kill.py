"""Spark Connect in front of the standalone cluster, and a Connect server SIGKILLed mid-stream.

Each test starts its own Connect server (a JVM from the pyspark package, see
``tests/helpers/spark_cluster.py``), because one of them is killed. The client is this
pytest process (pure Python, gRPC), with the project's sources registered from it.

- On the cluster: the server's application runs its tasks on the session's standalone
  cluster (executor JVMs of their own), and a Kafka -> ClickHouse stream started from
  the client lands every record once.
- The server SIGKILLed (its whole process group: the driver JVM and its Python
  workers) while the stream is between commits; a new server and a new client start
  the same query on the same checkpoint, and every record is in the target once.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers import spark_cluster
from tests.helpers.cluster_job import start_stream
from tests.helpers.spark_streams import assert_exactly_once_by_offsets, create_target, make_topic
from tests.helpers.spark_writes import scalar

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 2
PER_PARTITION = 2000


@contextlib.contextmanager
def connect_client(server: spark_cluster.ConnectServer, *, server_alive: bool = True) -> Iterator[Any]:
    """A new Spark Connect client session on ``server`` with the project's sources registered.

    pyspark marks the whole process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``);
    the mark is taken back afterwards so later classic sessions stay classic. A session
    whose server was killed is closed without releasing it (nothing would answer).
    """
    from pyspark.sql import SparkSession

    import spark_datasource

    marked = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    session = SparkSession.builder.remote(server.remote).create()
    state = {"alive": server_alive}
    try:
        spark_datasource.register(session)
        yield session, state
    finally:
        if not state["alive"]:
            session.release_session_on_close = False
        session.stop()
        if not marked:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def _rows(url: str, database: str) -> int:
    return scalar(url, f"SELECT count() FROM `{database}`.events")


def _args(kafka_bootstrap: str, topic: str, clickhouse_url: str, database: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "bootstrap": kafka_bootstrap,
        "topic": topic,
        "url": clickhouse_url,
        "database": database,
        "chk": str(tmp_path / "chk"),  # absolute: the server resolves it, not the client
        "max_offsets": 400,  # 10 batches of 2 tasks
        "delay_s": 1.0,  # per task: the kill lands while tasks run or between commits
    }


def _drain(query: Any, timeout_s: float = 420) -> None:
    query.awaitTermination(timeout_s)
    assert not query.isActive, f"the availableNow query did not finish in {timeout_s:.0f} s"
    assert query.exception() is None, query.exception()


@pytest.mark.timeout(900)
def test_a_stream_from_a_connect_client_runs_on_the_standalone_clusters_executors_with_every_record_once(
    standalone_cluster: spark_cluster.StandaloneCluster,
    stack,
    kafka_bootstrap: str,
    clickhouse_url: str,
    database: str,
    tmp_path: Path,
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database)
    apps_before = set(standalone_cluster.log_dir.glob("work-*/app-*"))
    conf = spark_cluster.app_conf(standalone_cluster)
    server = spark_cluster.start_connect_server(tmp_path / "server", master=standalone_cluster.master_url, **conf)
    try:
        with connect_client(server) as (remote, _):
            args = _args(kafka_bootstrap, topic, clickhouse_url, database, tmp_path)
            _drain(start_stream(remote, {**args, "delay_s": 0.0}))
    finally:
        spark_cluster.stop_connect_server(server)
    # the server's application ran executors on the cluster's Workers
    assert set(standalone_cluster.log_dir.glob("work-*/app-*")) - apps_before
    assert_exactly_once_by_offsets(clickhouse_url, database, expected)


@pytest.mark.timeout(900)
def test_a_connect_server_sigkilled_mid_stream_and_a_new_one_resumes_the_query_with_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database)
    args = _args(kafka_bootstrap, topic, clickhouse_url, database, tmp_path)
    total = PARTITIONS * PER_PARTITION
    first = spark_cluster.start_connect_server(tmp_path / "server-1")
    try:
        with connect_client(first) as (remote, state):
            start_stream(remote, args)
            deadline = time.monotonic() + 420
            while _rows(clickhouse_url, database) == 0:  # at least one batch committed
                assert time.monotonic() < deadline, "no batch committed in 420 s"
                time.sleep(0.2)
            spark_cluster.stop_connect_server(first)  # SIGKILL: driver JVM and its Python workers
            state["alive"] = False
    finally:
        spark_cluster.stop_connect_server(first)
    at_kill = _rows(clickhouse_url, database)
    assert 0 < at_kill < total, f"the kill came too late to test anything: {at_kill} of {total} rows"
    second = spark_cluster.start_connect_server(tmp_path / "server-2")
    try:
        with connect_client(second) as (remote, _):
            _drain(start_stream(remote, args))
    finally:
        spark_cluster.stop_connect_server(second)
    assert_exactly_once_by_offsets(clickhouse_url, database, expected)
