"""The transaction state machine: one table of legal transitions, one function applying it.

States of one xid (``docs/design.md`` §3)::

    UNKNOWN -> INITIALIZED -> COMMITTING -> COMMITTED
               INITIALIZED | COMMITTING -> ABORTING -> ABORTED
    UNKNOWN -> ABORTED   (fencing: an xid aborted before it registered never registers)

A transition to the state an xid is already in is a no-op for COMMITTING, COMMITTED,
ABORTING and ABORTED, so every step of the protocol can be replayed after a crash.
The registry stores states as :attr:`TxState.value` strings.
"""

from __future__ import annotations

import enum

from clickhouse_tx.errors import IllegalTransitionError, TransactionFinishedError


class TxState(str, enum.Enum):
    """State of one transaction (xid) in the registry."""

    UNKNOWN = "unknown"
    INITIALIZED = "initialized"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTING = "aborting"
    ABORTED = "aborted"


#: Every legal (current, target) pair; pairs with current == target are idempotent no-ops.
TRANSITIONS: frozenset[tuple[TxState, TxState]] = frozenset(
    {
        (TxState.UNKNOWN, TxState.INITIALIZED),
        (TxState.UNKNOWN, TxState.ABORTED),
        (TxState.INITIALIZED, TxState.COMMITTING),
        (TxState.INITIALIZED, TxState.ABORTING),
        (TxState.COMMITTING, TxState.COMMITTED),
        (TxState.COMMITTING, TxState.ABORTING),
        (TxState.ABORTING, TxState.ABORTED),
        (TxState.COMMITTING, TxState.COMMITTING),
        (TxState.COMMITTED, TxState.COMMITTED),
        (TxState.ABORTING, TxState.ABORTING),
        (TxState.ABORTED, TxState.ABORTED),
    }
)

FINISHED: frozenset[TxState] = frozenset({TxState.COMMITTED, TxState.ABORTED})


def as_state(value: "TxState | str | None") -> TxState:
    """Parse a registry string (``None`` = no entry = UNKNOWN) into a :class:`TxState`."""
    if value is None:
        return TxState.UNKNOWN
    if isinstance(value, TxState):
        return value
    try:
        return TxState(value)
    except ValueError:
        raise IllegalTransitionError(f"unknown transaction state {value!r} in the registry") from None


def is_finished(state: "TxState | str | None") -> bool:
    """True for COMMITTED and ABORTED: nothing can move such an xid any more."""
    return as_state(state) in FINISHED


def can_transition(current: "TxState | str | None", target: "TxState | str") -> bool:
    """True if ``current -> target`` is legal (including the idempotent no-ops)."""
    return (as_state(current), as_state(target)) in TRANSITIONS


def next_state(current: "TxState | str | None", target: "TxState | str", *, xid: str | None = None) -> TxState:
    """Apply the transition table: return ``target`` or raise.

    Raises
    ------
    TransactionFinishedError
        ``current`` is COMMITTED or ABORTED and ``target`` is a different state
        (a finished xid used again).
    IllegalTransitionError
        Any other pair not in :data:`TRANSITIONS`.
    """
    cur, tgt = as_state(current), as_state(target)
    if (cur, tgt) in TRANSITIONS:
        return tgt
    if cur in FINISHED:
        raise TransactionFinishedError(f"transaction already {cur.value}, cannot move to {tgt.value}", xid=xid)
    raise IllegalTransitionError(f"illegal transition {cur.value} -> {tgt.value}", xid=xid)


def predecessors(target: "TxState | str") -> tuple[TxState, ...]:
    """States other than ``target`` itself from which ``target`` is legal (for a CAS)."""
    tgt = as_state(target)
    return tuple(s for s in TxState if s is not tgt and (s, tgt) in TRANSITIONS)
