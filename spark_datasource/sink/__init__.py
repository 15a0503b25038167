"""The ``clickhouse_tx`` sink: the writers Spark builds (streaming, batch, overwrite),
their set-up on the driver, batch jobs, type mapping, table DDL, metrics and the
workers' GC.
"""
