"""Mode ``dedup``: an attempt's steps on the claims, refusing a replay that cut the batch otherwise.

The records and the pure checks are :mod:`clickhouse_tx.modes.dedup.claims`; this is
when each is made or read. The executor calls :meth:`ReplayGuard.first_chunk` before
a partition's first chunk and :meth:`ReplayGuard.later_chunk` before each later chunk
(and once past the last); the driver calls :meth:`ReplayGuard.seal` at the start of
every commit of a batch. Each raises :class:`~clickhouse_tx.modes.dedup.claims.DedupLayoutError`
(nothing more is inserted or committed).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Mapping, Sequence

from clickhouse_tx.errors import ClickHouseTxError, DedupLayoutError
from clickhouse_tx.interfaces import Prepared, WriteContext
from clickhouse_tx.modes.dedup import claims as dedup_claims
from clickhouse_tx.modes.dedup.claims import (
    Claim,
    Part,
    barrier,
    check_chunk,
    check_messages,
    check_partition,
    layout_of,
    run_claim,
)
from clickhouse_tx.modes.dedup.lifetime import records_gone_error
from clickhouse_tx.modes.dedup.records import ClaimRecords

log = logging.getLogger(__name__)
#: Runs the drop of a query's earlier layout records beside the rest of a commit (one at a time).
_HOUSEKEEPING = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="layout-forget")


class ReplayGuard:
    """The claim steps of one target's dedup batches, over its :class:`ClaimRecords`.

    Built per call by :class:`~clickhouse_tx.modes.dedup.mode.DedupMode` (on the executor
    and on the driver); holds no state of its own beyond the records' client.
    """

    def __init__(self, records: ClaimRecords) -> None:
        self.records = records

    def first_chunk(self, ctx: WriteContext, first: str, xid: str) -> bool:
        """Executor, before a partition's first chunk: refuse a batch cut otherwise.

        The batch's seal and the claims its barrier must see (:meth:`_batch_view`: a
        point read in a batch this run reached first, else a scan); before the batch's first
        commit, one claim of this partition (create-if-absent) and, for a partition no
        earlier run claimed, reads of the batch's claims until every one is caught up
        by this run (:func:`~clickhouse_tx.modes.dedup.claims.barrier`). Returns True
        when an earlier run inserted this partition and this attempt has still to
        re-check its later chunks (:meth:`later_chunk`). Raises
        :class:`DedupLayoutError`.
        """
        records = self.records
        try:
            sealed, claims = self._batch_view(ctx)
            check_partition(ctx.txn_id, ctx.batch, ctx.partition, first, sealed, None)
            # Once sealed, the sealing run had finished every partition (each has its
            # ``end``): every later chunk of a replay is bound by a record.
            return False if sealed is not None else self._claim(records, ctx, first, claims)
        except DedupLayoutError as exc:
            exc.xid = xid  # the task fails with this error as it is, not wrapped
            raise

    def check_records_left(self, ctx: WriteContext, marked: Mapping[int, str], xid: str) -> None:
        """Executor, before a partition's first chunk, when other partitions of its batch are
        committed and this one is not: refuse it if the batch's records are gone (no seal),
        since nothing is left to compare it with (:func:`~clickhouse_tx.modes.dedup.lifetime.records_gone_error`).
        One point read; a batch mid-commit holds its seal and is checked against it as before."""
        if not self.records.sealed(ctx.txn_id, ctx.batch):
            exc = records_gone_error(ctx.txn_id, ctx.batch, ctx.partition, marked)
            exc.xid = xid
            raise exc

    def _batch_view(self, ctx: WriteContext) -> tuple[dict[int, Part] | None, Mapping[int, Claim]]:
        """The batch's seal and the claims :meth:`_claim`'s barrier must see.

        In a batch this run reached first (its first-run record names this run), every
        claim is this run's or was made after the record by a task of another run: such
        a task finds the record not its own and scans, and its barrier waits for this
        run's inserted claims. So this run's barrier waits for nothing and needs no scan:
        one point read (seal, first run) instead of a scan of the batch's records, which
        grew with its partitions, in every task. Otherwise (a replay, a writer without a
        run id) one scan, as always.
        """
        records = self.records
        if not ctx.run:
            return records.of_batch(ctx.txn_id, ctx.batch)
        sealed, first = records.first_run(ctx.txn_id, ctx.batch, ctx.run)
        if first == ctx.run:
            return sealed, {}
        return records.of_batch(ctx.txn_id, ctx.batch)

    def later_chunk(self, ctx: WriteContext, chunk: int, fingerprint: str, xid: str, catching_up: bool) -> bool:
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
        records, where = self.records, (ctx.txn_id, ctx.batch, ctx.partition)
        try:
            if catching_up:
                recorded = records.recorded_chunk(*where, chunk)
                if recorded is not None:
                    self._compare_chunk(records, ctx, chunk, fingerprint, recorded)
                    if recorded != dedup_claims.END:
                        return True  # bound by the earlier run's record: still re-checking
                self._set_claim(records, ctx, caught_up=ctx.run)
                if recorded is not None:
                    return False  # the earlier run's end: nothing follows
                if fingerprint != dedup_claims.END and ctx.run:
                    self._wait_for_earlier_claims(records, ctx, chunk)
            recorded = records.chunk(*where, chunk, fingerprint, ctx.run)
            self._compare_chunk(records, ctx, chunk, fingerprint, recorded)
            return False
        except DedupLayoutError as exc:
            exc.xid = xid
            raise

    def _compare_chunk(self, records: ClaimRecords, ctx: WriteContext, chunk: int, mine: str, recorded: str) -> None:
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
    def _set_claim(records: ClaimRecords, ctx: WriteContext, **fields: str) -> None:
        """Add ``fields`` to the partition's claim (the last writer wins)."""
        where = (ctx.txn_id, ctx.batch, ctx.partition)
        claim = records.claim_of(*where)
        if claim is not None:
            records.update(*where, {**claim, **fields})

    def _claim(self, records: ClaimRecords, ctx: WriteContext, first: str, claims: Mapping[int, Claim]) -> bool:
        """Claim this partition before its first insert (see :mod:`~clickhouse_tx.modes.dedup.claims`).

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
    def _wait_for_earlier_claims(records: ClaimRecords, ctx: WriteContext, chunk: int = 0) -> None:
        """Until every inserted claim of the batch is caught up by this run (one registry scan per 0.5 s)."""
        deadline = time.monotonic() + dedup_claims.WAIT_S
        while True:
            waiting = barrier(ctx.txn_id, ctx.batch, ctx.partition, ctx.run, records.claims(ctx.txn_id, ctx.batch))
            if not waiting:
                return
            if time.monotonic() >= deadline:
                what = f"chunk {chunk} of partition {ctx.partition}" if chunk else f"partition {ctx.partition}"
                raise DedupLayoutError(
                    f"batch {ctx.batch} of {ctx.txn_id}, {what}: an earlier run inserted partitions "
                    f"{waiting} of this batch and stopped before its commit, and this run's attempts "
                    f"of them did not show within {dedup_claims.WAIT_S:.0f} s that they hold the same "
                    "rows (queued behind this task, or cut otherwise). The rows no earlier record "
                    "binds were not inserted; a retry of the task waits again. "
                    f"{dedup_claims.way_out(ctx.txn_id)}"
                )
            time.sleep(0.5)

    def seal(self, batch: int, messages: Sequence[Prepared]) -> "concurrent.futures.Future[None] | None":
        """Driver, at the start of every commit of a batch, before its decision.

        Compares this run's messages with the batch's seal (or, before the first commit,
        with its partitions' claims), then seals the batch's layout, so a replay that cuts
        it otherwise is refused by its executors before they insert. The seal and the
        batch's first-run record come from one point read. The claims are read only when
        the batch is not sealed and its first run is not this one (or the messages carry
        no run id): in a batch this run reached first, each claim is this run's, holding
        the first chunk of its message (an attempt whose first chunk differed from an
        inserted claim was refused and sent none), or was made after the record by a
        task of another run, which waits at its barrier until this run's inserted claims
        are caught up with the same rows. Raises :class:`DedupLayoutError` (nothing is
        committed).

        Returns the drop of the records of the query's earlier batches (Spark replays
        none of them), running beside the rest of the commit: wait for it before the
        next. None without messages. Its keys are those of the batch before, derived from
        that batch's seal, read beside this batch's (no scan); a scan of the query's
        records finds them where they cannot be (:meth:`ClaimRecords.at_seal`).
        """
        if not messages:
            return None
        txn_id, records, now = messages[0].txn_id, self.records, layout_of(messages)
        runs = {str(m.details.get("run") or "") for m in messages}
        run = runs.pop() if len(runs) == 1 else ""
        sealed, first, earlier = records.at_seal(txn_id, batch) if run else (None, "", None)
        if sealed is None and (not run or first != run):
            sealed, claims, earlier = records.at_commit(txn_id, batch)
            check_messages(txn_id, batch, now, sealed, claims if sealed is None else {})
        else:
            check_messages(txn_id, batch, now, sealed, {})
        if sealed is None and any(not part.get("committed") for part in now.values()):
            # (every partition committed already: a replay of a batch whose records are gone
            # inserted nothing; a new seal would only be left behind)
            check_messages(txn_id, batch, now, records.seal(txn_id, batch, now), {})
        return None if earlier == [] else _HOUSEKEEPING.submit(self._forget, txn_id, batch, earlier)

    def _forget(self, txn_id: str, batch: int, keys: Sequence[str] | None) -> None:
        """Drop the records of the query's batches before ``batch`` (``keys``, or found by a
        scan of the query's records). Housekeeping never fails a commit: any error is
        logged, and a later commit's scan finds what this one left."""
        try:
            self.records.forget(self.records.at_commit(txn_id, batch)[2] if keys is None else keys)
        except Exception as exc:  # housekeeping never fails a commit
            log.info("could not drop the layout records before batch %d: %s", batch, exc)
