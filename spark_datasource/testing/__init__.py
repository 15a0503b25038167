"""The end-to-end harness: Kafka -> Spark -> ClickHouse, crashes, and a check of every record.

As ``pyspark.testing`` ships with pyspark, this package ships the harness the kill
tests, the chaos runs and the benchmarks share (:func:`pipeline.run_pipeline`); it can
certify a deployment of one's own (``PipelineConfig(url=..., bootstrap=...)``). No
runtime module of ``spark_datasource`` imports it, and it is the only part of
``spark_datasource`` that imports ``server_patches`` (the embedded stack, when no
servers are given).
"""
