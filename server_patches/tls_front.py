"""A TLS front for the embedded server's HTTP interface: ``https://`` as a ClickHouse server serves it.

The embedded server (:mod:`server_patches.http_server`) listens in the clear, as a
ClickHouse server does on 8123; production servers and ClickHouse Cloud are reached
over HTTPS (8443). This front listens for TLS clients with a server certificate the
caller gives, optionally requires a client certificate signed by a given CA (what
ClickHouse's ``<verificationMode>strict</verificationMode>`` does), terminates TLS and
relays the bytes both ways to the server's HTTP port, one backend connection per
client connection. It reads nothing of the HTTP it relays, so sessions, chunked
bodies and keep-alive behave as they do in the clear.

Runs wherever it is started (the tests start it beside their stack), in daemon
threads. Stdlib only: ``ssl``, ``socket``, ``select``.
"""

from __future__ import annotations

import dataclasses
import logging
import select
import socket
import ssl
import threading
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["TlsFrontConfig", "TlsFront"]

#: Bytes read from one side before they are written to the other.
_CHUNK = 256 * 1024
#: Seconds a client has to complete its handshake, and the front to reach the backend.
_HANDSHAKE_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class TlsFrontConfig:
    """What the front presents and requires (PEM paths).

    Attributes
    ----------
    cert_file, key_file
        The server certificate (with any intermediates) and its unencrypted key.
    client_ca_file
        When set, a client must present a certificate signed by this CA; the
        handshake fails otherwise. None: no client certificate is asked for.
    """

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The server side's context: TLS 1.2 or later, the certificate, the client check."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.load_verify_locations(cafile=self.client_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


class TlsFront:
    """The listener: accepts TLS clients and pipes each to its own connection to ``backend``.

    Parameters
    ----------
    config
        The certificates (:class:`TlsFrontConfig`).
    backend
        ``(host, port)`` of the embedded server's HTTP interface.

    :meth:`start` binds and accepts in a daemon thread, once; each client connection is
    served by a thread of its own (blocking sockets: a refused handshake sends its TLS
    alert, as a ClickHouse server's does, where an event loop would drop it unsent).
    :meth:`close` stops accepting and ends the open relays.
    """

    def __init__(self, config: TlsFrontConfig, backend: tuple[str, int]) -> None:
        self.config = config
        self.backend = backend
        self._ssl = config.ssl_context()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.port = 0

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0: any free port); returns the bound port."""
        self._listener = socket.create_server((host, port))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, args=(self._listener,), name="tls-front", daemon=True).start()
        return self.port

    def close(self) -> None:
        """Stop listening and end the open relays."""
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for s in list(self._open):
                _shut(s)

    def __enter__(self) -> TlsFront:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(raw,), name="tls-front-conn", daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(_HANDSHAKE_TIMEOUT_S)
        tls = self._ssl.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError) as e:
            log.info("tls front: handshake refused (%s)", getattr(e, "reason", None) or type(e).__name__)
            _linger(tls)
            return
        tls.settimeout(None)
        try:
            backend = socket.create_connection(self.backend, timeout=_HANDSHAKE_TIMEOUT_S)
        except OSError as e:
            # The client sees its connection closed, as a server that is down would do it.
            log.warning("tls front: backend %s:%d unreachable (%s)", *self.backend, type(e).__name__)
            tls.close()
            return
        backend.settimeout(None)
        with self._lock:
            self._open.update((tls, backend))
        try:
            _relay(tls, backend)
        finally:
            with self._lock:
                self._open.difference_update((tls, backend))
            tls.close()
            backend.close()


def _relay(tls: ssl.SSLSocket, backend: socket.socket) -> None:
    """Copy bytes both ways until either side ends or fails.

    One thread per connection; ``tls.pending()`` covers bytes OpenSSL has already
    decrypted, which ``select`` cannot see.
    """
    peers = {tls: backend, backend: tls}
    while True:
        ready = [tls] if tls.pending() else select.select(list(peers), [], [])[0]
        for src in ready:
            try:
                data = src.recv(_CHUNK)
                if not data:
                    return
                peers[src].sendall(data)
            except (OSError, ValueError):
                return


def _linger(sock: socket.socket) -> None:
    """Close a refused connection without a reset: the client reads the TLS alert, not ECONNRESET.

    A client in TLS 1.3 sends its request before it learns that its certificate was
    refused; closing with that request unread would reset the connection and lose the alert.
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(1.0)
        while sock.recv(_CHUNK):
            pass
    except OSError:
        pass
    finally:
        sock.close()


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
