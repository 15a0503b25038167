"""Mode ``dedup``: idempotent at-least-once with content-derived deduplication tokens.

prepare (executor, once per partition attempt)
    Cut the partition's rows into chunks of :data:`CHUNK_ROWS` rows, counted from the
    partition's first row (the cut depends only on the rows and their order, not on
    how they arrive in record batches), and INSERT each chunk straight into the
    target with ``insert_deduplication_token = <txn_id>:<batch>:<partition>:<h>:<k>``
    where ``h`` is a SHA-256 of the chunk's Arrow IPC bytes and ``k`` counts earlier
    chunks of the partition with the same ``h``. The token has no attempt number and
    no chunk number: a retried or replayed attempt that sends the same rows sends the
    same tokens (ClickHouse drops the duplicate blocks), and one that sends other
    rows sends other tokens (ClickHouse inserts them: a token never hides rows that
    were never inserted, which a positional ``partition:chunk_no`` token did).
    Before each chunk it checks, in one registry read and one ``system.parts``
    read, that its xid is still INITIALIZED (a fenced zombie inserts nothing more)
    and that fewer blocks than the dedup window were inserted into the table since
    its first chunk (else the first chunks' tokens may have left the window).
commit (driver)
    Check the window again (blocks inserted since the partition's first chunk), then
    write the marker (rows are visible since prepare).
rollback
    Cannot undo: rows already inserted stay.
lookup
    marker -> COMMITTED, otherwise PENDING (committing only writes the marker).

Needs a dedup window on the table: ``non_replicated_deduplication_window`` (0 =
off, the default) for MergeTree, ``replicated_deduplication_window`` for
Replicated tables; :meth:`DedupMode.validate` refuses a table without one.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from clickhouse_tx import sql as q
from clickhouse_tx.dead_letters import write_dead_letters
from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError, NotCommittedError
from clickhouse_tx.http_client import ClickHouseHTTP
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CountingBatches
from clickhouse_tx.modes import peek_schema
from clickhouse_tx.modes.base import ModeBase
from clickhouse_tx.schema import describe_table
from clickhouse_tx.state import TxState

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.registry import KeeperMapRegistry

log = logging.getLogger(__name__)

#: Rows per INSERT (and per deduplication token). Part of the protocol: a run and
#: its replay must cut at the same size, so it is not an option.
CHUNK_ROWS = 250_000


class DedupWindowError(ClickHouseTxError):
    """More blocks went into the table since a partition's first chunk than the dedup
    window holds: a replay could duplicate rows. Raise the window (docs/modes.md)."""


def chunk_digest(chunk: pa.RecordBatch) -> str:
    """SHA-256 of the chunk's Arrow IPC message: equal rows give equal digests.

    The IPC writer drops the validity bitmap of a column without nulls and truncates
    sliced buffers, so the bytes depend on the values, not on how the record batches
    that made the chunk were cut.
    """
    return hashlib.sha256(chunk.serialize()).hexdigest()[:32]


def dedup_token(txn_id: str, batch: int, partition: int, digest: str, occurrence: int = 0) -> str:
    """The ``insert_deduplication_token`` of one chunk: its content, not its position.

    ``occurrence`` counts earlier chunks of the partition with the same digest, so
    two equal chunks of one partition are both inserted.
    """
    return f"{txn_id}:{batch}:{partition}:{digest}:{occurrence}"


def max_block_number(client: ClickHouseHTTP, target: Target) -> int:
    """The table's highest block number: one more for every part an INSERT writes.

    Every part written (one per table partition an insert block touches) is one
    entry of the dedup window, so the difference of two readings bounds how many
    entries were added in between.
    """
    rows = client.query_json(
        "SELECT max(max_block_number) AS b FROM system.parts WHERE database = {d:String} "
        "AND table = {t:String}", params={"d": target.database, "t": target.table})
    return int(rows[0]["b"] or 0) if rows else 0


#: (url, database, table) -> (window, monotonic time read). Spark reuses Python
#: workers, so most prepares skip the three queries of describe_table (~70 ms here).
_WINDOWS: dict[tuple[str, str, str], tuple[int, float]] = {}
#: How long a window read stays good: an ALTER of the window is seen within this.
WINDOW_CACHE_S = 30.0


def dedup_window(client: ClickHouseHTTP, target: Target, *, fresh: bool = False) -> int:
    """The table's dedup window (replicated or not), in parts; read at most every 30 s."""
    key = (target.url, target.database, target.table)
    hit = _WINDOWS.get(key)
    if hit is not None and not fresh and time.monotonic() - hit[1] < WINDOW_CACHE_S:
        return hit[0]
    info = describe_table(client, target.database, target.table)
    window = info.replicated_dedup_window if info.is_replicated else info.non_replicated_dedup_window
    _WINDOWS[key] = (window, time.monotonic())
    return window


def ensure_window(client: ClickHouseHTTP, target: Target, first_block: int, xid: str) -> int:
    """Raise :class:`DedupWindowError` if the table's parts since ``first_block`` fill its
    window (a refusal is confirmed with a fresh read of the window); the current block."""
    block = max_block_number(client, target)
    try:
        check_window(first_block, block, dedup_window(client, target), target, xid)
    except DedupWindowError:
        check_window(first_block, block, dedup_window(client, target, fresh=True), target, xid)
    return block


def check_window(first_block: int, current_block: int, window: int, target: Target, xid: str) -> None:
    """Raise :class:`DedupWindowError` if the parts since ``first_block`` fill ``window``."""
    since = current_block - first_block
    if since >= window:
        raise DedupWindowError(
            f"{since} parts were inserted into {target.database}.{target.table} since this "
            f"partition's first chunk, and its dedup window holds {window}: the tokens of its "
            f"first chunks may have left the window, so a replay could duplicate rows. Raise it "
            f"(ALTER TABLE {q.qualified(target.database, target.table)} MODIFY SETTING "
            f"non_replicated_deduplication_window = {max(1000, 4 * since)}, or "
            "replicated_deduplication_window for a Replicated table) or write smaller batches",
            xid=xid)


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

    def __init__(self, chunk_rows: int = CHUNK_ROWS, registry: "KeeperMapRegistry | None" = None) -> None:
        self.chunk_rows = chunk_rows
        self.registry = registry

    def __eq__(self, other: object) -> bool:  # the registry is where, not what: not compared
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

    def _registry(self, target: Target) -> "KeeperMapRegistry":
        if self.registry is None:
            from clickhouse_tx.registry import KeeperMapRegistry

            self.registry = KeeperMapRegistry(target)
        return self.registry

    def _fence(self, target: Target, xid: str) -> None:
        """Refuse to insert once the xid left INITIALIZED (fenced by the driver or GC)."""
        entry = self._registry(target).get(xid)
        if entry is None or entry.state != TxState.INITIALIZED.value:
            state = "not registered" if entry is None else entry.state
            raise NotCommittedError(
                f"dedup insert refused: the registry says this attempt is {state}, so it was "
                "fenced (a newer attempt or the driver's abort replaced it)", xid=xid)

    def _committed_by(self, target: Target, ctx: WriteContext) -> str | None:
        """The xid whose marker says (txn, batch, partition) is committed, or None."""
        for m in self.markers(target).list(ctx.txn_id, ctx.batch):
            if int(m["partition"]) == ctx.partition:
                return str(m["xid"])
        return None

    def prepare(self, target: Target, ctx: WriteContext, xid: str,
                batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: INSERT chunk by chunk (visible at once).

        First one read of the markers: a partition already committed (a replay of a
        done batch, a late zombie) inserts nothing. Then per chunk: one registry read
        (the fence), one ``system.parts`` read (the window), one INSERT. Memory: one
        chunk.
        """
        done = self._committed_by(target, ctx)
        if done is not None:
            # A replay or zombie of a partition some attempt already committed: its
            # rows are in, and re-sending them would rely on the window still
            # holding their tokens. The committed xid wins, as in every mode.
            log.info("batch %d partition %d is committed by xid %s; xid %s inserts nothing",
                     ctx.batch, ctx.partition, done, xid)
            return self.prepared(target, ctx, xid, 0, 0, {"chunks": 0, "committed_by": done})
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        seen: collections.Counter[Any] = collections.Counter()
        first_block: int | None = None
        if schema is not None:
            cutter = Rechunker(counted, self.chunk_rows)
            with self.client(target) as c:
                while cutter.has_more():
                    # One record batch per INSERT: the server makes one block of each
                    # Arrow batch, so the blocks (and their dedup hashes) must not depend
                    # on how the rows arrived.
                    one = pa.concat_batches(list(cutter.chunk()))
                    digest = chunk_digest(one)
                    token = dedup_token(ctx.txn_id, ctx.batch, ctx.partition, digest, seen[digest])
                    seen[digest] += 1
                    self._fence(target, xid)
                    if first_block is None:
                        first_block = max_block_number(c, target)
                    else:
                        ensure_window(c, target, first_block, xid)
                    self._insert(c, target, schema, one, token)
        letters = self._dead_letters(target, ctx, xid, converted)
        return self.prepared(target, ctx, xid, counted.rows, counted.checksum,
                             {"chunks": sum(seen.values()), "chunk_rows": self.chunk_rows,
                              "first_block": first_block, "dead_letters": letters})

    def _dead_letters(self, target: Target, ctx: WriteContext, xid: str, converted: object) -> int:
        """Insert the partition's dead letters, visible at once like its rows.

        The token is made of their content, as the rows' are: a replay of the same rows
        is dropped as a duplicate, a replay under another partitioning is not swallowed.
        """
        letters = getattr(converted, "dead_letters", None)
        if not letters:
            return 0
        digest = hashlib.sha256("\n".join(d["row_json"] for d in letters).encode()).hexdigest()
        with self.client(target) as c:
            return write_dead_letters(c, converted, table=self.display(target), txn_id=ctx.txn_id,
                                      batch=ctx.batch, partition=ctx.partition, xid=xid,
                                      token=f"{ctx.txn_id}:{ctx.batch}:{ctx.partition}:dead_letters:{digest}")

    def _insert(self, c: ClickHouseHTTP, target: Target, schema: pa.Schema, one: pa.RecordBatch,
                token: str) -> None:
        c.insert_arrow_stream(self.target_sql(target), schema, iter([one]), settings={
            "insert_deduplicate": "1",
            "insert_deduplication_token": token,
            "min_insert_block_size_rows": str(self.chunk_rows),
            "min_insert_block_size_bytes": "0",
            "max_insert_block_size": str(self.chunk_rows),
        })

    def commit(self, target: Target, p: Prepared) -> None:
        """Driver, once per decided xid: check the window, then write the marker once.

        Raises
        ------
        DedupWindowError
            The table took as many parts as its dedup window since the partition's
            first chunk: the batch is not committed (no marker) and the error says
            how to raise the window.
        """
        markers = self.markers(target)
        if markers.lookup(p.xid) is not None:
            return
        first = p.details.get("first_block")
        if first is not None:
            with self.client(target) as c:
                ensure_window(c, target, int(first), p.xid)
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
