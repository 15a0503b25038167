"""Mode ``dedup``: how a partition's rows are cut into chunks, and what names each chunk.

A chunk is one INSERT, one block, one ``insert_deduplication_token``. The cut and the
token depend only on the partition's rows and their order (never on how they arrived
in record batches), so a retried or replayed attempt that sends the same rows sends
the same tokens, and ClickHouse drops the blocks it already holds
(:mod:`clickhouse_tx.modes.dedup` says how the mode uses them).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterator, Sequence

import pyarrow as pa


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
