"""The exactly-once ``foreachBatch`` helper in mode ``dedup``: chunks named by the key and their rows.

For targets no ClickHouse transaction can hold (``Replicated*MergeTree``, Cloud's
``SharedMergeTree``). Driver, once per micro-batch, after the key read
(:meth:`~clickhouse_tx.modes.batch_keys.BatchRecords.recorded`) found nothing:

1. Per table, in the order given: the micro-batch's converted rows, put in an order
   their values alone decide (:func:`~clickhouse_tx.modes.dedup_chunks.canonical_order`),
   cut into chunks as mode ``dedup`` cuts a partition
   (:class:`~clickhouse_tx.modes.dedup_chunks.ChunkSizing`), each chunk one INSERT, one
   block, named ``insert_deduplication_token = <batch prefix>:<table>:<SHA-256 of the
   chunk>:<k>``; then the table's dead letters, named by their content.
2. The key row (:meth:`~clickhouse_tx.modes.batch_keys.BatchRecords.insert_sql`).

Rows are visible as each INSERT returns. A replay of the batch (the driver died before
the key row, Spark replays the batch over the same offsets) sends the same rows, so the
same chunks under the same tokens, whatever order its tasks or a shuffle gave them, and
ClickHouse drops the blocks it holds already: exactly once while the first attempt's
blocks are within the table's deduplication window (``replicated_deduplication_window``,
``non_replicated_deduplication_window``). Nothing checks that window at a replay: a
replay after that many other blocks went into the table inserts the blocks that left it
again. A function that emits other rows on a replay (a timestamp of the call, a random
value) makes other tokens, and its rows go in twice.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Callable, Sequence

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.checksum import CountingBatches, combine, finish
from clickhouse_tx.conversion.dead_letters import write_dead_letters
from clickhouse_tx.interfaces import Hook, Target, WriteContext
from clickhouse_tx.modes.base import peek_schema
from clickhouse_tx.modes.batch_keys import BatchKey, BatchRecords, TableRows, attempt_id, batch_prefix
from clickhouse_tx.modes.dedup_chunks import (
    ChunkSizing,
    canonical_order,
    chunk_digest,
    chunk_insert_settings,
    chunk_messages,
    cut_rows,
)

#: How a table's rows of one micro-batch are cut (the sink's ``dedup`` partition sizing).
HELPER_SIZING = ChunkSizing()


def write_batch_dedup(
    target: Target,
    key: BatchKey,
    parts: Sequence[TableRows],
    *,
    sizing: ChunkSizing = HELPER_SIZING,
    before_key: Hook | None = None,
    after_chunk: Callable[[int, int], None] | None = None,
) -> int:
    """Insert ``parts`` under tokens of ``key`` and their rows, then ``key``'s row (driver, once per micro-batch).

    Parameters
    ----------
    target, key
        As for :func:`~clickhouse_tx.modes.batch_keys.write_batch` (``key`` checked
        beforehand with :meth:`BatchRecords.recorded`).
    parts
        The rows per table; each table's are held in memory while they are ordered.
    sizing
        How rows are cut into chunks (tests cut small ones).
    before_key, after_chunk
        Run before the key row's INSERT, and after each chunk's with (part, chunk) (tests).

    Returns
    -------
    int
        The rows sent (dead letters not counted); blocks ClickHouse held already are
        counted too.

    Raises
    ------
    ClickHouseTxError
        An INSERT failed; the chunks sent before it stay, and a replay completes them.
    """
    key = key.scoped(p.display for p in parts)
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    rows, total = 0, 0
    with ClickHouseHTTP(target) as c:
        for i, part in enumerate(parts):
            counted = _insert_part(c, key, i, part, sizing, seen, after_chunk)
            rows += counted.rows
            total = combine(total, counted.checksum)
        if before_key is not None:
            before_key()
        tables = list(dict.fromkeys(p.display for p in parts))
        c.command(BatchRecords(target).insert_sql(key, attempt_id(key), tables, rows, finish(total)))
    return rows


def _insert_part(
    c: ClickHouseHTTP,
    key: BatchKey,
    index: int,
    part: TableRows,
    sizing: ChunkSizing,
    seen: collections.Counter[tuple[str, str]],
    after_chunk: Callable[[int, int], None] | None,
) -> CountingBatches:
    """One table's rows in canonical order, chunk by chunk, then its dead letters; what was counted."""
    schema, batches = peek_schema(iter(part.batches))
    counted = CountingBatches(iter(()))
    if schema is not None:
        ordered = canonical_order(pa.Table.from_batches(list(batches), schema=schema), part.display)
        counted = CountingBatches(iter(ordered.to_batches()))
        _, cutter = cut_rows(counted, sizing)
        table_sql = q.qualified(part.database, part.table)
        chunk = 0
        while cutter.has_more():
            n, messages = chunk_messages(cutter.chunk(), sizing.message_rows)
            digest = chunk_digest(messages)
            token = f"{batch_prefix(key)}:{part.display}:{digest}:{seen[(part.display, digest)]}"
            c.insert_arrow_messages(
                table_sql,
                ordered.schema,
                messages,
                rows=n,
                may_deduplicate=True,
                settings=chunk_insert_settings(token, n),
            )
            seen[(part.display, digest)] += 1
            if after_chunk is not None:
                after_chunk(index, chunk)
            chunk += 1
    _dead_letters(c, key, index, part)
    return counted


def _dead_letters(c: ClickHouseHTTP, key: BatchKey, index: int, part: TableRows) -> int:
    """The table's dead letters under a token of their content (in any order: sorted for the digest)."""
    letters = getattr(part.batches, "dead_letters", None)
    if not letters:
        return 0
    digest = hashlib.sha256("\n".join(sorted(d["row_json"] for d in letters)).encode()).hexdigest()[:32]
    ctx = WriteContext(txn_id=key.app_id, batch=key.batch_id, partition=index, attempt=0)
    token = f"{batch_prefix(key)}:{part.display}:dead_letters:{digest}"
    return write_dead_letters(c, part.batches, table=part.display, ctx=ctx, xid=batch_prefix(key), token=token)


__all__ = ["HELPER_SIZING", "write_batch_dedup"]
