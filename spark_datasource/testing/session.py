"""The ``local[2]`` SparkSession a benchmark process runs its jobs on."""

from __future__ import annotations

from typing import Any, Mapping


def local_session(app: str, conf: Mapping[str, str], master: str = "local[2]") -> Any:  # pyspark.sql.SparkSession
    """A ``local[2]`` session (or ``master``) named ``app``, UI off, logging at ERROR, with the Spark ``conf`` added.

    Every benchmark runs with :data:`spark_datasource.RECOMMENDED_SPARK_CONF`, the
    settings the docs give users; ``conf`` may override them.

    Driver, once per benchmark process (``getOrCreate``: a second call returns the first session).
    """
    from pyspark.sql import SparkSession

    from spark_datasource import RECOMMENDED_SPARK_CONF

    settings: dict[str, bool | float | int | str | None] = {  # the type Builder.config(map=) asks for
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **RECOMMENDED_SPARK_CONF,
        **conf,
    }
    spark = SparkSession.builder.master(master).appName(app).config(map=settings).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
