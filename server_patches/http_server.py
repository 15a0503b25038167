"""ClickHouse's HTTP interface served on top of the chdb engine: the server process.

The parts live in their own modules: :mod:`~server_patches.http_handler` (one
request), :mod:`~server_patches.http_params` (URL, form and multipart parameters),
:mod:`~server_patches.auth`, :mod:`~server_patches.compression` (request bodies),
:mod:`~server_patches.statements` (the SQL text), :mod:`~server_patches.engine`
(chdb connections and their pool), :mod:`~server_patches.sessions` (named sessions
and their timeouts) and :mod:`~server_patches.errors` (codes and statuses).

Run: ``python -m server_patches.http_server --data-dir DIR --config-file FILE --port N``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from http.server import ThreadingHTTPServer
from types import FrameType

from server_patches.chdb_connection import EngineConnection
from server_patches.engine import Engine
from server_patches.errors import HTTPError
from server_patches.http_handler import Handler
from server_patches.native_port import NativePort
from server_patches.sessions import Session

__all__ = ["Engine", "EngineConnection", "HTTPError", "Handler", "Server", "Session", "main", "make_server"]

log = logging.getLogger("server_patches.http_server")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def make_server(engine: Engine, host: str, port: int, users: dict[str, str]) -> Server:
    """A threaded server answering with ``Handler`` on ``engine``, for ``users`` (name -> password)."""
    handler = type("BoundHandler", (Handler,), {"engine": engine, "users": users})
    return Server((host, port), handler)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m server_patches.http_server", description="ClickHouse HTTP interface on the chdb engine"
    )
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--config-file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--tcp-port", type=int, help="the native port (tcp_port); see server_patches.native_port")
    ap.add_argument("--ready-file")
    ap.add_argument("--user", default="default")
    ap.add_argument("--password-env", help="name of the environment variable holding the password")
    ap.add_argument("--max-session-timeout", type=float, default=3600)
    ap.add_argument("--default-session-timeout", type=float, default=60)
    ap.add_argument("--log-file")
    ap.add_argument("--log-level", default="INFO")
    return ap


def _write_ready_file(path: str, port: int, tcp_port: int | None, version: str) -> None:
    """Announce the bound ports atomically: the launcher polls for this file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "port": port, "tcp_port": tcp_port, "version": version}, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; then close every session (rolling back its transaction)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        filename=args.log_file, level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    password = os.environ.get(args.password_env, "") if args.password_env else ""
    engine = Engine(
        args.data_dir,
        args.config_file,
        max_session_timeout=args.max_session_timeout,
        default_session_timeout=args.default_session_timeout,
    )
    server = make_server(engine, args.host, args.port, {args.user: password})
    port = server.server_address[1]
    native = NativePort(args.host, args.tcp_port, port) if args.tcp_port is not None else None
    if native:
        native.start()
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.ready_file:
        _write_ready_file(args.ready_file, port, native.server_address[1] if native else None, engine.version)
    log.info("serving ClickHouse %s HTTP on %s:%d (data %s)", engine.version, args.host, port, args.data_dir)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if native:
            native.shutdown()
            native.server_close()
        engine.shutdown()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
