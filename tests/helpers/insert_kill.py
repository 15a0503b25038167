"""SIGKILL a child driver in the middle of an INSERT body, by the server's own progress.

:class:`InsertKill` watches the server's ``system.processes`` from a client of its own
(a plain SELECT every ``poll_s``; the process list is no transactional table) for an
``INSERT INTO <database>.<table>`` (``table`` a regular expression of the table's name,
e.g. ``events`` or ``_ctx_stage_\\w+``) and SIGKILLs the child's whole process group
(driver Python, JVM, Python workers: :func:`tests.helpers.torture.start_child` starts it
in a session of its own) once such an INSERT has read ``rows`` rows, and, given an
``armed`` SELECT, only once that SELECT has returned 1 (e.g. the target holds an earlier
micro-batch's rows, read committed: the kill then falls in a later one). Give it to
:func:`tests.helpers.torture.run_child` or :func:`tests.helpers.batch_torture.run_batch_child`
as ``watch``.

It records what the server showed: the INSERT's ``read_rows`` when the kill fired and the
last one it showed before the query ended (:attr:`Fired.final_read_rows`, below the
INSERT's rows when the body broke off: the server never read the rest), and the
transactions open on the server right after the kill (:attr:`Fired.open_tids`), so a
test can check that none of them outlives the restart (:func:`open_transactions`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time

import requests

from spark_datasource.testing.credentials import http_auth

#: The INSERTs of the process list, their names unquoted (the writers quote them).
_INSERTS = (
    "SELECT query_id, read_rows, written_rows, query FROM system.processes "
    "WHERE match(replaceAll(query, '`', ''), {pattern:String}) FORMAT TSV"
)
#: One INSERT's progress, while it runs.
_PROGRESS = "SELECT read_rows FROM system.processes WHERE query_id = {q:String} FORMAT TSV"


@dataclasses.dataclass
class Fired:
    """What the server showed of the INSERT the kill interrupted."""

    query_id: str
    query: str
    read_rows: int  # when the kill was sent
    written_rows: int
    final_read_rows: int = -1  # the last the server showed before the query ended
    open_tids: frozenset[str] = frozenset()  # transactions open right after the kill
    seconds_to_end: float = -1.0  # from the kill until the INSERT left the process list

    def summary(self) -> str:
        return (
            f"killed at read_rows={self.read_rows} (written {self.written_rows}), the INSERT read "
            f"{self.final_read_rows} before it ended {self.seconds_to_end:.1f} s later: {self.query[:90]}"
        )


def _get(session: requests.Session, url: str, sql: str, **params: str) -> list[list[str]]:
    r = session.post(url, data=sql.encode(), params=params, timeout=30, auth=http_auth())
    r.raise_for_status()
    return [line.split("\t") for line in r.text.splitlines() if line]


def open_transactions(url: str) -> frozenset[str]:
    """The ids of the transactions open on the server (``system.transactions``, plainly read)."""
    with requests.Session() as s:
        return frozenset(row[0] for row in _get(s, url, "SELECT toString(tid) FROM system.transactions FORMAT TSV"))


class InsertKill:
    """Kill the child's process group once the server has read ``rows`` rows of an INSERT into ``table``."""

    def __init__(
        self, url: str, database: str, table: str, rows: int, armed: str | None = None, poll_s: float = 0.01
    ) -> None:
        self.url = url
        self.pattern = rf"^\s*INSERT INTO {re.escape(database)}\.{table}[\s(]"
        self.rows = rows
        self.armed = armed
        self.poll_s = poll_s
        self.progress: dict[str, int] = {}  # the highest read_rows seen of each
        self.fired: Fired | None = None

    def watch(self, proc: subprocess.Popen) -> None:
        """Poll until the kill fired or ``proc`` ended (run on a thread beside the child)."""
        with requests.Session() as s:
            armed = self.armed is None
            while proc.poll() is None:
                try:
                    armed = armed or _get(s, self.url, f"{self.armed} FORMAT TSV") == [["1"]]
                    rows = _get(s, self.url, _INSERTS, param_pattern=self.pattern) if armed else []
                except requests.RequestException:
                    time.sleep(self.poll_s)
                    continue
                for query_id, read, written, query in rows:
                    self.progress[query_id] = max(self.progress.get(query_id, 0), int(read))
                    if int(read) >= self.rows:
                        os.killpg(proc.pid, signal.SIGKILL)
                        self.fired = Fired(query_id, query, int(read), int(written))
                        self._follow(s, query_id)
                        return
                time.sleep(self.poll_s)

    def _follow(self, s: requests.Session, query_id: str) -> None:
        """Record the open transactions, then the INSERT's last ``read_rows`` until it ends."""
        assert self.fired is not None
        killed = time.monotonic()
        self.fired.open_tids = open_transactions(self.url)
        last = self.fired.read_rows
        while time.monotonic() - killed < 60:
            rows = _get(s, self.url, _PROGRESS, param_q=query_id)
            if not rows:
                break
            last = int(rows[0][0])
            time.sleep(self.poll_s)
        self.fired.final_read_rows = last
        self.fired.seconds_to_end = time.monotonic() - killed
