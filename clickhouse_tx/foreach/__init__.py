"""The ClickHouse side of the exactly-once ``foreachBatch`` helper (no Spark): a micro-batch's
key ``(app_id, batch_id, tables)`` (:mod:`.key_check`), its rows and key row in one transaction
(:mod:`.keys`), or in mode ``dedup`` its chunks (:mod:`.dedup`) and recorded contents
(:mod:`.contents`). The Spark side is :mod:`spark_datasource.foreach`."""
