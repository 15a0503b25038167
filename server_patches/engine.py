"""The chdb engine behind the HTTP front: the connection pool and the sessions.

Each chdb connection is its own ClickHouse session with its own transaction, so
``BEGIN TRANSACTION`` / ``COMMIT`` / ``ROLLBACK`` behave as on a server. Requests
without a session borrow a pooled connection; named sessions own one each
(:mod:`server_patches.sessions`). URL settings apply to one query, as in ClickHouse:
they are applied with ``SET`` on the connection (never pasted into the SQL text,
which breaks ``INSERT ... VALUES`` and ``BEGIN TRANSACTION``).
"""

from __future__ import annotations

import collections
import os
import threading

from server_patches.chdb_connection import EngineConnection
from server_patches.errors import load_error_table
from server_patches.sessions import SessionStore

PoolKey = tuple[str, tuple[tuple[str, str], ...]]
_MAX_IDLE_PER_KEY = 8
_MAX_IDLE = 64


class ConnectionPool:
    """Idle session-less connections, keyed by (database, settings): each configured once."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._idle: "collections.OrderedDict[PoolKey, list[EngineConnection]]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.closed = False

    def add(self, key: PoolKey, conn: EngineConnection) -> None:
        self._idle.setdefault(key, []).append(conn)

    def borrow(self, settings: dict[str, str], database: str | None) -> tuple[EngineConnection, PoolKey]:
        """An idle connection for these settings, or a new one configured with them."""
        key: PoolKey = (database or "default", tuple(sorted(settings.items())))
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                self._idle.move_to_end(key)
                return idle.pop(), key
        conn = EngineConnection(self.dsn)
        try:
            conn.configure(settings, database)
        except BaseException:
            conn.close()
            raise
        return conn, key

    def give_back(self, conn: EngineConnection, key: PoolKey, healthy: bool = True) -> None:
        """Keep ``conn`` for the next request with ``key``, unless it is spoilt or surplus."""
        if not healthy or conn.dirty or self.closed:
            conn.close()
            return
        evicted: list[EngineConnection] = []
        keep: EngineConnection | None = conn
        with self._lock:
            idle = self._idle.setdefault(key, [])
            self._idle.move_to_end(key)
            if len(idle) < _MAX_IDLE_PER_KEY:
                idle.append(conn)
                keep = None
            while sum(len(v) for v in self._idle.values()) > _MAX_IDLE:
                _, oldest = self._idle.popitem(last=False)
                evicted.extend(oldest)
        for c in evicted + ([keep] if keep else []):
            c.close()

    def close(self) -> None:
        self.closed = True
        with self._lock:
            pool, self._idle = self._idle, collections.OrderedDict()
        for idle in pool.values():
            for c in idle:
                c.close()


class Engine:
    """Connections to one chdb data path: a pool for session-less requests, one per session."""

    def __init__(
        self,
        data_dir: str,
        config_file: str | None,
        *,
        max_session_timeout: float = 3600,
        default_session_timeout: float = 60,
    ) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.dsn = f"file:{data_dir}" + (f"?config-file={config_file}" if config_file else "")
        self.pool = ConnectionPool(self.dsn)
        first = EngineConnection(self.dsn)
        load_error_table(lambda sql: str(first.run(sql).bytes().decode()))
        self.timezone = first.text("SELECT timezone()")
        self.version = first.text("SELECT version()")
        self.pool.add(("default", ()), first)
        self.sessions = SessionStore(
            lambda: EngineConnection(self.dsn), max_timeout=max_session_timeout, default_timeout=default_session_timeout
        )

    @property
    def max_session_timeout(self) -> float:
        return self.sessions.max_timeout

    @property
    def default_session_timeout(self) -> float:
        return self.sessions.default_timeout

    def borrow(self, settings: dict[str, str], database: str | None) -> tuple[EngineConnection, PoolKey]:
        return self.pool.borrow(settings, database)

    def give_back(self, conn: EngineConnection, key: PoolKey, healthy: bool = True) -> None:
        self.pool.give_back(conn, key, healthy)

    def shutdown(self) -> None:
        """Close every session (rolling back open transactions), then the pool."""
        self.pool.closed = True
        self.sessions.shutdown()
        self.pool.close()
