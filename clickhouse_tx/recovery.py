"""Operator-side recovery over the registry: in-doubt xids, stale prepares, a status summary.

These run outside any Spark query (``python -m clickhouse_tx status|recover|gc``),
possibly while queries run: every step is a registry compare-and-set plus an
idempotent commit-mode call, so racing a live coordinator is safe.

``log_for(txn_id)`` gives the decision log of a query (e.g.
``lambda t: FileDecisionLog(checkpoint, t)``); it may return None when the log of
that txn_id is not reachable, and then xids whose fate depends on it are skipped.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Callable, Mapping

from clickhouse_tx.coordinator import TxOps, prepared_from_entry
from clickhouse_tx.interfaces import (
    CommitModeIO,
    CommitOutcome,
    Decision,
    DecisionLogIO,
    RegistryEntry,
    RegistryIO,
    Target,
)
from clickhouse_tx.retry import RetryPolicy
from clickhouse_tx.state import TxState, as_state

log = logging.getLogger(__name__)

LogFor = Callable[[str], "DecisionLogIO | None"]


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    """What a recovery or GC pass did, xid by xid."""

    committed: tuple[str, ...] = ()
    rolled_back: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # left alone: decided, or its decision log unreachable
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StatusSummary:
    """Open (unfinished) xids of the registry at one moment."""

    open_by_state: Mapping[str, int]
    in_doubt: tuple[str, ...]  # COMMITTING or ABORTING: a driver died mid-step
    oldest_open_age_s: float | None
    by_txn: Mapping[str, int]


def _decision_of(log_for: LogFor, cache: dict, e: RegistryEntry) -> tuple[bool, Decision | None]:
    """(reachable, decision) of the entry's batch, cached per (txn_id, batch)."""
    key = (e.txn_id, e.batch)
    if key not in cache:
        lg = log_for(e.txn_id)
        cache[key] = (False, None) if lg is None else (True, lg.read(e.batch))
    return cache[key]


def _ops(target: Target, mode_io: CommitModeIO, registry: RegistryIO,
         retry: RetryPolicy | None, clock: Callable[[], float]) -> TxOps:
    return TxOps(target, mode_io, registry, retry=retry, clock=clock)


def resolve_in_doubt(target: Target, mode_io: CommitModeIO, registry: RegistryIO, log_for: LogFor, *,
                     txn_id: str | None = None, retry: RetryPolicy | None = None,
                     clock: Callable[[], float] = time.time) -> RecoveryReport:
    """Finish xids a dead driver left COMMITTING or ABORTING.

    COMMITTING: lookup; COMMITTED -> record it; PENDING and still in the batch's
    latest decision -> COMMIT it (roll forward); otherwise (NOT_COMMITTED, or
    pending but no longer decided) -> roll back, ABORTED. A decided xid rolled back
    here is replaced by the batch's replay, exactly as the coordinator would.
    ABORTING: finish the rollback, ABORTED.
    """
    ops = _ops(target, mode_io, registry, retry, clock)
    committed, rolled, skipped, errors = [], [], [], {}
    cache: dict = {}
    for e in registry.list_open(None):
        if txn_id is not None and e.txn_id != txn_id:
            continue
        state = as_state(e.state)
        p = prepared_from_entry(e)
        try:
            if state is TxState.ABORTING:
                ops.abort(p, known_dead=True)
                rolled.append(e.xid)
            elif state is TxState.COMMITTING:
                outcome = ops.lookup(p)
                if outcome is CommitOutcome.COMMITTED:
                    ops.move(e.xid, TxState.COMMITTED)
                    committed.append(e.xid)
                    continue
                reachable, decision = _decision_of(log_for, cache, e)
                decided = decision is not None and e.xid in {c.xid for c in decision.chosen}
                if outcome is CommitOutcome.PENDING and not reachable:
                    skipped.append(e.xid)
                elif outcome is CommitOutcome.PENDING and decided:
                    chosen = next(c for c in decision.chosen if c.xid == e.xid)  # type: ignore[union-attr]
                    if ops.ensure_committed(chosen):
                        committed.append(e.xid)
                    else:
                        ops.abort(chosen, known_dead=True)
                        rolled.append(e.xid)
                else:
                    ops.abort(p, known_dead=outcome is CommitOutcome.NOT_COMMITTED)
                    rolled.append(e.xid)
        except Exception as exc:  # noqa: BLE001 - one bad xid must not stop the pass
            errors[e.xid] = f"{type(exc).__name__}: {exc}"
    return RecoveryReport(tuple(committed), tuple(rolled), tuple(skipped), errors)


def gc_stale(target: Target, mode_io: CommitModeIO, registry: RegistryIO, log_for: LogFor,
             older_than_s: float, *, txn_id: str | None = None, retry: RetryPolicy | None = None,
             clock: Callable[[], float] = time.time) -> RecoveryReport:
    """Roll back INITIALIZED xids older than ``older_than_s`` that no decision names.

    These are prepares of dead executors, zombies and batches Spark never
    committed. ``older_than_s`` must exceed the longest batch (prepare to commit):
    an xid fenced here while its batch is being decided cannot commit, and that
    batch then needs a replay (safe, but lost work).
    Decided xids are skipped: a replay rolls them forward.
    """
    ops = _ops(target, mode_io, registry, retry, clock)
    rolled, skipped, errors = [], [], {}
    cache: dict = {}
    for e in registry.list_open(older_than_s):
        if (txn_id is not None and e.txn_id != txn_id) or as_state(e.state) is not TxState.INITIALIZED:
            continue
        try:
            reachable, decision = _decision_of(log_for, cache, e)
            if not reachable or (decision is not None and e.xid in {c.xid for c in decision.chosen}):
                skipped.append(e.xid)
                continue
            if ops.abort(prepared_from_entry(e)):
                rolled.append(e.xid)
        except Exception as exc:  # noqa: BLE001
            errors[e.xid] = f"{type(exc).__name__}: {exc}"
    return RecoveryReport(rolled_back=tuple(rolled), skipped=tuple(skipped), errors=errors)


def status_summary(registry: RegistryIO, *, clock: Callable[[], float] = time.time) -> StatusSummary:
    """Counts of open xids per state and per txn_id, the in-doubt ones, the oldest age."""
    entries = registry.list_open(None)
    now_ms = clock() * 1000
    by_state = collections.Counter(as_state(e.state).value for e in entries)
    by_txn = collections.Counter(e.txn_id for e in entries)
    in_doubt = tuple(sorted(e.xid for e in entries
                            if as_state(e.state) in (TxState.COMMITTING, TxState.ABORTING)))
    oldest = min((e.created_ms for e in entries), default=None)
    return StatusSummary(open_by_state=dict(by_state), in_doubt=in_doubt,
                         oldest_open_age_s=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
                         by_txn=dict(by_txn))
