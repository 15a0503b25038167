"""The request handler: one HTTP request in, one ClickHouse reply out.

Per request, on the server's thread for that connection: read the parameters and
authenticate (:mod:`~server_patches.http_params`, :mod:`~server_patches.auth`),
decode the body (:mod:`~server_patches.compression`), join query and body into one
statement (:mod:`~server_patches.statements`), lease a connection (the session's or
a pooled one, :mod:`~server_patches.engine`), run it, reply.

A SELECT in a row format without header or footer (Native, RowBinary, TSV, CSV,
JSONEachRow, ...) is streamed block by block as ClickHouse does: an error before
the first byte is an ordinary error reply (status and ``X-ClickHouse-Exception-Code``);
an error after it is written into the body, between ``__exception__`` markers
carrying the reply's ``X-ClickHouse-Exception-Tag``, and the connection is closed
without the final chunk, so the reply is visibly incomplete.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import IO, Any, Generator, Iterator, Mapping, cast
from urllib.parse import urlsplit

from server_patches.auth import authenticate
from server_patches.chdb_connection import EngineConnection
from server_patches.compression import decoded_body
from server_patches.engine import Engine, PoolKey
from server_patches.errors import BAD_ARGUMENTS, NOT_IMPLEMENTED, READONLY, UNKNOWN_TABLE, HTTPError
from server_patches.http_params import RequestParams, is_multipart, read_multipart, request_params, url_params
from server_patches.sessions import Session
from server_patches.statements import (
    READ_ONLY_KEYWORDS,
    SHOW_CREATE_SYSTEM_TABLE,
    TRANSACTION_KEYWORDS,
    Statement,
    statement_of,
    system_table_in_show_create,
)

log = logging.getLogger("server_patches.http_server")

#: Row formats whose blocks concatenate into one valid reply (no header, no footer).
STREAMABLE_FORMATS = frozenset(
    f.lower()
    for f in (
        "Native",
        "RowBinary",
        "TabSeparated",
        "TSV",
        "TabSeparatedRaw",
        "TSVRaw",
        "CSV",
        "JSONEachRow",
        "JSONStringsEachRow",
        "JSONCompactEachRow",
        "JSONCompactStringsEachRow",
        "JSONLines",
        "NDJSON",
        "Null",
    )
)
#: A streamed reply is held back until it is this large or this old, so short results
#: keep Content-Length, a complete summary, and a proper error status.
STREAM_BUFFER_BYTES = 1 << 20
STREAM_BUFFER_SECONDS = 0.1


@dataclasses.dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]


@dataclasses.dataclass
class Lease:
    """The connection one request runs on: its session's, or one borrowed from the pool."""

    engine: Engine
    conn: EngineConnection
    session: Session | None = None
    pool_key: PoolKey | None = None
    healthy: bool = True
    released: bool = False

    def release(self) -> None:
        """Free the session (restarting its idle timer) or return the connection; once."""
        if self.released:
            return
        self.released = True
        if self.session is not None:
            self.session.release()
        elif self.pool_key is not None:
            self.engine.give_back(self.conn, self.pool_key, self.healthy)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ClickHouse"
    # Headers and body go out in two writes; with Nagle on, a keep-alive client's
    # delayed ACK stalls every reply for the ACK timer.
    disable_nagle_algorithm = True
    engine: Engine
    users: dict[str, str]

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet by default
        log.debug("%s " + fmt, self.client_address[0], *args)

    def do_GET(self) -> None:
        self._handle(readonly=True)

    def do_POST(self) -> None:
        self._handle(readonly=False)

    def do_OPTIONS(self) -> None:
        self._reply(Reply(204, b"", {}))

    # ------------------------------------------------------------------ replies

    def _start_reply(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("X-ClickHouse-Server-Display-Name", "clickhouse-tx-local")
        self.send_header("X-ClickHouse-Timezone", self.engine.timezone)
        self.end_headers()

    def _reply(self, reply: Reply) -> None:
        self._start_reply(reply.status, {**reply.headers, "Content-Length": str(len(reply.body))})
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _error(self, err: HTTPError, query_id: str, drain: Iterator[bytes] | None) -> None:
        if drain is not None:
            # Read what is left of the body so the keep-alive connection stays usable.
            try:
                for _ in drain:
                    pass
            except Exception:
                self.close_connection = True
        self._reply(
            Reply(
                err.status,
                err.body(),
                {
                    "Content-Type": "text/plain; charset=UTF-8",
                    "X-ClickHouse-Exception-Code": str(err.code),
                    "X-ClickHouse-Query-Id": query_id,
                },
            )
        )

    # ------------------------------------------------------------------ request

    def _handle(self, readonly: bool) -> None:
        url = urlsplit(self.path)
        params = url_params(url.query)
        query_id = params.get("query_id") or str(uuid.uuid4())
        if url.path in ("/ping", "/replicas_status"):
            self._reply(Reply(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"}))
            return
        body: Iterator[bytes] | None = None
        try:
            if url.path not in ("/", ""):
                raise HTTPError(BAD_ARGUMENTS, f"There is no handle {url.path}")
            body = self._body(params)
            authenticate(cast("Mapping[str, str]", self.headers), params, self.users)
            req, body = self._request(params, body)
            if "query" not in req.http and body is None:
                self._reply(Reply(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"}))
                return
            self._execute(req, body, query_id, readonly)
        except HTTPError as err:
            self._error(err, query_id, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug here must not take the server down
            log.exception("internal error")
            self._error(HTTPError(1001, f"Internal error: {type(exc).__name__}: {exc}"), query_id, body)

    def _body(self, params: dict[str, str]) -> Iterator[bytes] | None:
        """The decoded request body as it arrives, or None when the request has none."""
        has_body = bool(
            self.headers.get("Content-Length") not in (None, "0")
            or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        )
        native = params.get("decompress") in ("1", "true")
        return (
            decoded_body(cast("IO[bytes]", self.rfile), cast("Mapping[str, str]", self.headers), native)
            if has_body
            else None
        )

    def _request(
        self, params: dict[str, str], body: Iterator[bytes] | None
    ) -> tuple[RequestParams, Iterator[bytes] | None]:
        """The request's parameters; a multipart body adds its fields and files and is used up."""
        content_type = self.headers.get("Content-Type")
        if body is None or not is_multipart(content_type):
            return request_params(params), body
        fields, files = read_multipart(content_type or "", body)
        return request_params({**params, **fields}, files), None

    def _execute(self, req: RequestParams, body: Iterator[bytes] | None, query_id: str, readonly: bool) -> None:
        stmt = statement_of(req.http.get("query", ""), body)
        if readonly and self.command == "GET" and stmt.keyword not in READ_ONLY_KEYWORDS:
            raise HTTPError(
                READONLY, "Cannot execute query in readonly mode: use POST for queries that write", "READONLY"
            )
        lease = self._lease(req, stmt)
        try:
            reply = self._run(lease, req, stmt, query_id)
        except HTTPError:
            raise
        except BaseException:
            lease.healthy = False
            raise
        finally:
            # Before the reply: a client that sends its next query as soon as it reads
            # this reply must not find the session still locked (373).
            lease.release()
        if reply is not None:
            self._reply(reply)

    def _lease(self, req: RequestParams, stmt: Statement) -> Lease:
        """The session's connection, or a pooled one configured with the URL settings."""
        database = req.http.get("database")
        sid = req.http.get("session_id")
        if not sid:
            if stmt.keyword in TRANSACTION_KEYWORDS:
                raise HTTPError(
                    NOT_IMPLEMENTED,
                    "Transactions need a session: pass session_id (each session is one transaction context)",
                )
            conn, key = self.engine.borrow(req.settings, database, stmt)
            return Lease(self.engine, conn, pool_key=key)
        session = self.engine.acquire_session(sid, req, stmt)
        if req.settings.get("implicit_transaction") in (None, "0", "false"):
            return Lease(self.engine, session.conn, session=session)
        # The query runs in a transaction of its own, never the session's, and
        # implicit_transaction cannot be set and undone on one connection: serve
        # it on a pooled connection carrying the session's database and SETs.
        merged = {**session.conn.session_values, **req.settings}
        database = database or session.conn.database
        session.release()
        conn, key = self.engine.borrow(merged, database)
        return Lease(self.engine, conn, pool_key=key)

    def _run(self, lease: Lease, req: RequestParams, stmt: Statement, query_id: str) -> Reply | None:
        """Run the statement; the reply to send, or None when it was streamed already."""
        conn = lease.conn
        if lease.session is not None:
            conn.apply(req.settings, req.http.get("database"), stmt.keyword)
        fmt = stmt.output_format(req.http.get("default_format"))
        started = time.monotonic()
        if self._streams(req, stmt, fmt):
            return self._stream(lease, req, stmt, fmt, query_id)
        conn.load_external(req.external)
        try:
            if stmt.insert_format is not None:
                body, summary = b"", _insert_summary(conn.insert(stmt.sql, stmt.insert_format, stmt.data or ()))
            else:
                res = _query(conn, stmt, fmt, req.query_params)
                body = res.bytes() or b""
                summary = _query_summary(res, body)
        finally:
            conn.drop_external(req.external)
        summary["elapsed_ns"] = str(int((time.monotonic() - started) * 1e9))
        if stmt.keyword in ("SET", "USE"):
            conn.remember_user_statement(stmt.sql)
        return Reply(200, body, self._ok_headers(req, stmt, fmt, query_id, summary))

    def _ok_headers(
        self, req: RequestParams, stmt: Statement, fmt: str, query_id: str, summary: dict[str, str]
    ) -> dict[str, str]:
        sid = req.http.get("session_id")
        # As ClickHouse: only a statement with a result set names its format; clients
        # (clickhouse-connect's command()) answer a summary for the others.
        result = (
            {"Content-Type": _content_type(fmt), "X-ClickHouse-Format": fmt}
            if stmt.has_result
            else {"Content-Type": "text/plain; charset=UTF-8"}
        )
        return {
            **result,
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Summary": json.dumps(summary, separators=(",", ":")),
            **({"X-ClickHouse-Session-Id": sid} if sid else {}),
        }

    # ------------------------------------------------------------------ streaming

    def _streams(self, req: RequestParams, stmt: Statement, fmt: str) -> bool:
        """Whether the SELECT's reply goes out block by block (``wait_end_of_query=0``)."""
        return (
            stmt.insert_format is None
            and stmt.keyword in ("SELECT", "WITH")
            and not req.external
            and fmt.lower() in STREAMABLE_FORMATS
            and not req.flag("wait_end_of_query")
            and self.command != "HEAD"
        )

    def _stream(self, lease: Lease, req: RequestParams, stmt: Statement, fmt: str, query_id: str) -> Reply | None:
        """Buffer the first blocks; a short result is one ordinary reply, a long one is streamed."""
        chunks = lease.conn.stream(stmt.sql, fmt, req.query_params)
        head: list[bytes] = []
        summary = {"read_rows": 0, "read_bytes": 0}
        deadline = time.monotonic() + STREAM_BUFFER_SECONDS
        try:
            for chunk in chunks:  # an HTTPError here, before any byte, is an ordinary error reply
                head.append(chunk.bytes() or b"")
                summary["read_rows"] += chunk.rows_read()
                summary["read_bytes"] += chunk.bytes_read()
                if sum(map(len, head)) >= STREAM_BUFFER_BYTES or time.monotonic() >= deadline:
                    break
            else:
                body = b"".join(head)
                return Reply(200, body, self._ok_headers(req, stmt, fmt, query_id, _stream_summary(summary, body)))
        except BaseException:
            chunks.close()
            raise
        headers = self._ok_headers(req, stmt, fmt, query_id, _stream_summary(summary, b"".join(head)))
        self._send_streamed(lease, chunks, head, headers)
        return None

    def _send_streamed(
        self, lease: Lease, chunks: Generator[Any, None, None], head: list[bytes], headers: dict[str, str]
    ) -> None:
        tag = secrets.token_hex(8)
        self._start_reply(200, {**headers, "Transfer-Encoding": "chunked", "X-ClickHouse-Exception-Tag": tag})
        try:
            self._write_chunk(b"".join(head))
            for chunk in chunks:
                self._write_chunk(chunk.bytes() or b"")
        except HTTPError as err:
            lease.release()
            self._write_chunk(_exception_block(err, tag))
            self.wfile.flush()
            self.close_connection = True  # no final chunk: the reply is visibly incomplete
            return
        except BaseException:  # the client went away: stop the query, drop the connection
            chunks.close()
            lease.healthy = False
            self.close_connection = True
            raise
        lease.release()
        self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))


def _query(conn: EngineConnection, stmt: Statement, fmt: str, params: dict[str, str]) -> Any:
    """Run a statement whole; a SHOW CREATE of a system table chdb cannot answer is built."""
    try:
        return conn.run(stmt.sql, fmt, params)
    except HTTPError as err:
        table = system_table_in_show_create(stmt.sql) if err.code == UNKNOWN_TABLE else None
        exists = (
            table is not None
            and conn.run(
                "SELECT count() FROM system.tables WHERE database = 'system' AND name = {t:String}",
                "TabSeparated",
                {"t": table},
            )
            .bytes()
            .strip()
            == b"1"
        )
        if not exists:
            raise
        return conn.run(SHOW_CREATE_SYSTEM_TABLE, fmt, {"table": str(table)})


def _exception_block(err: HTTPError, tag: str) -> bytes:
    """ClickHouse's in-body exception (25.11+): the text between tagged markers."""
    text = err.body().rstrip(b"\n")
    return b"__exception__\r\n%b\r\n%b\n%d %b\r\n__exception__\r\n" % (tag.encode(), text, len(text), tag.encode())


def _query_summary(res: Any, body: bytes) -> dict[str, str]:
    return {
        "read_rows": str(res.rows_read()),
        "read_bytes": str(res.bytes_read()),
        "written_rows": str(res.rows_written()),
        "written_bytes": str(res.bytes_written()),
        "total_rows_to_read": str(res.rows_read()),
        "result_rows": "0",
        "result_bytes": str(len(body)),
    }


def _stream_summary(read: dict[str, int], body: bytes) -> dict[str, str]:
    return {
        "read_rows": str(read["read_rows"]),
        "read_bytes": str(read["read_bytes"]),
        "written_rows": "0",
        "written_bytes": "0",
        "total_rows_to_read": str(read["read_rows"]),
        "result_rows": "0",
        "result_bytes": str(len(body)),
    }


def _insert_summary(result: Any) -> dict[str, str]:
    rows = result.rows_written()
    written = result.bytes_written()
    return {
        "read_rows": str(rows),
        "read_bytes": str(written),
        "written_rows": str(rows),
        "written_bytes": str(written),
        "total_rows_to_read": "0",
        "result_rows": "0",
        "result_bytes": "0",
    }


def _content_type(fmt: str) -> str:
    f = fmt.lower()
    if f.startswith("json"):
        return "application/json; charset=UTF-8"
    if f in ("tabseparated", "tsv", "csv", "csvwithnames", "tabseparatedwithnames", "pretty", "values"):
        return "text/plain; charset=UTF-8" if not f.startswith("csv") else "text/csv; charset=UTF-8"
    return "application/octet-stream"
