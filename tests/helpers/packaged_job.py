"""A user's job on an installed clickhouse-tx: one batch write and one streaming query.

Run by ``spark-submit`` with an interpreter that has the package from its wheel (or
gets it from ``spark.archives``), never with this checkout on the path: the test
copies this file into a temporary directory first, and the file imports nothing of
``tests``. Prints one line ``PACKAGED_JOB {json}``: where ``clickhouse_tx`` was
imported from, and which modules of the development stack were loaded or
installed, on the driver and in the executors' Python workers.

``python packaged_job.py '<json args>'``: ``url``, ``database``, ``rows`` (the batch),
``input`` (a directory of JSON files, one micro-batch each), ``chk``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

#: what the base install must neither bring nor load: the embedded server and its clients,
#: pandas (chdb's), kafka-python (the [kafka] extra)
DEV_PACKAGES = ("chdb", "pandas", "clickhouse_connect", "lz4", "zstandard", "kafka")
#: the wheel's own embedded stack (it ships server_patches/config.d for users' servers): never loaded by a job
DEV_MODULES = (*DEV_PACKAGES, "server_patches")


def where_am_i(_: object = None) -> dict[str, Any]:
    """The interpreter, the package's origin and the development stack's footprint (driver or executor)."""
    import clickhouse_tx

    return {
        "python": sys.executable,
        # absolute: a --py-files entry is imported by a path relative to the executor's directory
        "clickhouse_tx": os.path.abspath(clickhouse_tx.__file__),
        "version": clickhouse_tx.__version__,
        "loaded": sorted(m for m in DEV_MODULES if m in sys.modules),
        "installed": sorted(m for m in DEV_PACKAGES if importlib.util.find_spec(m) is not None),
    }


def main(args: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession

    import spark_datasource

    builder = SparkSession.builder.appName("clickhouse-tx-packaged")
    for k, v in spark_datasource.RECOMMENDED_SPARK_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark_datasource.register(spark)
    common = {"url": args["url"], "database": args["database"], "allow_nullable_into_non_nullable": "true"}
    columns = ("id", "cast(id % 1000 as int) as k", "concat('r', cast(id as string)) as s")
    (
        spark.range(0, int(args["rows"]), 1, 4)
        .selectExpr(*columns)
        .write.format("clickhouse_tx")
        .options(**common, table="batch_events")
        .mode("append")
        .save()
    )
    query = (
        spark.readStream.schema("id BIGINT, k INT, s STRING")
        .option("maxFilesPerTrigger", "1")  # one micro-batch per file
        .json(args["input"])
        .writeStream.format("clickhouse_tx")
        .options(**common, table="stream_events")
        .option("checkpointLocation", args["chk"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    # the executors' Python workers are reused: these tasks run in the processes that wrote
    executors = spark.sparkContext.parallelize(range(4), 4).map(where_am_i).collect()
    print("PACKAGED_JOB " + json.dumps({"driver": where_am_i(), "executors": executors}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
