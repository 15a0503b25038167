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
import json
import os
import threading
from typing import TYPE_CHECKING, Mapping

from server_patches.chdb_connection import EngineConnection
from server_patches.errors import NOT_IMPLEMENTED, HTTPError, load_error_table
from server_patches.sessions import Session, SessionStore
from server_patches.statements import Statement, bool_setting, insert_settings_clause

if TYPE_CHECKING:
    from server_patches.http_params import RequestParams

PoolKey = tuple[str, tuple[tuple[str, str], ...]]
_THROW = "throw_on_unsupported_query_inside_transaction"
#: Settings whose profile value the front needs itself (the async-insert refusal), besides
#: every setting the profile changes.
PROFILE_NAMES = ("async_insert", "implicit_transaction", _THROW)
_PROFILE_SQL = "SELECT name, value FROM system.settings WHERE changed OR name IN ({names:Array(String)})"
_MAX_IDLE_PER_KEY = 8
_MAX_IDLE = 64


def read_profile(conn: EngineConnection) -> dict[str, str]:
    """The settings a fresh connection starts with that differ from the built-in defaults
    (the users file's default profile, its ``compatibility`` included), and the values of
    :data:`PROFILE_NAMES`; read once, at engine start, so no request pays for it."""
    rows = conn.run(_PROFILE_SQL, "JSONCompactEachRow", {"names": "['" + "','".join(PROFILE_NAMES) + "']"})
    out = {str(n): str(v) for n, v in map(json.loads, rows.bytes().decode().splitlines())}
    # USE manages the database; a session's `SET database` is not a thing to restore.
    out.pop("database", None)
    return out


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
        self.profile = read_profile(first)
        self.pool.add(("default", ()), first)
        self.sessions = SessionStore(
            lambda: EngineConnection(self.dsn, self.profile),
            max_timeout=max_session_timeout,
            default_timeout=default_session_timeout,
        )

    def acquire_session(self, sid: str, req: "RequestParams", stmt: Statement) -> Session:
        """The session ``sid`` locked for the request ``req`` (:meth:`SessionStore.acquire`) once
        its ``stmt`` passed :meth:`refuse_async_insert`; released again if it did not."""
        session = self.sessions.acquire(sid, req.http.get("session_timeout"), req.flag("session_check"))
        try:
            self.refuse_async_insert(stmt, req.settings, session.conn)
        except BaseException:
            session.release()
            raise
        return session

    def refuse_async_insert(
        self, stmt: Statement, url_settings: Mapping[str, str], session: EngineConnection | None
    ) -> None:
        """Refuse an INSERT a server would queue (``async_insert`` 1) in a transaction, as
        executeQuery does (code 48, NOT_IMPLEMENTED).

        chdb has no asynchronous insert queue and runs such INSERTs synchronously; a stock
        server always has one. Runs on the handler's thread before the engine reads the
        body, with ``session`` (the session's connection; None without one) locked. Only
        an inline INSERT whose effective ``async_insert`` is 1 pays a query (is a
        transaction open?), so INSERTs with ``async_insert=0`` cost nothing.
        """
        if not stmt.inline_insert:
            return
        layers = (dict(insert_settings_clause(stmt.sql)), url_settings, session.session_values if session else {})
        if not (bool_setting(self.setting("async_insert", *layers)) and bool_setting(self.setting(_THROW, *layers))):
            return
        if session is not None and session.in_transaction():
            # The server's refusal fails the transaction as well: only ROLLBACK runs after it.
            session.fail_transaction()
            raise HTTPError(NOT_IMPLEMENTED, "Async inserts inside transactions are not supported")
        if bool_setting(self.setting("implicit_transaction", *layers)):
            raise HTTPError(NOT_IMPLEMENTED, "Async inserts with 'implicit_transaction' are not supported")

    def setting(self, name: str, *layers: Mapping[str, str]) -> str | None:
        """A setting's value for one query: the first of ``layers`` that gives it (most
        specific first: the INSERT's own SETTINGS, the URL, the session's SETs), else the
        profile's (read once at start, :func:`read_profile`)."""
        for layer in layers:
            if name in layer:
                return layer[name]
        return self.profile.get(name)

    @property
    def max_session_timeout(self) -> float:
        return self.sessions.max_timeout

    @property
    def default_session_timeout(self) -> float:
        return self.sessions.default_timeout

    def borrow(
        self, settings: dict[str, str], database: str | None, stmt: Statement | None = None
    ) -> tuple[EngineConnection, PoolKey]:
        """A pooled connection for a session-less request, once its ``stmt`` (when given)
        passed :meth:`refuse_async_insert`."""
        if stmt is not None:
            self.refuse_async_insert(stmt, settings, None)
        return self.pool.borrow(settings, database)

    def give_back(self, conn: EngineConnection, key: PoolKey, healthy: bool = True) -> None:
        self.pool.give_back(conn, key, healthy)

    def shutdown(self) -> None:
        """Close every session (rolling back open transactions), then the pool."""
        self.pool.closed = True
        self.sessions.shutdown()
        self.pool.close()
