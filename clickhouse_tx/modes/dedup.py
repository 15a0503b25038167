"""Mode ``dedup``: idempotent at-least-once with deterministic deduplication tokens.

prepare (executor, once per partition attempt)
    Cut the rows into chunks of a fixed number of rows (:data:`CHUNK_ROWS`; the cut
    depends only on the order of the rows, not on how they arrive in record
    batches) and INSERT each chunk straight into the target with
    ``insert_deduplication_token = "<txn_id>:<batch>:<partition>:<chunk_no>"``.
    The token has no attempt number: a retried or replayed attempt of the same
    partition produces the same tokens and ClickHouse drops the duplicate blocks.
    Each chunk is sent as ONE Arrow record batch (the server makes a block of each
    batch it reads, and the dedup hash is per block), with squashing pinned to the
    chunk size, so a chunk becomes the same block(s) every time. Memory: one chunk.
commit (driver)
    Write the marker (rows are visible since prepare).
rollback
    Cannot undo: rows already inserted stay. This mode is at-least-once made
    idempotent by the tokens; it is exactly-once only when a replay re-sends the
    same rows in the same partitions and order, within the dedup window.
lookup
    marker -> COMMITTED, otherwise PENDING (committing only writes the marker).

Needs a dedup window on the table: ``non_replicated_deduplication_window`` (0 =
off, the default) for MergeTree, ``replicated_deduplication_window`` for
Replicated tables; :meth:`DedupMode.validate` refuses a table without one.
"""

from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa

from clickhouse_tx.dead_letters import write_dead_letters
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.http_client import ClickHouseHTTP
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CountingBatches
from clickhouse_tx.modes import peek_schema
from clickhouse_tx.modes.base import ModeBase

log = logging.getLogger(__name__)

#: Rows per INSERT (and per deduplication token).
CHUNK_ROWS = 250_000


def dedup_token(txn_id: str, batch: int, partition: int, chunk_no: int) -> str:
    """The deterministic ``insert_deduplication_token`` of one chunk."""
    return f"{txn_id}:{batch}:{partition}:{chunk_no}"


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


class DedupMode(ModeBase):
    """Idempotent at-least-once: INSERT with deterministic dedup tokens."""

    mode = Mode.DEDUP

    def __init__(self, chunk_rows: int = CHUNK_ROWS) -> None:
        self.chunk_rows = chunk_rows

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DedupMode) and other.chunk_rows == self.chunk_rows

    def __hash__(self) -> int:
        return hash((DedupMode, self.chunk_rows))

    def validate(self, target: Target, schema: pa.Schema) -> None:
        """Driver, once per query: table, schema, MergeTree family, a dedup window > 0."""
        info = self.describe_and_check(target, schema)
        fq = self.target_sql(target)
        if not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'dedup' needs a *MergeTree "
                "table (insert deduplication exists only there); use mode 'none'")
        if info.is_replicated:
            if info.replicated_dedup_window <= 0:
                raise ConfigurationError(
                    f"table {info.display} has replicated_deduplication_window = 0, so mode 'dedup' "
                    f"cannot drop repeated inserts: run ALTER TABLE {fq} MODIFY SETTING "
                    "replicated_deduplication_window = 1000")
        elif info.non_replicated_dedup_window <= 0:
            raise ConfigurationError(
                f"table {info.display} has non_replicated_deduplication_window = 0 (the default: "
                "deduplication off), so mode 'dedup' cannot drop repeated inserts: run "
                f"ALTER TABLE {fq} MODIFY SETTING non_replicated_deduplication_window = 1000")
        self.markers(target).ensure_table()

    def prepare(self, target: Target, ctx: WriteContext, xid: str,
                batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor: INSERT chunk by chunk with deterministic tokens (visible at once)."""
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        chunks = 0
        with self.client(target) as c:
            if schema is not None:
                cutter = Rechunker(counted, self.chunk_rows)
                while cutter.has_more():
                    self._insert_chunk(c, target, schema, pa.concat_batches(list(cutter.chunk())),
                                       dedup_token(ctx.txn_id, ctx.batch, ctx.partition, chunks))
                    chunks += 1
            # Visible at once like the rows; the token makes a replay's copy a no-op.
            letters = write_dead_letters(c, converted, table=self.display(target), txn_id=ctx.txn_id,
                                         batch=ctx.batch, partition=ctx.partition, xid=xid,
                                         token=f"{ctx.txn_id}:{ctx.batch}:{ctx.partition}:dead_letters")
        return self.prepared(target, ctx, xid, counted.rows, counted.checksum,
                             {"chunks": chunks, "chunk_rows": self.chunk_rows, "dead_letters": letters,
                              "token_prefix": f"{ctx.txn_id}:{ctx.batch}:{ctx.partition}:"})

    def _insert_chunk(self, c: ClickHouseHTTP, target: Target, schema: pa.Schema,
                      one: pa.RecordBatch, token: str) -> None:
        # One record batch per INSERT: the server makes one block of each Arrow batch,
        # so the blocks (and their dedup hashes) must not depend on how the rows
        # arrived. Memory: one chunk.
        c.insert_arrow_stream(self.target_sql(target), schema, iter([one]), settings={
            "insert_deduplicate": "1",
            "insert_deduplication_token": token,
            "min_insert_block_size_rows": str(self.chunk_rows),
            "min_insert_block_size_bytes": "0",
            "max_insert_block_size": str(self.chunk_rows),
        })

    def commit(self, target: Target, p: Prepared) -> None:
        """Driver: write the marker once (rows are already in)."""
        markers = self.markers(target)
        if markers.lookup(p.xid) is None:
            markers.ensure_table()
            markers.insert(p)

    def rollback(self, target: Target, p: Prepared) -> None:
        """Cannot undo inserted rows: a replay re-sends the same tokens and is deduplicated."""
        log.info("mode dedup cannot roll back xid %s; its rows stay (at-least-once, idempotent)",
                 p.xid)

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """COMMITTED when the marker exists, else PENDING (commit just writes it)."""
        if self.markers(target).lookup(p.xid) is not None:
            return CommitOutcome.COMMITTED
        return CommitOutcome.PENDING
