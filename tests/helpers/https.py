"""HTTPS to the embedded server for the tests: generated certificates and a TLS front.

:func:`https_front` starts :class:`server_patches.tls_front.TlsFront` before a stack's
HTTP port with the certificates of :func:`tests.helpers.tls.make_tls_files` (the client
key unencrypted, as clickhouse-connect and the writer take it).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
