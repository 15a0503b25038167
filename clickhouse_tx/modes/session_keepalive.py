"""Executor side: prepared sessions of mode ``transaction`` kept alive until the driver finishes them.

One daemon thread per Python worker process (:data:`KEEP_ALIVE`) touches every
session it watches, so that a prepared transaction waiting for the driver's COMMIT
outlives the server's idle ``session_timeout`` (:class:`SessionKeepAlive`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time

from clickhouse_tx.client.codes import INVALID_TRANSACTION, SESSION_IS_LOCKED, SESSION_NOT_FOUND
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ServerError
from clickhouse_tx.interfaces import Target

log = logging.getLogger(__name__)

#: ``transactionID()`` outside a transaction.
NO_TRANSACTION_ID = "(0,0,'00000000-0000-0000-0000-000000000000')"


class SessionKeepAlive:
    """Executor side: keeps prepared sessions from expiring until the driver finishes them.

    A prepared transaction waits in its HTTP session for the driver's COMMIT, and the
    server drops a session idle for ``session_timeout``. A batch job with more tasks
    than slots, or a slow stage, reaches its commit long after its first tasks
    prepared. One daemon thread per Python worker process touches every session it
    watches (``SELECT transactionID()`` with ``session_check=1``; any request restarts
    the idle timer) every ``session_timeout / 4`` seconds, up to 8 at once, and stops
    watching one when its transaction is over (committed or rolled back), the session
    is gone, or no touch has succeeded for ``session_timeout`` (it has expired anyway).

    A touch can meet the driver's COMMIT in the session: one of the two gets
    SESSION_IS_LOCKED, which the server raises before running the request, and
    the COMMIT is retried (it is a ``ServerBusyError``). The thread dies with the worker process
    (Spark ends a worker it does not reuse with its task: ``spark.python.use.daemon=false``);
    the driver renews every session again before it writes a decision
    (:meth:`~clickhouse_tx.modes.transaction.TransactionMode.renew`). The writer refuses a
    ``session_timeout`` too short for these touches to hold
    (``spark_datasource.options.writer_specs.MIN_SESSION_TIMEOUT_S``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        # xid -> (target, last successful touch (or the watch), last attempt): monotonic
        self._watched: dict[str, tuple[Target, float, float]] = {}
        self._thread: threading.Thread | None = None
        self.touches = 0

    def watch(self, target: Target, xid: str) -> None:
        """Executor, once per prepared xid: touch its session until it is finished."""
        with self._lock:
            now = time.monotonic()
            self._watched[xid] = (target, now, now)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="clickhouse-tx-keepalive", daemon=True)
                self._thread.start()
        self._wake.set()  # a shorter session_timeout than the others may need an earlier touch

    def unwatch(self, xid: str) -> None:
        """Stop touching ``xid``'s session (tests: an executor that died)."""
        with self._lock:
            self._watched.pop(xid, None)

    def watching(self) -> list[str]:
        with self._lock:
            return sorted(self._watched)

    def _run(self) -> None:
        # Each session is touched a quarter of its own timeout after its last touch
        # (jobs with different session_timeout options share a worker process), up to
        # 8 at once so that one slow reply cannot delay the others past their timeout.
        with concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="clickhouse-tx-touch") as pool:
            while True:
                with self._lock:
                    if not self._watched:
                        self._thread = None
                        return
                    now = time.monotonic()
                    due = [
                        (x, t, ok_at)
                        for x, (t, ok_at, tried) in self._watched.items()
                        if now - tried >= t.session_timeout_s / 4
                    ]
                    wait = min(tried + t.session_timeout_s / 4 - now for t, _, tried in self._watched.values())
                if not due:
                    self._wake.wait(max(0.05, wait))
                    self._wake.clear()
                    continue
                touched = pool.map(lambda d: self._touch(d[1], d[0]), due)
                for (xid, target, last_ok), (keep, ok) in zip(due, touched):
                    self._settle(xid, target, last_ok, keep, ok)

    def _settle(self, xid: str, target: Target, last_ok: float, keep: bool, ok: bool) -> None:
        with self._lock:
            if xid not in self._watched:
                return
            now = time.monotonic()
            if not keep or (not ok and now - last_ok > target.session_timeout_s):
                if keep:
                    log.warning(
                        "keep-alive of session %s gave up: no touch succeeded for %d s", xid, target.session_timeout_s
                    )
                del self._watched[xid]
            else:
                self._watched[xid] = (target, now if ok else last_ok, now)

    def _touch(self, target: Target, xid: str) -> tuple[bool, bool]:
        """(keep watching, touched): one request in the session."""
        session = ClickHouseHTTP(
            dataclasses.replace(
                target, request_timeout_s=min(target.request_timeout_s, max(1.0, target.session_timeout_s / 2))
            ),
            session_id=xid,
            session_timeout=target.session_timeout_s,
        )
        try:
            tid = session.command("SELECT transactionID()", session_check=True).strip()
            self.touches += 1
            return tid != NO_TRANSACTION_ID, True
        except ServerError as e:
            if e.code == SESSION_IS_LOCKED:
                return True, False  # the driver is committing it right now
            return e.code not in (SESSION_NOT_FOUND, INVALID_TRANSACTION), False
        except Exception as exc:  # server down: try again next round
            log.info("keep-alive of session %s failed: %s", xid, exc)
            return True, False
        finally:
            session.close()


#: The one keep-alive of this process (each Python worker has its own).
KEEP_ALIVE = SessionKeepAlive()
