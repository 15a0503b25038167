"""A ``kafka_py`` stream run as a child process that SIGKILLs its own driver mid-batch.

``python -m tests.helpers.kafka_replay_job run <json args>``, started with
:func:`tests.helpers.torture.start_child` (its own session). Each micro-batch writes
what it read to ``<out>/<tag>-batch=<id>.parquet``; in batch ``kill_batch`` it then
SIGKILLs its process group (driver, JVM, workers): Spark has logged the batch's offsets
but not its commit, so a restart on the same checkpoint replays it.

``args``: ``bootstrap``, ``topic``, ``options`` (more source options), ``out``,
``chk``, ``tag``, ``kill_batch`` (or None), ``trigger`` (``availableNow`` or
``processingTime``: every 500 ms until killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def run(args: dict) -> None:
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    import spark_datasource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafka-py-replay")
        # Workers forked by pyspark's daemon leave the process group: a kill must reach them.
        .config("spark.python.use.daemon", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_datasource.register(spark)
    out = Path(args["out"])

    def each(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        pq.write_table(
            df.select("partition", "offset", "value").toArrow(), out / f"{args['tag']}-batch={batch_id}.parquet"
        )
        if batch_id == args.get("kill_batch"):
            os.killpg(os.getpgrp(), signal.SIGKILL)

    writer = (
        spark.readStream.format("kafka_py")
        .option("bootstrap.servers", args["bootstrap"])
        .option("subscribe", args["topic"])
        .options(**args.get("options", {}))
        .load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", args["chk"])
    )
    if args.get("trigger") == "processingTime":
        writer = writer.trigger(processingTime="500 milliseconds")
    else:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "run":
        sys.exit("usage: python -m tests.helpers.kafka_replay_job run '<json args>'")
    run(json.loads(sys.argv[2]))
