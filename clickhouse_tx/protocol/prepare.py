"""The executor's prepare of one partition attempt: 2PC phase one (``docs/design.md`` §2).

A fresh xid is registered INITIALIZED, then the mode writes the partition so that
nothing is visible yet, and the attempt's :class:`~clickhouse_tx.interfaces.Prepared`
goes back to the driver as the task's commit message. Whatever fails on the way is
rolled back and the xid fenced ABORTED, so a failed attempt can never be committed.
"""

from __future__ import annotations

from typing import Callable, Iterator

import pyarrow as pa

from clickhouse_tx.client.http import safe_url
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.errors import IllegalTransitionError, NotCommittedError, ValueDoesNotFitError
from clickhouse_tx.ids import run_fence_key
from clickhouse_tx.interfaces import Prepared, RegistryEntry, WriteContext
from clickhouse_tx.protocol.context import CommitContext
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.protocol.tx_ops import TxOps


def prepare_attempt(
    context: CommitContext,
    tx_ops: TxOps,
    ctx: WriteContext,
    batches: Iterator[pa.RecordBatch],
    *,
    xid_factory: Callable[[str, int, int, int], str],
    conversion: ConversionPlan | None = None,
) -> Prepared:
    """Executor, once per partition attempt: register, then write without committing.

    Parameters
    ----------
    context
        The query's commit context: its target, mode I/O and registry.
    tx_ops
        The per-xid steps built from ``context``.
    ctx
        Which attempt of which partition of which batch.
    batches
        The partition's rows.
    xid_factory
        ``(txn_id, batch, partition, attempt) -> xid``, unique per attempt.
    conversion
        The table's column types: every value is converted and checked before it is
        sent (None: the batches go as they are).

    Raises
    ------
    NotCommittedError
        Anything went wrong; what was written is rolled back and the xid is
        ABORTED (best effort: GC finishes what a dying executor could not).
    """
    target, mode_io = context.target, context.mode_io
    xid = xid_factory(ctx.txn_id, ctx.batch, ctx.partition, ctx.attempt)
    provisional = Prepared.for_attempt(
        ctx, xid, mode_io.mode, safe_url(target.url), f"{target.database}.{target.table}"
    )
    entry = RegistryEntry.of_attempt(provisional, TxState.INITIALIZED.value, tx_ops.now_ms())
    try:
        tx_ops.call(lambda: context.registry.register(entry))
    except Exception as exc:
        tx_ops.abort_quietly(provisional)
        raise NotCommittedError(f"could not register the transaction: {exc}", xid=xid) from exc
    written: Prepared | None = None
    try:
        if conversion is not None:
            # Modes whose inserts are visible one by one get the whole partition
            # checked before the first insert; the others roll back on a bad value.
            batches = conversion.apply(batches, eager=mode_io.mode.capabilities.visible_on_insert)
        written = mode_io.prepare(target, ctx, xid, batches)
        if written.xid != xid:
            raise IllegalTransitionError(f"mode returned xid {written.xid!r} for {xid!r}", xid=xid)
        fence = run_fence_key(ctx.txn_id, ctx.batch, ctx.run) if ctx.run else None
        state, aborted = tx_ops.state_and_fence(xid, fence)
        if state is not TxState.INITIALIZED or aborted:
            # The driver fenced this attempt while it wrote, or Spark's abort of this
            # run's batch ran before this attempt registered and so never listed it.
            # Either way no rollback of the driver reached this attempt's work (no
            # session yet, or no entry), so it rolls back what it wrote itself.
            # Otherwise its transaction stayed open, kept alive by the keep-alive of a
            # reused Python worker, and a DROP TABLE ... SYNC of the target waited behind it.
            tx_ops.rollback(written)
            why = "Spark aborted this batch of the run" if aborted else f"registry says {state.value}"
            raise NotCommittedError(f"fenced while writing: {why}", xid=xid)
        return written
    except Exception as exc:
        tx_ops.abort_quietly(written or provisional)
        if isinstance(exc, ValueDoesNotFitError):
            exc.xid = xid  # keep its type: the task failed on the data, not on I/O
        if isinstance(exc, NotCommittedError) and exc.xid == xid:
            raise
        # The server's code travels with the failure (TABLE_IS_READ_ONLY, ...), so a task's
        # error names what the server refused, not only that the attempt was rolled back.
        raise NotCommittedError(
            f"prepare failed: {type(exc).__name__}: {exc}",
            xid=xid,
            code=getattr(exc, "code", None),
            name=getattr(exc, "name", None),
        ) from exc
