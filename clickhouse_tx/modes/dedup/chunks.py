"""Mode ``dedup``: how a partition's rows are cut into chunks, and what names each chunk.

A chunk is one INSERT, one block, one ``insert_deduplication_token``. The cut and the
token depend only on the partition's rows and their order (never on how they arrived
in record batches), so a retried or replayed attempt that sends the same rows sends
the same tokens, and ClickHouse drops the blocks it already holds
(:mod:`clickhouse_tx.modes.dedup.mode` says how the mode uses them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc


@dataclasses.dataclass(frozen=True)
class ChunkSizing:
    """How many rows go into one chunk (one INSERT, one token, one part) of a partition.

    Part of the protocol, so not an option: a run and its replay must cut a partition
    at the same rows. The count is decided per partition from its first
    ``sample_rows`` rows (:meth:`rows_for`): as many rows as make about
    ``target_bytes`` of Arrow IPC at the sample's bytes per row, within
    ``[min_rows, max_rows]``. It depends only on those rows' values (their IPC bytes
    are what the digest hashes), so a replay of the same rows cuts the same chunks.
    Narrow rows make chunks of ``max_rows`` (ClickHouse's own insert block is about
    as large, so the table gets parts of the size a plain INSERT makes); wide rows
    make chunks of about ``target_bytes``, which bounds a task's memory (rows wider than
    ``target_bytes / min_rows`` make chunks of ``min_rows``).
    """

    target_bytes: int = 32 * 1024 * 1024
    sample_rows: int = 8192
    min_rows: int = 8192
    max_rows: int = 1_048_576
    #: Rows per Arrow IPC message of a chunk, counted from the chunk's first row: the
    #: server reads one while the next arrives, and makes one block of the chunk
    #: (``min_insert_block_size_rows``). The digest hashes the messages.
    message_rows: int = 65_536

    def __post_init__(self) -> None:
        if not 0 < self.sample_rows <= self.min_rows <= self.max_rows or self.message_rows <= 0:
            raise ValueError(f"need 0 < sample_rows <= min_rows <= max_rows and message_rows > 0, got {self}")

    @classmethod
    def fixed(cls, rows: int, message_rows: int = 65_536) -> "ChunkSizing":
        """Every chunk ``rows`` rows, whatever their width (tests cut small chunks with it)."""
        return cls(target_bytes=1, sample_rows=rows, min_rows=rows, max_rows=rows, message_rows=message_rows)

    def rows_for(self, sample_rows: int, sample_bytes: int) -> int:
        """Rows per chunk for a partition whose first ``sample_rows`` rows serialize to ``sample_bytes``.

        A partition shorter than the sample is one chunk whatever this returns.
        """
        if sample_rows <= 0 or sample_bytes <= 0:
            return self.min_rows
        return max(self.min_rows, min(self.max_rows, self.target_bytes * sample_rows // sample_bytes))


def cut_rows(batches: Iterator[pa.RecordBatch], sizing: ChunkSizing) -> tuple[int, "Rechunker"]:
    """Rows per chunk, from the first ``sizing.sample_rows`` rows, and the cutter of all the rows."""
    head = Rechunker(batches, sizing.sample_rows)
    if not head.has_more():
        return sizing.min_rows, head
    sample = pa.concat_batches(list(head.chunk()))
    rows = sizing.rows_for(sample.num_rows, sample.serialize().size)
    return rows, Rechunker(itertools.chain([sample], head.rest()), rows)


def chunk_insert_settings(token: str, rows: int) -> dict[str, str]:
    """The settings of one chunk's INSERT: one block of ``rows`` rows, named by ``token``."""
    # Deduplication itself (on, the views' tables too) is the server contract's, which
    # the client adds to an INSERT that may be deduplicated (clickhouse_tx.client.contract).
    return {
        "insert_deduplication_token": token,
        "min_insert_block_size_rows": str(rows),
        "min_insert_block_size_bytes": "0",
        "max_insert_block_size": str(rows),
    }


def canonical_order(table: pa.Table, display: str) -> pa.Table:
    """``table``'s rows in an order their values alone decide (pure; where mode ``dedup``
    orders a collected micro-batch, on the driver or in a task, before cutting it).

    For rows collected in an order a replay need not repeat (a shuffle's output): the
    same rows in any order come out the same, so they cut into the same chunks with the
    same tokens. Rows are ordered by every column that can be ordered (floats by their
    bits, so ``-0.0`` and ``0.0`` differ as their bytes do); dictionary columns come out
    decoded, since a dictionary's bytes depend on the rows' order. Rows equal on all of
    those and told apart only by columns that cannot be ordered as such (arrays, maps,
    tuples, unions) are then ordered by the text of those values (:func:`_tie_keys`): a
    total order, so no batch is refused, and rows still equal are equal values, whose
    order does not matter. ``display`` (the table's name) is kept for callers' messages.
    """
    del display  # every batch has an order now; callers still name the table
    for i, column in enumerate(table.columns):
        if pa.types.is_dictionary(column.type):
            table = table.set_column(
                i, table.field(i).with_type(column.type.value_type), column.cast(column.type.value_type)
            )
    if table.num_rows < 2:
        return table
    keys: dict[str, pa.ChunkedArray] = {}
    unordered: list[str] = []
    for i, (name, column) in enumerate(zip(table.column_names, table.columns)):
        key = _order_key(column)
        if key is None:
            unordered.append(name)
        else:
            keys[f"k{i}"] = key
    order = pa.array(range(table.num_rows), pa.int64())
    if keys:
        order = pc.sort_indices(pa.table(keys), sort_keys=[(k, "ascending") for k in keys])
        table = table.take(order)
    if unordered:
        by = pa.table(keys).take(order) if keys else None
        tie = _tie_keys(table, by, unordered)
        if tie is not None:
            sort_keys = [(k, "ascending") for k in keys] + [("tie", "ascending")]
            columns = {**({k: by.column(k) for k in keys} if by is not None else {}), "tie": tie}
            table = table.take(pc.sort_indices(pa.table(columns), sort_keys=sort_keys))
    return table


def _tie_keys(table: pa.Table, by: pa.Table | None, unordered: list[str]) -> pa.Array | None:
    """Per row of ``table`` (sorted by ``by``), the bytes that order the rows ``by`` ties:
    the ``repr`` of their ``unordered`` values (null elsewhere); None when no rows tie.

    Only rows in a tie are turned into Python values: in an honest batch a key column
    tells most rows apart, so this stays small. ``repr`` of Arrow's Python values is
    one text per value (floats round-trip, ``-0.0`` is not ``0.0``; structs keep their
    fields' order, maps their entries' order).
    """
    n = table.num_rows
    if by is None:
        in_tie: pa.Array = pa.array([True] * n)
    else:
        same = _adjacent_equal(by)
        if not pc.any(same).as_py():
            return None
        pad = pa.array([False])
        in_tie = pc.or_(pa.concat_arrays([pad, same]), pa.concat_arrays([same, pad]))
    rows = table.select(unordered).filter(in_tie).to_pylist()
    texts = pa.array([repr(tuple(r[c] for c in unordered)).encode() for r in rows], pa.binary())
    return pc.replace_with_mask(pa.nulls(n, pa.binary()), in_tie, texts)


def _order_key(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """What orders ``column`` (None: nothing can)."""
    t = column.type
    if pa.types.is_floating(t):
        bits = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[t.bit_width]
        return pa.chunked_array([c.view(bits) for c in column.chunks], type=bits)
    if pa.types.is_nested(t) or pa.types.is_union(t) or isinstance(t, pa.ExtensionType):
        return None
    return column


def _adjacent_equal(ordered: pa.Table) -> pa.Array:
    """Row ``i`` equal to row ``i + 1`` on every column of ``ordered`` (nulls equal), for each ``i``."""
    n = ordered.num_rows
    same: pa.Array = pa.array([True] * (n - 1))
    for column in ordered.columns:
        a, b = column.slice(0, n - 1), column.slice(1)
        equal = pc.or_kleene(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
        same = pc.and_(same, equal.combine_chunks() if isinstance(equal, pa.ChunkedArray) else equal)
    return same


def chunk_messages(pieces: Iterator[pa.RecordBatch], message_rows: int) -> tuple[int, list[pa.Buffer]]:
    """A chunk's rows (its pieces, in order) as IPC messages of ``message_rows`` rows
    (the last one fewer), counted from the chunk's first row; (rows, messages)."""
    cut = Rechunker(pieces, message_rows)
    rows, messages = 0, []
    while cut.has_more():
        one = pa.concat_batches(list(cut.chunk()))
        rows += one.num_rows
        messages.append(one.serialize())
    return rows, messages


def chunk_digest(messages: Sequence[pa.Buffer]) -> str:
    """SHA-256 of a chunk's Arrow IPC messages (:func:`chunk_messages`): equal rows give equal digests.

    The IPC writer drops the validity bitmap of a column without nulls and truncates
    sliced buffers, so the bytes depend on the values, not on how the record batches
    that made the chunk were cut.
    """
    h = hashlib.sha256()
    for m in messages:
        h.update(m)
    return h.hexdigest()[:32]


def dedup_token(txn_id: str, batch: int, partition: int, digest: str, occurrence: int = 0) -> str:
    """The ``insert_deduplication_token`` of one chunk: its content, not its position.

    ``occurrence`` counts earlier chunks of the partition with the same digest, so
    two equal chunks of one partition are both inserted.
    """
    return f"{txn_id}:{batch}:{partition}:{digest}:{occurrence}"


class Rechunker:
    """Re-cut a stream of record batches into chunks of exactly ``n`` rows (last: fewer).

    Each chunk is an iterator of zero-copy slices; consume it fully before asking for
    the next. Memory: one input batch at a time.
    """

    def __init__(self, batches: Iterator[pa.RecordBatch], n: int) -> None:
        if n <= 0:
            raise ValueError(f"chunk size must be positive, got {n}")
        self._it = iter(batches)
        self._n = n
        self._pending: pa.RecordBatch | None = None

    def has_more(self) -> bool:
        if self._pending is not None and self._pending.num_rows:
            return True
        for b in self._it:
            if b.num_rows:
                self._pending = b
                return True
        self._pending = None
        return False

    def chunk(self) -> Iterator[pa.RecordBatch]:
        left = self._n
        while left > 0:
            if self._pending is None or self._pending.num_rows == 0:
                nxt = next(self._it, None)
                if nxt is None:
                    return
                self._pending = nxt
                continue
            b = self._pending
            if b.num_rows <= left:
                self._pending = None
                left -= b.num_rows
                yield b
            else:
                self._pending = b.slice(left)
                yield b.slice(0, left)
                left = 0

    def rest(self) -> Iterator[pa.RecordBatch]:
        """The rows not cut yet, as record batches (this cutter is spent after)."""
        if self._pending is not None and self._pending.num_rows:
            yield self._pending
        self._pending = None
        yield from self._it
