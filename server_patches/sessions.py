"""Named HTTP sessions (``session_id``) and their timeouts, as ClickHouse's ``Session.cpp``.

Each session owns one engine connection, which is one ClickHouse session with its own
transaction. A session keeps the timeout it was created with (a later request's
``session_timeout`` is checked against ``max_session_timeout`` and otherwise
ignored); every request restarts its idle timer. A reaper thread closes sessions
idle longer than their timeout, which rolls back their open transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from server_patches.errors import INVALID_SESSION_TIMEOUT, SESSION_IS_LOCKED, SESSION_NOT_FOUND, HTTPError

if TYPE_CHECKING:
    from server_patches.chdb_connection import EngineConnection

log = logging.getLogger("server_patches.sessions")

REAP_INTERVAL_S = 0.25


class Session:
    """One named session: its connection, its fixed timeout, its last use, its lock."""

    def __init__(self, sid: str, conn: "EngineConnection", timeout: float) -> None:
        self.sid = sid
        self.conn = conn
        self.timeout = timeout
        self.lock = threading.Lock()
        self.last_used = time.monotonic()
        self.closed = False

    def release(self) -> None:
        """End a request: restart the idle timer, then let the next request in."""
        self.last_used = time.monotonic()
        self.lock.release()


class SessionStore:
    """The sessions of one engine, by id, and the thread that expires them."""

    def __init__(
        self, connect: Callable[[], "EngineConnection"], *, max_timeout: float, default_timeout: float
    ) -> None:
        self._connect = connect
        self.max_timeout = max_timeout
        self.default_timeout = default_timeout
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="session-reaper", daemon=True)
        self._reaper.start()

    def timeout_of(self, requested: str | None) -> float:
        """The ``session_timeout`` URL parameter as seconds (the default when absent)."""
        try:
            timeout = float(requested or self.default_timeout)
        except ValueError:
            raise HTTPError(INVALID_SESSION_TIMEOUT, f"Invalid session timeout: {requested!r}") from None
        if timeout > self.max_timeout:
            raise HTTPError(
                INVALID_SESSION_TIMEOUT, f"Session timeout {timeout:g} exceeds max_session_timeout {self.max_timeout:g}"
            )
        return timeout

    def get(self, sid: str, timeout: float, check: bool) -> Session:
        """The live session ``sid``, created with ``timeout`` unless ``check`` forbids it."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and not s.closed:
                # The timeout is fixed when the session is created (NamedSessionsStorage).
                return s
            if check:
                raise HTTPError(SESSION_NOT_FOUND, f"Session {sid} not found")
            s = Session(sid, self._connect(), timeout)
            self._sessions[sid] = s
            return s

    def acquire(self, sid: str, requested_timeout: str | None, check: bool) -> Session:
        """The session ``sid``, locked for one request; refused (373) while another runs."""
        session = self.get(sid, self.timeout_of(requested_timeout), check)
        if not session.lock.acquire(blocking=False):
            raise HTTPError(SESSION_IS_LOCKED, f"Session {sid} is locked by a concurrent client")
        if session.closed:
            session.lock.release()
            raise HTTPError(SESSION_NOT_FOUND, f"Session {sid} not found")
        return session

    def close(self, s: Session) -> None:
        """Forget ``s`` and close its connection, which rolls back an open transaction."""
        with self._lock:
            if self._sessions.get(s.sid) is s:
                del self._sessions[s.sid]
            s.closed = True
        s.conn.close()

    def _reap(self) -> None:
        while not self._stop.wait(REAP_INTERVAL_S):
            now = time.monotonic()
            with self._lock:
                expired = [s for s in self._sessions.values() if not s.lock.locked() and now - s.last_used > s.timeout]
            for s in expired:
                # Take the lock so a request that just arrived cannot use a closing session.
                if s.lock.acquire(blocking=False):
                    try:
                        if time.monotonic() - s.last_used > s.timeout:
                            log.info("session %s expired after %.0fs idle", s.sid, s.timeout)
                            self.close(s)
                    finally:
                        s.lock.release()

    def shutdown(self) -> None:
        """Stop the reaper and close every session (their transactions roll back)."""
        self._stop.set()
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            self.close(s)
