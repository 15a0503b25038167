"""What a long benchmark command runs inside: a private stack, timed progress lines, a clean stop."""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

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
