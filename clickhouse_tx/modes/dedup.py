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
    Before each chunk it checks, in one registry read and one ``system.parts``
    read, that its xid is still INITIALIZED (a fenced zombie inserts nothing more)
    and that fewer blocks than the dedup window were inserted into the table since
    its first chunk (else the first chunks' tokens may have left the window).
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
import dataclasses
import hashlib
import itertools
import logging
import time
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx import sql as q
from clickhouse_tx._transport import ClickHouseHTTP
from clickhouse_tx.dead_letters import write_dead_letters
from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError, NotCommittedError
from clickhouse_tx.interfaces import CommitOutcome, Hook, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CountingBatches
from clickhouse_tx.modes import dedup_layout
from clickhouse_tx.modes.base import ModeBase, peek_schema
from clickhouse_tx.modes.dedup_layout import (
    Claim,
    DedupLayoutError,
    LayoutRecords,
    barrier,
    check_chunk,
    check_messages,
    check_partition,
    layout_of,
    run_claim,
)
from clickhouse_tx.schema import describe_table
from clickhouse_tx.state import TxState
from clickhouse_tx.views import dependent_views, view_tables

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.registry import KeeperMapRegistry

log = logging.getLogger(__name__)


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


class DedupWindowError(ClickHouseTxError):
    """More blocks went into the table since a partition's first chunk than the dedup
    window holds: a replay could duplicate rows. Raise the window (docs/modes.md)."""


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


def max_block_number(client: ClickHouseHTTP, target: Target) -> int:
    """The table's highest block number: one more for every part an INSERT writes.

    Every part written (one per table partition an insert block touches) is one
    entry of the dedup window, so the difference of two readings bounds how many
    entries were added in between.
    """
    rows = client.query_json(
        "SELECT max(max_block_number) AS b FROM system.parts WHERE database = {d:String} AND table = {t:String}",
        params={"d": target.database, "t": target.table},
    )
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
            xid=xid,
        )


#: (url, database, table) -> (the tables its materialized views write into, monotonic time read).
_VIEW_TABLES: dict[tuple[str, str, str], tuple[tuple[tuple[str, str], ...], float]] = {}


def view_targets(target: Target) -> list[Target]:
    """The tables the target's materialized views write into (down chains), as Targets; read at most every 30 s.

    Executor (each prepare) and driver (each commit): their dedup windows are checked as
    the target's is, since a replayed block is dropped from a view's table only while
    the view's token is still in that table's window.
    """
    key = (target.url, target.database, target.table)
    hit = _VIEW_TABLES.get(key)
    if hit is None or time.monotonic() - hit[1] >= WINDOW_CACHE_S:
        hit = (tuple(view_tables(dependent_views(target))), time.monotonic())
        _VIEW_TABLES[key] = hit
    return [dataclasses.replace(target, database=d, table=t) for d, t in hit[0]]


def view_blocks(client: ClickHouseHTTP, views: Sequence[Target]) -> dict[str, int]:
    """``db.table`` -> :func:`max_block_number` of each view's table (the first blocks of a partition)."""
    return {f"{v.database}.{v.table}": max_block_number(client, v) for v in views}


def ensure_view_windows(client: ClickHouseHTTP, views: Sequence[Target], first: Mapping[str, object], xid: str) -> None:
    """:func:`ensure_window` for each view's table whose first block ``first`` holds."""
    for v in views:
        block = first.get(f"{v.database}.{v.table}")
        if block is not None:
            ensure_window(client, v, int(str(block)), xid)


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


class DedupMode(ModeBase):
    """Idempotent at-least-once: INSERT with deterministic dedup tokens."""

    mode = Mode.DEDUP

    def __init__(self, sizing: ChunkSizing = ChunkSizing(), registry: "KeeperMapRegistry | None" = None) -> None:
        self.sizing = sizing
        self.registry = registry
        # Driver: xids of the batch being committed whose marker commit_together found
        # or wrote, so their per-xid commit needs no lookup (confirmed markers only).
        self._marked: set[str] = set()

    def __eq__(self, other: object) -> bool:  # the registry is where, not what: not compared
        return isinstance(other, DedupMode) and other.sizing == self.sizing

    def __hash__(self) -> int:
        return hash((DedupMode, self.sizing))

    def validate(self, target: Target, schema: pa.Schema) -> None:
        """Driver, once per query: table, schema, MergeTree family, a dedup window > 0."""
        info = self.describe_and_check(target, schema)
        fq = self.target_sql(target)
        if not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'dedup' needs a *MergeTree "
                "table (insert deduplication exists only there); use mode 'none'"
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
                "fenced (a newer attempt or the driver's abort replaced it)",
                xid=xid,
            )

    def _layouts(self, target: Target) -> LayoutRecords:
        return LayoutRecords.beside(target, self._registry(target))

    def _check_layout(self, target: Target, ctx: WriteContext, first: str, xid: str) -> bool:
        """Executor, before a partition's first chunk: refuse a batch cut otherwise.

        One scan of the batch's records (its seal and claims); before the batch's first
        commit, one claim of this partition (create-if-absent) and, for a partition no
        earlier run claimed, reads of the batch's claims until every one is caught up
        by this run (:func:`~clickhouse_tx.modes.dedup_layout.barrier`). Returns True
        when an earlier run inserted this partition and this attempt has still to
        re-check its later chunks (:meth:`_check_chunk`). Raises
        :class:`DedupLayoutError`.
        """
        records = self._layouts(target)
        try:
            sealed, claims = records.of_batch(ctx.txn_id, ctx.batch)
            check_partition(ctx.txn_id, ctx.batch, ctx.partition, first, sealed, None)
            # Once sealed, the sealing run had finished every partition (each has its
            # ``end``): every later chunk of a replay is bound by a record.
            return False if sealed is not None else self._claim(records, ctx, first, claims)
        except DedupLayoutError as exc:
            exc.xid = xid  # the task fails with this error as it is, not wrapped
            raise

    def _check_chunk(
        self, target: Target, ctx: WriteContext, chunk: int, fingerprint: str, xid: str, catching_up: bool
    ) -> bool:
        """Executor, before each chunk after the first (and once past the last): refuse a
        partition whose chunk differs from the one an earlier attempt recorded there.

        The record is made just before the chunk's insert, so it binds a replay from the
        moment its rows may be in the table: one create-if-absent per chunk (a read too
        when an earlier attempt recorded it). While ``catching_up`` (an earlier run
        inserted this partition) the record is read first; where the earlier runs
        recorded nothing, this partition is caught up, and the chunk waits at the barrier
        before its record is made. Returns the new ``catching_up``. Raises
        :class:`DedupLayoutError`.
        """
        records, where = self._layouts(target), (ctx.txn_id, ctx.batch, ctx.partition)
        try:
            if catching_up:
                recorded = records.recorded_chunk(*where, chunk)
                if recorded is not None:
                    self._compare_chunk(records, ctx, chunk, fingerprint, recorded)
                    if recorded != dedup_layout.END:
                        return True  # bound by the earlier run's record: still re-checking
                self._set_claim(records, ctx, caught_up=ctx.run)
                if recorded is not None:
                    return False  # the earlier run's end: nothing follows
                if fingerprint != dedup_layout.END and ctx.run:
                    self._wait_for_earlier_claims(records, ctx, chunk)
            recorded = records.chunk(*where, chunk, fingerprint, ctx.run)
            self._compare_chunk(records, ctx, chunk, fingerprint, recorded)
            return False
        except DedupLayoutError as exc:
            exc.xid = xid
            raise

    def _compare_chunk(self, records: LayoutRecords, ctx: WriteContext, chunk: int, mine: str, recorded: str) -> None:
        """:func:`check_chunk`; a refusal marks the claim refused by this run, so the barrier's waiters stop."""
        try:
            check_chunk(ctx.txn_id, ctx.batch, ctx.partition, chunk, mine, recorded)
        except DedupLayoutError:
            try:
                self._set_claim(records, ctx, refused_by=ctx.run)
            except ClickHouseTxError as exc:  # the waiters then time out instead: still refused
                log.info("could not mark partition %d refused: %s", ctx.partition, exc)
            raise

    @staticmethod
    def _set_claim(records: LayoutRecords, ctx: WriteContext, **fields: str) -> None:
        """Add ``fields`` to the partition's claim (the last writer wins)."""
        where = (ctx.txn_id, ctx.batch, ctx.partition)
        claim = records.claim_of(*where)
        if claim is not None:
            records.update(*where, {**claim, **fields})

    def _claim(self, records: LayoutRecords, ctx: WriteContext, first: str, claims: Mapping[int, Claim]) -> bool:
        """Claim this partition before its first insert (see :mod:`~clickhouse_tx.modes.dedup_layout`).

        ``claims``: the batch's claims, read just before. A claim under which rows were
        inserted must hold this attempt's first chunk (else refused, and marked so for
        this run's other tasks); one under which nothing was inserted (its task was
        refused or died waiting) is taken over. A partition without an inserted claim
        waits at the barrier, then marks its own inserted and caught up. Returns True
        when an earlier run inserted the partition and this run has not yet re-checked
        all of it.
        """
        where = (ctx.txn_id, ctx.batch, ctx.partition)
        # With nothing to wait for, the claim is created already marked: one request
        # instead of the wait's read and the mark's two. The barrier's read (``claims``)
        # still comes before the mark, the write the other partitions' barriers look for.
        through = self._through_barrier(ctx, claims)
        mine = run_claim(first, ctx.run, inserted=through)
        claim = records.claim(*where, mine)
        if through and claim == mine:
            return False
        if claim.get("inserted"):
            if claim.get("first") != first:
                records.update(*where, {**claim, "refused_by": ctx.run})
                check_partition(*where, first, None, str(claim.get("first")))
            if claim.get("run") != ctx.run:
                # An earlier run's rows, the same as this attempt's: deduplicated by their
                # tokens. The claim is this run's now; caught up once its chunks are re-checked.
                records.update(*where, {**claim, "run": ctx.run})
            return claim.get("caught_up") != ctx.run
        unmarked = run_claim(first, ctx.run, inserted=False)
        if dict(claim) != unmarked:
            records.update(*where, unmarked)
        if ctx.run:
            self._wait_for_earlier_claims(records, ctx)
        records.update(*where, run_claim(first, ctx.run, inserted=True))
        return False

    @staticmethod
    def _through_barrier(ctx: WriteContext, claims: Mapping[int, Claim]) -> bool:
        """True when ``claims`` leave this partition nothing to wait for (always, without a run id).

        A refusal the barrier would raise is left to :meth:`_wait_for_earlier_claims`,
        which raises it after the claim is made, as for a partition that waits.
        """
        if not ctx.run:
            return True
        try:
            return not barrier(ctx.txn_id, ctx.batch, ctx.partition, ctx.run, claims)
        except DedupLayoutError:
            return False

    @staticmethod
    def _wait_for_earlier_claims(records: LayoutRecords, ctx: WriteContext, chunk: int = 0) -> None:
        """Until every inserted claim of the batch is caught up by this run (one registry scan per 0.5 s)."""
        deadline = time.monotonic() + dedup_layout.WAIT_S
        while True:
            waiting = barrier(ctx.txn_id, ctx.batch, ctx.partition, ctx.run, records.claims(ctx.txn_id, ctx.batch))
            if not waiting:
                return
            if time.monotonic() >= deadline:
                what = f"chunk {chunk} of partition {ctx.partition}" if chunk else f"partition {ctx.partition}"
                raise DedupLayoutError(
                    f"batch {ctx.batch} of {ctx.txn_id}, {what}: an earlier run inserted partitions "
                    f"{waiting} of this batch and stopped before its commit, and this run's attempts "
                    f"of them did not show within {dedup_layout.WAIT_S:.0f} s that they hold the same "
                    "rows (queued behind this task, or cut otherwise). The rows no earlier record "
                    "binds were not inserted; a retry of the task waits again. "
                    f"{dedup_layout.way_out(ctx.txn_id)}"
                )
            time.sleep(0.5)

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        """Driver, at the start of every commit of a batch, before its decision.

        Compares this run's messages with the batch's seal (or, before the first commit,
        with its partitions' claims), then seals the batch's layout, so a replay that cuts
        it otherwise is refused by its executors before they insert. Drops the records
        of the query's earlier batches (Spark replays none of them). One scan of the
        query's records reads the seal, the claims and the earlier batches' keys.
        Raises :class:`DedupLayoutError` (nothing is committed).
        """
        if not messages:
            return
        txn_id = messages[0].txn_id
        records = self._layouts(target)
        now = layout_of(messages)
        sealed, claims, earlier = records.at_commit(txn_id, batch)
        check_messages(txn_id, batch, now, sealed, claims if sealed is None else {})
        if sealed is None:
            check_messages(txn_id, batch, now, records.seal(txn_id, batch, now), {})
        try:
            records.forget(earlier)
        except ClickHouseTxError as exc:  # housekeeping never fails a commit
            log.info("could not drop the layout records before batch %d: %s", batch, exc)

    def _committed_by(self, target: Target, ctx: WriteContext) -> str | None:
        """The xid whose marker says (txn, batch, partition) is committed, or None."""
        for m in self.markers(target).list(ctx.txn_id, ctx.batch):
            if int(m["partition"]) == ctx.partition:
                return str(m["xid"])
        return None

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: INSERT chunk by chunk (visible at once).

        First one read of the markers: a partition already committed (a replay of a
        done batch, a late zombie) inserts nothing. Before the first chunk, the layout
        check (:meth:`_check_layout`: a replay cut into other partitions is refused).
        Then per chunk: for every chunk after the first one layout record
        (:meth:`_check_chunk`; a read before it while re-checking an earlier run's
        chunks), one registry read (the fence), one ``system.parts`` read (the window),
        one INSERT; one more record past the last chunk (:meth:`_insert_chunks`).
        Memory: about one chunk.
        """
        done = self._committed_by(target, ctx)
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
            return self.prepared(target, ctx, xid, 0, 0, {"chunks": 0, "committed_by": done})
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        first_views: dict[str, int] = {}
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
                "first_block": first_block,
                "first_view_blocks": first_views,
                "first_chunk": first,
                "dead_letters": letters,
            },
        )

    def _insert_chunks(
        self, target: Target, ctx: WriteContext, xid: str, schema: pa.Schema, batches: Iterator[pa.RecordBatch]
    ) -> tuple[int, int, int | None, str, dict[str, int]]:
        """Executor, inside :meth:`prepare`: each chunk's checks, then its INSERT.

        The chunk size comes from the partition's first rows (:class:`ChunkSizing`).
        Per chunk, in this order: its layout check (:meth:`_check_layout` for the
        first, :meth:`_check_chunk` after), the fence, the window, its INSERT.
        Returns (chunks inserted, rows per chunk, first block, first chunk's
        fingerprint, the first block of each view's table). Memory: one chunk's IPC
        messages, and one message's rows while it is built.
        """
        seen: collections.Counter[str] = collections.Counter()
        first_block: int | None = None
        first = ""
        chunks = 0  # inserted so far: the number of the next chunk
        catching_up = False  # re-checking an earlier run's chunks of this partition
        rows, cutter = self._cut(batches)
        views = view_targets(target)
        first_views: dict[str, int] = {}
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
                    catching_up = self._check_layout(target, ctx, first, xid)
                else:
                    catching_up = self._check_chunk(target, ctx, chunks, fingerprint, xid, catching_up)
                self._fence(target, xid)
                if first_block is None:
                    first_block, first_views = max_block_number(c, target), view_blocks(c, views)
                else:
                    ensure_window(c, target, first_block, xid)
                    ensure_view_windows(c, views, first_views, xid)
                token = dedup_token(ctx.txn_id, ctx.batch, ctx.partition, digest, seen[digest])
                self._insert(c, target, schema, messages, token, rows)
                seen[digest] += 1
                chunks += 1
        if chunks:  # a replay longer or shorter than this partition differs here
            self._check_chunk(target, ctx, chunks, dedup_layout.END, xid, catching_up)
        return chunks, rows, first_block, first, first_views

    def _cut(self, batches: Iterator[pa.RecordBatch]) -> tuple[int, Rechunker]:
        """Rows per chunk, from the partition's first ``sizing.sample_rows`` rows, and the cutter of all its rows."""
        head = Rechunker(batches, self.sizing.sample_rows)
        if not head.has_more():
            return self.sizing.min_rows, head
        sample = pa.concat_batches(list(head.chunk()))
        rows = self.sizing.rows_for(sample.num_rows, sample.serialize().size)
        return rows, Rechunker(itertools.chain([sample], head.rest()), rows)

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
        """INSERT one chunk's serialized record batches as one block under ``token``."""
        c.insert_arrow_messages(
            self.target_sql(target),
            schema,
            messages,
            settings={
                "insert_deduplicate": "1",
                "insert_deduplication_token": token,
                # The target's materialized views drop a replayed block too (their tables'
                # windows are checked with the target's); the default differs by version.
                "deduplicate_blocks_in_dependent_materialized_views": "1",
                "min_insert_block_size_rows": str(rows),
                "min_insert_block_size_bytes": "0",
                "max_insert_block_size": str(rows),
            },
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
        self._marked.update(p.xid for p in todo)

    def _windows_hold(self, target: Target, ps: Sequence[Prepared]) -> bool:
        """True if the dedup window still holds the first chunk of every ``p``."""
        firsts = [int(p.details["first_block"]) for p in ps if p.details.get("first_block") is not None]
        if not firsts:
            return True
        oldest: dict[str, int] = {}  # per view's table, the oldest first block of the batch
        for p in ps:
            for name, block in dict(p.details.get("first_view_blocks") or {}).items():
                oldest[name] = min(int(block), oldest.get(name, int(block)))
        with self.client(target) as c:
            try:
                ensure_window(c, target, min(firsts), ps[0].xid)
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
                ensure_window(c, target, int(first), p.xid)
                ensure_view_windows(c, view_targets(target), dict(p.details.get("first_view_blocks") or {}), p.xid)
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
