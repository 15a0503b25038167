"""An exhaustive depth-first explorer of schedules, with state hashing.

A *schedule* is the list of choices a scenario makes at its choice points. Choice
points are of two kinds:

- *boundaries*, where the code under test holds nothing in memory (between driver
  calls): the scenario's whole state is a snapshot and a digest. A boundary whose
  digest was met before is not explored again: everything reachable from it was.
- *steps* inside a call (a fault or an interleaving at one step of a fake): the code
  under test is mid-call, so these are explored statelessly: each *segment* (from a
  boundary to the next) is run again from its boundary snapshot once per choice
  sequence, depth-first, flipping the deepest choice that has options left.

The explored boundaries form a DAG; its root-to-end paths are the distinct schedules
covered. Each of them is checked, because every segment of it ran from an identical
state with the invariants checked at each choice point.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol


class AtBoundary(BaseException):
    """A segment reached the next boundary; the scenario is ready to be snapshotted."""


class Violation(BaseException):
    """An invariant failed; carries the schedule that reached it.

    A BaseException, like the fakes' ``Crash``: raised at a step inside the code under
    test, no ``except Exception`` there may swallow it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.schedule: list[int] = []
        self.labels: list[str] = []

    def __str__(self) -> str:
        steps = "\n".join(
            f"  {i:3d}. {label}"
            for i, label in enumerate(self.labels)
            if i < len(self.labels) - 1 and not label.endswith(": go on") or i == len(self.labels) - 1
        )
        short = list(self.schedule)
        while short and short[-1] == 0:
            short.pop()  # past its end a schedule takes option 0 anyway
        return (
            f"{self.args[0]}\nschedule (replay: tests.model.explorer.replay(model, {short})), "
            f"its choices other than 'go on':\n{steps}"
        )


class Chooser:
    """The choice points of one segment (or of a whole schedule when ``stop`` is False)."""

    def __init__(self, prefix: Sequence[int], *, stop: bool, seen_states: set[bytes] | None = None) -> None:
        self.prefix = list(prefix)
        self.stop = stop
        self.trail: list[tuple[int, int]] = []  # (choice, number of options)
        self.labels: list[str] = []
        self.seen_states = seen_states if seen_states is not None else set()

    @property
    def replaying(self) -> bool:
        """True while the forced prefix runs: its states were checked when first met."""
        return len(self.trail) < len(self.prefix)

    def choose(self, where: str, options: Sequence[str], digest: bytes | None, *, boundary: bool = False) -> int:
        """Pick one of ``options`` at a choice point whose state is ``digest``.

        ``digest`` may be None while :attr:`replaying` (nothing is counted there).

        Raises
        ------
        AtBoundary
            A boundary other than the segment's first, when stopping at boundaries.
        """
        if boundary and self.stop and self.trail:
            raise AtBoundary()
        i = len(self.trail)
        if digest is not None:
            self.seen_states.add(digest)
        k = self.prefix[i] if i < len(self.prefix) else 0
        if not 0 <= k < len(options):
            raise ValueError(
                f"choice {i} ({where}): option {k} of {len(options)} does not exist; "
                "the schedule belongs to another model"
            )
        self.trail.append((k, len(options)))
        self.labels.append(f"{where}: {options[k]}")
        return k

    @property
    def schedule(self) -> list[int]:
        return [k for k, _ in self.trail]


class Model(Protocol):
    """What :func:`explore` needs of a scenario."""

    def start(self) -> Any:
        """The snapshot of the first boundary."""

    def play(self, snapshot: Any, chooser: Chooser) -> tuple[str, Any, bytes | None]:
        """Run from ``snapshot``: ``(ending, None, None)`` at the end of the schedule, or
        ``("boundary", next snapshot, its digest)``; raises :class:`Violation`."""


@dataclasses.dataclass
class Stats:
    """What one exploration covered."""

    schedules: int = 0  # distinct complete schedules covered (root-to-end paths)
    segment_runs: int = 0  # segments executed
    boundary_states: int = 0
    states: int = 0  # distinct digests at every choice point
    revisits: int = 0  # boundaries reached again and not re-explored
    violations: int = 0
    seconds: float = 0.0
    endings: dict[str, int] = dataclasses.field(default_factory=dict)
    counterexample: Violation | None = None

    def line(self) -> str:
        return (
            f"{self.schedules:,} schedules, {self.states:,} distinct states "
            f"({self.boundary_states:,} between driver calls, {self.revisits:,} revisits cut), "
            f"{self.segment_runs:,} segment runs, {self.violations} violations, {self.seconds:.1f} s"
        )


def _next_prefix(trail: Sequence[tuple[int, int]]) -> list[int] | None:
    for j in range(len(trail) - 1, -1, -1):
        k, n = trail[j]
        if k + 1 < n:
            return [c for c, _ in trail[:j]] + [k + 1]
    return None


def explore(model: Model, *, stop_at_first_violation: bool = True) -> Stats:
    """Every schedule of ``model``, depth-first; the counts and the first counterexample.

    Runs in the calling process; memory grows with the distinct boundary states.
    """
    t0 = time.monotonic()
    stats = Stats()
    seen_states: set[bytes] = set()
    children: dict[bytes, list[bytes | None]] = {}  # boundary -> next boundaries (None: an end)
    path_to: dict[bytes, list[int]] = {b"": []}  # the schedule that first reached a boundary
    stack: list[tuple[bytes, Any]] = [(b"", model.start())]
    while stack:
        node, snap = stack.pop()
        out = children.setdefault(node, [])
        prefix: list[int] | None = []
        while prefix is not None:
            chooser = Chooser(prefix, stop=True, seen_states=seen_states)
            stats.segment_runs += 1
            try:
                ending, nxt, digest = model.play(snap, chooser)
            except Violation as v:
                v.schedule = path_to[node] + chooser.schedule
                v.labels = replay_labels(model, v.schedule)
                stats.violations += 1
                stats.counterexample = stats.counterexample or v
                if stop_at_first_violation:
                    stack.clear()
                    break
                ending, nxt, digest = "violation", None, None
            if digest is None:
                out.append(None)
                stats.endings[ending] = stats.endings.get(ending, 0) + 1
            else:
                out.append(digest)
                if digest in children:
                    stats.revisits += 1
                else:
                    children[digest] = []
                    path_to[digest] = path_to[node] + chooser.schedule
                    stack.append((digest, nxt))
            prefix = _next_prefix(chooser.trail)
    stats.schedules = _count_paths(children)
    stats.boundary_states = len(children)
    stats.states = len(seen_states)
    stats.seconds = time.monotonic() - t0
    return stats


def _count_paths(children: dict[bytes, list[bytes | None]]) -> int:
    """Root-to-end paths of the boundary DAG (iteratively: it can be deep)."""
    paths: dict[bytes, int] = {}
    todo: list[tuple[bytes, bool]] = [(b"", False)]
    while todo:
        node, expanded = todo.pop()
        if node in paths:
            continue
        kids = [k for k in children.get(node, []) if k is not None and k not in paths]
        if kids and not expanded:
            todo.append((node, True))
            todo.extend((k, False) for k in kids)
            continue
        paths[node] = sum(1 if k is None else paths.get(k, 0) for k in children.get(node, []))
    return paths[b""]


def replay(model: Model, schedule: Sequence[int]) -> str:
    """Run one whole schedule again from the start (raises its :class:`Violation`)."""
    ending, _, _ = model.play(model.start(), Chooser(schedule, stop=False))
    return ending


def replay_labels(model: Model, schedule: Sequence[int]) -> list[str]:
    """The choices ``schedule`` makes, as text (the run stops at its violation)."""
    chooser = Chooser(schedule, stop=False)
    try:
        model.play(model.start(), chooser)
    except Violation:
        pass
    return chooser.labels


#: one line per exploration run in this process, printed at the end of the pytest run
REPORTS: list[str] = []
