"""Mode ``dedup``: idempotent at-least-once with content-derived deduplication tokens.

prepare (executor, once per partition attempt)
    Cut the partition's rows into chunks of a size taken from its first rows
    (:class:`ChunkSizing`), counted from the partition's first row (the cut depends
    only on the rows and their order, not on how they arrive in record batches), and
    INSERT each chunk straight into the
    target with ``insert_deduplication_token = <txn_id>:<batch>:<partition>:<h>:<k>``
    where ``h`` is a SHA-256 of the chunk's Arrow IPC bytes and ``k`` counts earlier
    chunks of the partition with the same ``h``. The token has no attempt number and
    no chunk number: a retried or replayed attempt that sends the same rows sends the
    same tokens (ClickHouse drops the duplicate blocks), and one that sends other
    rows sends other tokens (ClickHouse inserts them: a token never hides rows that
    were never inserted, which a positional ``partition:chunk_no`` token did).
    Before each chunk it checks, in one read of the registry and ``system.parts``
    together, that its xid is still INITIALIZED (a fenced zombie inserts nothing more)
    and that fewer blocks than the dedup window were inserted into the table since
    its first chunk (else the first chunks' tokens may have left the window): counted
    per partition on a Replicated table, whose window also ends by age
    (:mod:`clickhouse_tx.modes.dedup.window`).
commit (driver)
    Check the window again (blocks inserted since the partition's first chunk), then
    write the marker (rows are visible since prepare). For the batch's partitions
    together first (:meth:`DedupMode.commit_together`: one markers read, one window
    check, one INSERT of every missing marker); what that leaves undone, xid by xid.
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
import concurrent.futures
import hashlib
import logging
from typing import TYPE_CHECKING, Iterator, Sequence

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.checksum import CountingBatches
from clickhouse_tx.conversion.dead_letters import write_dead_letters
from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError, DedupWindowError
from clickhouse_tx.interfaces import CommitOutcome, Hook, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes.base import ModeBase, distributed_hint, peek_schema
from clickhouse_tx.modes.dedup import claims as dedup_claims
from clickhouse_tx.modes.dedup.chunks import (
    ChunkSizing,
    chunk_digest,
    chunk_insert_settings,
    chunk_messages,
    cut_rows,
    dedup_token,
)
from clickhouse_tx.modes.dedup.records import ClaimRecords
from clickhouse_tx.modes.dedup.replay_guard import ReplayGuard
from clickhouse_tx.modes.dedup.window import (
    BlockPoint,
    earliest_first_points,
    ensure_view_windows,
    ensure_window,
    fence_and_blocks,
    points_from_details,
    points_to_details,
    view_targets,
)
from clickhouse_tx.modes.views import dependent_views

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.store.registry import KeeperMapRegistry

log = logging.getLogger(__name__)
#: How a partition is cut when no other sizing is given (tests pass small fixed chunks).
DEFAULT_SIZING = ChunkSizing()


class DedupMode(ModeBase):
    """Idempotent at-least-once: INSERT with deterministic dedup tokens."""

    mode = Mode.DEDUP

    def __init__(self, sizing: ChunkSizing = DEFAULT_SIZING, registry: "KeeperMapRegistry | None" = None) -> None:
        self.sizing = sizing
        self.registry = registry
        # Driver: xids of the batch being committed whose marker commit_together found
        # or wrote, so their per-xid commit needs no lookup (confirmed markers only).
        self._marked: set[str] = set()
        # Driver: the drop of earlier batches' layout records that check_layout started.
        self._housekeeping: "concurrent.futures.Future[None] | None" = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_housekeeping": None}  # a running drop stays with its process

    def __eq__(self, other: object) -> bool:  # the registry is where, not what: not compared
        return isinstance(other, DedupMode) and other.sizing == self.sizing

    def __hash__(self) -> int:
        return hash((DedupMode, self.sizing))

    def validate(self, target: Target, schema: pa.Schema, info: TableInfo | None = None) -> None:
        """Driver, once per query: table, schema, MergeTree family, a dedup window > 0."""
        info = self.described(target, schema, info)
        fq = self.target_sql(target)
        if not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'dedup' needs a *MergeTree "
                f"table (insert deduplication exists only there); use mode 'none'{distributed_hint(info)}"
            )
        if info.is_replicated:
            if info.replicated_dedup_window <= 0:
                raise ConfigurationError(
                    f"table {info.display} has replicated_deduplication_window = 0, so mode 'dedup' "
                    f"cannot drop repeated inserts: run ALTER TABLE {fq} MODIFY SETTING "
                    "replicated_deduplication_window = 1000"
                )
        elif info.non_replicated_dedup_window <= 0:
            raise ConfigurationError(
                f"table {info.display} has non_replicated_deduplication_window = 0 (the default: "
                "deduplication off), so mode 'dedup' cannot drop repeated inserts: run "
                f"ALTER TABLE {fq} MODIFY SETTING non_replicated_deduplication_window = 1000"
            )
        self._check_views(target)
        self.refuse_read_only(target, info)
        self.markers(target).ensure_table()

    def _check_views(self, target: Target) -> None:
        """Driver: every table the target's materialized views write into has a dedup window.

        The inserts run with ``deduplicate_blocks_in_dependent_materialized_views = 1``: a
        replayed block the target drops is dropped from each view's table too, by a token
        derived from the block's, but only by a table that keeps a window of them.
        """
        views = dependent_views(target)
        bad: dict[tuple[str, str], str] = {}
        for info in self.view_tables(target, views):
            replicated = info.is_replicated
            window = info.replicated_dedup_window if replicated else info.non_replicated_dedup_window
            if not info.is_merge_tree:
                bad[(info.database, info.table)] = f"{info.display} is {info.engine}, which has none"
            elif window <= 0:
                setting = f"{'' if replicated else 'non_'}replicated_deduplication_window"
                fix = f"ALTER TABLE {q.qualified(info.database, info.table)} MODIFY SETTING {setting} = 1000"
                bad[(info.database, info.table)] = f"{info.display} has {setting} = 0: run {fix}"
        if bad:
            raise self.views_error(
                target,
                [v for v in views if v.target in bad],
                "a replayed block is dropped from a view's table only within that table's own "
                f"deduplication window ({'; '.join(bad.values())})",
            )

    def _registry(self, target: Target) -> "KeeperMapRegistry":
        if self.registry is None:
            from clickhouse_tx.store.registry import KeeperMapRegistry

            self.registry = KeeperMapRegistry(target)
        return self.registry

    def _guard(self, target: Target) -> ReplayGuard:
        return ReplayGuard(ClaimRecords.beside(target, self._registry(target)))

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        """Driver, at the start of every commit of a batch, before its decision: seal the
        batch's layout (:meth:`ReplayGuard.seal`). Raises ``DedupLayoutError``.

        The drop of the earlier batches' records it starts runs beside the rest of the
        commit; :meth:`commit_together` (or the next commit) waits for it.
        """
        self._finish_housekeeping()
        self._housekeeping = self._guard(target).seal(batch, messages)

    def forget_batch(self, target: Target, txn_id: str, batch: int) -> int:
        """Driver, once a batch job is done (or aborted for good): drop its layout records."""
        return ClaimRecords.beside(target, self._registry(target)).forget_batch(txn_id, batch)

    def _finish_housekeeping(self) -> None:
        """Wait for the drop :meth:`check_layout` started, if any (it logs its own failure)."""
        if self._housekeeping is not None:
            self._housekeeping.result()
            self._housekeeping = None

    def _committed_by(self, target: Target, ctx: WriteContext) -> dict[int, str]:
        """The xid whose marker commits each partition of (txn, batch) that has one."""
        return {int(m["partition"]): str(m["xid"]) for m in self.markers(target).list(ctx.txn_id, ctx.batch)}

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: INSERT chunk by chunk (visible at once).

        First one read of the markers: a partition already committed (a replay of a
        done batch, a late zombie) inserts nothing. Before the first chunk, the layout
        check (:meth:`ReplayGuard.first_chunk`: a replay cut into other partitions is refused).
        Then per chunk: for every chunk after the first one layout record
        (:meth:`ReplayGuard.later_chunk`; a read before it while re-checking an earlier run's
        chunks), one read of the registry and ``system.parts`` together (the fence and
        the window, :func:`fence_and_blocks`), one INSERT; one more record past the last
        chunk (:meth:`_insert_chunks`).
        Memory: about one chunk.
        """
        marked = self._committed_by(target, ctx)
        if (done := marked.get(ctx.partition)) is None and marked:  # records may be gone: dedup_lifetime
            self._guard(target).check_records_left(ctx, marked, xid)
        if done is not None:
            # A replay or zombie of a partition some attempt already committed: its
            # rows are in, and re-sending them would rely on the window still
            # holding their tokens. The committed xid wins, as in every mode.
            log.info(
                "batch %d partition %d is committed by xid %s; xid %s inserts nothing",
                ctx.batch,
                ctx.partition,
                done,
                xid,
            )
            return self.prepared(target, ctx, xid, 0, 0, {"chunks": 0, "committed_by": done, "run": ctx.run})
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        first_views: dict[str, BlockPoint] = {}
        chunks, rows, first_block, first = 0, 0, None, ""
        if schema is not None:
            chunks, rows, first_block, first, first_views = self._insert_chunks(target, ctx, xid, schema, counted)
        letters = self._dead_letters(target, ctx, xid, converted)
        return self.prepared_counted(
            target,
            ctx,
            xid,
            counted,
            {
                "chunks": chunks,
                "chunk_rows": rows,
                "first_block": None if first_block is None else first_block.to_details(),
                "first_view_blocks": points_to_details(first_views),
                "first_chunk": first,
                "dead_letters": letters,
                "run": ctx.run,  # the driver's seal: did this run reach the batch first?
            },
        )

    def _insert_chunks(
        self, target: Target, ctx: WriteContext, xid: str, schema: pa.Schema, batches: Iterator[pa.RecordBatch]
    ) -> tuple[int, int, BlockPoint | None, str, dict[str, BlockPoint]]:
        """Executor, inside :meth:`prepare`: each chunk's checks, then its INSERT.

        The chunk size comes from the partition's first rows (:class:`ChunkSizing`).
        Per chunk, in this order: its layout check (:meth:`ReplayGuard.first_chunk` for the
        first, :meth:`ReplayGuard.later_chunk` after), the fence, the window, its INSERT.
        Returns (chunks inserted, rows per chunk, the table's point before the first
        chunk, first chunk's fingerprint, the point of each view's table then). Memory: one chunk's IPC
        messages, and one message's rows while it is built.
        """
        seen: collections.Counter[str] = collections.Counter()
        first_block: BlockPoint | None = None
        first = ""
        chunks = 0  # inserted so far: the number of the next chunk
        catching_up = False  # re-checking an earlier run's chunks of this partition
        rows, cutter = cut_rows(batches, self.sizing)
        views = view_targets(target)
        first_views: dict[str, BlockPoint] = {}
        with self.client(target) as c:
            while cutter.has_more():
                # One block per INSERT, named by the token: the server squashes the
                # messages into one (min_insert_block_size_rows). The messages are cut
                # from the chunk's first row, so the digest does not depend on how the
                # rows arrived.
                n, messages = chunk_messages(cutter.chunk(), self.sizing.message_rows)
                digest = chunk_digest(messages)
                fingerprint = f"{n}:{digest}"
                # The layout checks may wait at the barrier: fence after them.
                if chunks == 0:
                    first = fingerprint
                    catching_up = self._guard(target).first_chunk(ctx, first, xid)
                else:
                    catching_up = self._guard(target).later_chunk(ctx, chunks, fingerprint, xid, catching_up)
                block, *now_views = fence_and_blocks(c, self._registry(target), xid, [target, *views])
                if first_block is None:
                    first_block, first_views = block, {f"{v.database}.{v.table}": b for v, b in zip(views, now_views)}
                else:
                    ensure_window(c, target, first_block, xid, block)
                    ensure_view_windows(c, views, first_views, xid, now_views)
                token = dedup_token(ctx.txn_id, ctx.batch, ctx.partition, digest, seen[digest])
                self._insert(c, target, schema, messages, token, n)
                seen[digest] += 1
                chunks += 1
        if chunks:  # a replay longer or shorter than this partition differs here
            self._guard(target).later_chunk(ctx, chunks, dedup_claims.END, xid, catching_up)
        return chunks, rows, first_block, first, first_views

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
            token = f"{ctx.txn_id}:{ctx.batch}:{ctx.partition}:dead_letters:{digest}"
            return write_dead_letters(c, converted, table=self.display(target), ctx=ctx, xid=xid, token=token)

    def _insert(
        self, c: ClickHouseHTTP, target: Target, schema: pa.Schema, messages: Sequence[pa.Buffer], token: str, rows: int
    ) -> None:
        """INSERT one chunk's ``rows`` rows (serialized record batches) as one block under ``token``."""
        c.insert_arrow_messages(
            self.target_sql(target),
            schema,
            messages,
            rows=rows,
            may_deduplicate=True,
            settings=chunk_insert_settings(token, rows),
        )

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Driver, once per commit of a batch, after the decision, before the per-xid commits.

        One markers read for the batch, one window check for the partitions without a
        marker (the oldest first block decides for all), and one INSERT of their markers:
        three requests instead of three per xid. It only saves round trips: a full
        window, or any error (the INSERT's outcome unknown included), leaves the
        partitions to :meth:`commit`, which raises :class:`DedupWindowError` or looks the
        marker up before writing it, as it always did. ``before_commit`` runs right before
        the INSERT (a fault step of the tests).
        """
        self._marked = set()  # one batch's at a time
        try:
            markers = self.markers(target)
            done = {str(m["xid"]) for m in markers.list(ps[0].txn_id, ps[0].batch)}
            todo = [p for p in ps if p.xid not in done]
            self._marked.update(p.xid for p in ps if p.xid in done)
            if not todo or not self._windows_hold(target, todo):
                return
            markers.ensure_table()
            if before_commit is not None:
                before_commit()
            markers.client.command(markers.insert_sql(*todo))
        except ClickHouseTxError as exc:
            log.info("batch %d: markers not written together (%s); writing them one by one", ps[0].batch, exc)
            return
        finally:
            self._finish_housekeeping()
        self._marked.update(p.xid for p in todo)

    def _windows_hold(self, target: Target, ps: Sequence[Prepared]) -> bool:
        """True if the dedup window still holds the first chunk of every ``p``."""
        first, oldest = earliest_first_points([p.details for p in ps])
        if first is None:
            return True
        with self.client(target) as c:
            try:
                ensure_window(c, target, first, ps[0].xid)
                ensure_view_windows(c, view_targets(target), oldest, ps[0].xid)
            except DedupWindowError:
                return False
        return True

    def commit(self, target: Target, p: Prepared) -> None:
        """Driver, once per decided xid: check the window, then write the marker once.

        Nothing to do for an xid whose marker :meth:`commit_together` found or wrote.

        Raises
        ------
        DedupWindowError
            The table took as many parts as its dedup window since the partition's
            first chunk: the batch is not committed (no marker) and the error says
            how to raise the window.
        """
        if p.xid in self._marked:
            return
        markers = self.markers(target)
        if markers.lookup(p.xid) is not None:
            return
        first = p.details.get("first_block")
        if first is not None:
            with self.client(target) as c:
                ensure_window(c, target, BlockPoint.from_details(first), p.xid)
                ensure_view_windows(
                    c, view_targets(target), points_from_details(p.details.get("first_view_blocks")), p.xid
                )
        markers.ensure_table()
        markers.insert(p)

    def rollback(self, target: Target, p: Prepared) -> None:
        """Cannot undo inserted rows: a replay re-sends the same tokens and is deduplicated."""
        log.info("mode dedup cannot roll back xid %s; its rows stay (at-least-once, idempotent)", p.xid)

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """COMMITTED when the marker exists, else PENDING (commit just writes it)."""
        if self.markers(target).lookup(p.xid) is not None:
            return CommitOutcome.COMMITTED
        return CommitOutcome.PENDING
