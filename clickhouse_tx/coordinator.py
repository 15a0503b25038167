"""The two-phase commit of one micro-batch (`docs/design.md` §3, §5).

The decisions are pure functions over plain values (:func:`choose_per_partition`,
:func:`plan_commit`, :func:`plan_rollback`); :class:`Coordinator` executes them
through the three I/O protocols of :mod:`clickhouse_tx.interfaces` and keeps no
state between calls: Spark builds a fresh writer for every commit, so everything
comes from the decision log, the registry and the commit messages.

Order of effects for one batch (each step is idempotent, so a replay after a crash
at any point redoes what is missing and nothing twice):

1. no decision yet: choose one message per partition and write the Decision;
2. for each chosen xid: registry COMMITTING, COMMIT, registry COMMITTED; a chosen
   xid that definitely cannot commit is fenced (ABORTING), replaced by a message of
   the same partition under a new decision version, rolled back (ABORTED);
3. every other xid of the batch (messages, zombies and speculative attempts in the
   registry): ABORTING, ROLLBACK, ABORTED;
4. mark the batch done.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa

from clickhouse_tx.convert import ConversionPlan
from clickhouse_tx.errors import (
    DecisionConflictError,
    IllegalTransitionError,
    LostTransactionError,
    NotCommittedError,
    OutcomeUnknownError,
    ServerError,
    ValueDoesNotFitError,
)
from clickhouse_tx.http_client import safe_url
from clickhouse_tx.ids import new_xid
from clickhouse_tx.interfaces import (
    CommitModeIO,
    CommitOutcome,
    Decision,
    DecisionLogIO,
    Mode,
    Prepared,
    RegistryEntry,
    RegistryIO,
    Target,
    WriteContext,
)
from clickhouse_tx.retry import RetryPolicy, is_transient, is_transient_or_unknown, retry_call
from clickhouse_tx.state import TxState, as_state, is_finished, next_state, predecessors

log = logging.getLogger(__name__)
T = TypeVar("T")


# ----------------------------------------------------------------------------------------
# Pure planning
# ----------------------------------------------------------------------------------------


def _attempt_order(p: Prepared) -> tuple[int, str]:
    return (p.attempt, p.xid)


def prepared_from_entry(e: RegistryEntry) -> Prepared:
    """A :class:`Prepared` good enough to roll back a registered xid nobody reported.

    Zombie and speculative attempts never reach the driver as messages; their
    registry entry is all there is (rows and checksum are unknown, so 0).
    """
    return Prepared(**e.attempt_fields(), rows=0, checksum=0, details=dict(e.payload or {}))


def same_rows(a: Prepared, b: Prepared) -> bool:
    """True if ``a`` and ``b`` carry the same rows (row count and order-free checksum).

    The one test a replacement of a decided xid must pass (:func:`plan_commit`).
    """
    return a.rows == b.rows and a.checksum == b.checksum


def choose_per_partition(
    messages: Iterable[Prepared], states: Mapping[str, TxState]
) -> tuple[dict[int, Prepared], dict[int, tuple[Prepared, ...]]]:
    """Pick one committable message per partition, deterministically.

    Committable means INITIALIZED in the registry. Among several (speculative
    duplicates) the lowest attempt, then the lowest xid, wins; the rest are kept in
    that order as spares that may replace the chosen one if it turns out dead.

    Returns
    -------
    (chosen, spares)
        ``chosen[partition]``, ``spares[partition]``; a partition with no committable
        message appears in neither.
    """
    by_part: dict[int, list[Prepared]] = {}
    for m in messages:
        if states.get(m.xid, TxState.UNKNOWN) is TxState.INITIALIZED:
            by_part.setdefault(m.partition, []).append(m)
    chosen: dict[int, Prepared] = {}
    spares: dict[int, tuple[Prepared, ...]] = {}
    for part, ms in by_part.items():
        ordered = sorted({m.xid: m for m in ms}.values(), key=_attempt_order)
        chosen[part] = ordered[0]
        spares[part] = tuple(ordered[1:])
    return chosen, spares


@dataclasses.dataclass(frozen=True)
class CommitPlan:
    """What :meth:`Coordinator.commit_batch` will do, decided before any effect.

    Attributes
    ----------
    decision:
        The decision to roll forward (the logged one on a replay, else a new v1).
    write_decision:
        True if ``decision`` is new and must be written before the first COMMIT.
    spares:
        Per partition, messages that may replace a chosen xid that cannot commit,
        in the order they would be tried.
    already_done:
        The batch is marked done: commit nothing, roll back the messages.
    """

    decision: Decision | None
    write_decision: bool
    spares: Mapping[int, tuple[Prepared, ...]]
    already_done: bool = False

    @property
    def replay(self) -> bool:
        return not self.write_decision


def plan_commit(
    decision: Decision | None,
    messages: Sequence[Prepared],
    registry_entries: Sequence[RegistryEntry],
    *,
    txn_id: str,
    batch: int,
) -> CommitPlan:
    """Decide how to commit ``batch`` from what is durable and what Spark sent.

    Raises
    ------
    NotCommittedError
        No decision exists and some partition present in ``messages`` has no
        committable (INITIALIZED) message: nothing is written, Spark should retry
        the batch.
    """
    states = {e.xid: as_state(e.state) for e in registry_entries}
    if decision is not None and decision.done:
        return CommitPlan(decision=decision, write_decision=False, spares={}, already_done=True)
    if decision is not None:
        # On a replay a spare must carry the decided rows: same partition number, rows
        # and checksum. A replay under another partitioning (repartition(n), minPartitions,
        # Kafka partitions) has the same numbers over other slices of the batch.
        decided = {p.xid for p in decision.chosen}
        spares_all: dict[int, tuple[Prepared, ...]] = {}
        for d in decision.chosen:
            ms = [
                m
                for m in messages
                if m.partition == d.partition
                and m.xid not in decided
                and same_rows(m, d)
                and states.get(m.xid) is TxState.INITIALIZED
            ]
            spares_all[d.partition] = tuple(sorted({m.xid: m for m in ms}.values(), key=_attempt_order))
        return CommitPlan(decision=decision, write_decision=False, spares=spares_all)
    chosen, spares = choose_per_partition(messages, states)
    missing = sorted({m.partition for m in messages} - set(chosen))
    if missing:
        bad = sorted(m.xid for m in messages if m.partition in missing)
        raise NotCommittedError(
            f"batch {batch}: partitions {missing} have no committable message "
            f"(registry states of {bad}: {[states.get(x, TxState.UNKNOWN).value for x in bad]}); "
            "nothing was committed"
        )
    new = Decision(txn_id=txn_id, batch=batch, chosen=tuple(chosen[p] for p in sorted(chosen)), version=1)
    return CommitPlan(decision=new, write_decision=True, spares=spares)


def plan_rollback(
    keep_xids: Iterable[str], messages: Sequence[Prepared], registry_entries: Sequence[RegistryEntry]
) -> tuple[Prepared, ...]:
    """Everything of the batch to roll back: not kept and not finished.

    Covers the messages Spark sent and every registered xid of the batch (zombies
    and speculative attempts that never reached the driver). Finished xids
    (COMMITTED, ABORTED) are left alone: rollback cannot undo a COMMIT, and an
    aborted one is already gone. Messages win over registry entries because they
    carry the mode's details.
    """
    keep = set(keep_xids)
    states = {e.xid: as_state(e.state) for e in registry_entries}
    todo: dict[str, Prepared] = {}
    for e in registry_entries:
        todo[e.xid] = prepared_from_entry(e)
    for m in messages:
        todo[m.xid] = m
    return tuple(p for x, p in sorted(todo.items()) if x not in keep and not is_finished(states.get(x)))


# ----------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CommitReport:
    """What one :meth:`Coordinator.commit_batch` call did (driver, plain data)."""

    batch: int
    committed: tuple[str, ...]
    rolled_back: tuple[str, ...]
    rows: int
    replaced: tuple[tuple[str, str], ...] = ()
    durations: Mapping[str, float] = dataclasses.field(default_factory=dict)
    replay: bool = False
    already_done: bool = False
    decision_version: int = 0


@dataclasses.dataclass(frozen=True)
class AbortReport:
    """What one :meth:`Coordinator.abort_batch` call did."""

    batch: int
    rolled_back: tuple[str, ...]
    kept: tuple[str, ...]
    left: tuple[str, ...] = ()  # fenced, not rolled back (session busy): GC finishes them


# ----------------------------------------------------------------------------------------
# Per-xid operations (shared with clickhouse_tx.recovery)
# ----------------------------------------------------------------------------------------


def is_refusal(exc: BaseException) -> bool:
    """True for a mode's own refusal to commit (e.g. a full dedup window), raised before any
    request could have taken effect: neither a server's answer, a transport error nor an
    outcome error, so committing again cannot help and the refusal is raised as it is."""
    return not isinstance(exc, ServerError | OutcomeUnknownError | NotCommittedError) and not is_transient_or_unknown(
        exc
    )


class TxOps:
    """Idempotent per-xid steps over the registry and a commit mode.

    Each registry move is a compare-and-set checked against the transition table:
    if the CAS fails (or its reply is lost) the current state is read back; being
    already in the target state is a no-op, anything else illegal raises.
    """

    def __init__(
        self,
        target: Target,
        mode_io: CommitModeIO,
        registry: RegistryIO,
        *,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.target = target
        self.mode_io = mode_io
        self.registry = registry
        self.retry = retry or RetryPolicy()
        self.clock = clock
        self.sleep = sleep

    def call(self, fn: Callable[[], T], retry_on: Callable[[BaseException], bool] = is_transient) -> T:
        """``fn`` through the one retry helper; every retry is logged at WARNING."""
        return retry_call(
            fn,
            self.retry,
            retry_on=retry_on,
            sleep=self.sleep,
            what=getattr(fn, "__qualname__", "coordinator I/O").replace(".<locals>.<lambda>", ""),
        )

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- registry ----------------------------------------------------------------------
    def state(self, xid: str) -> TxState:
        e = self.call(lambda: self.registry.get(xid), is_transient_or_unknown)
        return as_state(e.state if e is not None else None)

    def move(self, xid: str, new: TxState, payload: Mapping[str, object] | None = None) -> None:
        """Bring ``xid`` to ``new`` (a no-op if it is there already) or raise."""
        expected = [s.value for s in predecessors(new) if s is not TxState.UNKNOWN]
        for _ in range(self.retry.max_attempts + 1):
            try:
                if self.call(lambda: self.registry.transition(xid, expected, new.value, payload)):
                    return
            except OutcomeUnknownError:
                pass  # the CAS may have happened: the read below decides
            cur = self.state(xid)
            next_state(cur, new, xid=xid)  # raises if illegal
            if cur is new:
                return
            # legal but the CAS lost a race with another writer: read-and-retry
        raise OutcomeUnknownError(f"registry kept refusing the move to {new.value}", xid=xid)

    def fence_unknown(self, p: Prepared) -> TxState:
        """UNKNOWN -> ABORTED: an unregistered xid gets a tombstone so it never registers.

        Returns the state the xid is in afterwards (someone may have registered it first).
        """
        entry = RegistryEntry.of_attempt(p, TxState.ABORTED.value, self.now_ms())
        try:
            self.call(lambda: self.registry.register(entry))
        except Exception:  # exists already, or reply lost: read it back
            pass
        return self.state(p.xid)

    # -- the commit mode ---------------------------------------------------------------
    def lookup(self, p: Prepared) -> CommitOutcome:
        return self.call(lambda: self.mode_io.lookup(self.target, p), is_transient_or_unknown)

    def rollback(self, p: Prepared) -> None:
        self.call(lambda: self.mode_io.rollback(self.target, p), is_transient_or_unknown)

    def abort(self, p: Prepared, *, known_dead: bool = False) -> bool:
        """ABORTING, ROLLBACK, ABORTED. False (and nothing done) if ``p`` turned out committed.

        A COMMITTING xid is looked up first unless ``known_dead``: it may have committed.
        """
        cur = self.state(p.xid)
        if cur is TxState.ABORTED:
            return True
        if cur is TxState.COMMITTED:
            return False
        if cur is TxState.UNKNOWN:
            cur = self.fence_unknown(p)
            if cur is TxState.ABORTED:
                self.rollback(p)  # in case it wrote before its registration was lost
                return True
            if cur is TxState.COMMITTED:
                return False
        if cur is TxState.COMMITTING and not known_dead:
            outcome = self.lookup(p)
            if outcome is CommitOutcome.COMMITTED:
                log.warning("xid %s, not chosen, was found committed; recording it", p.xid)
                self.move(p.xid, TxState.COMMITTED)
                return False
        self.move(p.xid, TxState.ABORTING)
        self.rollback(p)
        self.move(p.xid, TxState.ABORTED)
        return True

    def abort_quietly(self, p: Prepared) -> None:
        """Best-effort :meth:`abort` for cleanup paths (a later GC finishes the job)."""
        try:
            self.abort(p)
        except Exception as exc:  # the original error matters more
            log.warning("cleanup of xid %s failed: %s", p.xid, exc)

    def ensure_committed(self, p: Prepared, *, payload: Mapping[str, object] | None = None) -> bool:
        """Make a decided ``p`` visible. True if committed; False if it definitely cannot be.

        Never repeats a COMMIT whose outcome is unknown without a lookup first, and
        settles any error on the way (the registry's, the COMMIT's, one raised after
        the COMMIT took effect) by a lookup of ``p`` (:meth:`settle`).

        Raises
        ------
        OutcomeUnknownError
            The xid stayed PENDING through every attempt, or could not be looked up:
            the batch is not done; a replay resolves it.
        """
        try:
            return self._ensure_committed(p, payload)
        except Exception as exc:
            return self.settle(p, exc)

    def _ensure_committed(self, p: Prepared, payload: Mapping[str, object] | None) -> bool:
        # The common case first: one CAS, no read (a read per xid is a round trip).
        cur: TxState | None = None
        try:
            if self.call(
                lambda: self.registry.transition(
                    p.xid, [TxState.INITIALIZED.value, TxState.COMMITTING.value], TxState.COMMITTING.value, payload
                )
            ):
                cur = TxState.COMMITTING
        except OutcomeUnknownError:
            pass  # the CAS may have happened: the read below decides
        if cur is None:
            cur = self.state(p.xid)
            if cur in (TxState.INITIALIZED, TxState.COMMITTING):
                try:
                    self.move(p.xid, TxState.COMMITTING, payload)
                    cur = TxState.COMMITTING
                except IllegalTransitionError:
                    cur = self.state(p.xid)  # fenced (GC, another driver) between read and CAS
        if cur is TxState.COMMITTED:
            return True
        if cur is not TxState.COMMITTING:
            # fenced or never registered: it must not commit now; did it before?
            if self.lookup(p) is CommitOutcome.COMMITTED:
                log.warning("decided xid %s is %s in the registry but committed", p.xid, cur.value)
                return True
            return False
        if not self.commit_committing(p):
            return False
        self.record_committed(p.xid)
        return True

    def commit_committing(self, p: Prepared) -> bool:
        """COMMIT an xid the registry holds in COMMITTING; False if it definitely cannot.

        Leaves the registry alone: the caller moves it to COMMITTED (one by one, or in
        bulk). Never repeats a COMMIT whose outcome is unknown without a lookup first.
        Whatever the COMMIT raises (a lost reply, a refusal, a server error after the
        COMMIT took effect), the marker decides: a PENDING xid is committed again after
        a transient or unknown error, and a refusal is raised as it is.

        Raises
        ------
        OutcomeUnknownError
            Still PENDING after every attempt. An error of the lookup itself is raised
            as it is: the outcome stays unknown.
        """
        last: Exception | None = None
        for _ in range(self.retry.max_attempts):
            try:
                self.call(lambda: self.mode_io.commit(self.target, p))
                return True
            except Exception as exc:  # any error: the COMMIT may have taken effect
                last = exc
                outcome = self.lookup(p)
                log.info("commit of %s failed (%s); lookup says %s", p.xid, exc, outcome.value)
                if outcome is CommitOutcome.COMMITTED:
                    return True
                if outcome is CommitOutcome.NOT_COMMITTED:
                    return False
                if is_refusal(exc):
                    raise  # committing again cannot help
        raise OutcomeUnknownError(
            f"xid still pending after {self.retry.max_attempts} commit attempts (last: {last})", xid=p.xid
        ) from last

    def settle(self, p: Prepared, exc: Exception) -> bool:
        """After ``exc`` from a commit step of ``p``: what its lookup says happened.

        True if ``p`` is committed (its marker is visible; the registry is moved to
        COMMITTED, best effort), False if it definitely cannot commit.

        Raises
        ------
        OutcomeUnknownError
            ``p`` is PENDING, or the lookup failed too: in doubt (from ``exc``).
        """
        try:
            outcome = self.lookup(p)
        except Exception as again:
            raise OutcomeUnknownError(
                f"{type(exc).__name__}: {exc}; its lookup failed too ({type(again).__name__}: {again})", xid=p.xid
            ) from exc
        log.warning("commit of xid %s failed (%s: %s); lookup says %s", p.xid, type(exc).__name__, exc, outcome.value)
        if outcome is CommitOutcome.COMMITTED:
            self.record_committed(p.xid)
            return True
        if outcome is CommitOutcome.NOT_COMMITTED:
            return False
        if isinstance(exc, OutcomeUnknownError) or is_refusal(exc):
            raise exc
        raise OutcomeUnknownError(f"{type(exc).__name__}: {exc}; the xid is still pending", xid=p.xid) from exc

    def record_committed(self, xid: str) -> None:
        """COMMITTING -> COMMITTED for an xid whose COMMIT took effect (best effort).

        Its rows are visible whatever the registry says, and the batch's entries are
        dropped once it is done; an entry left COMMITTING (the registry failed here) is
        found committed by its marker by ``recover`` and GC.
        """
        try:
            self.move(xid, TxState.COMMITTED)
        except Exception as exc:
            log.warning("xid %s is committed but its registry entry stays COMMITTING: %s", xid, exc)

    def bulk_move(
        self,
        xids: Sequence[str],
        expected: Sequence[TxState],
        new: TxState,
        payload: Mapping[str, object] | None = None,
    ) -> set[str]:
        """The xids one bulk CAS moved to ``new`` (empty when the registry has no bulk CAS)."""
        many = getattr(self.registry, "transition_many", None)
        if many is None or not xids:
            return set()
        try:
            return set(self.call(lambda: many(list(xids), [e.value for e in expected], new.value, payload)))
        except OutcomeUnknownError:
            return set()  # whatever landed is found again, xid by xid


# ----------------------------------------------------------------------------------------
# The coordinator
# ----------------------------------------------------------------------------------------


class Coordinator:
    """Two-phase commit of micro-batches of one query (``txn_id``) into one target.

    Built fresh wherever it is used: on executors for :meth:`prepare`, on the driver
    for :meth:`validate`, :meth:`commit_batch` and :meth:`abort_batch`. It holds no
    state of its own between calls; it is picklable if its I/O objects are.

    Parameters
    ----------
    txn_id:
        Stable id of the query (see :func:`clickhouse_tx.ids.default_txn_id`).
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
        self.txn_id = txn_id
        self.conversion = conversion
        self.xid_factory = xid_factory
        self.log = log
        self.parallelism = parallelism
        self.ops = TxOps(target, mode_io, registry, retry=retry, clock=clock, sleep=sleep)
        # what the coordinator shares with its ops, by the same names
        self.target, self.mode_io, self.registry = target, mode_io, registry
        self.retry, self.clock = self.ops.retry, clock

    def __repr__(self) -> str:
        return f"Coordinator(txn_id={self.txn_id!r}, target={self.target!r}, mode={self.mode_io.mode.value})"

    # -- driver: once per query ---------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        """Driver, once per query/job before any task writes: check target and schema."""
        self.mode_io.validate(self.target, schema)

    # -- executor: once per partition attempt --------------------------------------------
    def prepare(self, ctx: WriteContext, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: register, then write without committing.

        Raises
        ------
        NotCommittedError
            Anything went wrong; what was written is rolled back and the xid is
            ABORTED (best effort: GC finishes what a dying executor could not).
        """
        if ctx.txn_id != self.txn_id:
            raise ValueError(f"WriteContext txn_id {ctx.txn_id!r} != coordinator's {self.txn_id!r}")
        xid = self.xid_factory(ctx.txn_id, ctx.batch, ctx.partition, ctx.attempt)
        provisional = Prepared.for_attempt(
            ctx, xid, self.mode_io.mode, safe_url(self.target.url), f"{self.target.database}.{self.target.table}"
        )
        entry = RegistryEntry.of_attempt(provisional, TxState.INITIALIZED.value, self.ops.now_ms())
        try:
            self.ops.call(lambda: self.registry.register(entry))
        except Exception as exc:
            self.ops.abort_quietly(provisional)
            raise NotCommittedError(f"could not register the transaction: {exc}", xid=xid) from exc
        written: Prepared | None = None
        try:
            if self.conversion is not None:
                # Modes whose inserts are visible one by one get the whole partition
                # checked before the first insert; the others roll back on a bad value.
                eager = self.mode_io.mode in (Mode.DEDUP, Mode.NONE)
                batches = self.conversion.apply(batches, eager=eager)
            written = self.mode_io.prepare(self.target, ctx, xid, batches)
            if written.xid != xid:
                raise IllegalTransitionError(f"mode returned xid {written.xid!r} for {xid!r}", xid=xid)
            state = self.ops.state(xid)
            if state is not TxState.INITIALIZED:
                # The driver fenced this attempt while it wrote. Its rollback may have run
                # before this attempt's work existed (no session yet: a no-op), and abort
                # skips an ABORTED xid: so this attempt rolls back what it wrote itself.
                # Otherwise its transaction stayed open, kept alive by the keep-alive,
                # and a DROP TABLE ... SYNC of the target waited behind it.
                self.ops.rollback(written)
                raise NotCommittedError(f"fenced while writing: registry says {state.value}", xid=xid)
            return written
        except Exception as exc:
            self.ops.abort_quietly(written or provisional)
            if isinstance(exc, ValueDoesNotFitError):
                exc.xid = xid  # keep its type: the task failed on the data, not on I/O
            if isinstance(exc, NotCommittedError) and exc.xid == xid:
                raise
            raise NotCommittedError(f"prepare failed: {type(exc).__name__}: {exc}", xid=xid) from exc

    # -- driver: once per batch ----------------------------------------------------------
    def _check_messages(self, batch: int, messages: Iterable[Prepared | None]) -> list[Prepared]:
        out = []
        for m in messages:
            if m is None:
                continue  # Spark passes None for tasks that sent no message
            if not isinstance(m, Prepared):
                raise TypeError(f"commit message must be a Prepared, got {type(m).__name__}")
            if m.txn_id != self.txn_id or m.batch != batch:
                raise ValueError(
                    f"message {m.xid} is of txn_id={m.txn_id!r} batch={m.batch}, "
                    f"not of txn_id={self.txn_id!r} batch={batch}"
                )
            out.append(m)
        return out

    def _read(self, batch: int) -> Decision | None:
        return self.ops.call(lambda: self.log.read(batch), is_transient_or_unknown)

    def _entries(self, batch: int) -> list[RegistryEntry]:
        return self.ops.call(lambda: self.registry.list_batch(self.txn_id, batch), is_transient_or_unknown)

    def _entries_after_commit(self, batch: int) -> list[RegistryEntry]:
        """The batch's registry entries, for rolling back its other attempts; [] if unreadable.

        Every decided partition is visible by now: a registry that fails here must not
        fail the job. The attempts it would have listed can never be chosen once the
        batch is done, and GC rolls them back (``python -m clickhouse_tx gc``).
        """
        try:
            return self._entries(batch)
        except Exception as exc:
            log.warning("batch %d: could not list its other attempts (left to GC): %s", batch, exc)
            return []

    def _write(self, decision: Decision) -> None:
        """Write a decision version; a lost reply or a conflict is resolved by reading back."""
        try:
            self.ops.call(lambda: self.log.write(decision))
            return
        except (OutcomeUnknownError, DecisionConflictError):
            back = self._read(decision.batch)
            if (
                back is not None
                and back.version == decision.version
                and [p.xid for p in back.chosen] == [p.xid for p in decision.chosen]
            ):
                return  # our own write, whose reply was lost
            raise

    def _rollback_all(self, ps: Iterable[Prepared], *, quiet: bool = False) -> list[str]:
        """Abort each of ``ps``; the xids rolled back.

        ``quiet``: an xid whose abort fails (a straggler still holds its session:
        SESSION_IS_LOCKED) is logged and left to GC and session expiry instead of
        failing the caller. Safe once the batch's fate is decided: an xid not chosen
        can never commit, whatever state the failed abort left it in.
        """
        done = []
        for p in ps:
            try:
                if self.ops.abort(p):
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

    def commit_batch(self, batch: int, messages: Sequence[Prepared | None]) -> CommitReport:
        """Driver, once per batch commit (possibly again after a crash): 2PC phase two.

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
        t0 = self.clock()
        msgs = self._check_messages(batch, messages)
        self._check_layout(batch, msgs)
        plan = plan_commit(self._read(batch), msgs, self._entries(batch), txn_id=self.txn_id, batch=batch)
        durations: dict[str, float] = {"plan": self.clock() - t0}
        assert plan.decision is not None
        if plan.already_done:
            return self._replay_of_done(plan.decision, msgs, t0, durations)
        run = _Run(plan.decision, dict(plan.spares))
        if plan.write_decision:
            t = self.clock()
            self._check_sessions(run, msgs)
            durations["session_check"] = self.clock() - t
            t = self.clock()
            self._write(run.decision)
            durations["decision_write"] = self.clock() - t

        t = self.clock()
        first_pass = self._commit_all(run)
        if plan.replay and run.chosen and msgs and not any(first_pass.values()):
            first_pass = self._redecide(run, msgs) or first_pass
        self._replace_dead(run, first_pass)
        durations["commit"] = self.clock() - t

        t = self.clock()
        keep = {p.xid for p in run.chosen.values()}
        registered = self._entries_after_commit(batch)
        run.rolled += self._rollback_all(plan_rollback(keep, msgs, registered), quiet=True)
        durations["rollback"] = self.clock() - t
        if run.lost:
            raise LostTransactionError(self._lost_message(run, msgs), xid=run.lost[0].xid)
        t = self.clock()
        self.ops.call(lambda: self.log.mark_done(batch), is_transient_or_unknown)
        durations["mark_done"] = self.clock() - t
        self._forget(keep | set(run.rolled) | {e.xid for e in registered})
        durations["total"] = self.clock() - t0
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

    def _check_layout(self, batch: int, msgs: Sequence[Prepared]) -> None:
        """A mode that records how a batch was cut (dedup) refuses a run that cut it otherwise."""
        self.ops.call(lambda: self.mode_io.check_layout(self.target, batch, msgs), is_transient_or_unknown)

    def _replay_of_done(
        self, decision: Decision, msgs: Sequence[Prepared], t0: float, durations: dict[str, float]
    ) -> CommitReport:
        """A done batch again (Spark replays it after a crash past mark_done): roll back only."""
        t = self.clock()
        keep = {p.xid for p in decision.chosen}
        rolled = self._rollback_all(plan_rollback(keep, msgs, self._entries(decision.batch)), quiet=True)
        durations["rollback"] = self.clock() - t
        durations["total"] = self.clock() - t0
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

    def _renew(self, p: Prepared) -> bool:
        """True if ``p``'s prepared work is still there (and its session renewed)."""
        renew = getattr(self.mode_io, "renew", None)
        if renew is None:
            return True  # modes without sessions keep prepared work until rolled back
        return bool(self.ops.call(lambda: renew(self.target, p), is_transient_or_unknown))

    def _check_sessions(self, run: "_Run", msgs: Sequence[Prepared]) -> None:
        """Before a decision is written: every chosen xid must still be committable.

        Renews each chosen session (so none expires between here and its COMMIT);
        a dead one is swapped for a live spare of its partition. If a partition has
        none, nothing is decided: every xid of the batch is rolled back and
        :class:`NotCommittedError` says why. Without this check a batch job whose
        early sessions expired committed the rest and failed half-visible.
        """
        parts = sorted(run.chosen)
        alive = self._each(parts, lambda part: self._renew(run.chosen[part]))
        dead: list[Prepared] = []
        for part in parts:
            if alive[part]:
                continue
            spare = next((s for s in run.spares.get(part, ()) if self._renew(s)), None)
            if spare is None:
                dead.append(run.chosen[part])
                continue
            run.spares[part] = tuple(s for s in run.spares[part] if s.xid != spare.xid)
            run.chosen[part] = spare
        if dead:
            self._rollback_all(plan_rollback((), msgs, self._entries(run.decision.batch)), quiet=True)
            raise NotCommittedError(
                f"batch {run.decision.batch}: the prepared transactions of partitions "
                f"{[p.partition for p in dead]} are gone before the commit: lost xids "
                f"{[p.xid for p in dead]} (their sessions expired "
                f"after session_timeout={self.target.session_timeout_s} s idle, or ClickHouse "
                "restarted). Nothing of the batch was committed and every prepared partition is "
                "rolled back, so restarting the query replays the batch (a batch job: run it "
                "again) and writes it once; supervise streaming queries to restart them. "
                "Tasks that wait longer than session_timeout for the commit need a larger "
                "session_timeout option (the server caps it at max_session_timeout)",
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
            fresh = plan_commit(None, msgs, self._entries(batch), txn_id=self.txn_id, batch=batch)
        except NotCommittedError as exc:
            log.warning("batch %d: cannot decide again from this run: %s", batch, exc)
            return None
        assert fresh.decision is not None
        old = dict(run.chosen)
        for p in old.values():
            self.ops.abort(p, known_dead=True)
            run.rolled.append(p.xid)
        new = _Run(dataclasses.replace(fresh.decision, version=run.decision.version + 1), dict(fresh.spares))
        self._check_sessions(new, msgs)
        self._write(new.decision)
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
                self.ops.abort(current, known_dead=True)
                run.rolled.append(current.xid)
                nxt = next((s for s in spares if self.ops.state(s.xid) is TxState.INITIALIZED), None)
                if nxt is None:
                    run.lost.append(current)
                    break
                spares = spares[spares.index(nxt) + 1 :]
                run.chosen[part] = nxt
                run.decision = Decision(
                    txn_id=self.txn_id,
                    batch=batch,
                    version=run.decision.version + 1,
                    chosen=tuple(run.chosen[p] for p in sorted(run.chosen)),
                )
                self._write(run.decision)  # before the replacement's COMMIT, as for v1
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
                ok = self.ops.ensure_committed(current, payload={"decision_version": run.decision.version})

    def _log_root(self) -> str:
        return getattr(self.log, "root_uri", None) or "<decision_log>"

    def _way_out(self) -> str:
        root = self._log_root()
        return (
            f"python -m clickhouse_tx recover --url {safe_url(self.target.url)} "
            f"--table {self.target.database}.{self.target.table} --mode {self.mode_io.mode.value} "
            f"--txn-id {self.txn_id} --checkpoint {root}"
        )

    def _lost_message(self, run: "_Run", msgs: Sequence[Prepared]) -> str:
        lost = {p.partition for p in run.lost}
        visible = sorted(set(run.chosen) - lost)
        now = len({m.partition for m in msgs})
        return (
            f"batch {run.decision.batch} of {self.txn_id}: partitions {sorted(lost)} (xids "
            f"{[p.xid for p in run.lost]}) can no longer commit: their prepared transactions are "
            "gone (ClickHouse restarted, their sessions expired, or the server lost Keeper at "
            "COMMIT and rolled them back) and no task of this run wrote "
            "the same rows (a replacement must match the decided partition's rows and checksum; "
            f"this run has {now} partitions, the decision {len(run.chosen)}). Partitions {visible} "
            f"are committed and visible ({sum(run.chosen[p].rows for p in visible)} rows): running "
            "the job again under a new transactional_id would write them twice. Way out: run again "
            f"with transactional_id '{self.txn_id}' and decision_log '{self._log_root()}' (a "
            "streaming query: restart it on the same "
            f"checkpoint) and the original partitioning ({len(run.chosen)} partitions: the same "
            "repartition(n), minPartitions and Kafka partitions), which re-writes and matches the "
            "missing partitions and keeps the visible ones"
        )

    def _commit_all(self, run: "_Run") -> dict[int, bool]:
        """First COMMIT of every decided partition.

        Safe in any order and concurrently: the decision is durable before this runs,
        and each xid's COMMIT touches only its own session and registry entry. The
        registry moves go in bulk where the registry can (one CAS to COMMITTING for
        every xid, one to COMMITTED for the committed ones: 16 partitions took 82
        requests xid by xid); an xid the bulk CAS did not move takes the one-by-one path,
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
        ready = self.ops.bulk_move(
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
                    return self.ops.ensure_committed(p, payload=payload)
                try:
                    return self.ops.commit_committing(p)
                except Exception as exc:  # its lookup failed: once more, then in doubt
                    return self.ops.settle(p, exc)
            except Exception as exc:  # in doubt after its lookup; the others still commit; raised below
                doubt[part] = exc
                return False

        results = self._each(parts, commit_one)
        finish = [chosen[p].xid for p in parts if results[p] and chosen[p].xid in ready]
        try:
            done = self.ops.bulk_move(finish, (TxState.COMMITTING,), TxState.COMMITTED)
        except Exception:  # bookkeeping of visible rows: xid by xid below
            done = set()
        for xid in finish:
            if xid not in done:
                self.ops.record_committed(xid)
        if doubt:
            part = min(doubt)
            first = doubt[part]
            raise OutcomeUnknownError(
                f"batch {run.decision.batch}: partitions {sorted(doubt)} are in doubt "
                f"({type(first).__name__}: {first}; retry.attempts={self.retry.max_attempts}); "
                f"partitions {sorted(p for p in parts if results[p])} are committed and visible. "
                f"The batch is not done: restart the query (or run the job again with options "
                f"transactional_id '{self.txn_id}' and decision_log '{self._log_root()}'), or "
                f"finish it with `{self._way_out()}`; "
                "running the job again under a new transactional_id would write the visible "
                "partitions twice",
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
            self.ops.call(lambda: self.mode_io.commit_together(self.target, ps))
        except (NotCommittedError, ServerError) as exc:
            if isinstance(exc, OutcomeUnknownError):
                raise
            log.warning(
                "batch %d: could not publish the batch in one transaction (%s); committing its "
                "partitions one by one, so readers may see part of it",
                run.decision.batch,
                exc,
            )

    def _forget(self, xids: Iterable[str]) -> None:
        """Drop a done batch's finished entries from the registry (best effort).

        Nothing reads them again: the decision is immutable and done, lookups go
        through the markers, and a late attempt of the batch can never be chosen (GC
        rolls it back). Keeping them would make every batch-wide registry scan slower.
        """
        forget = getattr(self.registry, "forget", None)
        if forget is None:
            return
        try:
            forget(sorted(xids))
        except Exception as exc:  # housekeeping never fails a commit
            log.info("could not drop finished registry entries: %s", exc)

    def _each(self, parts: Sequence[int], fn: Callable[[int], bool]) -> dict[int, bool]:
        """``fn`` over the partitions, ``parallelism`` at a time; the first error is raised."""
        if self.parallelism <= 1 or len(parts) <= 1:
            return {part: fn(part) for part in parts}
        with concurrent.futures.ThreadPoolExecutor(
            min(self.parallelism, len(parts)), thread_name_prefix="clickhouse-tx-commit"
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

    def abort_batch(
        self, batch: int, messages: Sequence[Prepared | None], *, discard_decided: bool = False
    ) -> AbortReport:
        """Driver, when Spark aborts a batch: roll back everything not decided.

        Decided xids are left alone: a decision means some may already be
        committed, and the replay of the batch rolls the rest forward. With
        ``discard_decided`` (a batch job's stage, dropped afterwards: nothing of it is
        visible and no replay comes) they are rolled back too, so that no open
        transaction holds the stage; one already committed into it stays. Never raises
        for one xid that cannot be rolled back now (a straggler task still holds its
        session: SESSION_IS_LOCKED): it is fenced, so it can never commit, and is
        listed in ``left`` for GC and session expiry; Spark's own error stays the one
        the user sees.
        """
        msgs = self._check_messages(batch, messages)
        decision = self._read(batch)
        keep = {p.xid for p in decision.chosen} if decision is not None and not discard_decided else set()
        todo = plan_rollback(keep, msgs, self._entries(batch))
        rolled = self._rollback_all(todo, quiet=True)
        left = tuple(p.xid for p in todo if p.xid not in rolled)
        return AbortReport(batch=batch, rolled_back=tuple(rolled), kept=tuple(sorted(keep)), left=left)


@dataclasses.dataclass
class _Run:
    """The mutable state of one :meth:`Coordinator.commit_batch` call (driver, in memory)."""

    decision: Decision
    spares: dict[int, tuple[Prepared, ...]]
    chosen: dict[int, Prepared] = dataclasses.field(default_factory=dict)
    replaced: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    rolled: list[str] = dataclasses.field(default_factory=list)
    lost: list[Prepared] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.chosen:
            self.chosen = {p.partition: p for p in self.decision.chosen}
