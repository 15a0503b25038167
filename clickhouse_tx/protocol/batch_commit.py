"""The driver's commit of one batch: 2PC phase two (``docs/design.md`` §5).

:class:`BatchCommitter` carries out the plan of :func:`~clickhouse_tx.protocol.commit_plan.plan_commit`
(decision written before the first COMMIT, every decided xid committed, every other
attempt rolled back, the batch marked done) and repairs what the plan could not
foresee: a decided xid whose prepared work is gone is replaced by a message with the
same rows under a new decision version, or, when nothing of the batch is visible, the
batch is decided again from the replay's messages. The state of one call is a
:class:`_Run`, in memory only: everything else comes from the decision log, the
registry and the commit messages.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Mapping, Sequence

from clickhouse_tx.client.http import safe_url
from clickhouse_tx.errors import (
    LostTransactionError,
    NotCommittedError,
    OutcomeUnknownError,
    ServerError,
    in_doubt_runbook,
    lost_partitions_runbook,
    recover_command,
    sessions_gone_runbook,
)
from clickhouse_tx.interfaces import Decision, Prepared, RegistryEntry
from clickhouse_tx.protocol.batch_ops import BatchOps, StepTimes
from clickhouse_tx.protocol.commit_plan import plan_commit, plan_rollback
from clickhouse_tx.protocol.context import CommitContext
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.protocol.tx_ops import TxOps
from clickhouse_tx.retry import is_transient_or_unknown

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CommitReport:
    """What one :meth:`~clickhouse_tx.protocol.coordinator.Coordinator.commit_batch` call did (driver, plain data)."""

    batch: int
    committed: tuple[str, ...]
    rolled_back: tuple[str, ...]
    rows: int
    replaced: tuple[tuple[str, str], ...] = ()
    durations: Mapping[str, float] = dataclasses.field(default_factory=dict)
    replay: bool = False
    already_done: bool = False
    decision_version: int = 0


@dataclasses.dataclass
class _Run:
    """The mutable state of one :meth:`BatchCommitter.commit_batch` call (driver, in memory)."""

    decision: Decision
    spares: dict[int, tuple[Prepared, ...]]
    chosen: dict[int, Prepared] = dataclasses.field(default_factory=dict)
    replaced: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    rolled: list[str] = dataclasses.field(default_factory=list)
    lost: list[Prepared] = dataclasses.field(default_factory=list)
    # xids committed from the bulk CAS's COMMITTING: recorded COMMITTED only if the
    # batch fails (a done batch's are dropped from COMMITTING, see BatchOps.forget)
    unrecorded: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.chosen:
            self.chosen = {p.partition: p for p in self.decision.chosen}


class BatchCommitter:
    """The driver's commit of the batches of one query, over its commit ``context`` and the
    per-xid steps ``tx_ops`` built from that context.

    Built by :meth:`~clickhouse_tx.protocol.coordinator.Coordinator.commit_batch` for each
    call, with the batch-wide steps (:class:`~clickhouse_tx.protocol.batch_ops.BatchOps`)
    over the same two; holds nothing between calls.
    """

    def __init__(self, context: CommitContext, tx_ops: TxOps) -> None:
        self.context = context
        self.tx_ops = tx_ops
        self.batch_ops = BatchOps(context, tx_ops)

    def commit_batch(self, batch: int, messages: Sequence[Prepared | None]) -> CommitReport:
        """Driver, once per batch commit: what :meth:`Coordinator.commit_batch
        <clickhouse_tx.protocol.coordinator.Coordinator.commit_batch>` does (and raises)."""
        step = StepTimes(self.context.clock)
        with step("plan"):
            msgs = self.batch_ops.check_messages(batch, messages)
            registered, logged = self._plan_reads(batch, msgs)
            plan = plan_commit(logged, msgs, registered, txn_id=self.context.txn_id, batch=batch)
        assert plan.decision is not None
        if plan.already_done:
            return self._replay_of_done(plan.decision, msgs, step)
        run = _Run(plan.decision, dict(plan.spares))
        if plan.write_decision:
            with step("session_check"):
                self._check_sessions(run, msgs)
            with step("decision_write"):
                self.batch_ops.write(run.decision)
        with step("commit"):
            first_pass = self._commit_all(run)
            if plan.replay and run.chosen and msgs and not any(first_pass.values()):
                first_pass = self._redecide(run, msgs) or first_pass
            self._replace_dead(run, first_pass)
        with step("rollback"):
            keep = {p.xid for p in run.chosen.values()}
            # The plan's listing, not a new one: once the decision is durable no other attempt
            # can be chosen, so rolling back one registered since is GC's job either way.
            todo = plan_rollback(keep | set(run.rolled), msgs, registered)
            run.rolled += self.batch_ops.rollback_all(todo, quiet=True)
        if run.lost:
            self.batch_ops.record_committed(run.unrecorded)
            raise LostTransactionError(self._lost_message(run, msgs), xid=run.lost[0].xid)
        with step("mark_done"):
            self.tx_ops.call(lambda: self.context.log.mark_done(batch), is_transient_or_unknown)
        with step("forget"):
            self.batch_ops.forget(keep | set(run.rolled) | {e.xid for e in registered}, committed=run.unrecorded)
        durations = step.done()
        chosen = run.chosen
        return CommitReport(
            batch=batch,
            committed=tuple(p.xid for _, p in sorted(chosen.items())),
            rolled_back=tuple(run.rolled),
            rows=sum(p.rows for p in chosen.values()),
            replaced=tuple(run.replaced),
            durations=durations,
            replay=plan.replay,
            decision_version=run.decision.version,
        )

    def _plan_reads(self, batch: int, msgs: Sequence[Prepared]) -> tuple[list[RegistryEntry], Decision | None]:
        """The batch's registry entries and logged decision, read while the mode checks its layout.

        A mode that records how a batch was cut (dedup) refuses here a run that cut it
        otherwise (and seals the layout). The two reads do not depend on that check and
        nothing is written from them before it passes, so they run beside it: the plan
        waits for the longer of the two, not their sum. A refusal is raised before any
        error of the reads.
        """
        c = self.context
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="plan-reads") as pool:
            reads = pool.submit(lambda: (self.batch_ops.entries(batch), self.batch_ops.read(batch)))
            self.tx_ops.call(lambda: c.mode_io.check_layout(c.target, batch, msgs), is_transient_or_unknown)
            return reads.result()

    def _replay_of_done(self, decision: Decision, msgs: Sequence[Prepared], step: "StepTimes") -> CommitReport:
        """A done batch again (Spark replays it after a crash past mark_done): roll back only.

        The crash may have come before the batch's entries were dropped: they are
        dropped now, its chosen xids from COMMITTING too (every one is committed).
        """
        with step("rollback"):
            keep = {p.xid for p in decision.chosen}
            registered = self.batch_ops.entries(decision.batch)
            rolled = self.batch_ops.rollback_all(plan_rollback(keep, msgs, registered), quiet=True)
        self.batch_ops.forget(set(rolled) | {e.xid for e in registered}, committed=sorted(keep))
        durations = step.done()
        return CommitReport(
            batch=decision.batch,
            committed=tuple(sorted(keep)),
            rolled_back=tuple(rolled),
            rows=sum(p.rows for p in decision.chosen),
            durations=durations,
            replay=True,
            already_done=True,
            decision_version=decision.version,
        )

    def _check_sessions(self, run: "_Run", msgs: Sequence[Prepared]) -> None:
        """Before a decision is written: every chosen xid must still be committable.

        Renews each chosen session (so none expires between here and its COMMIT);
        a dead one is swapped for a live spare of its partition. If a partition has
        none, nothing is decided: every xid of the batch is rolled back and
        :class:`NotCommittedError` says why. Without this check a batch job whose
        early sessions expired committed the rest and failed half-visible.
        """
        parts = sorted(run.chosen)
        alive = self.batch_ops.each(parts, lambda part: self.tx_ops.renew(run.chosen[part]))
        dead: list[Prepared] = []
        for part in parts:
            if alive[part]:
                continue
            spare = next((s for s in run.spares.get(part, ()) if self.tx_ops.renew(s)), None)
            if spare is None:
                dead.append(run.chosen[part])
                continue
            run.spares[part] = tuple(s for s in run.spares[part] if s.xid != spare.xid)
            run.chosen[part] = spare
        if dead:
            self.batch_ops.rollback_all(plan_rollback((), msgs, self.batch_ops.entries(run.decision.batch)), quiet=True)
            raise NotCommittedError(
                sessions_gone_runbook(
                    run.decision.batch,
                    [p.partition for p in dead],
                    [p.xid for p in dead],
                    self.context.target.session_timeout_s,
                ),
                xid=dead[0].xid,
            )
        run.decision = dataclasses.replace(run.decision, chosen=tuple(run.chosen[p] for p in parts))

    def _redecide(self, run: "_Run", msgs: Sequence[Prepared]) -> dict[int, bool] | None:
        """Replay where no decided xid committed: decide again from this run's messages.

        Nothing of the batch is visible, and Spark replays a batch with every task
        done, so this run's messages hold the whole batch, under whatever
        partitioning it now has. The dead xids are fenced ABORTED first, so nothing
        can commit them after the new version is written. None if this run cannot
        replace the decision (a partition without a committable message).
        """
        batch = run.decision.batch
        try:
            fresh = plan_commit(None, msgs, self.batch_ops.entries(batch), txn_id=self.context.txn_id, batch=batch)
        except NotCommittedError as exc:
            log.warning("batch %d: cannot decide again from this run: %s", batch, exc)
            return None
        assert fresh.decision is not None
        old = dict(run.chosen)
        for p in old.values():
            self.tx_ops.abort(p, known_dead=True)
            run.rolled.append(p.xid)
        new = _Run(dataclasses.replace(fresh.decision, version=run.decision.version + 1), dict(fresh.spares))
        self._check_sessions(new, msgs)
        self.batch_ops.write(new.decision)
        run.decision, run.chosen, run.spares = new.decision, new.chosen, new.spares
        run.replaced += [(p.xid, run.chosen[part].xid) for part, p in sorted(old.items()) if part in run.chosen]
        log.warning(
            "batch %d: no decided xid could commit; decided again from this run's %d "
            "partitions (decision v%d, was %d partitions)",
            batch,
            len(run.chosen),
            run.decision.version,
            len(old),
        )
        return self._commit_all(run)

    def _replace_dead(self, run: "_Run", committed: Mapping[int, bool]) -> None:
        """Fence each decided xid that cannot commit; replace it by a spare with its rows.

        Each replacement is a new decision version, written before its COMMIT. A
        partition without such a spare is recorded in ``run.lost``.
        """
        batch = run.decision.batch
        for part in sorted(run.chosen):
            current, ok = run.chosen[part], committed[part]
            spares = list(run.spares.get(part, ()))
            while not ok:
                # definitely not committed: fence it so nothing can commit it later
                self.tx_ops.abort(current, known_dead=True)
                run.rolled.append(current.xid)
                nxt = next((s for s in spares if self.tx_ops.state(s.xid) is TxState.INITIALIZED), None)
                if nxt is None:
                    run.lost.append(current)
                    break
                spares = spares[spares.index(nxt) + 1 :]
                run.chosen[part] = nxt
                run.decision = Decision(
                    txn_id=self.context.txn_id,
                    batch=batch,
                    version=run.decision.version + 1,
                    chosen=tuple(run.chosen[p] for p in sorted(run.chosen)),
                )
                self.batch_ops.write(run.decision)  # before the replacement's COMMIT, as for v1
                run.replaced.append((current.xid, nxt.xid))
                log.warning(
                    "batch %d partition %d: xid %s cannot commit, replaced by %s (decision v%d)",
                    batch,
                    part,
                    current.xid,
                    nxt.xid,
                    run.decision.version,
                )
                current = nxt
                ok = self.tx_ops.ensure_committed(current, payload={"decision_version": run.decision.version})

    def _lost_message(self, run: "_Run", msgs: Sequence[Prepared]) -> str:
        lost = {p.partition: p.xid for p in run.lost}
        return lost_partitions_runbook(
            batch=run.decision.batch,
            txn_id=self.context.txn_id,
            lost=lost,
            visible_rows={part: p.rows for part, p in sorted(run.chosen.items()) if part not in lost},
            decided=len(run.chosen),
            this_run=len({m.partition for m in msgs}),
            log_root=self.context.log.root_uri,
        )

    def _commit_all(self, run: "_Run") -> dict[int, bool]:
        """First COMMIT of every decided partition.

        Safe in any order and concurrently: the decision is durable before this runs,
        and each xid's COMMIT touches only its own session and registry entry. The
        registry moves go in bulk where the registry can (one CAS to COMMITTING for
        every xid, one to COMMITTED for the committed ones, instead of a few requests
        per xid); an xid the bulk CAS did not move takes the one-by-one path,
        which reads its state and decides. What cannot commit is handled afterwards,
        one partition at a time, because a replacement writes a new decision version.
        Whatever an xid's commit raises (a server error after its COMMIT took effect
        as much as a lost reply), its lookup decides: committed, cannot commit, or in
        doubt (still pending, or the lookup failed too). So the job fails only when
        some xid is not visible.

        Raises
        ------
        OutcomeUnknownError
            Some xids stayed in doubt through every retry; the message names the
            visible partitions and the recover command. The others are committed.
        """
        chosen, version = run.chosen, run.decision.version
        payload = {"decision_version": version}
        parts = sorted(chosen)
        ready = self.tx_ops.bulk_move(
            [chosen[p].xid for p in parts] if len(parts) > 1 else [],
            (TxState.INITIALIZED, TxState.COMMITTING),
            TxState.COMMITTING,
            payload,
        )
        self._commit_together(run, [chosen[p] for p in parts if chosen[p].xid in ready])
        doubt: dict[int, Exception] = {}

        def commit_one(part: int) -> bool:
            p = chosen[part]
            try:
                if p.xid not in ready:
                    return self.tx_ops.ensure_committed(p, payload=payload)
                try:
                    return self.tx_ops.commit_committing(p)
                except Exception as exc:  # its lookup failed: once more, then in doubt
                    return self.tx_ops.settle(p, exc)
            except Exception as exc:  # in doubt after its lookup; the others still commit; raised below
                doubt[part] = exc
                return False

        results = self.batch_ops.each(parts, commit_one)
        run.unrecorded += [chosen[p].xid for p in parts if results[p] and chosen[p].xid in ready]
        if doubt:
            self.batch_ops.record_committed(run.unrecorded)
            run.unrecorded.clear()
            part = min(doubt)
            first = doubt[part]
            c = self.context
            raise OutcomeUnknownError(
                in_doubt_runbook(
                    batch=run.decision.batch,
                    txn_id=c.txn_id,
                    doubt=sorted(doubt),
                    first=first,
                    attempts=c.retry.max_attempts,
                    committed=sorted(p for p in parts if results[p]),
                    log_root=c.log.root_uri,
                    recover=recover_command(
                        safe_url(c.target.url),
                        f"{c.target.database}.{c.target.table}",
                        c.mode_io.mode.value,
                        c.txn_id,
                        c.log.root_uri,
                    ),
                ),
                xid=chosen[part].xid,
                code=getattr(first, "code", None),
                name=getattr(first, "name", None),
            ) from first
        return results

    def _commit_together(self, run: "_Run", ps: Sequence[Prepared]) -> None:
        """Publish the batch in one step where the mode offers it (``visibility=batch``).

        Only xids the bulk CAS moved to COMMITTING take part. If the one step is
        refused (a stage gone after a restart, a part locked), nothing of it is visible
        and the per-xid commits that follow publish the batch partition by partition:
        still exactly once, but no longer at once, and the log says so. A server error
        (the request ended, whatever it did) goes the same way: the per-xid commits find
        the markers of what it published. Only a step that may still be running
        (:class:`OutcomeUnknownError`) stops the commit, in doubt.
        """
        if not ps:
            return
        try:
            c = self.context
            self.tx_ops.call(lambda: c.mode_io.commit_together(c.target, ps))
        except (NotCommittedError, ServerError) as exc:
            if isinstance(exc, OutcomeUnknownError):
                raise
            log.warning(
                "batch %d: could not publish the batch in one transaction (%s); committing its "
                "partitions one by one, so readers may see part of it",
                run.decision.batch,
                exc,
            )
