"""The project's one ClickHouse HTTP client on ``requests``: sessions, parameters, Arrow streams.

Why not clickhouse-connect: the protocol needs full control of the HTTP session
(``session_id`` = xid, ``session_timeout``, ``session_check``), of which failures
mean "not sent" and which mean "sent, reply lost", and a streaming
``INSERT ... FORMAT ArrowStream`` whose body is produced lazily from an iterator of
Arrow record batches (chunked transfer encoding: a partition is never whole in
memory and no Python runs per row).

A :class:`ClickHouseHTTP` is cheap, holds a ``requests.Session`` (connection pool)
and is not picklable on purpose: executors build their own from the
:class:`~clickhouse_tx.interfaces.Target`, which is.

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
Every failure is mapped in one place, :mod:`clickhouse_tx._transport.errors`: a
request that never reached the server is a ``RequestNotSentError`` (transient), one
whose reply was lost a ``ReplyLostError`` (outcome unknown), a ClickHouse exception a
``ServerError`` or one of its outcome-certain kinds (``ServerBusyError``,
``ServerOutcomeUnknownError``).

No message contains the password: it travels only in the ``Authorization`` header,
and error messages are built from the URL without its user-info part.
"""

from __future__ import annotations

import io
import json
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, cast

import pyarrow as pa
import requests

from clickhouse_tx import sql as q
from clickhouse_tx._transport.errors import ReplyLostError, error_from_connection, error_from_reply
from clickhouse_tx.interfaces import Target
from clickhouse_tx.retry import inside_retry, is_transient_or_unknown, retry_call


def safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part, query or fragment: the one form of a
    URL that is logged, put in messages or recorded (registry ``server``, CLI hints).

    A URL too broken to split (bad port, bad IPv6 literal) yields ``<unparseable url>``:
    its text may hold anything, a password included."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets
    if port:
        host = f"{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


#: The Arrow IPC stream's end marker: continuation token, then a zero metadata length.
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class _PendingBytes(io.RawIOBase):
    """A write-only file that keeps what was written until :meth:`take` collects it.

    The Arrow IPC stream writer writes into it; the request-body generator hands the
    bytes to ``requests`` after each record batch, so memory holds one batch at most.
    """

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        data = bytes(b)
        self._chunks.append(data)
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


class _SizedBody:
    """A request body of parts whose total length is known before it is sent.

    ``requests`` sends it with a ``Content-Length`` and hands each part to the socket
    as it is. A body of unknown length goes chunked, and urllib3 then copies every
    part into a new ``bytes`` to frame it: one more pass over the data.
    """

    def __init__(self, parts: Sequence[memoryview]) -> None:
        self._parts = parts
        self._size = sum(p.nbytes for p in parts)

    def __iter__(self) -> Iterator[bytes]:
        # requests' stubs say bytes; the socket takes any buffer, a memoryview uncopied.
        return iter(cast("Sequence[bytes]", self._parts))

    def __len__(self) -> int:
        return self._size


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
        self._http = requests.Session()
        self._http.auth = (target.user, target.password) if (target.user or target.password) else None
        parts = urllib.parse.urlsplit(target.url)
        self._endpoint = urllib.parse.urlunsplit(
            (parts.scheme, (parts.hostname or "") + (f":{parts.port}" if parts.port else ""), parts.path or "/", "", "")
        )
        if parts.username is not None and not target.user:
            self._http.auth = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
        self.server = safe_url(target.url)

    def __repr__(self) -> str:
        return f"ClickHouseHTTP(url={self.server!r}, session_id={self.session_id!r})"

    def __reduce__(self) -> NoReturn:  # pragma: no cover - guard
        raise TypeError("ClickHouseHTTP holds connections and is not picklable; pickle the Target")

    def close(self) -> None:
        """Close the pooled HTTP connections (the server-side session stays)."""
        self._http.close()

    def __enter__(self) -> ClickHouseHTTP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def _params(
        self,
        settings: Mapping[str, object] | None,
        params: Mapping[str, object] | None,
        session_check: bool,
        session_timeout: int | None,
    ) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.database:
            out["database"] = self.database
        for name, text in (self.target.settings or {}).items():
            out[str(name)] = _setting_text(text)
        for name, value in (settings or {}).items():
            out[str(name)] = _setting_text(value)
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
        data: bytes | Iterator[bytes] | _SizedBody,
        what: str,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        try:
            resp = self._http.post(
                self._endpoint,
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

    def _post_idempotent(self, *, url_params: dict[str, str], data: bytes, what: str) -> requests.Response:
        """:meth:`_post` of a request that may be repeated: retried by ``read_retry`` outside a session."""
        if self.session_id is not None or self.target.read_retry.max_attempts <= 1 or inside_retry():
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
        settings: Mapping[str, object] | None = None,
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
        resp = post(
            url_params=self._params(settings, params, session_check, session_timeout),
            data=sql.encode(),
            what=_what(sql),
        )
        return resp.content.decode("utf-8", "replace")

    def query_json(
        self,
        sql: str,
        params: Mapping[str, object] | None = None,
        settings: Mapping[str, object] | None = None,
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
            what=_what(sql),
        )
        lines = [ln for ln in resp.content.decode("utf-8").splitlines() if ln.strip()]
        if len(lines) < 2:
            return []
        names = json.loads(lines[0])
        convs = [_converter(t) for t in json.loads(lines[1])]
        out = []
        try:
            for ln in lines[2:]:
                vals = json.loads(ln)
                out.append({n: (f(v) if f else v) for n, f, v in zip(names, convs, vals)})
        except ValueError as exc:  # a reply broken mid-stream is a lost reply, not rows
            raise ReplyLostError(
                f"{_what(sql)}: reply from {self.server} is not the rows asked for ({exc})", xid=self.session_id
            ) from None
        return out

    def insert_arrow_stream(
        self,
        table_sql: str,
        schema: pa.Schema,
        batches: Iterator[pa.RecordBatch],
        settings: Mapping[str, object] | None = None,
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

        Returns
        -------
        int
            Number of rows sent (counted from the batches, no per-row Python).
        """
        sql = f"INSERT INTO {table_sql} {q.column_list(schema.names)} FORMAT ArrowStream"
        counter = [0]

        def body() -> Iterator[bytes]:
            sink = _PendingBytes()
            writer = pa.ipc.new_stream(sink, schema)
            pending = sink.take()
            if pending:
                yield pending
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                writer.write_batch(batch)
                counter[0] += batch.num_rows
                chunk = sink.take()
                if chunk:
                    yield chunk
            writer.close()
            tail = sink.take()
            if tail:
                yield tail

        url_params = self._params(settings, None, False, None)
        url_params["query"] = sql
        self._post(url_params=url_params, data=body(), what=_what(sql))
        return counter[0]

    def insert_arrow_messages(
        self,
        table_sql: str,
        schema: pa.Schema,
        messages: Sequence[pa.Buffer],
        settings: Mapping[str, object] | None = None,
    ) -> None:
        """``INSERT INTO <table_sql> (<cols>) FORMAT ArrowStream`` of serialized record batches.

        Parameters
        ----------
        table_sql
            Already quoted table name.
        schema
            The batch's schema; its field names are the INSERT column list.
        messages
            ``RecordBatch.serialize()`` of batches without dictionary columns. The body
            is the schema message, these messages and the end-of-stream marker: the
            bytes :meth:`insert_arrow_stream` would send for the batches, without
            encoding and copying them again (a caller that hashed the messages sends
            what it hashed). Their total length is known, so the body goes with a
            ``Content-Length`` and each message reaches the socket uncopied.
        """
        sql = f"INSERT INTO {table_sql} {q.column_list(schema.names)} FORMAT ArrowStream"
        url_params = self._params(settings, None, False, None)
        url_params["query"] = sql
        parts = [memoryview(b) for b in (schema.serialize(), *messages, _END_OF_STREAM)]
        self._post(url_params=url_params, data=_SizedBody(parts), what=_what(sql))


_BIG_INT = re.compile(r"^(?:Nullable\()?U?Int(?:64|128|256)\)?$")
_BIG_INT_ARRAY = re.compile(r"^Array\((?:Nullable\()?U?Int(?:64|128|256)\)?\)$")


def _converter(ch_type: str) -> Callable[[Any], Any] | None:
    """How to turn a JSON value of ``ch_type`` into Python (64-bit+ ints arrive quoted)."""
    if _BIG_INT.match(ch_type):
        return lambda v: int(v) if isinstance(v, str) else v
    if _BIG_INT_ARRAY.match(ch_type):
        return lambda v: [int(x) if isinstance(x, str) else x for x in v] if isinstance(v, list) else v
    return None


def _setting_text(v: object) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _what(sql: str) -> str:
    """A short label of a statement for error messages (first words, no values)."""
    words = sql.strip().split()
    return " ".join(words[:3])[:80] if words else "request"
