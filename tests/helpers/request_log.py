"""A recording HTTP proxy in front of the stack's ClickHouse, and the server contract's check of what it saw.

:class:`RecordingProxy` forwards every request to the stack unchanged and keeps, per
request, its URL parameters and the statement's first words (from the ``query``
parameter, else the body's head): what a writer's driver and its Spark workers send,
seen from outside their processes. :func:`unpinned_inserts` names each recorded
INSERT that lacks a setting the server contract (:mod:`clickhouse_tx.client.contract`)
pins.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import BinaryIO

import requests

from clickhouse_tx.client.sql import is_insert

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer", "upgrade"}


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One request: its URL parameters and the first 200 characters of its statement."""

    params: dict[str, str]
    statement: str

    @property
    def is_insert(self) -> bool:
        return is_insert(self.statement)


class RecordingProxy:
    """``with RecordingProxy(upstream) as proxy:`` ``proxy.url`` forwards to ``upstream``; ``proxy.requests``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[Recorded] = []
        #: TCP connections clients opened to the proxy (each may carry many requests).
        self.connections = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query, keep_blank_values=True))
        head = params.get("query") or _body_head(body, headers)
        with self._lock:
            self.requests.append(Recorded(params, head[:200]))

    def inserts(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.is_insert]


def _body_head(body: bytes, headers: Mapping[str, str]) -> str:
    if headers.get("content-encoding", "").lower() == "gzip":
        body = gzip.decompress(body)
    return body[:400].decode("utf-8", "replace")


def _read_body(rfile: BinaryIO, headers: Message) -> bytes:
    if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
        return b"".join(_chunks(rfile))
    return rfile.read(int(headers.get("Content-Length") or 0))


def _chunks(rfile: BinaryIO) -> Iterator[bytes]:
    while True:
        size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            rfile.readline()  # the blank line after the last chunk
            return
        yield rfile.read(size)
        rfile.readline()


def _handler(proxy: RecordingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def setup(self) -> None:  # once per accepted connection
            super().setup()
            with proxy._lock:
                proxy.connections += 1

        def do_GET(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def _forward(self) -> None:
            body = _read_body(self.rfile, self.headers)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            proxy.record(self.path, body, {k.lower(): v for k, v in headers.items()})
            resp = requests.request(
                self.command, proxy.upstream + self.path, data=body, headers=headers, stream=True, timeout=600
            )
            content = resp.raw.read(decode_content=False)
            self.send_response(resp.status_code)
            for k, v in resp.headers.items():
                if k.lower() not in _HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

    return Handler


def unpinned_inserts(recorded: list[Recorded], *, has_deduplicate_insert: bool) -> list[str]:
    """Each INSERT of ``recorded`` that lacks a pinned setting, with what it lacks (empty: all pinned).

    Every INSERT: ``async_insert=0`` and a non-empty ``insert_deduplication_token``; and its
    deduplication stated: ``insert_deduplicate`` and, on a server that has it,
    ``deduplicate_insert`` (``enable`` with ``insert_deduplicate=1``, ``disable`` with 0).
    """
    out = []
    for r in recorded:
        if not r.is_insert:
            continue
        p, lacks = r.params, []
        if p.get("async_insert") != "0":
            lacks.append(f"async_insert={p.get('async_insert')!r}")
        if not p.get("insert_deduplication_token"):
            lacks.append("insert_deduplication_token")
        dedup = p.get("insert_deduplicate")
        if dedup not in ("0", "1"):
            lacks.append(f"insert_deduplicate={dedup!r}")
        elif has_deduplicate_insert and p.get("deduplicate_insert") != ("enable" if dedup == "1" else "disable"):
            lacks.append(f"deduplicate_insert={p.get('deduplicate_insert')!r} with insert_deduplicate={dedup}")
        if lacks:
            out.append(f"{r.statement[:80]!r} lacks {', '.join(lacks)}")
    return out
