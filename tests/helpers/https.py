"""HTTPS to the embedded server for the tests: generated certificates and a TLS front.

:func:`https_front` starts :class:`server_patches.tls_front.TlsFront` before a stack's
HTTP port with the certificates of :func:`tests.helpers.tls.make_tls_files` (the client
key unencrypted, as clickhouse-connect and the writer take it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Iterator

from server_patches.tls_front import TlsFront, TlsFrontConfig
from tests.helpers.tls import TlsFiles, make_tls_files


@dataclasses.dataclass(frozen=True)
class HttpsFront:
    """A running front: its ``https://`` URL and the PKI it was built with."""

    url: str
    files: TlsFiles


@contextlib.contextmanager
def https_front(http_url: str, directory: Path, *, require_client_cert: bool = False) -> Iterator[HttpsFront]:
    """``https://127.0.0.1:<port>`` relaying to ``http_url``, for the duration of the block."""
    files = make_tls_files(directory, client_key_password="")
    backend = urllib.parse.urlsplit(http_url)
    config = TlsFrontConfig(files.server_cert, files.server_key, files.ca if require_client_cert else None)
    with TlsFront(config, (backend.hostname or "127.0.0.1", backend.port or 80)) as front:
        port = front.start()
        yield HttpsFront(f"https://127.0.0.1:{port}", files)


@contextlib.contextmanager
def connect_proxy() -> Iterator[tuple[str, list[str]]]:
    """An HTTP ``CONNECT`` proxy on ``127.0.0.1`` (what ``HTTPS_PROXY`` names): its URL and
    the targets it tunnelled to, in order. It never sees inside the tunnel."""
    listener = socket.create_server(("127.0.0.1", 0))
    tunnels: list[str] = []

    def serve(client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := client.recv(4096)):
            head += chunk
        target = head.split(b" ", 2)[1].decode()
        tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=_copy, args=(upstream, client), daemon=True).start()
        _copy(client, upstream)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", tunnels
    finally:
        listener.close()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
