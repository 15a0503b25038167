"""One chdb connection of the HTTP front: a ClickHouse session and the URL settings on it.

Each chdb connection is its own ClickHouse session with its own transaction, so
``BEGIN TRANSACTION`` / ``COMMIT`` / ``ROLLBACK`` behave as on a server. The pool
(:mod:`server_patches.engine`) and named sessions (:mod:`server_patches.sessions`)
both hold these.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Generator, Iterable, Mapping, Sequence

from server_patches import chdb_import
from server_patches.errors import UNKNOWN_FORMAT, UNKNOWN_SETTING, HTTPError, undecodable_error
from server_patches.pipe_insert import insert_through_pipe
from server_patches.statements import (
    first_keyword,
    quote_identifier,
    quote_literal,
    set_assignments,
    wire,
)

# Not a plain `import chdb`: its import probe would break streaming tables (chdb_import).
chdb = chdb_import.load()

if TYPE_CHECKING:
    from server_patches.http_params import ExternalTable


class EngineConnection:
    """One chdb connection (one ClickHouse session) and the URL settings applied to it.

    Pooled (session-less) connections are configured once, at creation, with the
    database and settings of their pool key and are never reset: ``implicit_transaction=1``
    cannot be undone on a connection (every later statement, even ``SET``, then starts a
    transaction that ``SET``/``USE`` do not support), so it is applied last, for good.
    Session connections apply URL settings per query and restore them afterwards.
    """

    def __init__(self, dsn: str, profile: Mapping[str, str] | None = None) -> None:
        self.dsn = dsn
        self.conn = chdb.connect(dsn)
        self.applied: dict[str, str] = {}
        # Values the session's own SET statements gave; restored instead of DEFAULT.
        self.session_values: dict[str, str] = {}
        # What a fresh connection starts with where it differs from the built-in default
        # (the settings profile, `compatibility` included): `SET x = DEFAULT` would
        # restore the built-in value, a server's next query gets the profile's.
        self.profile: Mapping[str, str] = profile or {}
        self.database = "default"
        self.dirty = False  # a user's SET/USE changed a pooled connection: do not reuse it

    def run(self, sql: str, fmt: str = "TabSeparated", params: dict[str, str] | None = None) -> Any:
        """Run one statement to completion; the engine's errors become :class:`HTTPError`."""
        try:
            return self.conn._conn.query(wire(sql), fmt, params=params or {})
        except UnicodeDecodeError:
            raise undecodable_error() from None
        except Exception as exc:  # chdb raises RuntimeError subclasses with ClickHouse text
            raise HTTPError.from_engine(exc) from None

    def stream(self, sql: str, fmt: str, params: dict[str, str]) -> Generator[Any, None, None]:
        """Run a SELECT block by block (chdb's streaming query); yields result chunks.

        Started at the first ``next``; closing the generator early cancels the query.
        """
        try:
            result = self.conn.send_query(wire(sql), fmt, params)
        except Exception as exc:
            raise HTTPError.from_engine(exc) from None
        try:
            yield from result
        except UnicodeDecodeError:
            raise undecodable_error() from None
        except Exception as exc:
            raise HTTPError.from_engine(exc) from None
        finally:
            try:
                result.cancel()  # a no-op once the stream is exhausted
            except Exception:  # the query already failed; nothing is left to cancel
                pass

    def insert(self, sql: str, fmt: str, data: Iterable[bytes]) -> Any:
        """Stream ``data`` into ``INSERT ... FORMAT fmt``; the engine's result (``rows_written()``).

        Through a pipe and the query path (:mod:`server_patches.pipe_insert`), not chdb's
        ``send_insert``, whose ``finish`` reports success for an insert its table refused.
        """
        return insert_through_pipe(self.run, self._kill_reader_of, sql, fmt, data)

    def _kill_reader_of(self, path: str) -> bool:
        """Cancel this connection's statement reading ``path``, from a connection of its own."""
        killer = chdb.connect(self.dsn)
        try:
            found = killer._conn.query(
                "KILL QUERY WHERE query LIKE {p:String} AND query NOT LIKE '%system.processes%' ASYNC",
                "TabSeparated",
                params={"p": f"%FROM INFILE '{path}'%"},
            )
            return bool(found.bytes().strip())
        finally:
            killer.close()

    def load_external(self, tables: "Sequence[ExternalTable]") -> None:
        """Create each external data file as a temporary table of this connection."""
        for t in tables:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", t.fmt):
                raise HTTPError(UNKNOWN_FORMAT, f"Unknown format {t.fmt}", "UNKNOWN_FORMAT")
            self.run(f"CREATE TEMPORARY TABLE {quote_identifier(t.name)} ({t.columns}) ENGINE = Memory")
            self.dirty = True  # a pooled connection that held temporary tables is not reused
            self.insert(f"INSERT INTO {quote_identifier(t.name)}", t.fmt, [t.data])

    def drop_external(self, tables: "Sequence[ExternalTable]") -> None:
        """Drop what :meth:`load_external` created: external data lives for one query."""
        for t in tables:
            self.run(f"DROP TEMPORARY TABLE IF EXISTS {quote_identifier(t.name)}")

    def text(self, sql: str) -> str:
        """The TabSeparated result of ``sql``, stripped (for one-value queries)."""
        return str(self.run(sql).bytes().decode()).strip()

    def configure(self, settings: dict[str, str], database: str | None) -> None:
        """Pooled connection, once: USE, then every setting, ``implicit_transaction`` last."""
        self.use(database)
        last = {k: v for k, v in settings.items() if k == "implicit_transaction"}
        for name, value in settings.items():
            if name not in last:
                self._set(name, value)
        for name, value in last.items():
            self._set(name, value)

    def use(self, database: str | None) -> None:
        want = database or "default"
        if want != self.database:
            self.run(f"USE {quote_identifier(want)}")
            self.database = want

    def apply(self, settings: dict[str, str], database: str | None, keyword: str = "") -> None:
        """Session connection: make exactly ``settings`` current for the next query, whose
        first word is ``keyword``.

        COMMIT and ROLLBACK run with the settings (and database) as they stand,
        ``applied`` untouched: a failed transaction refuses every statement but
        ROLLBACK, these SETs included, so a plain ROLLBACK after a request with settings
        must not reset them first. The next ordinary statement applies its own diff.
        """
        if keyword in ("COMMIT", "ROLLBACK"):
            return  # BEGIN applies them: the statements after it expect its database
        self.use(database)
        for name in list(self.applied):
            if name not in settings:
                self._set(name, self.session_values.get(name, self.profile.get(name)))
                del self.applied[name]
        for name, value in settings.items():
            if self.applied.get(name) != value:
                self._set(name, value)
                self.applied[name] = value

    def in_transaction(self) -> bool:
        """Whether this connection's session has a transaction open (``BEGIN`` without its end).

        Raises the engine's 649 (``INVALID_TRANSACTION``) when that transaction failed, as
        a server answers every statement but ``ROLLBACK`` then.
        """
        return self.text("SELECT transactionID().1") != "0"

    def fail_transaction(self) -> None:
        """Mark the open transaction failed, as a server does for any statement it refuses
        inside one (executeQuery's ``txn->onException()``): from now on only ROLLBACK runs."""
        try:
            self.run("SELECT throwIf(1)")
        except HTTPError:
            pass  # the error is the point: the engine fails the transaction on it

    def remember_user_statement(self, sql: str) -> None:
        """After the user's own ``SET``/``USE``, keep what it changed as the session's."""
        word = first_keyword(sql)
        if word == "USE":
            self.database = self.text("SELECT currentDatabase()") or "default"
        elif word == "SET":
            for name, literal in set_assignments(sql):
                self.session_values[name] = literal
                self.applied.pop(name, None)
        self.dirty = True

    def _set(self, name: str, value: str | None) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise HTTPError(UNKNOWN_SETTING, f"Unknown setting '{name}'", "UNKNOWN_SETTING")
        # The name is checked above and the value goes in as a quoted literal, so no
        # request text reaches the SQL raw; ClickHouse converts the string to the type.
        self.run(f"SET {name} = " + ("DEFAULT" if value is None else quote_literal(value)))

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # closing twice or after an engine error is harmless
            pass
