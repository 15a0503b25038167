"""What :data:`spark_datasource.RECOMMENDED_SPARK_CONF` promises, in a real SparkSession."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa


def _socket_families(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Python worker: the address families of the sockets this process holds."""
    import os
    import socket

    families = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))  # a duplicate: closing it leaves the worker's open
        except OSError:
            continue
        families.add(s.family.name)
        s.close()
    for _ in batches:
        pass
    yield pa.record_batch([pa.array(sorted(families), pa.string())], names=["family"])


def test_the_recommended_conf_connects_python_workers_to_the_jvm_over_unix_domain_sockets(spark) -> None:
    # Over loopback TCP a worker holds no Unix socket at all: its link to the JVM is
    # the one socket every task has, so a Unix one can only be that link.
    from spark_datasource import RECOMMENDED_SPARK_CONF

    assert (
        spark.conf.get("spark.python.unix.domain.socket.enabled")
        == RECOMMENDED_SPARK_CONF["spark.python.unix.domain.socket.enabled"]
    )
    rows = spark.range(1, numPartitions=1).mapInArrow(_socket_families, "family string").collect()
    assert "AF_UNIX" in {r.family for r in rows}
