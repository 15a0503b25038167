"""The two-phase commit of one micro-batch (`docs/design.md` §3, §5).

:class:`Coordinator` is the one object the writers use: :meth:`~Coordinator.prepare`
on the executors, :meth:`~Coordinator.commit_batch` and :meth:`~Coordinator.abort_batch`
on the driver. It keeps no state between calls (Spark builds a fresh writer for
every commit). What its commit depends on (target, the three I/O protocols, retry
policy, clock, sleep, parallelism) is one frozen
:class:`~clickhouse_tx.protocol.context.CommitContext`, built in its constructor and
handed to each object below; each phase is delegated to the module that holds it:

- :mod:`clickhouse_tx.protocol.commit_plan`: what to commit and roll back, pure;
- :mod:`clickhouse_tx.protocol.tx_ops`: the idempotent steps of one xid (also recovery's);
- :mod:`clickhouse_tx.protocol.batch_ops`: the batch-wide steps a commit and an abort share;
- :mod:`clickhouse_tx.protocol.prepare`: the executor's prepare of one partition attempt;
- :mod:`clickhouse_tx.protocol.batch_commit`: the driver's commit of one batch.

Order of effects for one batch's commit (each step is idempotent, so a replay after a
crash at any point redoes what is missing and nothing twice). The names are the keys
of :attr:`CommitReport.durations <clickhouse_tx.protocol.batch_commit.CommitReport.durations>`,
each the seconds of its step, with ``total`` the whole call's:

1. ``plan``: the messages checked, the mode's check of how the batch was cut (mode
   ``dedup``), the registry entries and the decision read, the commit planned
   (:func:`~clickhouse_tx.protocol.commit_plan.plan_commit`). A batch already marked
   done goes no further than ``rollback`` (what is left of it); its entries are then
   dropped, its chosen xids straight from COMMITTING, outside any timed step;
2. no decision yet: ``session_check`` (each chosen session renewed; a dead one swapped
   for a live spare of its partition, or everything is rolled back and nothing is
   decided), then ``decision_write``;
3. ``commit``: the chosen xids moved COMMITTING in bulk, published in one step where
   the mode offers it (``visibility=batch``), committed ``parallelism`` at a time,
   each outcome looked up where unknown. On a replay where no chosen xid committed,
   the batch is decided again from the replay's messages. A chosen xid that
   definitely cannot commit is then fenced (rolled back, ABORTED) and replaced by a
   spare of the same partition under a new decision version, written before its COMMIT;
4. ``rollback``: every other xid of the batch (messages, and the zombies and
   speculative attempts the plan's listing found): ABORTING, ROLLBACK, ABORTED. A
   partition left without a committable xid stops the commit here
   (:class:`~clickhouse_tx.errors.LostTransactionError`): the batch is not marked done;
5. ``mark_done``, then ``forget``: the batch's registry entries dropped (its committed
   xids straight from COMMITTING).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator, Sequence

import pyarrow as pa

from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.ids import new_xid
from clickhouse_tx.interfaces import CommitModeIO, DecisionLogIO, Prepared, RegistryIO, Target, WriteContext
from clickhouse_tx.protocol.batch_commit import BatchCommitter, CommitReport
from clickhouse_tx.protocol.batch_ops import STRAGGLER_WAIT_S, BatchOps
from clickhouse_tx.protocol.context import CommitContext
from clickhouse_tx.protocol.prepare import prepare_attempt
from clickhouse_tx.protocol.tx_ops import TxOps
from clickhouse_tx.retry import RetryPolicy


@dataclasses.dataclass(frozen=True)
class AbortReport:
    """What one :meth:`Coordinator.abort_batch` call did."""

    batch: int
    rolled_back: tuple[str, ...]
    kept: tuple[str, ...]
    left: tuple[str, ...] = ()  # fenced, not rolled back (session busy): GC finishes them


class Coordinator:
    """Two-phase commit of micro-batches of one query (``txn_id``) into one target.

    Built fresh wherever it is used: on executors for :meth:`prepare`, on the driver
    for :meth:`validate`, :meth:`commit_batch` and :meth:`abort_batch`. It holds no
    state of its own between calls; it is picklable if its I/O objects are.

    Every parameter but ``xid_factory`` and ``conversion`` (the prepare's alone) goes into
    its :attr:`context`, a frozen :class:`~clickhouse_tx.protocol.context.CommitContext`;
    ``txn_id``, ``target``, ``mode_io``, ``registry``, ``log``, ``retry``, ``clock`` and
    ``parallelism`` are read-only views of it. The per-xid steps (:attr:`ops`) and the
    batch-wide ones (:meth:`batch_ops`) are built from the context on each call.

    Parameters
    ----------
    txn_id:
        Stable id of the query (see :func:`clickhouse_tx.ids.txn_id_for_spark_query`).
    target, mode_io, registry, log:
        Where rows go and the three I/O protocols.
    retry:
        Policy for transient errors of every I/O call (default :class:`RetryPolicy`).
    parallelism:
        How many decided partitions are committed at once (1: in partition order, as
        the scripted unit tests need; :func:`clickhouse_tx.factory.build_coordinator`
        uses 8).
    clock, sleep, xid_factory:
        Injectable for tests: wall clock (registry timestamps, durations), sleep, and
        ``(txn_id, batch, partition, attempt) -> xid`` (default :func:`~clickhouse_tx.ids.new_xid`).
    conversion:
        The table's column types (built on the driver): :meth:`prepare` converts and
        checks every value before it is sent (None: the batches go as they are).
    """

    def __init__(
        self,
        txn_id: str,
        target: Target,
        mode_io: CommitModeIO,
        registry: RegistryIO,
        log: DecisionLogIO,
        *,
        retry: RetryPolicy | None = None,
        parallelism: int = 1,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        xid_factory: Callable[[str, int, int, int], str] = new_xid,
        conversion: ConversionPlan | None = None,
    ) -> None:
        self.context = CommitContext(
            txn_id,
            target,
            mode_io,
            registry,
            log,
            retry=retry or RetryPolicy(),
            clock=clock,
            sleep=sleep,
            parallelism=parallelism,
        )
        # the executor's prepare alone uses these: they are not the commit's
        self.conversion = conversion
        self.xid_factory = xid_factory

    def __repr__(self) -> str:
        return f"Coordinator(txn_id={self.txn_id!r}, target={self.target!r}, mode={self.mode_io.mode.value})"

    # Read-only views of the context: a test changes a built coordinator's I/O by
    # replacing ``context`` as a whole, so that every step sees the same objects.
    @property
    def txn_id(self) -> str:
        return self.context.txn_id

    @property
    def target(self) -> Target:
        return self.context.target

    @property
    def mode_io(self) -> CommitModeIO:
        return self.context.mode_io

    @property
    def registry(self) -> RegistryIO:
        return self.context.registry

    @property
    def log(self) -> DecisionLogIO:
        return self.context.log

    @property
    def retry(self) -> RetryPolicy:
        return self.context.retry

    @property
    def clock(self) -> Callable[[], float]:
        return self.context.clock

    @property
    def parallelism(self) -> int:
        return self.context.parallelism

    @property
    def ops(self) -> TxOps:
        """The per-xid steps over the context's registry and mode (built per call, like
        :meth:`batch_ops`, from the context as it is then)."""
        c = self.context
        return TxOps(c.target, c.mode_io, c.registry, retry=c.retry, clock=c.clock, sleep=c.sleep)

    def batch_ops(self) -> BatchOps:
        """The driver's batch-wide steps over the context (an abort's; a commit's are its
        :class:`~clickhouse_tx.protocol.batch_commit.BatchCommitter`'s)."""
        return BatchOps(self.context, self.ops)

    def validate(self, schema: pa.Schema) -> None:
        """Driver, once per query/job before any task writes: check target and schema."""
        self.mode_io.validate(self.target, schema)

    def prepare(self, ctx: WriteContext, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: register, then write without committing.

        See :func:`~clickhouse_tx.protocol.prepare.prepare_attempt`.

        Raises
        ------
        NotCommittedError
            Anything went wrong; what was written is rolled back and the xid is
            ABORTED (best effort: GC finishes what a dying executor could not).
        """
        if ctx.txn_id != self.txn_id:
            raise ValueError(f"WriteContext txn_id {ctx.txn_id!r} != coordinator's {self.txn_id!r}")
        return prepare_attempt(
            self.context, self.ops, ctx, batches, xid_factory=self.xid_factory, conversion=self.conversion
        )

    def commit_batch(self, batch: int, messages: Sequence[Prepared | None]) -> CommitReport:
        """Driver, once per batch commit (possibly again after a crash): 2PC phase two.

        Carried out by :class:`~clickhouse_tx.protocol.batch_commit.BatchCommitter`.

        Raises
        ------
        NotCommittedError
            Before any decision: a chosen partition's prepared transaction is gone
            (session expired, ClickHouse restarted). Everything is rolled back.
        LostTransactionError
            A decided xid cannot commit, some partitions of the batch are already
            visible, and no message of this run carries the same rows; the message
            names what is visible and the way out. The batch is not marked done.
        OutcomeUnknownError
            An xid stayed in doubt; the batch is not done and a replay (or
            ``python -m clickhouse_tx recover``, which the message spells out) resolves it.
        """
        return BatchCommitter(self.context, self.ops).commit_batch(batch, messages)

    def abort_batch(
        self,
        batch: int,
        messages: Sequence[Prepared | None],
        *,
        discard_decided: bool = False,
        straggler_wait_s: float = STRAGGLER_WAIT_S,
        run: str = "",
    ) -> AbortReport:
        """Driver, when Spark aborts a batch: roll back everything not decided.

        Decided xids are left alone: a decision means some may already be
        committed, and the replay of the batch rolls the rest forward. With
        ``discard_decided`` (a batch job's stage, dropped afterwards: nothing of it is
        visible and no replay comes) they are rolled back too, so that no open
        transaction holds the stage; one already committed into it stays.

        An xid that cannot be rolled back now (a straggler task still holds its
        session: SESSION_IS_LOCKED) is fenced, so it can never commit, and tried again
        for up to ``straggler_wait_s`` (Spark kills a cancelled task's Python worker
        within seconds). One still held then never makes this raise: it is listed in
        ``left`` for GC and session expiry; Spark's own error stays the one the user sees.

        With ``run`` (the writer's id of this run of the job or query), the abort is
        first recorded for the run's batch (:meth:`BatchOps.fence_run`): an attempt that
        registers after the listing, which Spark lets finish while it fails the job,
        finds it after writing and rolls itself back.
        """
        io = self.batch_ops()
        msgs = io.check_messages(batch, messages)
        if run:
            io.fence_run(batch, run)  # before the listing: a later attempt of the run sees it
        decision = io.read(batch)
        keep = {p.xid for p in decision.chosen} if decision is not None and not discard_decided else set()
        rolled, left = io.rollback_batch(batch, keep, msgs, wait_s=straggler_wait_s)
        return AbortReport(batch=batch, rolled_back=tuple(rolled), kept=tuple(sorted(keep)), left=left)
