"""The idempotent steps of one xid over the registry and a commit mode (:class:`TxOps`).

Shared by the driver's commit (:mod:`clickhouse_tx.protocol.batch_commit`), the executor's
prepare (:mod:`clickhouse_tx.protocol.prepare`) and operator-side recovery
(:mod:`clickhouse_tx.admin.recovery`). Every step is a registry compare-and-set checked
against the transition table (:mod:`clickhouse_tx.protocol.state`) plus an idempotent call of
the mode, and every I/O call goes through the one retry helper, so a step repeated
after a crash or a lost reply does nothing twice.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence, TypeVar

from clickhouse_tx.errors import IllegalTransitionError, NotCommittedError, OutcomeUnknownError, ServerError
from clickhouse_tx.interfaces import CommitModeIO, CommitOutcome, Prepared, RegistryEntry, RegistryIO, Target
from clickhouse_tx.protocol.state import TxState, as_state, next_state, predecessors
from clickhouse_tx.retry import RetryPolicy, is_transient, is_transient_or_unknown, retry_call

log = logging.getLogger(__name__)
T = TypeVar("T")


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

    Takes its I/O one by one: the coordinator's from its
    :class:`~clickhouse_tx.protocol.context.CommitContext`, recovery's (which serves no
    one query) from the target it sweeps.
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

    def state_and_fence(self, xid: str, fence: str | None) -> tuple[TxState, bool]:
        """``xid``'s state, and whether ``fence`` (its run's abort fence) exists: one read."""
        keys = [xid, fence] if fence else [xid]
        found = self.call(lambda: self.registry.get_many(keys), is_transient_or_unknown)
        e = found.get(xid)
        return as_state(e.state if e is not None else None), bool(fence) and fence in found

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

    def renew(self, p: Prepared) -> bool:
        """True if ``p``'s prepared work is still there (and its session renewed)."""
        return bool(self.call(lambda: self.mode_io.renew(self.target, p), is_transient_or_unknown))

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
        if not xids:
            return set()
        many = self.registry.transition_many
        try:
            return set(self.call(lambda: many(list(xids), [e.value for e in expected], new.value, payload)))
        except OutcomeUnknownError:
            return set()  # whatever landed is found again, xid by xid
