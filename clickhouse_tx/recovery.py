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
from typing import Callable, Collection, Iterable, Mapping

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


def _theirs(entries: Iterable[RegistryEntry], txn_ids: Collection[str] | None) -> list[RegistryEntry]:
    """The entries of the queries an operator named (all of them when ``txn_ids`` is None)."""
    return [e for e in entries if txn_ids is None or e.txn_id in txn_ids]


def _finish_committing(ops: TxOps, e: RegistryEntry, log_for: LogFor, cache: dict) -> str:
    """Settle one COMMITTING xid; returns "committed", "rolled_back" or "skipped".

    COMMITTING means the xid's query decided it: only that decision may roll it back
    (when a later version replaced it, or when it definitely cannot commit and the
    replay replaces it). Without the decision (log unreachable, or no decision for the
    batch: the log of another query) it is left alone whatever the lookup says.
    """
    p = prepared_from_entry(e)
    outcome = ops.lookup(p)
    if outcome is CommitOutcome.COMMITTED:
        ops.move(e.xid, TxState.COMMITTED)
        return "committed"
    reachable, decision = _decision_of(log_for, cache, e)
    if not reachable or decision is None:
        if reachable:
            log.warning("xid %s is COMMITTING but the decision log has no decision for batch %d of %s: "
                        "left alone (is this the query's checkpoint?)", e.xid, e.batch, e.txn_id)
        return "skipped"
    chosen = next((c for c in decision.chosen if c.xid == e.xid), None)
    if chosen is None:  # replaced by a later decision version
        ops.abort(p, known_dead=outcome is CommitOutcome.NOT_COMMITTED)
        return "rolled_back"
    if outcome is CommitOutcome.PENDING and ops.ensure_committed(chosen):
        return "committed"
    ops.abort(chosen, known_dead=True)  # definitely cannot commit: the replay replaces it
    return "rolled_back"


def resolve_in_doubt(target: Target, mode_io: CommitModeIO, registry: RegistryIO, log_for: LogFor, *,
                     txn_ids: Collection[str] | None = None, retry: RetryPolicy | None = None,
                     clock: Callable[[], float] = time.time) -> RecoveryReport:
    """Finish xids a dead driver left COMMITTING or ABORTING.

    Runs on an operator's machine (``python -m clickhouse_tx recover``), once per call.
    ``txn_ids``: act only on these queries' xids (None: every query in the registry,
    which is safe only when ``log_for`` reaches every query's decision log).

    COMMITTING: committed per lookup -> record it; otherwise settled by the batch's
    decision (:func:`_finish_committing`), and skipped without it. ABORTING: its
    driver chose to roll it back; finish that, ABORTED.
    """
    ops = _ops(target, mode_io, registry, retry, clock)
    done: dict[str, list[str]] = {"committed": [], "rolled_back": [], "skipped": []}
    errors: dict[str, str] = {}
    cache: dict = {}
    for e in _theirs(registry.list_open(None), txn_ids):
        try:
            state = as_state(e.state)
            if state is TxState.ABORTING:
                ops.abort(prepared_from_entry(e), known_dead=True)
                done["rolled_back"].append(e.xid)
            elif state is TxState.COMMITTING:
                done[_finish_committing(ops, e, log_for, cache)].append(e.xid)
        except Exception as exc:  # noqa: BLE001 - one bad xid must not stop the pass
            errors[e.xid] = f"{type(exc).__name__}: {exc}"
    return RecoveryReport(tuple(done["committed"]), tuple(done["rolled_back"]), tuple(done["skipped"]), errors)


def gc_stale(target: Target, mode_io: CommitModeIO, registry: RegistryIO, log_for: LogFor,
             older_than_s: float, *, txn_ids: Collection[str] | None = None, retry: RetryPolicy | None = None,
             clock: Callable[[], float] = time.time) -> RecoveryReport:
    """Roll back INITIALIZED xids older than ``older_than_s`` that no decision names.

    Runs on an operator's machine (``python -m clickhouse_tx gc``), once per call.
    These are prepares of dead executors, zombies and batches Spark never
    committed. ``older_than_s`` must exceed the longest batch (prepare to commit):
    an xid fenced here while its batch is being decided cannot commit, and that
    batch then needs a replay (safe, but lost work). ``txn_ids`` as in
    :func:`resolve_in_doubt`. Decided xids, and xids whose decision log is
    unreachable, are skipped: a replay rolls them forward.
    """
    ops = _ops(target, mode_io, registry, retry, clock)
    rolled, skipped, errors = [], [], {}
    cache: dict = {}
    for e in _theirs(registry.list_open(older_than_s), txn_ids):
        if as_state(e.state) is not TxState.INITIALIZED:
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


def decision_log_txn_ids(checkpoint: str) -> list[str]:
    """The txn_ids that have at least one decision under ``checkpoint`` (sorted).

    Operator side, once per ``recover``/``gc`` call: these are the queries whose
    xids the command may touch when it is given a checkpoint and no ``--txn-id``.
    """
    import pyarrow.fs as pafs

    from clickhouse_tx.decision_log import FileDecisionLog, _filesystem

    fs, root = _filesystem(checkpoint)
    infos = fs.get_file_info(pafs.FileSelector(f"{root.rstrip('/')}/clickhouse_tx", allow_not_found=True))
    names = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
    return [n for n in names if list(FileDecisionLog(checkpoint, n).batches())]


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
