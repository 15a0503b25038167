"""The key of a ``foreachBatch`` helper call, ``(app_id, batch_id, tables)``, and the pure check of
what the key table holds for it (driver, once per call; :mod:`clickhouse_tx.foreach.keys`
reads the rows and writes them).

Why the tables are part of the key: one micro-batch may be written by several calls under
one ``app_id`` (two ``clickhouse_tx_batch`` functions into two tables inside one
``foreachBatch`` function). Keyed by ``(app_id, batch_id)`` alone, the second call found the
first's row and skipped its own table silently. Keyed by the table set, each call is
its own unit of the protocol: its rows and its key row in one transaction (mode
``transaction``, in a session of its own, :func:`~clickhouse_tx.foreach.keys.key_session`),
or its chunks then its key row (mode ``dedup``). A driver killed between two calls leaves
the first's key row and nothing of the second's (or an open transaction the second's
restart rolls back): the replay skips the first call and writes the second, each
table once. A call whose tables overlap a row of the batch without being equal to its
tables (code changed between a run and its replay, one table under two calls) can be
neither skipped nor written safely, and is refused naming ``app_id``, the tables and
``clickhouse_tx_transaction``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

from clickhouse_tx.errors import ConfigurationError


@dataclasses.dataclass(frozen=True)
class BatchKey:
    """Which micro-batch of which stream: the key, and the query it comes from.

    Attributes
    ----------
    app_id
        The user's name of the stream (one per streaming query, for its whole life).
    batch_id
        Spark's micro-batch id.
    query_id
        The streaming query's id (Spark's ``<checkpoint>/metadata``): the same across
        restarts on one checkpoint, another on a new checkpoint.
    checkpoint
        The query's checkpoint location when the user gave it ('' otherwise), recorded
        for the operator.
    """

    app_id: str
    batch_id: int
    query_id: str
    checkpoint: str = ""
    #: The tables this call writes (``db.table``, sorted, once each): part of the key, so
    #: two calls of one micro-batch into other tables are two keys (:func:`check_recorded`).
    tables: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"(app_id={self.app_id!r}, batch_id={self.batch_id})"

    def scoped(self, tables: Iterable[str]) -> "BatchKey":
        """This key for the call writing ``tables``; ValueError if it names other ones already."""
        named = tuple(sorted(set(tables)))
        if self.tables and self.tables != named:
            raise ValueError(f"{self} names tables {list(self.tables)}, not {list(named)}")
        return dataclasses.replace(self, tables=named)


def check_recorded(rows: Sequence[Mapping[str, Any]], key: BatchKey) -> Mapping[str, Any] | None:
    """The key's row when ``key`` is written already (skip it), None to write it (pure).

    A key is ``(app_id, batch_id, tables)``: a row of the same batch naming exactly
    ``key.tables`` is this call's, written already; rows naming only other tables are
    other calls' of the same micro-batch (a second helper into another table), and this
    call's tables are still to be written.

    Parameters
    ----------
    rows
        The key table's rows of ``key.app_id`` with ``key.batch_id`` or another query id.
    key
        The micro-batch and the tables about to be written.

    Raises
    ------
    ConfigurationError
        A row of ``key.app_id`` comes from another streaming query: a new checkpoint
        restarts batch ids at 0, so its batches would be skipped as already written. Or a
        row of this batch names some of ``key.tables`` with others: writing would write
        them twice, skipping would skip the rest.
    """
    other = next((r for r in rows if str(r["query_id"]) != key.query_id), None)
    if other is not None:
        raise ConfigurationError(_another_query(other, key))
    mine = set(key.tables)
    same = [r for r in rows if int(r["batch_id"]) == key.batch_id]
    found = next((r for r in same if set(r["tables"]) == mine), None)
    if found is not None:
        return found
    clash = next((r for r in same if mine & set(r["tables"])), None)
    if clash is not None:
        raise ConfigurationError(_tables_clash(clash, key))
    return None


def _tables_clash(row: Mapping[str, Any], key: BatchKey) -> str:
    return (
        f"option app_id={key.app_id!r}: batch {key.batch_id} recorded tables {list(row['tables'])} under this "
        f"app_id at {row['committed_at']}, and this call writes tables {list(key.tables)}: a table cannot be "
        "written under two keys of one micro-batch (it would be written twice, or the key's other tables "
        "skipped). Write the tables of a micro-batch with one call per table set, the same on every replay "
        "(clickhouse_tx_transaction for several tables in one transaction), or give each call its own "
        "app_id; nothing was written"
    )


def _another_query(row: Mapping[str, Any], key: BatchKey) -> str:
    def query(query_id: object, checkpoint: object) -> str:
        return f"query {query_id}" + (f" (checkpoint {checkpoint})" if checkpoint else "")

    return (
        f"option app_id={key.app_id!r} is already used by another streaming query: "
        f"{query(row['query_id'], row['checkpoint'])} recorded batch {row['batch_id']} at {row['committed_at']}, "
        f"and batch {key.batch_id} comes from {query(key.query_id, key.checkpoint)}. A new checkpoint "
        "restarts batch ids at 0, so its batches would be skipped as already written. Give this query a new "
        "app_id, or restart it on the checkpoint of the query that wrote those batches; nothing was written"
    )


__all__ = ["BatchKey", "check_recorded"]
