"""SIGKILL a child driver in the middle of an INSERT body, by the server's own progress.

:class:`InsertKill` watches the server's ``system.processes`` from a client of its own
(a plain SELECT every ``poll_s``; the process list is no transactional table) for an
``INSERT INTO <database>.<table>`` (``table`` a regular expression of the table's name,
e.g. ``events`` or ``_ctx_stage_\\w+``) and SIGKILLs the child's whole process group
(driver Python, JVM, Python workers: :func:`tests.helpers.torture.start_child` starts it
in a session of its own) once such an INSERT has read ``rows`` rows, and, given an
``armed`` SELECT, only once that SELECT has returned 1 (e.g. the target holds an earlier
micro-batch's rows, read committed: the kill then falls in a later one; an INSERT
already running before is never killed), and, given ``elapsed_s``, only once the INSERT
has run that long. Give it to
:func:`tests.helpers.torture.run_child` or :func:`tests.helpers.batch_torture.run_batch_child`
as ``watch``. ``on_kill`` runs right after the SIGKILL, before anything is recorded: e.g.
a :class:`~spark_datasource.testing.chaos.proxy.FaultProxy` between the child and the
server resetting its connections, so that the bytes a dead child left in its socket
buffers (the kernel still delivers them) never reach the server.

It records what the server showed: the INSERT's ``read_rows`` when the kill fired and the
last one it showed before the query ended (:attr:`Fired.final_read_rows`, below the
INSERT's rows when the body broke off: the server never read the rest), the bytes of
the body the query had read (the embedded server pipes the body into the query:
:attr:`Fired.read_bytes`), and the transactions open on the server right after the
kill (:attr:`Fired.open_tids`), so a test can check that none of them outlives the
restart (:func:`open_transactions`). :func:`query_log_types` tells how the killed
INSERT ended (no ``QueryFinish``: it never finished).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from typing import Callable

import requests

from spark_datasource.testing.credentials import http_auth

#: The INSERTs of the process list, their names unquoted (the writers quote them).
#: The bytes the query read of its input, the body (piped: a file descriptor). The embedded
#: server pipes a Content-Length body in reads of up to 1 MiB: a smaller one all at its end.
_INSERTS = (
    "SELECT query_id, elapsed, read_rows, written_rows, ProfileEvents['ReadBufferFromFileDescriptorReadBytes'], "
    "query FROM system.processes "
    "WHERE match(replaceAll(query, '`', ''), {pattern:String}) FORMAT TSV"
)
#: One INSERT's progress, while it runs.
_PROGRESS = (
    "SELECT read_rows, ProfileEvents['ReadBufferFromFileDescriptorReadBytes'] FROM system.processes "
    "WHERE query_id = {q:String} FORMAT TSV"
)


@dataclasses.dataclass
class Fired:
    """What the server showed of the INSERT the kill interrupted."""

    query_id: str
    query: str
    elapsed_s: float  # how long it had run when the kill was sent
    read_rows: int  # when the kill was sent
    written_rows: int
    read_bytes: int  # of the body, when the kill was sent
    final_read_rows: int = -1  # the last the server showed before the query ended
    final_read_bytes: int = -1  # of the body, likewise
    open_tids: frozenset[str] = frozenset()  # transactions open right after the kill
    seconds_to_end: float = -1.0  # from the kill until the INSERT left the process list

    def summary(self) -> str:
        return (
            f"killed {self.elapsed_s:.2f} s in at read_rows={self.read_rows} (written {self.written_rows}, "
            f"body bytes read {self.read_bytes}), the INSERT read {self.final_read_rows} rows "
            f"({self.final_read_bytes} body bytes) before it ended "
            f"{self.seconds_to_end:.1f} s later: {self.query[:90]}"
        )


def _get(session: requests.Session, url: str, sql: str, **params: str) -> list[list[str]]:
    r = session.post(url, data=sql.encode(), params=params, timeout=30, auth=http_auth())
    r.raise_for_status()
    return [line.split("\t") for line in r.text.splitlines() if line]


def open_transactions(url: str) -> frozenset[str]:
    """The ids of the transactions open on the server (``system.transactions``, plainly read)."""
    with requests.Session() as s:
        return frozenset(row[0] for row in _get(s, url, "SELECT toString(tid) FROM system.transactions FORMAT TSV"))


def query_log_types(url: str, query_id: str, wait_s: float = 10.0) -> list[str]:
    """How query ``query_id`` ended, by ``system.query_log`` (flushed first): its entries'
    types and exceptions, e.g. ``['QueryStart', 'ExceptionWhileProcessing: ...']`` for a killed
    INSERT, once an entry of its end is there (or after ``wait_s``: what there is)."""
    sql = (
        "SELECT concat(toString(type), if(exception = '', '', concat(': ', substring(exception, 1, 160)))) "
        "FROM system.query_log WHERE query_id = {q:String} ORDER BY event_time_microseconds FORMAT TSV"
    )
    deadline = time.monotonic() + wait_s
    with requests.Session() as s:
        while True:
            _get(s, url, "SYSTEM FLUSH LOGS")
            types = [row[0] for row in _get(s, url, sql, param_q=query_id)]
            if any(t != "QueryStart" for t in types) or time.monotonic() > deadline:
                return types
            time.sleep(0.2)


class InsertKill:
    """Kill the child's process group once the server has read ``rows`` rows of an INSERT into
    ``table`` (that has run ``elapsed_s`` seconds)."""

    def __init__(
        self,
        url: str,
        database: str,
        table: str,
        rows: int,
        armed: str | None = None,
        poll_s: float = 0.01,
        on_kill: Callable[[], None] | None = None,
        elapsed_s: float = 0.0,
    ) -> None:
        self.url = url
        self.pattern = rf"^\s*INSERT INTO {re.escape(database)}\.{table}[\s(]"
        self.rows = rows
        self.armed = armed
        self.poll_s = poll_s
        self.on_kill = on_kill
        self.elapsed_s = elapsed_s  # and has run this long
        self.progress: dict[str, int] = {}  # the highest read_rows seen of each
        self.fired: Fired | None = None

    def watch(self, proc: subprocess.Popen) -> None:
        """Poll until the kill fired or ``proc`` ended (run on a thread beside the child)."""
        with requests.Session() as s:
            armed = self.armed is None
            # The INSERTs running before it was armed: never the one killed (e.g. the last
            # INSERT of the micro-batch the armed SELECT waits for, its rows seen at once
            # in mode dedup while it is still in the process list).
            earlier: set[str] = set()
            while proc.poll() is None:
                try:
                    armed = armed or _get(s, self.url, f"{self.armed} FORMAT TSV") == [["1"]]
                    rows = _get(s, self.url, _INSERTS, param_pattern=self.pattern)
                except requests.RequestException:
                    time.sleep(self.poll_s)
                    continue
                if not armed:
                    earlier.update(row[0] for row in rows)
                    rows = []
                for query_id, elapsed, read, written, read_bytes, query in rows:
                    self.progress[query_id] = max(self.progress.get(query_id, 0), int(read))
                    if query_id in earlier:
                        continue
                    if int(read) >= self.rows and float(elapsed) >= self.elapsed_s:
                        os.killpg(proc.pid, signal.SIGKILL)
                        if self.on_kill is not None:
                            self.on_kill()
                        self.fired = Fired(query_id, query, float(elapsed), int(read), int(written), int(read_bytes))
                        self._follow(s, query_id)
                        return
                time.sleep(self.poll_s)

    def _follow(self, s: requests.Session, query_id: str) -> None:
        """Record the open transactions, then the INSERT's last ``read_rows`` until it ends."""
        assert self.fired is not None
        killed = time.monotonic()
        self.fired.open_tids = open_transactions(self.url)
        last = self.fired.read_rows, self.fired.read_bytes
        while time.monotonic() - killed < 60:
            rows = _get(s, self.url, _PROGRESS, param_q=query_id)
            if not rows:
                break
            last = int(rows[0][0]), int(rows[0][1])
            time.sleep(self.poll_s)
        self.fired.final_read_rows, self.fired.final_read_bytes = last
        self.fired.seconds_to_end = time.monotonic() - killed
