"""Exactly-once ``foreachBatch``: one micro-batch's write under its key ``(app_id, batch_id)``.

The public helpers are :mod:`spark_datasource.foreach.helper`'s (``clickhouse_tx_batch``,
``clickhouse_tx_transaction``); this is what they run.

Spark calls the function on the driver, once per micro-batch (and again for a batch it
replays after a restart, with the same batch id over the same source offsets). Each call
collects the micro-batch to the driver as Arrow record batches, converts them to the
table's column types (the sink's :class:`~clickhouse_tx.conversion.convert.ConversionPlan`,
built by :func:`spark_datasource.sink.setup.prepare_target`), and writes them with one key
row in one ClickHouse transaction (:mod:`clickhouse_tx.foreach.keys`), or in mode
``dedup`` as chunks named by the key and their rows, then the key row
(:mod:`clickhouse_tx.foreach.dedup`). A key already recorded is skipped with one INFO
line of the logger ``clickhouse_tx.spark.foreach_batch``.

A key names the tables the call writes (``(app_id, batch_id, tables)``,
:mod:`clickhouse_tx.foreach.key_check`): two helper functions of one ``app_id`` called
in one micro-batch into two tables write both, each exactly once, under two keys; a call
whose tables overlap another key of the batch, or a second call under the same key in one
run, is refused naming ``app_id`` and ``clickhouse_tx_transaction``, never skipped.

The key is tied to the streaming query: the row records the query's id, which Spark keeps
in the checkpoint (the same across restarts on it, another on a new checkpoint). It is read
from the local property Spark sets while it runs a micro-batch (``sql.streaming.queryId``),
or, when the helper is given ``checkpoint_location``, from ``<checkpoint>/metadata`` and
checked against the running query. A new checkpoint restarts batch ids at 0, so an
``app_id`` whose rows carry another query id is refused, naming the option ``app_id``.

Several tables in one micro-batch: ``clickhouse_tx_transaction``, a context opened in
the user's own function (one transaction, one key row). The DataFrames given to
:meth:`BatchTransaction.insert` are collected when the context ends without error, all
before the transaction begins (no Spark job runs while it is open), so the whole
micro-batch of every table is in driver memory at once.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Sequence

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.client.sql import split_table
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.foreach.dedup import write_batch_dedup
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords, TableRows, settle_key, write_batch
from clickhouse_tx.interfaces import Mode, Target
from spark_datasource.foreach.collect import collect_arrow
from spark_datasource.foreach.options import ForeachOptions
from spark_datasource.foreach.query import RunMemory, query_identity, run_memory
from spark_datasource.sink.setup import prepare_target

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchTransaction", "Spill"]

log = logging.getLogger("clickhouse_tx.spark.foreach_batch")


def _called_twice(key: BatchKey) -> str:
    return (
        f"option app_id={key.app_id!r}: batch {key.batch_id} was written into {list(key.tables)} by an earlier "
        "call of this micro-batch already: one table set is one key of a micro-batch, so this call would be "
        "skipped as a replay. Write a table once per micro-batch (clickhouse_tx_transaction for several tables "
        "in one transaction), or give each call its own app_id; nothing of this call was written"
    )


def _check_batch_id(batch_id: object) -> int:
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ConfigurationError(f"batch_id={batch_id!r}: expected Spark's micro-batch id (an int >= 0)")
    return batch_id


def _plan_text(df: "DataFrame") -> str:
    """The analyzed plan of ``df`` (driver; '' on Spark Connect or when Spark cannot say): what a
    refused ``dedup`` replay searches for functions whose results differ on a replay."""
    try:
        return str(df._jdf.queryExecution().analyzed().toString())
    except Exception:  # noqa: BLE001 - only a message is at stake
        return ""


#: Writes one table's micro-batch too large for the driver from the executors, then its
#: key row; returns the rows (:func:`spark_datasource.foreach.helper.write_from_executors`).
Spill = Callable[["DataFrame", ForeachOptions, Target, BatchKey], int]


class BatchTransaction:
    """One micro-batch written in one ClickHouse transaction with its key row, or in mode
    ``dedup`` chunk by chunk, then its key row (driver).

    Built by :func:`clickhouse_tx_transaction` (or the single-table helper, which names its
    table up front). The key is checked once its tables are known: at ``with`` when given,
    else when the block ends (:attr:`skipped` when it is recorded already); :meth:`insert`
    queues a DataFrame for a table; leaving the block without error writes them all and
    the key row at once. An error inside the block writes nothing.
    """

    def __init__(
        self,
        options: ForeachOptions,
        batch_id: int,
        spark: "SparkSession | None" = None,
        spill: Spill | None = None,
        tables: Sequence[str] | None = None,
    ) -> None:
        self.options = options
        self.spill = spill
        self.batch_id = _check_batch_id(batch_id)
        self.spark = spark
        #: The tables written, when known before the block (the single-table helper's).
        self.tables = None if tables is None else tuple(tables)
        self.key: BatchKey | None = None
        #: The key is recorded already: nothing is written. Known at ``with`` when the
        #: tables are given, else when the block ends (the context's tables are its inserts').
        self.skipped = False
        #: Rows written when the block ended (0 when skipped).
        self.rows = 0
        self._pending: list[tuple[str, str, "DataFrame"]] = []
        self._run: RunMemory | None = None
        self._checked = False

    def __enter__(self) -> "BatchTransaction":
        query_id, checkpoint = query_identity(self.spark, self.options.checkpoint_location)
        self.key = BatchKey(self.options.app_id, self.batch_id, query_id, checkpoint)
        if self.tables is not None:
            self._check(self.key.scoped(self.tables))
        return self

    def _check(self, key: BatchKey) -> None:
        """Settle and read ``key`` (its tables named now), unless the run's memory says no
        earlier attempt at it exists; :attr:`skipped` when it is recorded already."""
        self.key, self._checked = key, True
        target = self.options.writer.target()
        self._run = run_memory(self.spark, key.query_id, key.app_id, target.url, target.database, key.tables)
        if self._run is not None and self._run.last_batch == self.batch_id:
            raise ConfigurationError(_called_twice(key))
        if self._run is not None and self._run.follows(self.batch_id):
            return  # a later batch of the run: no earlier attempt at its key exists
        with ClickHouseHTTP(target) as client:  # the key table's DDL and its read share one connection
            records = BatchRecords(target, client)
            if self._run is None or not self._run.key_table_ready:
                records.ensure_table()
            if self.options.writer.mode is Mode.TRANSACTION:
                settle_key(target, key)  # an attempt killed inside its transaction left it open
            found = records.recorded(key)
        if self._run is not None:
            self._run.key_table_ready = True
        if found is not None:
            self.skipped = True
            log.info(
                "clickhouse_tx: %s is written already (%s rows into %s at %s): skipped, nothing written",
                key,
                found["rows"],
                ", ".join(found["tables"]) or "no table",
                found["committed_at"],
            )

    def insert(self, table: str, df: "DataFrame") -> None:
        """Queue ``df``'s rows for ``table`` (``db.table``, or a table of the option ``database``).

        Nothing is sent before the ``with`` block ends; a batch already written queues nothing.
        """
        if self.key is None:
            raise RuntimeError("BatchTransaction.insert runs inside its `with` block")
        database, name = split_table(table, self.options.writer.database)
        if self.tables is not None and f"{database}.{name}" not in self.tables:
            raise ConfigurationError(f"{self.key}: {database}.{name} is not among the tables {list(self.tables)}")
        if not self.skipped:
            self._pending.append((database, name, df))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        ok = False
        try:
            if exc_type is None and self.key is not None:
                if not self._checked:
                    self._check(self.key.scoped(f"{db}.{t}" for db, t, _ in self._pending))
                if not self.skipped:
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
        parts = []
        for (db, t, df), plan in zip(self._pending, plans):
            batches = collect_arrow(df, self.options.driver_max_bytes)
            if batches is None:
                return self._too_large(key, db, t, df)
            parts.append(TableRows(db, t, plan.apply(batches)))
        if self.options.writer.mode is Mode.DEDUP:
            frames = {f"{db}.{t}": df for db, t, df in self._pending}  # plans read only for a refused replay
            rows = write_batch_dedup(
                self.options.writer.target(), key, parts, plan_text=lambda table: _plan_text(frames[table])
            )
        else:
            rows = write_batch(self.options.writer.target(), key, parts)
        log.debug("clickhouse_tx: %s written: %d rows into %d tables", key, rows, len(parts))
        return rows

    def _too_large(self, key: BatchKey, database: str, table: str, df: "DataFrame") -> int:
        """A table's rows past ``driver_max_bytes``: written by :attr:`spill` (given by the
        single-table helper only) in mode ``transaction``, else refused with nothing written."""
        limit = self.options.driver_max_bytes
        if self.spill is not None and self.options.writer.mode is Mode.TRANSACTION:
            return self.spill(df, self.options, self.options.for_table(database, table).target(), key)
        why = (
            "mode 'dedup' writes from the driver only"
            if self.spill is not None
            else "a clickhouse_tx_transaction context writes every table from the driver"
        )
        raise ConfigurationError(
            f"{key}: the rows for {database}.{table} pass option driver_max_bytes={limit} and {why}; nothing of "
            "the batch was written. Bound the micro-batch with the source's rate limit (maxOffsetsPerTrigger, "
            "maxFilesPerTrigger) or raise driver_max_bytes (the driver's Python process holds the rows whole)"
        )
