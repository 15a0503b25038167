"""The Kafka -> ClickHouse streaming job run on a Spark cluster or through Spark Connect.

:func:`start_stream` builds the query on any session (a classic one on a standalone
cluster, or a Spark Connect client): ``kafka_py`` -> ``clickhouse_tx`` with trigger
``availableNow``, rows ``(p, o, v)`` as in :mod:`tests.helpers.spark_streams`. A
``delay_s`` makes each task sleep that long per Arrow batch on its executor, so that
most of a run is spent inside tasks and an executor killed at any moment is likely
killed while it writes.

This module is also the entry point of a driver process on a standalone cluster:
``python -m tests.helpers.cluster_job '<json args>'`` (``conf``: the Spark settings).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterator

import pyarrow as pa

from spark_datasource.testing.credentials import writer_options


class Throttle:
    """``mapInArrow`` function: every batch unchanged, each after ``delay_s`` seconds (executor);
    given ``rows``, cut into slices of at most that many rows, each after ``delay_s``."""

    def __init__(self, delay_s: float, rows: int | None = None) -> None:
        self.delay_s = delay_s
        self.rows = rows

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            step = self.rows or max(b.num_rows, 1)
            for start in range(0, max(b.num_rows, 1), step):
                time.sleep(self.delay_s)
                yield b.slice(start, step)


def kafka_rows(spark: Any, args: dict[str, Any]) -> Any:
    """The streaming DataFrame of rows ``(p, o, v)`` read by ``kafka_py`` from ``args["topic"]``.

    ``args``: ``bootstrap``, ``topic``, optional ``max_offsets`` (1500), ``delay_s`` (with
    ``delay_rows``: per slice of that many rows, :class:`Throttle`) and ``repartition``
    (as for :func:`start_stream`).
    """
    df = (
        spark.readStream.format("kafka_py")
        .option("bootstrap.servers", args["bootstrap"])
        .option("subscribe", args["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.get("max_offsets", 1500)))
        # One Spark partition per Kafka partition even in small batches, so every
        # protocol step between two partitions' commits is reached.
        .option("minRecordsPerPartition", "1")
        .load()
    )
    if args.get("delay_s"):
        df = df.mapInArrow(Throttle(float(args["delay_s"]), args.get("delay_rows")), df.schema)
    df = df.selectExpr("partition as p", "offset as o", "cast(value as string) as v")
    if args.get("repartition"):
        df = df.repartition(int(args["repartition"]))
    return df


def start_stream(spark: Any, args: dict[str, Any]) -> Any:
    """Start the query on ``spark`` (classic or Connect); its ``StreamingQuery``.

    ``args``: those of :func:`kafka_rows`, and ``database``, ``chk`` (absolute), ``url`` (none
    when ``options`` name ``shards``), optional ``name`` (the query name), ``options`` and
    ``fault`` (more writer options; ``fault`` wins).
    """
    df = kafka_rows(spark, args)
    writer = (
        df.writeStream.format("clickhouse_tx")
        .option("database", args["database"])
        .option("table", "events")
        .option("allow_nullable_into_non_nullable", "true")
        .option("checkpointLocation", args["chk"])
        .trigger(availableNow=True)
    )
    if args.get("url"):
        writer = writer.option("url", args["url"]).options(**writer_options())
    if args.get("name"):
        writer = writer.queryName(args["name"])
    for k, v in {**args.get("options", {}), **(args.get("fault") or {})}.items():
        writer = writer.option(k, v)
    return writer.start()


def _main(args: dict[str, Any]) -> None:
    """A driver: a classic session with ``args["conf"]``, the query drained, exit 0."""
    from pyspark.sql import SparkSession

    import spark_datasource

    builder = SparkSession.builder.appName("clickhouse-tx-cluster-job")
    for k, v in args["conf"].items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")  # the test reads the lost executors and tasks from it
    spark_datasource.register(spark)
    start_stream(spark, args).awaitTermination()
    spark.stop()


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
