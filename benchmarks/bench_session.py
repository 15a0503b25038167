"""What a long benchmark command runs inside: a private stack, timed progress lines, a clean stop,
and the wait for a streaming query's micro-batches."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from server_patches.stack import running_stack
from server_patches.stack_files import StackInfo


class BenchSession(NamedTuple):
    """The scratch directory (the stack is in ``work / "stack"``), the stack, and ``say``."""

    work: Path
    info: StackInfo
    say: Callable[[str], None]


@contextlib.contextmanager
def bench_session(prefix: str, t0: float | None = None) -> Iterator[BenchSession]:
    """A scratch directory with an embedded stack (Kafka included), stopped on the way out.

    A SIGTERM (a timeout) unwinds like an exception, so the stack is stopped then too.
    ``say`` prints a line stamped with the seconds since ``t0`` (default: now).
    """
    start = time.monotonic() if t0 is None else t0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def say(s: str) -> None:
        print(f"[{time.monotonic() - start:6.0f} s] {s}", flush=True)

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        with running_stack(work / "stack", kafka=True) as info:
            yield BenchSession(work, info, say)


def run_micro_batches(query: Any, count: int, timeout_s: float, label: str) -> list[dict[str, Any]]:
    """Wait until the streaming ``query`` ran ``count`` micro-batches with input rows, stop
    it, and return the progress (``StreamingQueryProgress`` as dicts) of every such batch.

    Raises ``RuntimeError`` naming ``label`` when the query fails or ``timeout_s`` passes.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while len([p for p in query.recentProgress if p.numInputRows]) < count:
            if query.exception() is not None:
                raise RuntimeError(f"{label}: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: {len(query.recentProgress)} micro-batches before the deadline")
            time.sleep(0.2)
    finally:
        query.stop()
    return [json.loads(p.json) for p in query.recentProgress if p.numInputRows]
