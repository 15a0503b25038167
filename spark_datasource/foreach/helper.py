"""Exactly-once ``foreachBatch``: the call users already write, keyed by ``(app_id, batch_id)``.

>>> fn = clickhouse_tx_batch(url=url, table="db.events", app_id="events-to-ch")
>>> df.writeStream.foreachBatch(fn).option("checkpointLocation", chk).start()

The public helpers (exported by :mod:`spark_datasource`) and the write of a micro-batch
too large for the driver (:func:`write_from_executors`): a batch job of the sink, which
is registered here; :mod:`spark_datasource.foreach.write` is the rest.

A table's rows of a micro-batch past ``driver_max_bytes``
(:func:`spark_datasource.foreach.collect.collect_arrow` gave up on them) go, with the
single-table helper in mode ``transaction``, through ``df.write.format("clickhouse_tx")``:
from the executors, published at once in one ClickHouse transaction with the job's row
(``visibility=batch``), under ``idempotence_key =
clickhouse_tx_batch/<app_id>/<batch_id>/<query id>``; then the key row, outside that
transaction. A replay of the batch (a crash after the publish, before the key row or
Spark's commit log) runs the batch job again, which finds its key recorded and writes
nothing; the key row's count comes from the job's row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import NotCommittedError
from clickhouse_tx.foreach.keys import BATCHES_TABLE, BatchKey, BatchRecords, attempt_id
from clickhouse_tx.interfaces import Hook, Target
from clickhouse_tx.jobs.publish import JobRecords
from spark_datasource.datasource import ClickHouseTxDataSource
from spark_datasource.foreach.options import DEFAULT_DRIVER_MAX_BYTES, ForeachOptions
from spark_datasource.foreach.write import BatchTransaction

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("clickhouse_tx.spark.foreach_batch")


def clickhouse_tx_batch(
    *,
    url: str,
    table: str,
    app_id: str,
    mode: str = "transaction",
    checkpoint_location: str | None = None,
    driver_max_bytes: int | str = DEFAULT_DRIVER_MAX_BYTES,
    **options: object,
) -> Callable[["DataFrame", int], None]:
    """A ``foreachBatch`` function that writes each micro-batch into ``table`` exactly once.

    Built on the driver, once per query; the options are checked here, before any batch.
    The function it returns runs on the driver, once per micro-batch (and again for a
    replayed one): it collects the micro-batch to the driver as Arrow (the whole
    micro-batch is in driver memory), checks the table and converts the values as the
    sink does, and writes the rows and a key row ``(app_id, batch_id)`` of
    ``<database>.clickhouse_tx_batches`` in one ClickHouse transaction (mode ``dedup``:
    chunks named by the key and their rows, then the key row). A batch whose key is
    recorded already is skipped with one INFO log line. Exactly once for non-replicated
    ``*MergeTree`` tables on a server with transactions on; in mode ``dedup`` exactly once
    while a killed attempt's blocks are within the table's deduplication window.

    Parameters
    ----------
    url, table
        The server and the table (``db.table``, or ``table`` with the option ``database``).
    app_id
        The stream's name: one per streaming query, kept across its restarts. A query on a
        new checkpoint needs a new one (its batch ids restart at 0): its first batch is
        refused otherwise.
    mode
        ``transaction`` (non-replicated ``*MergeTree``, server transactions on) or
        ``dedup`` (``Replicated*MergeTree``, Cloud: a table with a deduplication window;
        rows visible as they are inserted; docs/writer.md, "Mode ``dedup``").
    checkpoint_location
        The query's ``checkpointLocation``. Optional in classic Spark, where the running
        query's id is read from Spark; when given it must be the running query's, and
        the function may then be called outside the query (Spark Connect, a test).
    driver_max_bytes
        The Arrow bytes of a micro-batch the driver collects (256 MiB by default). A
        larger one is written from the executors by the sink's batch job, published at
        once under the key (mode ``transaction``: :func:`write_from_executors`); mode
        ``dedup`` refuses it, writing nothing. Classic Spark stops keeping rows at the
        limit; Spark Connect checks it once the whole batch has arrived.
    **options
        The writer's options by the same names (``user``, ``password``, ``database``,
        HTTPS ``verify``/``ca_cert``/..., ``create_table``, ``bad_rows`` with
        ``dead_letter_table``, ``batch_size``, timeouts, ``retry.*``, and ClickHouse
        settings as ``**{"setting.NAME": value}``); ``docs/options.md``.

    Returns
    -------
    Callable[[DataFrame, int], None]
        The function to give ``df.writeStream.foreachBatch``.

    Raises
    ------
    ConfigurationError
        Bad options (here), a table or values the sink would refuse, or an ``app_id``
        used by another streaming query (in the function, before anything is written).
    NotCommittedError, OutcomeUnknownError
        From the function: nothing written, or a COMMIT whose outcome could not be read
        (naming the key; a restart on the checkpoint settles it).
    """
    parsed = ForeachOptions.parse(
        app_id=app_id,
        checkpoint_location=checkpoint_location,
        options={"url": url, "table": table, "mode": mode, **options},
        driver_max_bytes=driver_max_bytes,
    )
    database, name = parsed.writer.database, parsed.writer.table

    def write_micro_batch(df: "DataFrame", batch_id: int) -> None:
        table = f"{database}.{name}"
        with BatchTransaction(parsed, batch_id, df.sparkSession, spill=write_from_executors, tables=[table]) as tx:
            tx.insert(table, df)

    return write_micro_batch


def clickhouse_tx_transaction(
    *,
    url: str,
    app_id: str,
    batch_id: int,
    database: str = "default",
    mode: str = "transaction",
    checkpoint_location: str | None = None,
    spark: "SparkSession | None" = None,
    driver_max_bytes: int | str = DEFAULT_DRIVER_MAX_BYTES,
    **options: object,
) -> BatchTransaction:
    """A context writing several tables of one micro-batch in one transaction, exactly once
    (mode ``dedup``: one table after the other, each exactly once within its window).

    Opened inside the user's ``foreachBatch`` function, on the driver, once per micro-batch::

        def write(df, batch_id):
            with clickhouse_tx_transaction(url=url, app_id="orders", batch_id=batch_id, database="db") as tx:
                tx.insert("db.orders", df.where("kind = 'order'"))
                tx.insert("db.refunds", df.where("kind = 'refund'"))

    Every table's rows and one key row ``(app_id, batch_id)`` of
    ``<database>.clickhouse_tx_batches`` commit together when the block ends; an error
    in the block writes nothing. The key is ``(app_id, batch_id, tables inserted)``: one
    recorded already makes ``tx.skipped`` true when the block ends, and nothing is written.

    Parameters
    ----------
    url, app_id, mode, checkpoint_location, driver_max_bytes, **options
        As for :func:`clickhouse_tx_batch`, but a table's rows past ``driver_max_bytes`` are
        refused (every table of the context is written from the driver), writing nothing.
    batch_id
        The ``batch_id`` Spark gave the function.
    database
        Where the key table lives, and the database of table names given without one.
    spark
        The session running the micro-batch (``df.sparkSession``); the active one by default.

    Raises
    ------
    ConfigurationError
        Bad options (when called), as for :func:`clickhouse_tx_batch` otherwise.
    """
    parsed = ForeachOptions.parse(
        app_id=app_id,
        checkpoint_location=checkpoint_location,
        options={**options, "url": url, "database": database, "table": BATCHES_TABLE, "mode": mode},
        driver_max_bytes=driver_max_bytes,
    )
    return BatchTransaction(parsed, batch_id, spark)


def spill_key(key: BatchKey) -> str:
    """The batch job's ``idempotence_key`` for ``key``: the query's id in it, as in the key row."""
    return f"clickhouse_tx_batch/{key.app_id}/{key.batch_id}/{key.query_id}"


def write_from_executors(
    df: "DataFrame", options: ForeachOptions, target: Target, key: BatchKey, before_key: Hook | None = None
) -> int:
    """Write ``df`` into ``target`` as the sink's batch job, then ``key``'s row (driver, once per such batch).

    Parameters
    ----------
    df
        The micro-batch's rows for the table (computed again by the job's tasks).
    options
        The helper's options: the writer's as the user gave them go to the sink, which
        parses them again.
    target
        The table; the key table and the job table live in its database.
    key
        The micro-batch.
    before_key
        Runs after the batch job, before the key row's INSERT (tests).

    Returns
    -------
    int
        The rows the batch job recorded (this run's or the replayed run's).
    """
    idempotence_key = spill_key(key)
    log.info(
        "clickhouse_tx: %s holds more than driver_max_bytes=%d of rows for %s.%s: written from the executors "
        "as a batch job of the sink (idempotence_key %r)",
        key,
        options.driver_max_bytes,
        target.database,
        target.table,
        idempotence_key,
    )
    df.sparkSession.dataSource.register(ClickHouseTxDataSource)  # format("clickhouse_tx"), once per call
    sink_options = {
        **dict(options.sink_options),
        "database": target.database,
        "table": target.table,
        "mode": "transaction",
        "visibility": "batch",
        "idempotence_key": idempotence_key,
    }
    df.write.format("clickhouse_tx").options(**sink_options).mode("append").save()
    with ClickHouseHTTP(target) as c:
        job = JobRecords(target, c).by_key(idempotence_key)
        if job is None:
            raise NotCommittedError(f"{key}: the sink's batch job returned but recorded no row for {idempotence_key!r}")
        rows = int(job["rows"])
        if before_key is not None:
            before_key()
        c.command(
            BatchRecords(target, c).insert_sql(key, attempt_id(key), [f"{target.database}.{target.table}"], rows, 0)
        )
    return rows


__all__ = ["clickhouse_tx_batch", "clickhouse_tx_transaction", "spill_key", "write_from_executors"]
