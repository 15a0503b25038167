"""The server's native TCP port (``tcp_port``), as far as the embedded engine allows.

chdb speaks no native protocol, but a ClickHouse server always listens on its native
port (9000 by default), and clients rely on what that port answers:

- An HTTP request sent there gets ClickHouse's own reply (``TCPHandler::receiveHello``
  sees a packet type of ``'G'`` or ``'P'`` and writes
  ``formatHTTPErrorResponseWhenUserIsConnectedToWrongPort``): ``HTTP/1.0 400 Bad
  Request`` and ``Port <tcp_port> is for clickhouse-client program`` /
  ``You must use port <http_port> for HTTP.``. clickhouse-connect shows that text when
  it is pointed at the wrong port.
- A native client's Hello gets an Exception packet (``Protocol::Server::Exception``:
  code, name, message, stack trace, no nested exception) that says the native
  protocol is not served here, instead of a connection refused: clickhouse-client
  prints it as a server exception.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading

#: ``NOT_IMPLEMENTED``: what a ClickHouse answers for a feature it does not have.
NOT_IMPLEMENTED = 48
_EXCEPTION_PACKET = 2  # Protocol::Server::Exception


def wrong_port_reply(tcp_port: int, http_port: int) -> bytes:
    """ClickHouse's reply to an HTTP request on its native port."""
    return (
        "HTTP/1.0 400 Bad Request\r\n\r\n"
        f"Port {tcp_port} is for clickhouse-client program\r\n"
        f"You must use port {http_port} for HTTP.\r\n"
    ).encode()


def _varuint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(s: str) -> bytes:
    b = s.encode()
    return _varuint(len(b)) + b


def exception_packet(code: int, message: str) -> bytes:
    """A native-protocol Exception packet, as ``TCPHandler::sendException`` writes it."""
    return (
        _varuint(_EXCEPTION_PACKET)
        + struct.pack("<i", code)
        + _string("DB::Exception")
        + _string(f"DB::Exception: {message}")
        + _string("")
        + b"\x00"
    )


class _Handler(socketserver.BaseRequestHandler):
    http_port: int

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)
        try:
            first = sock.recv(1)
        except OSError:
            return
        tcp_port = int(self.server.server_address[1])  # type: ignore[index]
        if first in (b"G", b"P"):
            sock.sendall(wrong_port_reply(tcp_port, self.http_port))
        elif first:
            message = (
                f"The native protocol is not served on port {tcp_port}: this server (the embedded chdb "
                f"engine) speaks ClickHouse's HTTP interface only, on port {self.http_port}"
            )
            sock.sendall(exception_packet(NOT_IMPLEMENTED, message))


class NativePort(socketserver.ThreadingTCPServer):
    """Listens on the native port in daemon threads; :meth:`serve_forever` in a thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, http_port: int) -> None:
        handler = type("BoundNativeHandler", (_Handler,), {"http_port": http_port})
        super().__init__((host, port), handler)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        t.start()
        return t
