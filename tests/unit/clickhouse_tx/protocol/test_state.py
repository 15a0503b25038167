"""The transition table, checked pair by pair."""

from __future__ import annotations

import itertools

import pytest

from clickhouse_tx.errors import IllegalTransitionError, TransactionFinishedError
from clickhouse_tx.protocol.state import (
    TRANSITIONS,
    TxState,
    as_state,
    can_transition,
    is_finished,
    next_state,
    predecessors,
)

S = TxState
# The design's lifecycle, written as each state's successors (the table lists pairs):
# an independent statement of it, not a copy.
SUCCESSORS = {
    S.UNKNOWN: (S.INITIALIZED, S.ABORTED),
    S.INITIALIZED: (S.COMMITTING, S.ABORTING),
    S.COMMITTING: (S.COMMITTED, S.ABORTING),
    S.ABORTING: (S.ABORTED,),
}
LEGAL = {(cur, nxt) for cur, nexts in SUCCESSORS.items() for nxt in nexts}
NO_OPS = {(S.COMMITTED, S.COMMITTED), (S.ABORTED, S.ABORTED), (S.COMMITTING, S.COMMITTING), (S.ABORTING, S.ABORTING)}


def test_the_table_is_exactly_the_designed_transitions_and_no_ops() -> None:
    assert TRANSITIONS == LEGAL | NO_OPS


@pytest.mark.parametrize("cur,tgt", sorted(itertools.product(S, S), key=lambda p: (p[0].value, p[1].value)))
def test_every_pair_is_applied_or_refused_by_the_table(cur: TxState, tgt: TxState) -> None:
    if (cur, tgt) in LEGAL | NO_OPS:
        assert next_state(cur, tgt) is tgt
        assert next_state(cur.value, tgt.value) is tgt  # registry strings work the same
        assert can_transition(cur, tgt)
    else:
        expected = TransactionFinishedError if cur in (S.COMMITTED, S.ABORTED) else IllegalTransitionError
        with pytest.raises(expected) as info:
            next_state(cur, tgt, xid="x-1")
        assert info.value.xid == "x-1"
        assert cur.value in str(info.value) and tgt.value in str(info.value)
        assert not can_transition(cur, tgt)


def test_reusing_a_committed_xid_raises_transaction_finished() -> None:
    with pytest.raises(TransactionFinishedError):
        next_state(S.COMMITTED, S.ABORTING)
    with pytest.raises(TransactionFinishedError):
        next_state(S.ABORTED, S.INITIALIZED)


def test_an_aborted_unregistered_xid_can_never_register_later() -> None:
    state = next_state(S.UNKNOWN, S.ABORTED)
    with pytest.raises(TransactionFinishedError):
        next_state(state, S.INITIALIZED)


def test_only_committed_and_aborted_are_finished() -> None:
    assert {s for s in S if is_finished(s)} == {S.COMMITTED, S.ABORTED}
    assert is_finished("committed") and not is_finished(None)


def test_a_missing_entry_is_unknown_and_a_garbage_state_is_refused() -> None:
    assert as_state(None) is S.UNKNOWN
    with pytest.raises(IllegalTransitionError, match="'bogus'"):
        as_state("bogus")


def test_predecessors_list_the_states_a_compare_and_set_may_expect() -> None:
    assert set(predecessors(S.COMMITTING)) == {S.INITIALIZED}
    assert set(predecessors(S.ABORTING)) == {S.INITIALIZED, S.COMMITTING}
    assert set(predecessors(S.ABORTED)) == {S.ABORTING, S.UNKNOWN}
