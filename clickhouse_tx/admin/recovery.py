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
from typing import Callable, Collection, Iterable, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP, safe_url
from clickhouse_tx.ids import parse_xid, sanitize_txn
from clickhouse_tx.interfaces import (
    CommitModeIO,
    CommitOutcome,
    Decision,
    DecisionLogIO,
    Prepared,
    RegistryEntry,
    RegistryIO,
    Target,
    WriteContext,
)
from clickhouse_tx.modes.staging.tables import (
    OVERWRITE_STAGE_PREFIX,
    is_overwrite_stage_of,
    leftover_stages,
    tables_named,
)
from clickhouse_tx.protocol.commit_plan import prepared_from_entry
from clickhouse_tx.protocol.state import TxState, as_state
from clickhouse_tx.protocol.tx_ops import TxOps
from clickhouse_tx.retry import RetryPolicy

#: (reachable, decision) per (txn_id, batch), for one recovery pass.
_DecisionCache = dict[tuple[str, int], tuple[bool, "Decision | None"]]

log = logging.getLogger(__name__)

LogFor = Callable[[str], "DecisionLogIO | None"]


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    """What a recovery or GC pass did, xid by xid."""

    committed: tuple[str, ...] = ()
    rolled_back: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # left alone: decided, or its decision log unreachable
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    forgotten: tuple[str, ...] = ()  # finished registry entries nothing reads again (gc)
    dropped: tuple[str, ...] = ()  # leftover stage tables dropped (gc, mode staging)


@dataclasses.dataclass(frozen=True)
class StatusSummary:
    """Open (unfinished) xids of the registry at one moment."""

    open_by_state: Mapping[str, int]
    in_doubt: tuple[str, ...]  # COMMITTING or ABORTING: a driver died mid-step
    oldest_open_age_s: float | None
    by_txn: Mapping[str, int]


def _decision_of(log_for: LogFor, cache: _DecisionCache, e: RegistryEntry) -> tuple[bool, Decision | None]:
    """(reachable, decision) of the entry's batch, cached per (txn_id, batch)."""
    key = (e.txn_id, e.batch)
    if key not in cache:
        lg = log_for(e.txn_id)
        cache[key] = (False, None) if lg is None else (True, lg.read(e.batch))
    return cache[key]


def _ops(
    target: Target, mode_io: CommitModeIO, registry: RegistryIO, retry: RetryPolicy | None, clock: Callable[[], float]
) -> TxOps:
    return TxOps(target, mode_io, registry, retry=retry, clock=clock)


def _theirs(entries: Iterable[RegistryEntry], txn_ids: Collection[str] | None) -> list[RegistryEntry]:
    """The entries of the queries an operator named (all of them when ``txn_ids`` is None)."""
    return [e for e in entries if txn_ids is None or e.txn_id in txn_ids]


def _finish_committing(ops: TxOps, e: RegistryEntry, log_for: LogFor, cache: _DecisionCache) -> str:
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
            log.warning(
                "xid %s is COMMITTING but the decision log has no decision for batch %d of %s: "
                "left alone (is this the query's checkpoint?)",
                e.xid,
                e.batch,
                e.txn_id,
            )
        return "skipped"
    chosen = next((c for c in decision.chosen if c.xid == e.xid), None)
    if chosen is None:  # replaced by a later decision version
        ops.abort(p, known_dead=outcome is CommitOutcome.NOT_COMMITTED)
        return "rolled_back"
    if outcome is CommitOutcome.PENDING and ops.ensure_committed(chosen):
        return "committed"
    ops.abort(chosen, known_dead=True)  # definitely cannot commit: the replay replaces it
    return "rolled_back"


def resolve_in_doubt(
    target: Target,
    mode_io: CommitModeIO,
    registry: RegistryIO,
    log_for: LogFor,
    *,
    txn_ids: Collection[str] | None = None,
    retry: RetryPolicy | None = None,
    clock: Callable[[], float] = time.time,
) -> RecoveryReport:
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
    cache: _DecisionCache = {}
    for e in _theirs(registry.list_open(None), txn_ids):
        try:
            state = as_state(e.state)
            if state is TxState.ABORTING:
                ops.abort(prepared_from_entry(e), known_dead=True)
                done["rolled_back"].append(e.xid)
            elif state is TxState.COMMITTING:
                done[_finish_committing(ops, e, log_for, cache)].append(e.xid)
        except Exception as exc:  # one bad xid must not stop the pass
            errors[e.xid] = f"{type(exc).__name__}: {exc}"
    return RecoveryReport(tuple(done["committed"]), tuple(done["rolled_back"]), tuple(done["skipped"]), errors)


def gc_stale(
    target: Target,
    mode_io: CommitModeIO,
    registry: RegistryIO,
    log_for: LogFor,
    older_than_s: float,
    *,
    overwrite_stages: bool = True,
    not_running: bool = False,
    txn_ids: Collection[str] | None = None,
    retry: RetryPolicy | None = None,
    clock: Callable[[], float] = time.time,
) -> RecoveryReport:
    """Remove what dead executors, zombies and crashed drivers left behind.

    Runs on an operator's machine (``python -m clickhouse_tx gc``), once per call;
    only what is older than ``older_than_s`` (which must exceed the longest batch,
    prepare to commit: an xid fenced while its batch is being decided cannot commit,
    and the batch then needs a replay) and belongs to ``txn_ids`` (as in
    :func:`resolve_in_doubt`). Four passes:

    1. INITIALIZED xids no decision names: rolled back (open transaction or stage
       dropped), ABORTED, then forgotten.
    2. Finished entries (with ``txn_ids``): forgotten when nothing reads them
       again, i.e. undecided ABORTED ones (rolled back once more first: a stage a
       failed prepare could not drop goes with it) and any of a done batch.
    3. Stage tables (modes that have them) whose xid has no entry or an ABORTED
       one: dropped (or, when their marker exists, finished: all moved).
    4. Stage tables of batch jobs, appends and overwrites (with ``txn_ids`` and
       ``overwrite_stages``): every open xid of this mode prepared into one is rolled
       back, decided or not (no replay comes for a batch job), then it is dropped.

    Decided xids of a batch not done, and anything whose decision log is
    unreachable, are left alone: their query's replay rolls them forward. With
    ``not_running`` (the operator says the named queries are stopped; ``txn_ids`` is
    required), an xid whose batch has no decision log here is treated by
    :func:`untouched_batch` instead: a query that never decided a batch leaves no log.
    """
    if not_running and not txn_ids:
        raise ValueError("gc with not_running needs the queries named (txn_ids)")
    ops = _ops(target, mode_io, registry, retry, clock)
    rolled, skipped, errors = [], [], {}
    cache: _DecisionCache = {}
    untouched: dict[tuple[str, int], bool] = {}
    for e in _theirs(registry.list_open(older_than_s), txn_ids):
        if as_state(e.state) is not TxState.INITIALIZED:
            continue
        try:
            reachable, decision = _decision_of(log_for, cache, e)
            if not reachable and not_running:
                reachable = untouched_batch(registry, e, untouched)  # no decision log needed
            if not reachable or (decision is not None and e.xid in {c.xid for c in decision.chosen}):
                skipped.append(e.xid)
                continue
            if ops.abort(prepared_from_entry(e)):
                rolled.append(e.xid)
        except Exception as exc:
            errors[e.xid] = f"{type(exc).__name__}: {exc}"
    forgotten = _forget_finished(
        ops, registry, log_for, cache, txn_ids, older_than_s, clock, errors, untouched if not_running else None
    )
    _forget(registry, rolled, errors)
    sweep = _Sweep(txn_ids, older_than_s)
    dropped = _drop_leftover_stages(ops, sweep, errors)
    if overwrite_stages:
        dropped += _drop_job_stages(ops, sweep, errors)
    return RecoveryReport(
        rolled_back=tuple(rolled),
        skipped=tuple(skipped),
        errors=errors,
        forgotten=tuple(sorted(set(forgotten) | set(rolled))),
        dropped=tuple(dropped),
    )


def untouched_batch(registry: RegistryIO, e: RegistryEntry, cache: dict[tuple[str, int], bool]) -> bool:
    """True if no xid of ``e``'s batch is COMMITTING or COMMITTED (cached per batch).

    ``gc --not-running`` rolls back the undecided attempts of such a batch without
    its decision log. Safe because (a) the operator says the query is not running, so
    no driver decides the batch meanwhile, and the age (``--older-than``) backs that;
    (b) nothing of such a batch is visible (transaction, staging) and an attempt is
    visible only once COMMITTING; (c) if a decision does exist somewhere (a driver
    killed between writing it and the first registry move), none of its xids
    committed, so the batch's replay decides again from its own messages, as after a
    ClickHouse restart (docs/protocol.md, "Replays under another partitioning").
    A batch with any COMMITTING or COMMITTED xid is left to its replay or ``recover``.
    """
    key = (e.txn_id, e.batch)
    if key not in cache:
        entries = registry.list_batch(e.txn_id, e.batch)
        cache[key] = not any(as_state(x.state) in (TxState.COMMITTING, TxState.COMMITTED) for x in entries)
    return cache[key]


def _forget(registry: RegistryIO, xids: Sequence[str], errors: dict[str, str]) -> None:
    if not xids:
        return
    try:
        registry.forget(list(xids))
    except Exception as exc:  # reported, the next gc tries again
        errors.update({x: f"forget: {type(exc).__name__}: {exc}" for x in xids})


def _forget_finished(
    ops: TxOps,
    registry: RegistryIO,
    log_for: LogFor,
    cache: _DecisionCache,
    txn_ids: Collection[str] | None,
    older_than_s: float,
    clock: Callable[[], float],
    errors: dict[str, str],
    untouched: dict[tuple[str, int], bool] | None = None,
) -> list[str]:
    """Pass 2 of :func:`gc_stale`: the finished entries no replay will read; forgets them.

    ``untouched`` (``gc --not-running``): an ABORTED entry without a reachable
    decision log is forgotten too when :func:`untouched_batch` holds for its batch.
    """
    if txn_ids is None:
        return []
    cut_ms = (clock() - older_than_s) * 1000
    out = []
    for txn in sorted(txn_ids):
        for e in registry.list_txn(txn):
            if e.updated_ms > cut_ms or as_state(e.state) not in (TxState.COMMITTED, TxState.ABORTED):
                continue
            reachable, decision = _decision_of(log_for, cache, e)
            decided = decision is not None and e.xid in {c.xid for c in decision.chosen}
            if not reachable and untouched is not None and as_state(e.state) is TxState.ABORTED:
                reachable = untouched_batch(registry, e, untouched)
            if not reachable or (decided and not decision.done):  # type: ignore[union-attr]
                continue
            if as_state(e.state) is TxState.COMMITTED and not (decision is not None and decision.done):
                continue
            try:
                if as_state(e.state) is TxState.ABORTED:
                    ops.rollback(prepared_from_entry(e))  # idempotent: drops what a failed prepare left
                out.append(e.xid)
            except Exception as exc:
                errors[e.xid] = f"{type(exc).__name__}: {exc}"
    _forget(registry, out, errors)
    return out


@dataclasses.dataclass(frozen=True)
class _Sweep:
    """Which stage tables gc's passes 3 and 4 may drop: those of ``txn_ids`` (None: any
    query's) at least ``older_than_s`` old."""

    txn_ids: Collection[str] | None
    older_than_s: float


def _drop_leftover_stages(ops: TxOps, sweep: _Sweep, errors: dict[str, str]) -> list[str]:
    """Pass 3 of :func:`gc_stale`: stage tables of the given queries that no live xid owns."""
    target, mode_io, registry = ops.target, ops.mode_io, ops.registry
    txn_ids, older_than_s = sweep.txn_ids, sweep.older_than_s
    if not mode_io.mode.capabilities.stage_tables:
        return []
    owners = None if txn_ids is None else {sanitize_txn(t) for t in txn_ids}
    dropped = []
    for xid, age_s in leftover_stages(target):
        try:
            parts = parse_xid(xid)
        except ValueError:
            continue  # not one of ours
        if age_s < older_than_s or (owners is not None and parts.txn not in owners):
            continue
        entry = registry.get(xid)
        if entry is not None and as_state(entry.state) is not TxState.ABORTED:
            continue  # a live or decided xid: the passes above or its replay settle it
        ctx = WriteContext(parts.txn, parts.batch, parts.partition, parts.attempt)
        p = Prepared.for_attempt(ctx, xid, mode_io.mode, safe_url(target.url), f"{target.database}.{target.table}")
        try:
            if mode_io.lookup(target, p) is CommitOutcome.COMMITTED:
                mode_io.commit(target, p)  # all moved, marker written: only the drop was missing
            else:
                mode_io.rollback(target, p)
            dropped.append(xid)
        except Exception as exc:
            errors[xid] = f"{type(exc).__name__}: {exc}"
    return dropped


def _drop_job_stages(ops: TxOps, sweep: _Sweep, errors: dict[str, str]) -> list[str]:
    """Pass 4 of :func:`gc_stale`: the stage tables of batch jobs (appends and overwrites) of the given queries.

    A job whose driver died before it published its stage (or swapped it in) leaves
    ``_ctx_ow_<txn>_<hex>``; the target never saw a row of it, and no replay comes (a
    batch job's id is fresh per job). Every open xid prepared into the stage, decided
    or not, is rolled back first (its open transaction would hold the DROP until its
    session expires), then the stage is dropped. A stage with an open xid of another
    mode than this pass's is left (``gc --mode`` of that mode drops it).
    """
    target, registry, txn_ids = ops.target, ops.registry, sweep.txn_ids
    if not txn_ids:
        return []
    open_by_table: dict[str, list[RegistryEntry]] = collections.defaultdict(list)
    for e in registry.list_open_all_modes(None):
        open_by_table[e.table].append(e)
    dropped = []
    for name, age_s in tables_named(target, OVERWRITE_STAGE_PREFIX):
        if age_s < sweep.older_than_s or not any(is_overwrite_stage_of(name, t) for t in txn_ids):
            continue
        try:
            entries = open_by_table.get(f"{target.database}.{name}", [])
            if any(e.mode is not ops.mode_io.mode for e in entries):
                continue
            for e in entries:
                ops.abort(prepared_from_entry(e))
            with ClickHouseHTTP(target) as c:
                c.command(f"DROP TABLE IF EXISTS {q.qualified(target.database, name)} SYNC", idempotent=True)
            dropped.append(name)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return dropped


def status_summary(registry: RegistryIO, *, clock: Callable[[], float] = time.time) -> StatusSummary:
    """Counts of open xids per state and per txn_id, the in-doubt ones, the oldest age."""
    entries = registry.list_open(None)
    now_ms = clock() * 1000
    by_state = collections.Counter(as_state(e.state).value for e in entries)
    by_txn = collections.Counter(e.txn_id for e in entries)
    in_doubt = tuple(sorted(e.xid for e in entries if as_state(e.state) in (TxState.COMMITTING, TxState.ABORTING)))
    oldest = min((e.created_ms for e in entries), default=None)
    return StatusSummary(
        open_by_state=dict(by_state),
        in_doubt=in_doubt,
        oldest_open_age_s=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
        by_txn=dict(by_txn),
    )
