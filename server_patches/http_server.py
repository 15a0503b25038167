"""ClickHouse's HTTP interface served on top of the chdb engine.

Each ``session_id`` owns its own chdb connection, which is its own ClickHouse session
with its own transaction, so ``BEGIN TRANSACTION`` / ``COMMIT`` / ``ROLLBACK`` behave as
on a server. Closing a connection that holds an open transaction rolls it back, which
is how session expiry ends a transaction. Requests without a session borrow a pooled
connection. URL settings apply to one query, as in ClickHouse: they are applied with
``SET`` on the connection and restored afterwards (never pasted into the SQL text,
which breaks ``INSERT ... VALUES`` and ``BEGIN TRANSACTION``).

Run: ``python -m server_patches.http_server --data-dir DIR --config-file FILE --port N``.
"""

from __future__ import annotations

import argparse
import base64
import collections
import hmac
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl, urlsplit

import chdb

log = logging.getLogger("server_patches.http_server")

# URL parameters the HTTP layer consumes itself; everything else is a setting.
HTTP_PARAMS = frozenset({
    "query", "session_id", "session_timeout", "session_check", "query_id", "database",
    "default_format", "user", "password", "quota_key", "compress", "decompress",
    "buffer_size", "wait_end_of_query", "client_protocol_version", "stacktrace", "role",
    "enable_http_compression", "http_zlib_compression_level", "add_http_cors_header",
    "http_response_buffer_size", "max_query_size_http",
})

# ClickHouse error codes used by the HTTP layer itself.
UNKNOWN_SETTING = 115
SESSION_NOT_FOUND = 372
SESSION_IS_LOCKED = 373
INVALID_SESSION_TIMEOUT = 374
AUTHENTICATION_FAILED = 516
CANNOT_DECOMPRESS = 271
UNKNOWN_FORMAT = 73
BAD_ARGUMENTS = 36
SYNTAX_ERROR = 62
UNKNOWN_TABLE = 60
UNKNOWN_DATABASE = 81
UNKNOWN_IDENTIFIER = 47
HTTP_LENGTH_REQUIRED = 381
NOT_IMPLEMENTED = 48
CANNOT_PARSE_INPUT_ASSERTION_FAILED = 27
TIMEOUT_EXCEEDED = 159

_ERROR_NAMES = {
    UNKNOWN_SETTING: "UNKNOWN_SETTING", SESSION_NOT_FOUND: "SESSION_NOT_FOUND",
    SESSION_IS_LOCKED: "SESSION_IS_LOCKED", INVALID_SESSION_TIMEOUT: "INVALID_SESSION_TIMEOUT",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED", CANNOT_DECOMPRESS: "CANNOT_DECOMPRESS",
    BAD_ARGUMENTS: "BAD_ARGUMENTS", HTTP_LENGTH_REQUIRED: "HTTP_LENGTH_REQUIRED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED", TIMEOUT_EXCEEDED: "TIMEOUT_EXCEEDED",
}

# ClickHouse's exceptionCodeToHTTPStatus, by error name; codes are resolved from the
# engine itself at start-up (errorCodeToName) so no number is typed twice.
_STATUS_BY_NAME: dict[str, int] = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE",
                     "ACCESS_DENIED"), 403),
    **dict.fromkeys((
        "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
        "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
        "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
        "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
        "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST",
        "TOO_BIG_AST", "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
        "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE"), 400),
    **dict.fromkeys((
        "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
        "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
        "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"), 404),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503, "CANNOT_OPEN_FILE": 503, "CANNOT_SCHEDULE_TASK": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}
_HTTP_STATUS: dict[int, int] = {}  # filled by Engine from the engine's own error table

_CODE_RE = re.compile(r"Code:\s*(\d+)\.")
_FORMAT_TAIL = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*;?\s*$", re.I)
_INSERT_HEAD = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*INSERT\b", re.I | re.S)
_FIRST_WORD = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*([A-Za-z]+)", re.S)
# The body of `INSERT ... FORMAT Name` ends at one newline after the format name.
_INSERT_FORMAT = re.compile(rb"^(.*?\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*))[ \t]*(\r?\n)?", re.I | re.S)
_MAX_INSERT_HEAD = 1 << 20


class HTTPError(Exception):
    """An error answered with ClickHouse's code, name and text."""

    def __init__(self, code: int, message: str, name: str | None = None) -> None:
        self.code = code
        self.name = name or _ERROR_NAMES.get(code, "")
        self.text = message
        super().__init__(message)

    def body(self) -> bytes:
        suffix = f" ({self.name})" if self.name and f"({self.name})" not in self.text else ""
        text = self.text if self.text.startswith("Code:") else f"Code: {self.code}. DB::Exception: {self.text}{suffix}"
        return (text.rstrip() + "\n").encode()

    @classmethod
    def from_engine(cls, exc: BaseException) -> "HTTPError":
        text = str(exc).removeprefix("Streaming insert finish failed: ")
        m = _CODE_RE.search(text)
        return cls(int(m.group(1)) if m else 1001, _tidy_engine_text(text))


_NESTED_PREFIX = re.compile(r"^(?:Code:\s*\d+\.\s*DB::Exception:\s*)+")
_NESTED_SUFFIX = re.compile(r"(?:\.?\s*\(([A-Z][A-Z0-9_]*)\)(?:\s*\(version ([^)]*)\))?)+\s*$")


def _tidy_engine_text(text: str) -> str:
    """chdb wraps an error once per layer (``Code: 73. DB::Exception: Code: 73. ...``);
    answer with the one line a server would send."""
    m = _CODE_RE.match(text.strip())
    if not m:
        return text
    body = _NESTED_PREFIX.sub("", text.strip())
    tail = _NESTED_SUFFIX.search(body)
    name = version = None
    if tail:
        names = re.findall(r"\(([A-Z][A-Z0-9_]*)\)", tail.group(0))
        versions = re.findall(r"\(version ([^)]*)\)", tail.group(0))
        name = names[-1] if names else None
        version = versions[0] if versions else None
        body = body[: tail.start()].rstrip()
        if not body.endswith("."):
            body += "."
    out = f"Code: {m.group(1)}. DB::Exception: {body}"
    if name:
        out += f" ({name})"
    if version:
        out += f" (version {version})"
    return out


def _undecodable_error() -> "HTTPError":
    # The engine's message quoted binary input that is not UTF-8, so its text is lost.
    return HTTPError(117, "Cannot parse input: the data is not valid for the format "
                          "(the engine's message quoted bytes that are not UTF-8)", "INCORRECT_DATA")


def first_keyword(sql: str) -> str:
    m = _FIRST_WORD.match(sql)
    return m.group(1).upper() if m else ""


# --------------------------------------------------------------------------- engine


class EngineConnection:
    """One chdb connection (one ClickHouse session) and the URL settings applied to it.

    Pooled (session-less) connections are configured once, at creation, with the
    database and settings of their pool key and are never reset: ``implicit_transaction=1``
    cannot be undone on a connection (every later statement, even ``SET``, then starts a
    transaction that ``SET``/``USE`` do not support), so it is applied last, for good.
    Session connections apply URL settings per query and restore them afterwards.
    """

    def __init__(self, dsn: str) -> None:
        self.conn = chdb.connect(dsn)
        self.applied: dict[str, str] = {}
        # Values the session's own SET statements gave; restored instead of DEFAULT.
        self.session_values: dict[str, str] = {}
        self.database = "default"
        self.dirty = False  # a user's SET/USE changed a pooled connection: do not reuse it

    def run(self, sql: str, fmt: str = "TabSeparated", params: dict[str, str] | None = None):
        try:
            return self.conn._conn.query(sql, fmt, params=params or {})
        except UnicodeDecodeError:
            raise _undecodable_error() from None
        except Exception as exc:  # chdb raises RuntimeError subclasses with ClickHouse text
            raise HTTPError.from_engine(exc) from None

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

    def apply(self, settings: dict[str, str], database: str | None) -> None:
        """Session connection: make exactly ``settings`` current for the next query."""
        self.use(database)
        for name in list(self.applied):
            if name not in settings:
                self._set(name, self.session_values.get(name))
                del self.applied[name]
        for name, value in settings.items():
            if self.applied.get(name) != value:
                self._set(name, value)
                self.applied[name] = value

    def remember_user_statement(self, sql: str) -> None:
        """After the user's own ``SET``/``USE``, keep what it changed as the session's."""
        word = first_keyword(sql)
        if word == "USE":
            rows = self.run("SELECT currentDatabase()").bytes().decode().strip()
            self.database = rows or "default"
        elif word == "SET":
            for name, literal in _set_assignments(sql):
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


def _set_assignments(sql: str) -> list[tuple[str, str]]:
    """``SET a = 1, b = 'x,y'`` -> [(a, "1"), (b, "x,y")] (values unquoted)."""
    body = re.sub(r"^\s*SET\s+", "", sql.strip().rstrip(";"), flags=re.I)
    parts, cur, quote = [], "", None
    for ch in body:
        if quote:
            cur += ch
            if ch == quote and not cur.endswith("\\" + quote):
                quote = None
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch == ",":
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        name, eq, value = part.partition("=")
        if eq:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
            out.append((name.strip(), value))
    return out


def quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Session:
    def __init__(self, sid: str, conn: EngineConnection, timeout: float) -> None:
        self.sid = sid
        self.conn = conn
        self.timeout = timeout
        self.lock = threading.Lock()
        self.last_used = time.monotonic()
        self.closed = False


class Engine:
    """Connections to one chdb data path: a pool for session-less requests, one per session."""

    def __init__(self, data_dir: str, config_file: str | None, *, max_session_timeout: float = 3600,
                 default_session_timeout: float = 60) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.dsn = f"file:{data_dir}" + (f"?config-file={config_file}" if config_file else "")
        self.max_session_timeout = max_session_timeout
        self.default_session_timeout = default_session_timeout
        self._pool: "collections.OrderedDict[tuple[Any, ...], list[EngineConnection]]" = collections.OrderedDict()
        self._pool_lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._sessions_lock = threading.Lock()
        self._stop = threading.Event()
        first = EngineConnection(self.dsn)
        if not _HTTP_STATUS:
            codes = first.run("SELECT number, errorCodeToName(number) FROM numbers(2000) "
                              "WHERE errorCodeToName(number) != ''", "TabSeparated").bytes().decode()
            for line in codes.splitlines():
                code, name = line.split("\t")
                _ERROR_NAMES.setdefault(int(code), name)
                if name in _STATUS_BY_NAME:
                    _HTTP_STATUS[int(code)] = _STATUS_BY_NAME[name]
        self.timezone = first.run("SELECT timezone()").bytes().decode().strip()
        self.version = first.run("SELECT version()").bytes().decode().strip()
        self._pool[("default", ())] = [first]
        self._reaper = threading.Thread(target=self._reap, name="session-reaper", daemon=True)
        self._reaper.start()

    # pooled connections, keyed by (database, settings): each configured once
    def borrow(self, settings: dict[str, str], database: str | None) -> tuple[EngineConnection, tuple[Any, ...]]:
        key = (database or "default", tuple(sorted(settings.items())))
        with self._pool_lock:
            idle = self._pool.get(key)
            if idle:
                self._pool.move_to_end(key)
                return idle.pop(), key
        conn = EngineConnection(self.dsn)
        try:
            conn.configure(settings, database)
        except BaseException:
            conn.close()
            raise
        return conn, key

    def give_back(self, conn: EngineConnection, key: tuple[Any, ...], healthy: bool = True) -> None:
        if not healthy or conn.dirty or self._stop.is_set():
            conn.close()
            return
        evicted: list[EngineConnection] = []
        with self._pool_lock:
            idle = self._pool.setdefault(key, [])
            self._pool.move_to_end(key)
            if len(idle) < 8:
                idle.append(conn)
            else:
                evicted.append(conn)
            while sum(len(v) for v in self._pool.values()) > 64:
                _, oldest = self._pool.popitem(last=False)
                evicted.extend(oldest)
        for c in evicted:
            c.close()

    # sessions
    def session(self, sid: str, timeout: float, check: bool) -> Session:
        if timeout > self.max_session_timeout:
            raise HTTPError(INVALID_SESSION_TIMEOUT,
                            f"Session timeout {timeout:g} exceeds max_session_timeout {self.max_session_timeout:g}")
        with self._sessions_lock:
            s = self._sessions.get(sid)
            if s is not None and not s.closed:
                # As ClickHouse's NamedSessionsStorage: the timeout is fixed when the
                # session is created; a later request's session_timeout is checked
                # against max_session_timeout but does not change it. Each request
                # restarts the idle timer (last_used).
                return s
            if check:
                raise HTTPError(SESSION_NOT_FOUND, f"Session {sid} not found")
            s = Session(sid, EngineConnection(self.dsn), timeout)
            self._sessions[sid] = s
            return s

    def close_session(self, s: Session) -> None:
        with self._sessions_lock:
            if self._sessions.get(s.sid) is s:
                del self._sessions[s.sid]
            s.closed = True
        s.conn.close()  # rolls back an open transaction

    def _reap(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._sessions_lock:
                expired = [s for s in self._sessions.values()
                           if not s.lock.locked() and now - s.last_used > s.timeout]
            for s in expired:
                # Take the lock so a request that just arrived cannot use a closing session.
                if s.lock.acquire(blocking=False):
                    try:
                        if time.monotonic() - s.last_used > s.timeout:
                            log.info("session %s expired after %.0fs idle", s.sid, s.timeout)
                            self.close_session(s)
                    finally:
                        s.lock.release()

    def shutdown(self) -> None:
        self._stop.set()
        with self._sessions_lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            self.close_session(s)
        with self._pool_lock:
            pool, self._pool = self._pool, collections.OrderedDict()
        for idle in pool.values():
            for c in idle:
                c.close()


# --------------------------------------------------------------------------- bodies


def _raw_body(rfile, headers) -> Iterator[bytes]:
    """The request body as it arrives: Content-Length or chunked, never whole in memory."""
    te = (headers.get("Transfer-Encoding") or "").lower()
    if "chunked" in te:
        while True:
            line = rfile.readline(65537)
            if not line:
                raise HTTPError(BAD_ARGUMENTS, "Unexpected end of chunked body")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HTTPError(BAD_ARGUMENTS, "Malformed chunked encoding") from None
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return
            remaining = size
            while remaining:
                part = rfile.read(min(remaining, 1 << 20))
                if not part:
                    raise HTTPError(BAD_ARGUMENTS, "Unexpected end of chunked body")
                remaining -= len(part)
                yield part
            rfile.readline(3)
        return
    length = int(headers.get("Content-Length") or 0)
    while length > 0:
        part = rfile.read(min(length, 1 << 20))
        if not part:
            raise HTTPError(BAD_ARGUMENTS, "Unexpected end of request body")
        length -= len(part)
        yield part


def _decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip"):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return d.decompress
    if enc == "deflate":
        d = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip header
        return d.decompress
    if enc == "zstd":
        import zstandard

        zd = zstandard.ZstdDecompressor().decompressobj()
        return zd.decompress
    if enc == "lz4":
        import lz4.frame

        d = lz4.frame.LZ4FrameDecompressor()
        return d.decompress
    if enc in ("br",):
        raise HTTPError(NOT_IMPLEMENTED, f"Content-Encoding {encoding} is not supported here; use gzip, deflate, zstd or lz4")
    raise HTTPError(BAD_ARGUMENTS, f"Unknown Content-Encoding: {encoding}")


UNKNOWN_COMPRESSION_METHOD = 89
TOO_LARGE_SIZE_COMPRESSED = 39
_BLOCK_HEADER = 16 + 9  # CityHash128 checksum, method byte, compressed and raw sizes
_MAX_BLOCK = 1 << 30


def native_blocks(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Decode ClickHouse's own compression framing (``decompress=1``) block by block.

    The CityHash128 checksum is not verified (no CityHash in the standard library);
    a wrong method byte or inconsistent sizes are refused with the server's codes.
    """
    import struct

    buf = bytearray()
    src = iter(chunks)

    def need(n: int) -> bool:
        while len(buf) < n:
            part = next(src, None)
            if part is None:
                return False
            buf.extend(part)
        return True

    while need(1):
        if not need(_BLOCK_HEADER):
            raise HTTPError(CANNOT_DECOMPRESS, "Cannot decompress: truncated compressed block header")
        method = buf[16]
        compressed, raw = struct.unpack_from("<II", buf, 17)
        if method not in (0x02, 0x82, 0x90):
            raise HTTPError(UNKNOWN_COMPRESSION_METHOD,
                            f"Unknown compression method 0x{method:02x} in a decompress=1 body",
                            "UNKNOWN_COMPRESSION_METHOD")
        if compressed < 9 or compressed > _MAX_BLOCK or raw > _MAX_BLOCK:
            raise HTTPError(TOO_LARGE_SIZE_COMPRESSED,
                            f"Compressed block size {compressed} (raw {raw}) is out of bounds",
                            "TOO_LARGE_SIZE_COMPRESSED")
        if not need(16 + compressed):
            raise HTTPError(CANNOT_DECOMPRESS, "Cannot decompress: truncated compressed block")
        payload = bytes(buf[16 + 9:16 + compressed])
        del buf[:16 + compressed]
        try:
            if method == 0x02:
                out = payload
            elif method == 0x82:
                import lz4.block

                out = lz4.block.decompress(payload, uncompressed_size=raw)
            else:
                import zstandard

                out = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw)
        except Exception as exc:
            raise HTTPError(CANNOT_DECOMPRESS, f"Cannot decompress block: {exc}") from None
        if len(out) != raw:
            raise HTTPError(CANNOT_DECOMPRESS, f"Decompressed size {len(out)} != declared {raw}")
        yield out


def decoded_body(rfile, headers, native: bool = False) -> Iterator[bytes]:
    body = _http_decoded(rfile, headers)
    return native_blocks(body) if native else body


def _http_decoded(rfile, headers) -> Iterator[bytes]:
    dec = _decoder(headers.get("Content-Encoding") or "")
    for chunk in _raw_body(rfile, headers):
        if dec is None:
            yield chunk
            continue
        try:
            out = dec(chunk)
        except Exception as exc:
            raise HTTPError(CANNOT_DECOMPRESS, f"Cannot decompress request body ({headers.get('Content-Encoding')}): {exc}") from None
        if out:
            yield out


# --------------------------------------------------------------------------- handler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ClickHouse"
    # Headers and body go out in two writes; with Nagle on, a keep-alive client's
    # delayed ACK stalls every reply by ~40 ms (measured: SELECT 1 took 44 ms).
    disable_nagle_algorithm = True
    engine: Engine
    users: dict[str, str]

    def log_message(self, fmt: str, *args) -> None:  # quiet by default
        log.debug("%s " + fmt, self.client_address[0], *args)

    def do_GET(self) -> None:
        self._handle(readonly=True)

    def do_POST(self) -> None:
        self._handle(readonly=False)

    def do_OPTIONS(self) -> None:
        self._reply(204, b"", {})

    # ------------------------------------------------------------------ plumbing

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-ClickHouse-Server-Display-Name", "clickhouse-tx-local")
        self.send_header("X-ClickHouse-Timezone", self.engine.timezone)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, err: HTTPError, query_id: str, drain: Iterator[bytes] | None) -> None:
        if drain is not None:
            # Read what is left of the body so the keep-alive connection stays usable.
            try:
                for _ in drain:
                    pass
            except Exception:
                self.close_connection = True
        status = _HTTP_STATUS.get(err.code, 500)
        self._reply(status, err.body(), {
            "Content-Type": "text/plain; charset=UTF-8",
            "X-ClickHouse-Exception-Code": str(err.code),
            "X-ClickHouse-Query-Id": query_id,
        })

    def _authenticate(self, params: dict[str, str]) -> str:
        user = password = None
        auth = self.headers.get("Authorization")
        if auth and auth.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            except Exception:
                raise HTTPError(AUTHENTICATION_FAILED, "Malformed Authorization header") from None
        if self.headers.get("X-ClickHouse-User"):
            user = self.headers["X-ClickHouse-User"]
            password = self.headers.get("X-ClickHouse-Key", "")
        if "user" in params:
            user, password = params["user"], params.get("password", "")
        user = user or "default"
        password = password or ""
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise HTTPError(AUTHENTICATION_FAILED,
                            f"{user}: Authentication failed: password is incorrect, or there is no user with such name")
        return user

    # ------------------------------------------------------------------ request

    def _handle(self, readonly: bool) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        body: Iterator[bytes] | None = None
        if url.path in ("/ping", "/replicas_status"):
            self._reply(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        if url.path not in ("/", ""):
            self._error(HTTPError(BAD_ARGUMENTS, f"There is no handle {url.path}"), query_id, None)
            return
        try:
            has_body = bool(self.headers.get("Content-Length") not in (None, "0")
                            or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower())
            native = params.get("decompress") in ("1", "true")
            body = decoded_body(self.rfile, self.headers, native) if has_body else None
            self._authenticate(params)
            if "query" not in params and body is None:
                self._reply(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
                return
            self._execute(params, body, query_id, readonly)
        except HTTPError as err:
            self._error(err, query_id, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug here must not take the server down
            log.exception("internal error")
            self._error(HTTPError(1001, f"Internal error: {type(exc).__name__}: {exc}"), query_id, body)

    def _execute(self, params: dict[str, str], body: Iterator[bytes] | None, query_id: str,
                 readonly: bool) -> None:
        settings: dict[str, str] = {}
        query_params: dict[str, str] = {}
        for k, v in params.items():
            if k.startswith("param_"):
                query_params[k[6:]] = v
            elif k not in HTTP_PARAMS:
                settings[k] = v
        sql = params.get("query", "")
        data: Iterator[bytes] | None = None
        insert_format: str | None = None

        if body is not None:
            if sql and _INSERT_HEAD.match(sql):
                m = _FORMAT_TAIL.search(sql)
                if m:
                    insert_format = m.group(1)
                    sql = sql[: m.start()].rstrip()
                    data = body
                else:
                    sql = sql + " " + b"".join(body).decode()
            elif sql:
                sql = sql + "\n" + b"".join(body).decode()
            else:
                sql, insert_format, data = self._split_insert_body(body)

        if readonly and self.command == "GET" and first_keyword(sql) not in ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", ""):
            raise HTTPError(164, "Cannot execute query in readonly mode: use POST for queries that write", "READONLY")

        sid = params.get("session_id")
        session: Session | None = None
        if sid:
            try:
                timeout = float(params.get("session_timeout") or self.engine.default_session_timeout)
            except ValueError:
                raise HTTPError(INVALID_SESSION_TIMEOUT, f"Invalid session timeout: {params.get('session_timeout')!r}") from None
            session = self.engine.session(sid, timeout, params.get("session_check") in ("1", "true"))
            if not session.lock.acquire(blocking=False):
                raise HTTPError(SESSION_IS_LOCKED, f"Session {sid} is locked by a concurrent client")
            if session.closed:
                session.lock.release()
                raise HTTPError(SESSION_NOT_FOUND, f"Session {sid} not found")
            conn = session.conn
            if settings.get("implicit_transaction") not in (None, "0", "false"):
                # The query runs in a transaction of its own, never the session's, and
                # implicit_transaction cannot be set and undone on one connection: serve
                # it on a pooled connection carrying the session's database and SETs.
                merged = {**session.conn.session_values, **settings}
                database = params.get("database") or session.conn.database
                session.last_used = time.monotonic()
                session.lock.release()
                session = None
                conn, pool_key = self.engine.borrow(merged, database)
        else:
            if first_keyword(sql) in ("BEGIN", "START", "COMMIT", "ROLLBACK"):
                raise HTTPError(NOT_IMPLEMENTED,
                                "Transactions need a session: pass session_id (each session is one transaction context)")
            conn, pool_key = self.engine.borrow(settings, params.get("database"))

        healthy = True
        try:
            if session is not None:
                conn.apply(settings, params.get("database"))
            started = time.monotonic()
            if insert_format is not None:
                result_body, summary = self._stream_insert(conn, sql, insert_format, data)
                fmt = insert_format
            else:
                m = _FORMAT_TAIL.search(sql)
                fmt = m.group(1) if m else params.get("default_format") or "TabSeparated"
                res = conn.run(sql, fmt, query_params)
                result_body = res.bytes() or b""
                summary = {
                    "read_rows": str(res.rows_read()), "read_bytes": str(res.bytes_read()),
                    "written_rows": str(res.rows_written()), "written_bytes": str(res.bytes_written()),
                    "total_rows_to_read": str(res.rows_read()), "result_rows": "0",
                    "result_bytes": str(len(result_body)),
                }
            summary["elapsed_ns"] = str(int((time.monotonic() - started) * 1e9))
            if first_keyword(sql) in ("SET", "USE"):
                conn.remember_user_statement(sql)
        except HTTPError:
            raise
        except Exception:
            healthy = False
            raise
        finally:
            if session is not None:
                session.last_used = time.monotonic()
                session.lock.release()
            else:
                self.engine.give_back(conn, pool_key, healthy)
        # Only after the session is free: a client that sends its next query as soon as
        # it reads this reply must not find the session still locked (373).
        self._reply(200, result_body, {
            "Content-Type": _content_type(fmt),
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Format": fmt,
            "X-ClickHouse-Summary": json.dumps(summary, separators=(",", ":")),
            **({"X-ClickHouse-Session-Id": sid} if sid else {}),
        })

    @staticmethod
    def _split_insert_body(body: Iterator[bytes]) -> tuple[str, str | None, Iterator[bytes] | None]:
        """Split ``INSERT ... FORMAT X\\n<data>`` sent whole in the body (clickhouse-connect ``insert``)."""
        head = b""
        for chunk in body:
            head += chunk
            if not re.match(rb"\s*(?:--[^\n]*\n\s*)*INSERT\b", head[:64], re.I) and len(head) >= 64:
                return (head + b"".join(body)).decode(), None, None
            m = _INSERT_FORMAT.match(head)
            if m and (m.group(3) or len(head) > m.end(1)):
                rest = head[m.end():]
                sql = m.group(1)[: -len(m.group(2))].decode().rstrip()
                sql = re.sub(r"\s*FORMAT\s*$", "", sql, flags=re.I)

                def data(rest: bytes = rest) -> Iterator[bytes]:
                    if rest:
                        yield rest
                    yield from body

                return sql, m.group(2).decode(), data()
            if len(head) > _MAX_INSERT_HEAD:
                break
        text = head.decode(errors="replace")
        if _INSERT_HEAD.match(text) and (tail := _FORMAT_TAIL.search(text)):
            return text[: tail.start()].rstrip(), tail.group(1), iter(())
        return text, None, None

    @staticmethod
    def _stream_insert(conn: EngineConnection, sql: str, fmt: str,
                       data: Iterator[bytes] | None) -> tuple[bytes, dict[str, str]]:
        try:
            inserter = conn.conn.send_insert(sql, fmt)
        except Exception as exc:
            raise HTTPError.from_engine(exc) from None
        try:
            for chunk in data or ():
                inserter.append(chunk)
            result = inserter.finish()
        except HTTPError:
            inserter.cancel()
            raise
        except UnicodeDecodeError:
            inserter.cancel()
            raise _undecodable_error() from None
        except Exception as exc:
            try:
                inserter.cancel()
            except Exception:
                pass
            raise HTTPError.from_engine(exc) from None
        rows = getattr(result, "rows_written", 0)
        written = getattr(result, "bytes_written", 0)
        return b"", {"read_rows": str(rows), "read_bytes": str(written), "written_rows": str(rows),
                     "written_bytes": str(written), "total_rows_to_read": "0", "result_rows": "0",
                     "result_bytes": "0"}


def _content_type(fmt: str) -> str:
    f = fmt.lower()
    if f.startswith("json"):
        return "application/json; charset=UTF-8"
    if f in ("tabseparated", "tsv", "csv", "csvwithnames", "tabseparatedwithnames", "pretty", "values"):
        return "text/plain; charset=UTF-8" if not f.startswith("csv") else "text/csv; charset=UTF-8"
    return "application/octet-stream"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def make_server(engine: Engine, host: str, port: int, users: dict[str, str]) -> Server:
    handler = type("BoundHandler", (Handler,), {"engine": engine, "users": users})
    return Server((host, port), handler)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m server_patches.http_server",
                                 description="ClickHouse HTTP interface on the chdb engine")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--config-file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ready-file")
    ap.add_argument("--user", default="default")
    ap.add_argument("--password-env", help="name of the environment variable holding the password")
    ap.add_argument("--max-session-timeout", type=float, default=3600)
    ap.add_argument("--default-session-timeout", type=float, default=60)
    ap.add_argument("--log-file")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)

    logging.basicConfig(filename=args.log_file, level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    password = os.environ.get(args.password_env, "") if args.password_env else ""
    engine = Engine(args.data_dir, args.config_file, max_session_timeout=args.max_session_timeout,
                    default_session_timeout=args.default_session_timeout)
    server = make_server(engine, args.host, args.port, {args.user: password})
    port = server.server_address[1]

    stopping = threading.Event()

    def stop(signum, frame) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "port": port, "version": engine.version}, f)
        os.replace(tmp, args.ready_file)
    log.info("serving ClickHouse %s HTTP on %s:%d (data %s)", engine.version, args.host, port, args.data_dir)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        engine.shutdown()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
