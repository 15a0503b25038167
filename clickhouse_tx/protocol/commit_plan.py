"""The commit plan of one batch, pure: which message commits each partition, what is rolled back.

Functions over plain values (the decision, the commit messages, the registry
entries) with no I/O, so each can be tested on its own and the coordinator
(:mod:`clickhouse_tx.protocol.coordinator`) only carries out what they decide
(``docs/design.md`` §5).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

from clickhouse_tx.errors import NotCommittedError
from clickhouse_tx.interfaces import Decision, Prepared, RegistryEntry
from clickhouse_tx.protocol.state import TxState, as_state, is_finished


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
    """What :meth:`~clickhouse_tx.protocol.coordinator.Coordinator.commit_batch` will do, decided before any effect.

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
