"""Exactly-once ``foreachBatch``: the call users already write, keyed by ``(app_id, batch_id)``.

>>> fn = clickhouse_tx_batch(url=url, table="db.events", app_id="events-to-ch")
>>> df.writeStream.foreachBatch(fn).option("checkpointLocation", chk).start()

Spark calls the function on the driver, once per micro-batch (and again for a batch it
replays after a restart, with the same batch id over the same source offsets). Each call
collects the micro-batch to the driver as Arrow record batches, converts them to the
table's column types (the sink's :class:`~clickhouse_tx.conversion.convert.ConversionPlan`,
built by :func:`spark_datasource.sink.setup.prepare_target`), and writes them with one key
row in one ClickHouse transaction (:mod:`clickhouse_tx.modes.batch_keys`), or in mode
``dedup`` as chunks named by the key and their rows, then the key row
(:mod:`clickhouse_tx.modes.batch_dedup`). A key already recorded is skipped with one INFO
line of the logger ``clickhouse_tx.spark.foreach_batch``.

The key is tied to the streaming query: the row records the query's id, which Spark keeps
in the checkpoint (the same across restarts on it, another on a new checkpoint). It is read
from the local property Spark sets while it runs a micro-batch (``sql.streaming.queryId``),
or, when the helper is given ``checkpoint_location``, from ``<checkpoint>/metadata`` and
checked against the running query. A new checkpoint restarts batch ids at 0, so an
``app_id`` whose rows carry another query id is refused, naming the option ``app_id``.

Several tables in one micro-batch: :func:`clickhouse_tx_transaction`, a context opened in
the user's own function (one transaction, one key row). The DataFrames given to
:meth:`BatchTransaction.insert` are collected when the context ends without error, all
before the transaction begins (no Spark job runs while it is open), so the whole
micro-batch of every table is in driver memory at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Mapping

import pyarrow as pa

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.client.sql import split_table
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import canonical_location
from clickhouse_tx.interfaces import Mode
from clickhouse_tx.modes.batch_dedup import write_batch_dedup
from clickhouse_tx.modes.batch_keys import BATCHES_TABLE, BatchKey, BatchRecords, TableRows, settle_key, write_batch
from spark_datasource.options.writer import WriterOptions
from spark_datasource.sink.foreach_query import RunMemory, query_identity, run_memory
from spark_datasource.sink.setup import prepare_target

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchTransaction", "ForeachOptions", "clickhouse_tx_batch", "clickhouse_tx_transaction", "collect_arrow"]

log = logging.getLogger("clickhouse_tx.spark.foreach_batch")

#: Writer options of the sink that mean nothing to the helper (lower-cased): the helper's
#: key is ``(app_id, batch_id)``, it writes one server, and Spark's checkpoint is its own.
_SINK_ONLY = (
    "transactional_id",
    "decision_log",
    "visibility",
    "idempotence_key",
    "shards",
    "sharding_key",
    "shard_weights",
    "table_column",
    "tables",
    "checkpointlocation",
    "queryname",
    "path",
)


@dataclasses.dataclass(frozen=True)
class ForeachOptions:
    """The helper's options, checked once on the driver when the helper is built (frozen)."""

    writer: WriterOptions
    app_id: str
    checkpoint_location: str | None

    @classmethod
    def parse(cls, *, app_id: str, checkpoint_location: str | None, options: Mapping[str, object]) -> "ForeachOptions":
        """The writer's options (same names, same parsing as ``format("clickhouse_tx")``) and the helper's own.

        Raises
        ------
        ConfigurationError
            An unknown or malformed option, an option of the sink only, a mode other than
            ``transaction`` and ``dedup``, or a malformed ``app_id`` or ``checkpoint_location``.
        """
        texts = {str(k): _option_text(v) for k, v in options.items()}
        for name in texts:
            if name.lower() in _SINK_ONLY or name.lower().startswith("fault."):
                raise ConfigurationError(
                    f"option {name} is the clickhouse_tx sink's; the foreachBatch helper is keyed by "
                    "(app_id, batch_id) and takes the query's checkpoint as checkpoint_location"
                )
        writer = WriterOptions.parse(texts, streaming=False)
        _check_mode(writer.mode)
        if checkpoint_location is not None:
            canonical_location(checkpoint_location, os.getcwd())  # malformed: refused here
        return cls(writer, _check_app_id(app_id), checkpoint_location)

    def for_table(self, database: str, table: str) -> WriterOptions:
        """The writer options of one target table."""
        return dataclasses.replace(self.writer, database=database, table=table)


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_mode(mode: Mode) -> None:
    if mode in (Mode.TRANSACTION, Mode.DEDUP):
        return
    raise ConfigurationError(
        f"option mode={mode.value!r}: the foreachBatch helper writes in mode 'transaction' (one "
        "ClickHouse transaction per micro-batch) or 'dedup' (Replicated and Cloud tables: chunks "
        "named by the key and their rows); for other modes use writeStream.format('clickhouse_tx')"
    )


def _check_app_id(app_id: object) -> str:
    text = app_id.strip() if isinstance(app_id, str) else ""
    if not text or len(text) > 256 or not text.isprintable():
        raise ConfigurationError(
            f"option app_id={app_id!r}: expected 1 to 256 printable characters naming the stream "
            "(one app_id per streaming query, kept across its restarts)"
        )
    return text


def _check_batch_id(batch_id: object) -> int:
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ConfigurationError(f"batch_id={batch_id!r}: expected Spark's micro-batch id (an int >= 0)")
    return batch_id


def collect_arrow(df: "DataFrame") -> list[pa.RecordBatch]:
    """The DataFrame's rows on the driver as Arrow record batches (all of them in driver memory).

    Classic Spark sends them as its tasks made them (``_collect_as_arrow``); Spark Connect
    has ``toArrow`` only.
    """
    collect = getattr(df, "_collect_as_arrow", None)
    if collect is not None:
        return list(collect())
    return list(df.toArrow().to_batches())


class BatchTransaction:
    """One micro-batch written in one ClickHouse transaction with its key row, or in mode
    ``dedup`` chunk by chunk, then its key row (driver).

    Built by :func:`clickhouse_tx_transaction` (or the single-table helper). ``with``
    checks the key (:attr:`skipped` when it is recorded already); :meth:`insert`
    queues a DataFrame for a table; leaving the block without error writes them all and
    the key row at once. An error inside the block writes nothing.
    """

    def __init__(self, options: ForeachOptions, batch_id: int, spark: "SparkSession | None" = None) -> None:
        self.options = options
        self.batch_id = _check_batch_id(batch_id)
        self.spark = spark
        self.key: BatchKey | None = None
        #: The batch is recorded already: nothing is written, :meth:`insert` does nothing.
        self.skipped = False
        #: Rows written when the block ended (0 when skipped).
        self.rows = 0
        self._pending: list[tuple[str, str, "DataFrame"]] = []
        self._run: RunMemory | None = None

    def __enter__(self) -> "BatchTransaction":
        query_id, checkpoint = query_identity(self.spark, self.options.checkpoint_location)
        self.key = BatchKey(self.options.app_id, self.batch_id, query_id, checkpoint)
        target = self.options.writer.target()
        self._run = run_memory(self.spark, query_id, self.options.app_id, target.url, target.database)
        if self._run is not None and self._run.follows(self.batch_id):
            return self  # a later batch of the run: no earlier attempt at its key exists
        with ClickHouseHTTP(target) as client:  # the key table's DDL and its read share one connection
            records = BatchRecords(target, client)
            if self._run is None or not self._run.key_table_ready:
                records.ensure_table()
            if self.options.writer.mode is Mode.TRANSACTION:
                settle_key(target, self.key)  # an attempt killed inside its transaction left it open
            found = records.recorded(self.key)
        if self._run is not None:
            self._run.key_table_ready = True
        if found is not None:
            self.skipped = True
            log.info(
                "clickhouse_tx: %s is written already (%s rows into %s at %s): skipped, nothing written",
                self.key,
                found["rows"],
                ", ".join(found["tables"]) or "no table",
                found["committed_at"],
            )
        return self

    def insert(self, table: str, df: "DataFrame") -> None:
        """Queue ``df``'s rows for ``table`` (``db.table``, or a table of the option ``database``).

        Nothing is sent before the ``with`` block ends; a batch already written queues nothing.
        """
        if self.key is None:
            raise RuntimeError("BatchTransaction.insert runs inside its `with` block")
        database, name = split_table(table, self.options.writer.database)
        if not self.skipped:
            self._pending.append((database, name, df))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        ok = False
        try:
            if exc_type is None and not self.skipped and self.key is not None:
                self.rows = self._write(self.key)
            ok = exc_type is None
        finally:
            if self._run is not None and ok:
                self._run.done(self.batch_id)
            elif self._run is not None:
                self._run.failed()

    def _plan(self, database: str, table: str, df: "DataFrame") -> ConversionPlan:
        """The table checked (and created with ``create_table``) for ``df``'s schema: once per run."""
        if self._run is None:
            return prepare_target(self.options.for_table(database, table), df.schema)
        key = (database, table, df.schema.json())
        if key not in self._run.plans:
            self._run.plans[key] = prepare_target(self.options.for_table(database, table), df.schema)
        return self._run.plans[key]

    def _write(self, key: BatchKey) -> int:
        """Check every table, collect every DataFrame, then write them all (one transaction, or dedup's chunks)."""
        plans = [self._plan(db, t, df) for db, t, df in self._pending]
        parts = [TableRows(db, t, plan.apply(collect_arrow(df))) for (db, t, df), plan in zip(self._pending, plans)]
        if self.options.writer.mode is Mode.DEDUP:
            rows = write_batch_dedup(self.options.writer.target(), key, parts)
        else:
            rows = write_batch(self.options.writer.target(), key, parts)
        log.debug("clickhouse_tx: %s written: %d rows into %d tables", key, rows, len(parts))
        return rows


def clickhouse_tx_batch(
    *,
    url: str,
    table: str,
    app_id: str,
    mode: str = "transaction",
    checkpoint_location: str | None = None,
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
    )
    database, name = parsed.writer.database, parsed.writer.table

    def write_micro_batch(df: "DataFrame", batch_id: int) -> None:
        with BatchTransaction(parsed, batch_id, df.sparkSession) as tx:
            tx.insert(f"{database}.{name}", df)

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
    in the block writes nothing; a key recorded already makes ``tx.skipped`` true and
    ``insert`` a no-op.

    Parameters
    ----------
    url, app_id, mode, checkpoint_location, **options
        As for :func:`clickhouse_tx_batch`.
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
    )
    return BatchTransaction(parsed, batch_id, spark)
