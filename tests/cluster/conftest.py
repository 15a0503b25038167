"""One standalone Spark cluster and one Spark Connect server per test run, started on first use.

Each is a set of JVMs started from the pyspark package (``tests/helpers/spark_cluster.py``),
logging under the session's tmp dir, and SIGKILLed (whole process groups) at the end
of the run, failures included. The pytest process itself starts no JVM here: drivers
on the cluster are child processes, and the Connect client is pure Python.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.helpers import spark_cluster


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[spark_cluster.StandaloneCluster]:
    """A Master and two Workers (1 core, 768 MiB each) on 127.0.0.1."""
    cluster = spark_cluster.start_cluster(tmp_path_factory.mktemp("spark_cluster"))
    try:
        yield cluster
    finally:
        spark_cluster.stop_cluster(cluster)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[spark_cluster.ConnectServer]:
    """A Spark Connect server (``local[2]``) whose Python workers import this checkout."""
    server = spark_cluster.start_connect_server(tmp_path_factory.mktemp("spark_connect"))
    try:
        yield server
    finally:
        spark_cluster.stop_connect_server(server)
