"""Rows into the column types of an existing table: the plan, checked by value, vectorised.

Spark has no unsigned types, keeps microseconds and marks nearly every derived column
nullable, so a check of *declared* types refuses almost every real ClickHouse table.
ClickHouse itself converts on ``INSERT ... FORMAT ArrowStream`` but silently: a
negative into ``UInt64`` wraps, a null into ``String`` becomes ``''``, a date before
1970 into ``Date`` is refused only by some servers. So this module checks **values**:

- :func:`clickhouse_tx.conversion.column_fit.fit_problem` (driver, once per column and query):
  what can never fit, by kind (a string into ``Int32``, an array into a scalar). Used
  by :func:`clickhouse_tx.conversion.schema.check_schema`.
- :class:`ConversionPlan` (built on the driver, pickled to executors): for each Arrow
  batch, every column is converted with ``pyarrow.compute`` (no Python per row) to the
  exact Arrow type of its ClickHouse column, after range / membership / length / null
  checks (:mod:`clickhouse_tx.conversion.values`), so the server receives its own types
  and converts nothing. A value that does not fit raises
  :class:`~clickhouse_tx.errors.ValueDoesNotFitError` naming the table, the column
  (with its path inside Array/Map/Tuple), the ClickHouse type, the value and its row
  in the partition (and Kafka topic/partition/offset when the data has those
  columns). It is raised while the mode's prepare reads the batches, so the
  partition's transaction (or stage) is rolled back and nothing becomes visible.
- :class:`ConvertedBatches`: one partition's converted batches; with
  ``bad_rows=dead_letter`` the rows that do not fit are set aside as dead letters.

Sub-second digits the column cannot hold are truncated toward the past (as
ClickHouse does) unless ``strict_precision``; then they do not fit.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from clickhouse_tx.conversion.chtypes import parse_clickhouse_type
from clickhouse_tx.conversion.values import ValueSite, convert_array
from clickhouse_tx.errors import ValueDoesNotFitError

__all__ = ["ConversionPlan", "ConvertedBatches"]


# --------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    """How the data's columns become the table's column types (plain, picklable).

    Built on the driver once per query (from ``system.columns``) and pickled to the
    executors with the writer, so no task queries the table. Columns of the data
    that the plan does not list (a routing column) pass through unchanged.

    Attributes
    ----------
    table
        ``db.table`` for messages.
    columns
        ``(name, ClickHouse type)`` of each column the data writes.
    allow_nullable_into_non_nullable
        Nulls into non-Nullable columns are sent as nulls (the server stores the
        column's default) instead of failing.
    strict_precision
        Sub-second digits the column cannot hold fail instead of being truncated.
    batch_rows, batch_bytes
        Upper bounds of each record batch sent (one ArrowStream message each): larger
        batches are cut into zero-copy slices (None: as they come).
    dead_letter_table
        ``(database, table)``: a row with a value that does not fit is taken out of
        the data and kept as a dead letter (see :class:`ConvertedBatches`) instead of
        failing the task (option ``bad_rows=dead_letter``).
    """

    table: str
    columns: tuple[tuple[str, str], ...]
    allow_nullable_into_non_nullable: bool = False
    strict_precision: bool = False
    batch_rows: int | None = None
    batch_bytes: int | None = None
    dead_letter_table: tuple[str, str] | None = None

    def convert(self, batch: pa.RecordBatch, first_row: int = 0) -> pa.RecordBatch:
        """Executor, once per Arrow batch: every planned column converted and checked.

        Parameters
        ----------
        batch
            One batch of the partition.
        first_row
            Position of the batch's first row in the partition (for messages).

        Raises
        ------
        ValueDoesNotFitError
            Naming table, column path, ClickHouse type, value and row.
        """
        types = dict(self.columns)
        arrays, fields = [], []
        for f, arr in zip(batch.schema, batch.columns):
            ch_text = types.get(f.name)
            if ch_text is not None:
                where = ValueSite(
                    self.table,
                    self.strict_precision,
                    self.allow_nullable_into_non_nullable,
                    batch,
                    first_row,
                    f.name,
                    ch_text,
                    "",
                )
                arr = convert_array(where, arr, parse_clickhouse_type(ch_text))
            arrays.append(arr)
            fields.append(pa.field(f.name, arr.type, nullable=True))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def apply(self, batches: Iterable[pa.RecordBatch], *, eager: bool = False) -> "ConvertedBatches":
        """Executor, once per partition: the converted batches, lazily or all up front.

        ``eager`` converts (and checks) the whole partition before the first batch is
        yielded, for modes whose inserts become visible one by one (``dedup``,
        ``none``): a bad value then fails before anything is sent. It holds the
        converted partition in memory.
        """
        return ConvertedBatches(self, batches, eager=eager)

    def bounded(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """``batch`` in zero-copy slices of at most ``batch_rows`` rows and ~``batch_bytes`` bytes.

        The byte bound uses the batch's average row size (a single row larger than
        ``batch_bytes`` still goes as one slice).
        """
        rows = batch.num_rows
        step = rows if self.batch_rows is None else self.batch_rows
        if self.batch_bytes is not None and rows and batch.nbytes > self.batch_bytes:
            step = min(step, max(1, self.batch_bytes * rows // batch.nbytes))
        if step >= rows:
            yield batch
            return
        for start in range(0, rows, step):
            yield batch.slice(start, step)


# --------------------------------------------------------------------------- dead letters


class ConvertedBatches(Iterator[pa.RecordBatch]):
    """One partition's batches, converted (what :meth:`ConversionPlan.apply` returns).

    With ``plan.dead_letter_table``, a row holding a value that does not fit is taken
    out of its batch and kept in :attr:`dead_letters` (the batch is converted again
    without it: the cost grows with the bad rows of a batch, which are expected to be
    few); the mode writes them with :func:`clickhouse_tx.conversion.dead_letters.write_dead_letters`
    in the same transaction as the good rows, once every batch has been read.
    """

    def __init__(self, plan: ConversionPlan, batches: Iterable[pa.RecordBatch], *, eager: bool) -> None:
        self.plan = plan
        self.dead_letters: list[dict[str, Any]] = []
        self._it: Iterator[pa.RecordBatch] = self._lazy(batches)
        if eager:
            self._it = iter(list(self._it))

    def __next__(self) -> pa.RecordBatch:
        return next(self._it)

    def _lazy(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        first_row = 0
        for b in batches:
            converted = self._convert(b, first_row)
            if converted.num_rows:
                yield from self.plan.bounded(converted)
            first_row += b.num_rows

    def _convert(self, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
        if self.plan.dead_letter_table is None:
            return self.plan.convert(batch, first_row)
        keep = np.arange(batch.num_rows)
        current = batch
        while True:
            try:
                return self.plan.convert(current, first_row)
            except ValueDoesNotFitError as e:
                original = int(keep[e.row])
                self.dead_letters.append(
                    {
                        "row": first_row + original,
                        "column": e.column,
                        "clickhouse_type": e.ch_type,
                        "reason": e.reason,
                        "row_json": _row_json(batch, original),
                    }
                )
                keep = np.delete(keep, e.row)
                current = batch.take(pa.array(keep, pa.int64()))


def _row_json(batch: pa.RecordBatch, i: int) -> str:
    """The whole row as JSON (bytes as latin-1 text, other values by ``str``)."""

    def plain(v: object) -> object:
        if isinstance(v, bytes):
            return v.decode("latin-1")
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    row = {k: plain(v) for k, v in batch.slice(i, 1).to_pylist()[0].items()}
    return json.dumps(row, default=str, ensure_ascii=False, sort_keys=True)
