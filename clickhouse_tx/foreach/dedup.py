"""The exactly-once ``foreachBatch`` helper in mode ``dedup``: chunks named by the key and their rows.

For targets no ClickHouse transaction can hold (``Replicated*MergeTree``, Cloud's
``SharedMergeTree``). Driver, once per micro-batch, after the key read
(:meth:`~clickhouse_tx.foreach.keys.BatchRecords.recorded`) found nothing:

1. Per table: the micro-batch's converted rows, put in an order their values alone
   decide (:func:`~clickhouse_tx.modes.dedup.chunks.canonical_order`), cut into chunks as
   mode ``dedup`` cuts a partition (:class:`~clickhouse_tx.modes.dedup.chunks.ChunkSizing`),
   and each chunk's digest taken (the chunks are serialized once for that, and again
   while they are sent: the memory of one chunk, not of the batch).
2. What the attempt is about to write, recorded before its first chunk
   (:class:`~clickhouse_tx.foreach.contents.ContentRecords`): a replay whose rows
   differ from an earlier attempt's record is refused here, before it sends anything.
3. Per table, in the order given: each chunk one INSERT, one block, named
   ``insert_deduplication_token = <batch prefix>:<table>:<SHA-256 of the chunk>:<k>``;
   then the table's dead letters, named by their content.
4. The key row (:meth:`~clickhouse_tx.foreach.keys.BatchRecords.insert_sql`), then
   the record of the batch before is dropped.

Rows are visible as each INSERT returns. A replay of the batch (the driver died before
the key row, Spark replays the batch over the same offsets) sends the same rows, so the
same chunks under the same tokens, whatever order its tasks or a shuffle gave them, and
ClickHouse drops the blocks it holds already: exactly once while the first attempt's
blocks are within the table's deduplication window (``replicated_deduplication_window``,
``non_replicated_deduplication_window``). Nothing checks that window at a replay: a
replay after that many other blocks went into the table inserts the blocks that left it
again. A function that emits other rows on a replay (a sum of doubles over a shuffle,
``collect_list``, a timestamp of the call, a random value) would make other tokens; the
record of step 2 refuses it instead of letting its rows go in twice.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import logging
from typing import Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.checksum import CountingBatches, combine, finish
from clickhouse_tx.conversion.dead_letters import write_dead_letters
from clickhouse_tx.errors import ClickHouseTxError, TransientError
from clickhouse_tx.foreach.contents import ContentRecords, TableContent, content_digest, unstable_inputs
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords, TableRows, attempt_id, batch_prefix
from clickhouse_tx.interfaces import Hook, Target, WriteContext
from clickhouse_tx.modes.base import peek_schema
from clickhouse_tx.modes.dedup.chunks import (
    ChunkSizing,
    canonical_order,
    chunk_digest,
    chunk_insert_settings,
    chunk_messages,
    cut_rows,
)

log = logging.getLogger("clickhouse_tx.spark.foreach_batch")

#: How a table's rows of one micro-batch are cut (the sink's ``dedup`` partition sizing).
HELPER_SIZING = ChunkSizing()
#: Per table (``db.table``), the text of the plan its rows came from ('' when unknown):
#: read only to name the likely non-deterministic inputs of a refused replay.
PlanText = Callable[[str], str]


@dataclasses.dataclass
class _Planned:
    """One part's rows in canonical order and its chunks' ``(rows, digest)``, before any is sent."""

    part: TableRows
    ordered: pa.Table | None
    chunks: list[tuple[int, str]]
    dead: tuple[int, str] | None  # the dead letters' count and content digest


@dataclasses.dataclass
class _Progress:
    """INSERTs that returned, so a failed first one that sent nothing can drop its record."""

    sent: int = 0


def write_batch_dedup(
    target: Target,
    key: BatchKey,
    parts: Sequence[TableRows],
    *,
    sizing: ChunkSizing = HELPER_SIZING,
    plan_text: PlanText | None = None,
    after_record: Hook | None = None,
    before_key: Hook | None = None,
    after_chunk: Callable[[int, int], None] | None = None,
) -> int:
    """Record what ``parts`` hold, insert them under tokens of ``key`` and their rows, then
    ``key``'s row (driver, once per micro-batch).

    Parameters
    ----------
    target, key
        As for :func:`~clickhouse_tx.foreach.keys.write_batch` (``key`` checked
        beforehand with :meth:`BatchRecords.recorded`).
    parts
        The rows per table; each table's are held in memory while they are ordered.
    sizing
        How rows are cut into chunks (tests cut small ones).
    plan_text
        The plan each table's rows came from, for the message of a refused replay.
    after_record, before_key, after_chunk
        Run after the record, before the key row's INSERT, and after each chunk's with
        (part, chunk) (tests).

    Returns
    -------
    int
        The rows sent (dead letters not counted); blocks ClickHouse held already are
        counted too.

    Raises
    ------
    ConfigurationError
        A replay whose rows are not the ones an earlier attempt recorded; nothing sent.
    ClickHouseTxError
        An INSERT failed; the chunks sent before it stay, and a replay completes them.
    """
    key = key.scoped(p.display for p in parts)
    planned = [_plan(part, sizing) for part in parts]
    records = ContentRecords(target)
    created = records.claim(key, _contents(planned), attempt_id(key), lambda: _hints(planned, plan_text))
    if after_record is not None:
        after_record()
    progress = _Progress()
    try:
        rows = _send(target, key, planned, sizing, progress, before_key, after_chunk)
    except TransientError:
        if created and progress.sent == 0:
            # Nothing of this attempt reached the table and no earlier one recorded any:
            # the record would only refuse a replay with other rows for no reason.
            with contextlib.suppress(ClickHouseTxError):
                records.drop(key)
        raise
    try:
        records.drop_before(key)
    except ClickHouseTxError as exc:  # housekeeping: gc drops what is left
        log.warning("clickhouse_tx: %s: the record of the batch before stays (%s)", key, exc)
    return rows


def _send(
    target: Target,
    key: BatchKey,
    planned: Sequence[_Planned],
    sizing: ChunkSizing,
    progress: _Progress,
    before_key: Hook | None,
    after_chunk: Callable[[int, int], None] | None,
) -> int:
    """Every part's chunks and dead letters, then the key row; the rows sent."""
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    rows, total = 0, 0
    with ClickHouseHTTP(target) as c:
        for i, one in enumerate(planned):
            counted = _insert_part(c, key, i, one, sizing, seen, after_chunk, progress)
            rows += counted.rows
            total = combine(total, counted.checksum)
        if before_key is not None:
            before_key()
        tables = list(dict.fromkeys(p.part.display for p in planned))
        c.command(BatchRecords(target).insert_sql(key, attempt_id(key), tables, rows, finish(total)))
    return rows


def _plan(part: TableRows, sizing: ChunkSizing) -> _Planned:
    """``part``'s rows collected, converted and put in canonical order, and its chunks' digests."""
    schema, batches = peek_schema(iter(part.batches))
    ordered, chunks = None, []
    if schema is not None:
        ordered = canonical_order(pa.Table.from_batches(list(batches), schema=schema), part.display)
        chunks = [(n, chunk_digest(m)) for n, m in _chunks(iter(ordered.to_batches()), sizing)]
    return _Planned(part, ordered, chunks, _dead_digest(part))


def _chunks(batches: Iterator[pa.RecordBatch], sizing: ChunkSizing) -> Iterator[tuple[int, list[pa.Buffer]]]:
    """The chunks of ``batches`` (rows in canonical order), each as (rows, IPC messages)."""
    _, cutter = cut_rows(batches, sizing)
    while cutter.has_more():
        yield chunk_messages(cutter.chunk(), sizing.message_rows)


def _contents(planned: Sequence[_Planned]) -> dict[str, TableContent]:
    """Per table, its parts' rows, dead letters and chunks as one :class:`TableContent`."""
    by_table: dict[str, list[_Planned]] = collections.defaultdict(list)
    for one in planned:
        by_table[one.part.display].append(one)
    out = {}
    for table, ones in by_table.items():
        chunks = [c for one in ones for c in one.chunks]
        dead = [one.dead for one in ones if one.dead is not None]
        elements = chunks + [(n, f"dead_letters:{d}") for n, d in dead]
        out[table] = TableContent(sum(n for n, _ in chunks), content_digest(elements), sum(n for n, _ in dead))
    return out


def _hints(planned: Sequence[_Planned], plan_text: PlanText | None) -> Mapping[str, list[str]]:
    """Per table, the likely non-deterministic inputs of its rows (only for a refusal)."""
    out: dict[str, list[str]] = {}
    for one in planned:
        plan = plan_text(one.part.display) if plan_text is not None else ""
        schema = one.ordered.schema if one.ordered is not None else None
        out.setdefault(one.part.display, unstable_inputs(plan, schema))
    return out


def _insert_part(
    c: ClickHouseHTTP,
    key: BatchKey,
    index: int,
    one: _Planned,
    sizing: ChunkSizing,
    seen: collections.Counter[tuple[str, str]],
    after_chunk: Callable[[int, int], None] | None,
    progress: _Progress,
) -> CountingBatches:
    """One table's rows in canonical order, chunk by chunk, then its dead letters; what was counted."""
    part = one.part
    counted = CountingBatches(iter(()))
    if one.ordered is not None:
        counted = CountingBatches(iter(one.ordered.to_batches()))
        table_sql = q.qualified(part.database, part.table)
        for chunk, ((n, messages), (_, digest)) in enumerate(zip(_chunks(counted, sizing), one.chunks)):
            token = f"{batch_prefix(key)}:{part.display}:{digest}:{seen[(part.display, digest)]}"
            c.insert_arrow_messages(
                table_sql,
                one.ordered.schema,
                messages,
                rows=n,
                may_deduplicate=True,
                settings=chunk_insert_settings(token, n),
            )
            progress.sent += 1
            seen[(part.display, digest)] += 1
            if after_chunk is not None:
                after_chunk(index, chunk)
    _dead_letters(c, key, index, part, one.dead, progress)
    return counted


def _dead_digest(part: TableRows) -> tuple[int, str] | None:
    """The count and content digest of the part's dead letters (in any order: sorted), or None."""
    letters = getattr(part.batches, "dead_letters", None)
    if not letters:
        return None
    return len(letters), hashlib.sha256("\n".join(sorted(d["row_json"] for d in letters)).encode()).hexdigest()[:32]


def _dead_letters(
    c: ClickHouseHTTP, key: BatchKey, index: int, part: TableRows, dead: tuple[int, str] | None, progress: _Progress
) -> int:
    """The table's dead letters under a token of their content."""
    if dead is None:
        return 0
    ctx = WriteContext(txn_id=key.app_id, batch=key.batch_id, partition=index, attempt=0)
    token = f"{batch_prefix(key)}:{part.display}:dead_letters:{dead[1]}"
    n = write_dead_letters(c, part.batches, table=part.display, ctx=ctx, xid=batch_prefix(key), token=token)
    progress.sent += 1
    return n


__all__ = ["HELPER_SIZING", "PlanText", "write_batch_dedup"]
