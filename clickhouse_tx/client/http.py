"""The project's one ClickHouse HTTP client on ``requests``: sessions, parameters, Arrow streams.

Every module of the project (and the Spark data sources, the benchmarks, the tests)
imports the client from here; what a failed reply means and the codes callers branch
on are :mod:`clickhouse_tx.client.codes`. The wire details (body framing, JSON values,
the mapping of replies to errors) are the private :mod:`clickhouse_tx.client._transport`.

Why not clickhouse-connect: the protocol needs full control of the HTTP session (``session_id``
= xid, ``session_timeout``, ``session_check``), of which failures mean "not sent" and which mean
"sent, reply lost", and a streaming ``INSERT ... FORMAT ArrowStream`` whose body is produced lazily
from an iterator of Arrow record batches (chunked: no partition whole in memory, no Python per row).

A :class:`ClickHouseHTTP` is cheap: it opens nothing, and its requests go through the one
connection pool of its server in this process (:mod:`clickhouse_tx.client._transport.pool`).
Not picklable on purpose: executors build their own from the :class:`~clickhouse_tx.interfaces.Target`.
Every INSERT carries the server contract's settings (:mod:`clickhouse_tx.client.contract`).

Retries
-------
A read (:meth:`ClickHouseHTTP.query_json`) and a statement its caller marks
``idempotent`` are retried by the target's ``read_retry`` policy when they run outside
a session: repeating them cannot change what the server holds, so a connection reset,
a lost reply or a Keeper connection loss on the server costs a retry, not the task.
Under a caller's own retry loop (the coordinator's ``TxOps.call``, the registry's
read-back: :func:`clickhouse_tx.retry.inside_retry`) the client does not retry again:
one loop per call, with one budget. Nothing else is retried here: a write whose reply was lost is resolved by its
caller's lookup, and a request inside a session (a transaction) may find the session
still busy with the lost one.

Errors
------
Every failure is mapped in one place, :mod:`clickhouse_tx.client._transport.reply_mapping`: a
request that never reached the server is a ``RequestNotSentError`` (transient), one
whose reply was lost a ``ReplyLostError`` (outcome unknown), a ClickHouse exception a
``ServerError`` or one of its outcome-certain kinds (``ServerBusyError``,
``ServerOutcomeUnknownError``).

No message contains the password: it travels only in the ``Authorization`` header,
and error messages are built from the URL without its user-info part.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import pyarrow as pa
import requests

from clickhouse_tx.client import contract
from clickhouse_tx.client import sql as q
from clickhouse_tx.client._transport import pool
from clickhouse_tx.client._transport.reply_mapping import error_from_connection, error_from_reply, unwritten_rows_error
from clickhouse_tx.client._transport.urls import safe_url
from clickhouse_tx.client._transport.wire import (
    END_OF_STREAM,
    SizedBody,
    arrow_stream_body,
    converter,
    setting_text,
    statement_label,
)
from clickhouse_tx.errors import ReplyLostError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.retry import inside_retry, is_transient_or_unknown, retry_call

#: Settings of one request (name -> value; booleans as 1/0), beside the target's own.
Settings = Mapping[str, object] | None

#: What each server of this process has (:class:`~clickhouse_tx.client.contract.ServerTraits`),
#: by endpoint: probed by the first INSERT to it, then kept for the process.
_TRAITS: dict[str, contract.ServerTraits] = {}
_TRAITS_LOCK = threading.Lock()


class ClickHouseHTTP:
    """One client of ClickHouse's HTTP interface, optionally bound to a session.

    Parameters
    ----------
    target
        Server URL, credentials, per-request settings and timeouts.
    session_id
        Every request runs in this ClickHouse session (its own transaction context).
        ``None``: every request stands alone.
    session_timeout
        Seconds the server keeps the session alive between requests (sent with every
        request; the last one wins). Defaults to ``target.session_timeout_s``.
    database
        Default database of the requests; defaults to ``target.database``.

    Notes
    -----
    Runs wherever it is built (driver or executor). Not thread-safe within one
    session (ClickHouse allows one query at a time per session anyway); separate
    instances may run in parallel.
    """

    def __init__(
        self,
        target: Target,
        session_id: str | None = None,
        session_timeout: int | None = None,
        database: str | None = None,
    ) -> None:
        self.target = target
        self.session_id = session_id
        self.session_timeout = session_timeout if session_timeout is not None else target.session_timeout_s
        self.database = database if database is not None else target.database
        self._http = pool.shared_session(target.url, target.tls)
        parts = urllib.parse.urlsplit(target.url)
        self._auth: tuple[str, str] | None = (
            (target.user, target.password) if (target.user or target.password) else None
        )
        if parts.username is not None and not target.user:
            self._auth = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
        # where requests go, and what messages show: no credentials (they go per request)
        self.server = safe_url(target.url)

    def __repr__(self) -> str:
        return f"ClickHouseHTTP(url={self.server!r}, session_id={self.session_id!r})"

    def __reduce__(self) -> NoReturn:  # pragma: no cover - guard
        raise TypeError("ClickHouseHTTP holds connections and is not picklable; pickle the Target")

    def close(self) -> None:
        """Nothing to release: the connections belong to the server's pool of this process
        (:mod:`~clickhouse_tx.client._transport.pool`), the server-side session stays."""

    def __enter__(self) -> ClickHouseHTTP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def _params(
        self,
        settings: Settings,
        params: Mapping[str, object] | None,
        session_check: bool,
        session_timeout: int | None,
        pins: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.database:
            out["database"] = self.database
        for name, text in (self.target.settings or {}).items():
            out[str(name)] = setting_text(text)
        for name, value in (settings or {}).items():
            out[str(name)] = setting_text(value)
        # Last: what the server contract pins wins over the target's and the caller's.
        out.update(pins or {})
        for name, param in (params or {}).items():
            out[f"param_{name}"] = q.format_param(param)
        if self.session_id is not None:
            out["session_id"] = self.session_id
            out["session_timeout"] = str(session_timeout if session_timeout is not None else self.session_timeout)
            if session_check:
                out["session_check"] = "1"
        return out

    def _post(
        self,
        *,
        url_params: dict[str, str],
        data: bytes | Iterator[bytes] | SizedBody,
        what: str,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        try:
            resp = self._http.post(
                self.server,
                auth=self._auth,
                params=url_params,
                data=data,
                timeout=(self.target.connect_timeout_s, self.target.request_timeout_s),
                headers={"Accept-Encoding": "gzip, deflate", **(headers or {})},
            )
            # Read the whole reply here so a connection dropped mid-body is a lost reply.
            resp.content  # noqa: B018
        except requests.RequestException as exc:
            raise error_from_connection(
                exc, what=what, server=self.server, request_timeout_s=self.target.request_timeout_s, xid=self.session_id
            ) from None
        header_code = resp.headers.get("X-ClickHouse-Exception-Code")
        if resp.status_code != 200 or header_code:
            raise error_from_reply(
                resp.status_code, header_code, resp.content.decode("utf-8", "replace"), what=what, xid=self.session_id
            )
        return resp

    def _post_idempotent(
        self, *, url_params: dict[str, str], data: bytes, what: str, sessionless: bool = False
    ) -> requests.Response:
        """:meth:`_post` of a request that may be repeated: retried by ``read_retry`` outside a session
        (``sessionless``: the request carries no session even though this client has one)."""
        in_session = self.session_id is not None and not sessionless
        if in_session or self.target.read_retry.max_attempts <= 1 or inside_retry():
            return self._post(url_params=url_params, data=data, what=what)
        return retry_call(
            lambda: self._post(url_params=url_params, data=data, what=what),
            self.target.read_retry,
            retry_on=is_transient_or_unknown,
            what=f"{what} on {self.server}",
        )

    # ------------------------------------------------------------------ API

    def command(
        self,
        sql: str,
        settings: Settings = None,
        params: Mapping[str, object] | None = None,
        *,
        session_check: bool = False,
        session_timeout: int | None = None,
        idempotent: bool = False,
    ) -> str:
        """Run a statement (DDL, BEGIN/COMMIT/ROLLBACK, small SELECT); its text reply.

        ``session_check=True`` makes the server fail (code 372) instead of creating a
        new session when ``session_id`` no longer exists. ``idempotent=True`` says that
        running the statement twice leaves the server as running it once (a SELECT,
        ``CREATE ... IF NOT EXISTS``, ``DROP ... IF EXISTS``): it is then retried like a
        read (see "Retries" above).
        """
        post = self._post_idempotent if idempotent else self._post
        pins = self._insert_pins(contract.InsertKind.KEEP, settings) if q.is_insert(sql) else None
        resp = post(
            url_params=self._params(settings, params, session_check, session_timeout, pins),
            data=sql.encode(),
            what=statement_label(sql),
        )
        return resp.content.decode("utf-8", "replace")

    def server_traits(self) -> contract.ServerTraits:
        """Which later-release settings this client's server has: probed once per process and server.

        The probe runs outside any session (a session's transaction may have failed, and
        then refuses every statement but ``ROLLBACK``).
        """
        traits = _TRAITS.get(self.server)
        if traits is None:
            url_params = {"param_names": q.format_param(list(contract.VERSIONED))}
            sql = contract.PROBE_SQL + "\nFORMAT TabSeparated"
            resp = self._post_idempotent(
                url_params=url_params, data=sql.encode(), what="SELECT FROM system.settings", sessionless=True
            )
            traits = contract.ServerTraits.from_names(resp.content.decode("utf-8", "replace").split())
            with _TRAITS_LOCK:
                _TRAITS[self.server] = traits
        return traits

    def _insert_pins(self, kind: contract.InsertKind, settings: Settings) -> dict[str, str]:
        """The server contract's settings of one INSERT of ``kind`` from this client."""
        token = (settings or {}).get("insert_deduplication_token")
        in_session = self.session_id is not None
        return contract.insert_settings(
            kind, self.server_traits(), token=None if token is None else str(token), in_session=in_session
        )

    def query_json(
        self,
        sql: str,
        params: Mapping[str, object] | None = None,
        settings: Settings = None,
    ) -> list[dict[str, Any]]:
        """Run a SELECT and return its rows as dicts; 64-bit integers come back as ints.

        Uses ``FORMAT JSONCompactEachRowWithNamesAndTypes`` and converts by the column
        types, rather than the ``output_format_json_quote_64bit_integers`` setting:
        a request should carry no settings it does not need (inside an open
        transaction every extra setting is one more thing that can fail it).
        """
        resp = self._post_idempotent(
            url_params=self._params(settings, params, False, None),
            data=(sql.rstrip().rstrip(";") + "\nFORMAT JSONCompactEachRowWithNamesAndTypes").encode(),
            what=statement_label(sql),
        )
        lines = [ln for ln in resp.content.decode("utf-8").splitlines() if ln.strip()]
        if len(lines) < 2:
            return []
        names = json.loads(lines[0])
        convs = [converter(t) for t in json.loads(lines[1])]
        out = []
        try:
            for ln in lines[2:]:
                vals = json.loads(ln)
                out.append({n: (f(v) if f else v) for n, f, v in zip(names, convs, vals)})
        except ValueError as exc:  # a reply broken mid-stream is a lost reply, not rows
            broken = f"{statement_label(sql)}: reply from {self.server} is not the rows asked for ({exc})"
            raise ReplyLostError(broken, xid=self.session_id) from None
        return out

    def insert_arrow_stream(
        self,
        table_sql: str,
        schema: pa.Schema,
        batches: Iterator[pa.RecordBatch],
        settings: Settings = None,
        *,
        may_deduplicate: bool = False,
    ) -> int:
        """Stream ``batches`` as ``INSERT INTO <table_sql> (<cols>) FORMAT ArrowStream``.

        Parameters
        ----------
        table_sql
            Already quoted table name, e.g. ``sql.qualified(db, table)``.
        schema
            Schema of every batch; its field names are the INSERT column list.
        batches
            Consumed lazily while the body is sent (chunked transfer encoding).
        may_deduplicate
            The INSERT is one block the server may drop as already held (a
            deduplication token): a reply writing 0 rows is then not an error.

        Returns
        -------
        int
            Number of rows sent (counted from the batches, no per-row Python).

        Raises
        ------
        RowsNotWrittenError
            The reply said success, but its summary counts fewer rows written than
            sent (see :func:`~clickhouse_tx.client._transport.reply_mapping.unwritten_rows_error`).
        """
        counter = [0]
        body = arrow_stream_body(schema, batches, counter)
        self._insert_arrow(table_sql, schema, body, settings, lambda: counter[0], may_deduplicate)
        return counter[0]

    def insert_arrow_messages(
        self,
        table_sql: str,
        schema: pa.Schema,
        messages: Sequence[pa.Buffer],
        *,
        rows: int,
        settings: Settings = None,
        may_deduplicate: bool = False,
    ) -> None:
        """:meth:`insert_arrow_stream` of record batches already serialized: ``messages`` are
        ``RecordBatch.serialize()`` of batches of ``schema`` without dictionary columns.

        The body is the schema message, these messages and the end-of-stream marker: the
        bytes :meth:`insert_arrow_stream` would send for the batches, without encoding and
        copying them again (a caller that hashed the messages sends what it hashed). Their
        total length is known, so the body goes with a ``Content-Length`` and each message
        reaches the socket uncopied. ``rows`` is the messages' row count, checked against
        the reply's summary as :meth:`insert_arrow_stream` checks its own.
        """
        parts = [memoryview(b) for b in (schema.serialize(), *messages, END_OF_STREAM)]
        self._insert_arrow(table_sql, schema, SizedBody(parts), settings, lambda: rows, may_deduplicate)

    def _insert_arrow(
        self,
        table_sql: str,
        schema: pa.Schema,
        body: Iterator[bytes] | SizedBody,
        settings: Settings,
        sent: Callable[[], int],
        may_deduplicate: bool,
    ) -> None:
        """POST ``INSERT INTO <table_sql> (<cols>) FORMAT ArrowStream`` with ``body`` (the SQL in the URL),
        then check that the reply's summary counts the ``sent()`` rows written."""
        sql = f"INSERT INTO {table_sql} {q.column_list(schema.names)} FORMAT ArrowStream"
        kind = contract.InsertKind.DEDUPLICATE if may_deduplicate else contract.InsertKind.KEEP
        url_params = self._params(settings, None, False, None, self._insert_pins(kind, settings))
        url_params["query"] = sql
        resp = self._post(url_params=url_params, data=body, what=statement_label(sql))
        unwritten = unwritten_rows_error(
            resp.headers.get("X-ClickHouse-Summary"),
            sent(),
            may_deduplicate=may_deduplicate,
            what=statement_label(sql),
            xid=self.session_id,
        )
        if unwritten is not None:
            raise unwritten


def reuse_or_open(target: Target, client: ClickHouseHTTP | None) -> contextlib.AbstractContextManager[ClickHouseHTTP]:
    """``with reuse_or_open(target, client) as c:``: the caller's ``client``, left open, else a session-less
    client of ``target`` closed at the end of the block.

    For a helper that a caller may hand the client of a run of requests (one connection
    pool for a whole driver step) and that opens its own when called alone.
    """
    return contextlib.nullcontext(client) if client is not None else ClickHouseHTTP(target)


__all__ = ["ClickHouseHTTP", "reuse_or_open", "safe_url"]
