"""The driver's batch-wide steps, shared by a batch's commit and its abort (:class:`BatchOps`).

The commit messages checked, the decision read and written (a lost reply settled by
reading it back), the batch's registry entries listed, many xids rolled back, and
the partitions of a batch handled ``parallelism`` at a time. Per-xid steps are
:class:`~clickhouse_tx.protocol.tx_ops.TxOps`'; what to do is decided by
:mod:`clickhouse_tx.protocol.commit_plan`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from typing import Callable, Iterable, Iterator, Sequence

from clickhouse_tx.errors import AlreadyRegisteredError, DecisionConflictError, OutcomeUnknownError
from clickhouse_tx.ids import run_fence_key
from clickhouse_tx.interfaces import Decision, Prepared, RegistryEntry
from clickhouse_tx.protocol.commit_plan import plan_rollback
from clickhouse_tx.protocol.context import CommitContext
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.protocol.tx_ops import TxOps
from clickhouse_tx.retry import is_transient_or_unknown

log = logging.getLogger(__name__)

#: How long the driver's abort keeps trying an xid whose session a straggler still
#: holds (SESSION_IS_LOCKED). Spark cancels the other tasks of a failed stage and kills
#: their Python workers within seconds, which ends their INSERTs; rolled back then,
#: their transactions do not stay open (blocking a DROP of the target) until their
#: sessions time out.
STRAGGLER_WAIT_S = 30.0
#: Pause between two rounds of that wait.
STRAGGLER_POLL_S = 0.5


class StepTimes:
    """The wall time of each step of one commit call, by name, and ``total`` since it was built.

    ``with step("commit"): ...`` adds the block's seconds to ``commit``; :meth:`done` gives
    the durations a :class:`~clickhouse_tx.protocol.batch_commit.CommitReport` carries."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._t0 = clock()
        self._durations: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = self._clock()
        try:
            yield
        finally:
            self._durations[name] = self._durations.get(name, 0.0) + self._clock() - t

    def done(self) -> dict[str, float]:
        return {**self._durations, "total": self._clock() - self._t0}


class BatchOps:
    """The batch-wide I/O of one query on the driver, over its commit ``context`` and the
    per-xid steps ``tx_ops`` built from that context.

    Built for each driver call and dropped after it: an abort's by
    :meth:`~clickhouse_tx.protocol.coordinator.Coordinator.batch_ops`, a commit's by its
    :class:`~clickhouse_tx.protocol.batch_commit.BatchCommitter`. Holds nothing but the
    two; :meth:`each` handles ``context.parallelism`` partitions at once.
    """

    def __init__(self, context: CommitContext, tx_ops: TxOps) -> None:
        self.context = context
        self.tx_ops = tx_ops

    def check_messages(self, batch: int, messages: Iterable[Prepared | None]) -> list[Prepared]:
        """Spark's commit messages of ``batch``, without the None of tasks that sent none.

        Raises TypeError or ValueError for a message that is not a :class:`Prepared`
        of this query and batch (a bug, never a state to recover from).
        """
        out = []
        for m in messages:
            if m is None:
                continue  # Spark passes None for tasks that sent no message
            if not isinstance(m, Prepared):
                raise TypeError(f"commit message must be a Prepared, got {type(m).__name__}")
            if m.txn_id != self.context.txn_id or m.batch != batch:
                raise ValueError(
                    f"message {m.xid} is of txn_id={m.txn_id!r} batch={m.batch}, "
                    f"not of txn_id={self.context.txn_id!r} batch={batch}"
                )
            out.append(m)
        return out

    def read(self, batch: int) -> Decision | None:
        """The logged decision of ``batch`` (None if none), read within the retry budget."""
        return self.tx_ops.call(lambda: self.context.log.read(batch), is_transient_or_unknown)

    def entries(self, batch: int) -> list[RegistryEntry]:
        """Every registry entry of ``batch`` of this query, read within the retry budget."""
        c = self.context
        return self.tx_ops.call(lambda: c.registry.list_batch(c.txn_id, batch), is_transient_or_unknown)

    def write(self, decision: Decision) -> None:
        """Write a decision version; a lost reply or a conflict is resolved by reading back."""
        try:
            self.tx_ops.call(lambda: self.context.log.write(decision))
            return
        except (OutcomeUnknownError, DecisionConflictError):
            back = self.read(decision.batch)
            if (
                back is not None
                and back.version == decision.version
                and [p.xid for p in back.chosen] == [p.xid for p in decision.chosen]
            ):
                return  # our own write, whose reply was lost
            raise

    def rollback_all(self, ps: Iterable[Prepared], *, quiet: bool = False) -> list[str]:
        """Abort each of ``ps``; the xids rolled back.

        ``quiet``: an xid whose abort fails (a straggler still holds its session:
        SESSION_IS_LOCKED) is logged and left to GC and session expiry instead of
        failing the caller. Safe once the batch's fate is decided: an xid not chosen
        can never commit, whatever state the failed abort left it in.
        """
        done = []
        for p in ps:
            try:
                if self.tx_ops.abort(p):
                    done.append(p.xid)
            except Exception as exc:  # only when quiet, see below
                if not quiet:
                    raise
                log.warning(
                    "batch %d: rollback of xid %s (partition %d) failed, left to GC and session expiry: %s",
                    p.batch,
                    p.xid,
                    p.partition,
                    exc,
                )
        return done

    def fence_run(self, batch: int, run: str) -> None:
        """Spark's abort, before it lists ``batch``: record the abort of ``run``'s batch.

        An attempt of ``run`` that registers after the listing is never seen by it; it
        reads this fence after writing and rolls itself back
        (:func:`~clickhouse_tx.protocol.prepare.prepare_attempt`). Best effort: without
        the fence such an attempt is left to GC and session expiry, as before it.
        """
        c = self.context
        now = self.tx_ops.now_ms()
        key = run_fence_key(c.txn_id, batch, run)
        fence = RegistryEntry(
            key, f"{c.txn_id}/aborted-runs", batch, 0, 0, c.mode_io.mode, "", "",
            TxState.ABORTED.value, {"run": run}, now, now,
        )  # fmt: skip
        try:
            self.tx_ops.call(lambda: c.registry.register(fence))
        except AlreadyRegisteredError:
            pass  # an abort repeated
        except Exception as exc:  # the abort itself goes on
            log.warning("could not record the abort of batch %d of run %s: %s", batch, run, exc)

    def rollback_batch(
        self, batch: int, keep: set[str], messages: Sequence[Prepared], *, wait_s: float
    ) -> tuple[list[str], tuple[str, ...]]:
        """Roll back everything of ``batch`` not in ``keep``: (xids rolled back, xids left).

        An xid that cannot be rolled back now (a straggler holds its session) is tried
        again every :data:`STRAGGLER_POLL_S`, with the batch listed afresh so that an
        attempt registered meanwhile is included, until ``wait_s`` has passed; what is
        still left then is fenced and left to GC and session expiry (:meth:`rollback_all`).
        """
        # Two bounds: the rounds, because the injected sleep need not pass time (tests);
        # the deadline, because a round's own retries take time beyond its pause.
        deadline = time.monotonic() + wait_s
        rolled: list[str] = []
        for _ in range(int(wait_s / STRAGGLER_POLL_S) + 1):
            todo = [p for p in plan_rollback(keep, messages, self.entries(batch)) if p.xid not in rolled]
            rolled += self.rollback_all(todo, quiet=True)
            left = tuple(p.xid for p in todo if p.xid not in rolled)
            if not left or time.monotonic() + STRAGGLER_POLL_S > deadline:
                break
            self.context.sleep(STRAGGLER_POLL_S)
        return rolled, left

    def each(self, parts: Sequence[int], fn: Callable[[int], bool]) -> dict[int, bool]:
        """``fn`` over the partitions, ``parallelism`` at a time; the first error is raised."""
        parallelism = self.context.parallelism
        if parallelism <= 1 or len(parts) <= 1:
            return {part: fn(part) for part in parts}
        with concurrent.futures.ThreadPoolExecutor(
            min(parallelism, len(parts)), thread_name_prefix="clickhouse-tx-commit"
        ) as pool:
            futures = {part: pool.submit(fn, part) for part in parts}
        results: dict[int, bool] = {}
        error: BaseException | None = None
        for part, fut in futures.items():
            try:
                results[part] = fut.result()
            except BaseException as exc:  # re-raised below, first one wins
                error = error or exc
        if error is not None:
            raise error
        return results

    def forget(self, xids: Iterable[str], committed: Sequence[str] = ()) -> None:
        """Drop a done batch's finished entries from the registry (best effort).

        Nothing reads them again: the decision is immutable and done, lookups go
        through the markers, and a late attempt of the batch can never be chosen (GC
        rolls it back). Keeping them would make every batch-wide registry scan slower.
        ``committed`` (xids whose COMMIT took effect) are dropped from COMMITTING. If
        the delete fails, they are recorded COMMITTED instead (:meth:`record_committed`),
        so that a commit does not return with an entry of its batch unfinished; one left
        COMMITTING even then is found committed by its lookup (``recover``, GC).
        """
        try:
            c = self.context
            self.tx_ops.call(lambda: c.registry.forget(sorted(xids), sorted(committed)), is_transient_or_unknown)
        except Exception as exc:  # housekeeping never fails a commit
            log.info("could not drop finished registry entries: %s", exc)
            if committed:
                self.record_committed(committed)

    def record_committed(self, xids: Sequence[str]) -> None:
        """COMMITTING -> COMMITTED for xids whose COMMIT took effect: bookkeeping only.

        Their rows are visible whatever the registry says; an entry left COMMITTING
        is found committed by its lookup (``recover``, GC). One bulk CAS, then xid by
        xid for what it did not move.
        """
        try:
            done = self.tx_ops.bulk_move(xids, (TxState.COMMITTING,), TxState.COMMITTED)
        except Exception:  # xid by xid below
            done = set()
        for xid in xids:
            if xid not in done:
                self.tx_ops.record_committed(xid)
