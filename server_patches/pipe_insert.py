"""An INSERT whose data streams through a pipe into the engine's query path.

chdb's own streaming inserter (``send_insert``/``finish``) loses every error of the
table's sink: an INSERT into a read-only replica (``TABLE_IS_READ_ONLY``), one
violating a ``CONSTRAINT``, ... reports rows written and writes nothing, while
``system.query_log`` records the exception. The query path reports those errors. So
the data of ``INSERT ... FORMAT X`` is fed into an ``os.pipe`` and the engine runs
``INSERT ... FROM INFILE '/dev/fd/N' FORMAT X``: the same input format parses the
same bytes into the same blocks, in constant memory, and the insert fails exactly
when ClickHouse says it failed.

A pipe cannot say "the sender died": closing it is a clean end of the data, which a
format may accept at a block boundary (an Arrow stream cut between two record
batches is a shorter valid stream). A body that breaks off (the client went away, a
broken compressed frame) therefore kills the running query before the pipe is
closed, so nothing of a cut-off body is committed beyond the blocks a server would
have flushed before the break.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Callable, Iterable

#: How long a broken-off insert waits for its query to show up in the process list.
KILL_WAIT_S = 10.0
#: The trailing ``SETTINGS ...`` of an INSERT head; ``FROM INFILE`` goes before it.
_SETTINGS_TAIL = re.compile(r"\s+SETTINGS\s+(?=[A-Za-z_])", re.I)


def infile_statement(head: str, fmt: str, path: str) -> str:
    """``INSERT INTO t (c) [SETTINGS ...]`` -> ``INSERT INTO t (c) FROM INFILE 'path' [SETTINGS ...] FORMAT fmt``."""
    m = next(reversed(list(_SETTINGS_TAIL.finditer(head))), None)
    table, settings = (head[: m.start()], head[m.start() :]) if m else (head.rstrip(), "")
    return f"{table.rstrip()} FROM INFILE '{path}'{settings} FORMAT {fmt}"


def insert_through_pipe(
    run: Callable[[str], Any], kill: Callable[[str], bool], head: str, fmt: str, data: Iterable[bytes]
) -> Any:
    """Run ``head`` as ``INSERT ... FROM INFILE`` on a pipe fed with ``data``; the engine's result.

    Parameters
    ----------
    run
        Runs one statement on the session's connection and returns its result, raising
        the engine's error (called once, on a helper thread, while this thread feeds).
    kill
        Cancels the running statement that reads the given ``/dev/fd/N`` path, on another
        connection; True when it found one. Called only when ``data`` breaks off, until
        it finds the statement or the statement is over (it may not have started yet).
    head, fmt
        The INSERT without its ``FORMAT`` clause, and the format of ``data``.
    data
        The request body as it arrives (read on this thread: the socket stays the
        handler's).
    """
    read_fd, write_fd = os.pipe()
    path = f"/dev/fd/{read_fd}"
    outcome: dict[str, Any] = {}

    def query() -> None:
        try:
            outcome["result"] = run(infile_statement(head, fmt, path))
        except BaseException as exc:  # handed to the feeding thread, raised there
            outcome["error"] = exc
        finally:
            os.close(read_fd)  # a feeder blocked on a full pipe gets EPIPE once the query is over

    worker = threading.Thread(target=query, name="pipe-insert", daemon=True)
    worker.start()
    try:
        _feed(write_fd, data)
    except BrokenPipeError:
        pass  # the query ended before reading everything: its own error says why
    except BaseException:
        _kill_until_gone(kill, path, worker)
        os.close(write_fd)
        worker.join()
        raise
    os.close(write_fd)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _kill_until_gone(kill: Callable[[str], bool], path: str, worker: threading.Thread) -> None:
    """Cancel the query reading ``path``: it may not be in the process list yet, so retry
    until it is found or over. The pipe stays open meanwhile, so the query cannot end
    on a clean end of data first."""
    deadline = time.monotonic() + KILL_WAIT_S
    while worker.is_alive() and not kill(path) and time.monotonic() < deadline:
        worker.join(0.01)


def _feed(fd: int, data: Iterable[bytes]) -> None:
    for chunk in data:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
