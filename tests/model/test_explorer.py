"""The explorer's own counting and counterexamples, on a model small enough to count by hand."""

from __future__ import annotations

from typing import Any

import pytest

from tests.model.explorer import AtBoundary, Chooser, Violation, explore, replay


class Coins:
    """``flips`` coin flips, each a boundary whose state is (flips so far, heads so far)."""

    def __init__(self, flips: int, bad_heads: int | None = None) -> None:
        self.flips, self.bad_heads = flips, bad_heads

    def start(self) -> Any:
        return (0, 0)

    def play(self, snap: Any, chooser: Chooser) -> tuple[str, Any, bytes | None]:
        k, heads = snap
        try:
            while k < self.flips:
                h = chooser.choose(f"flip {k}", ["tails", "heads"], repr((k, heads)).encode(), boundary=True)
                k, heads = k + 1, heads + h
                if heads == self.bad_heads:
                    raise Violation(f"{heads} heads")
        except AtBoundary:
            return "boundary", (k, heads), repr((k, heads)).encode()
        return "end", None, None


def test_three_flips_are_eight_schedules_over_six_boundaries_with_one_revisit_cut() -> None:
    stats = explore(Coins(3))
    assert (stats.schedules, stats.boundary_states, stats.revisits, stats.segment_runs) == (8, 6, 1, 12)
    assert stats.violations == 0 and stats.counterexample is None


def test_a_violation_carries_the_schedule_that_replays_to_it_from_the_start() -> None:
    stats = explore(Coins(3, bad_heads=2))
    v = stats.counterexample
    assert v is not None and stats.violations == 1
    assert v.schedule == [1, 1] and v.labels == ["flip 0: heads", "flip 1: heads"]
    assert "replay(model, [1, 1])" in str(v)
    with pytest.raises(Violation, match="2 heads"):
        replay(Coins(3, bad_heads=2), v.schedule)
    assert replay(Coins(3, bad_heads=2), [0, 0, 1]) == "end"
