"""HTTPS to ClickHouse: the ``ssl.SSLContext`` of a :class:`~clickhouse_tx.interfaces.TlsSettings`.

The settings mean what clickhouse-connect's ``verify``, ``ca_cert``, ``client_cert`` and
``client_cert_key`` mean (``clickhouse_connect.driver.httputil.get_pool_manager_options``):
without ``ca_cert`` the operating system's trust store is used, ``ca_cert="certifi"`` is
the ``certifi`` bundle, a path is the only CAs trusted, and ``verify=False`` accepts any
certificate. The one HTTP client (:mod:`clickhouse_tx.client.http`) mounts
:func:`https_adapter` for ``https://`` URLs, so every request of the project, on the
driver and on executors, goes with the same context.

:func:`check_tls` runs on the driver (the writer's set-up, the CLI) before anything is
written: a file that is missing or not a certificate is refused naming its option. A
server whose certificate is not trusted is refused by the first request, with an error
naming ``ca_cert`` and ``verify`` (:mod:`clickhouse_tx.client._transport.reply_mapping`).
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
import urllib.parse
import warnings
from typing import Any

import requests.adapters
import urllib3.exceptions

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import Target, TlsSettings

log = logging.getLogger(__name__)

__all__ = ["ssl_context", "https_adapter", "check_tls", "CERTIFI"]

#: The ``ca_cert`` value naming the ``certifi`` package's bundle (as clickhouse-connect reads it).
CERTIFI = "certifi"


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """The client context of ``tls``: trusted CAs, host name check, client certificate.

    Built once per distinct settings and file versions in a process (driver or executor
    Python worker) and shared by its clients: a certificate renewed in place (a new
    modification time) is read by the next client, an unchanged one is not read again.

    Raises
    ------
    ConfigurationError
        A file that cannot be read or is not PEM of the expected kind, naming its option.
    """
    files = (tls.ca_cert, tls.client_cert, tls.client_cert_key)
    return _context(tls.verify, *files, versions=tuple(_mtime(f) for f in files))


def _mtime(path: str | None) -> int | None:
    try:
        return os.stat(path).st_mtime_ns if path and path != CERTIFI else None
    except OSError:
        return None  # reported by _readable, naming the option


@functools.lru_cache(maxsize=16)
def _context(
    verify: bool,
    ca_cert: str | None,
    client_cert: str | None,
    client_key: str | None,
    *,
    versions: tuple[int | None, ...],  # the cache key's part that changes when a file is rewritten
) -> ssl.SSLContext:
    if verify:
        ctx = _trusting(ca_cert)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        # urllib3 warns on every request to an unverified server; the writer's one
        # WARNING on the driver says it once instead.
        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    if client_cert:
        _readable("client_cert", client_cert)
        if client_key:
            _readable("client_cert_key", client_key)
        try:
            ctx.load_cert_chain(client_cert, client_key or None, password=_no_password)
        except (ssl.SSLError, OSError) as e:
            raise ConfigurationError(
                f"option client_cert={client_cert!r} (client_cert_key={client_key!r}): not a PEM certificate with its "
                f"unencrypted private key ({_ssl_reason(e)})"
            ) from None
    return ctx


def _trusting(ca_cert: str | None) -> ssl.SSLContext:
    """A verifying context trusting ``ca_cert`` (a file, a directory, ``certifi``), else the system's CAs."""
    if not ca_cert:
        return ssl.create_default_context()
    if ca_cert == CERTIFI:
        import certifi  # a dependency of requests

        ca_cert = certifi.where()
    _readable("ca_cert", ca_cert)
    try:
        if os.path.isdir(ca_cert):
            return ssl.create_default_context(capath=ca_cert)
        return ssl.create_default_context(cafile=ca_cert)
    except (ssl.SSLError, OSError) as e:
        raise ConfigurationError(
            f"option ca_cert={ca_cert!r}: not a PEM file of CA certificates ({_ssl_reason(e)})"
        ) from None


def _no_password() -> str:
    # A key that asks for a password fails here instead of prompting on a terminal.
    raise ssl.SSLError("the key is encrypted; give it unencrypted")


def _ssl_reason(e: BaseException) -> str:
    return getattr(e, "reason", None) or getattr(e, "strerror", None) or type(e).__name__


def _readable(option: str, path: str) -> None:
    if not os.path.exists(path):
        raise ConfigurationError(f"option {option}={path!r}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigurationError(f"option {option}={path!r}: not readable by this process")


class _ContextAdapter(requests.adapters.HTTPAdapter):
    """``requests``' adapter with every TLS choice taken from one ``ssl.SSLContext``.

    ``requests`` would otherwise add its own default (the certifi bundle) to the trusted
    CAs of every connection; here the context alone decides, as in clickhouse-connect.
    """

    def __init__(self, context: ssl.SSLContext, pool_size: int) -> None:
        self._context = context
        super().__init__(pool_connections=1, pool_maxsize=pool_size)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, ssl_context=self._context, **pool_kwargs)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        # Through an HTTPS_PROXY tunnel the server's TLS is the same as without one.
        return super().proxy_manager_for(proxy, ssl_context=self._context, **proxy_kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        conn.cert_reqs = "CERT_REQUIRED" if self._context.verify_mode == ssl.CERT_REQUIRED else "CERT_NONE"
        conn.ca_certs = None
        conn.ca_cert_dir = None


def https_adapter(tls: TlsSettings, pool_size: int) -> requests.adapters.HTTPAdapter:
    """The adapter to mount on ``https://`` of a ``requests.Session``: :func:`ssl_context` of ``tls``,
    keeping up to ``pool_size`` connections per server."""
    return _ContextAdapter(ssl_context(tls), pool_size)


def check_tls(target: Target) -> None:
    """Driver, once per write or command, before anything is written: ``target.tls`` is usable.

    Builds the context (every file read and parsed, each error naming its option),
    refuses TLS settings on an ``http://`` URL (they would do nothing), and logs a
    WARNING when ``verify`` is off.

    Raises
    ------
    ConfigurationError
        Naming the option (``ca_cert``, ``client_cert``, ``client_cert_key``, ``verify``).
    """
    tls = target.tls
    parts = urllib.parse.urlsplit(target.url)
    if parts.scheme.lower() != "https":
        given = [n for n in ("ca_cert", "client_cert", "client_cert_key") if getattr(tls, n)]
        if not tls.verify:
            given.append("verify")
        if given:
            raise ConfigurationError(
                f"option {', '.join(given)} only applies to an https:// url; the url is http:// (no TLS)"
            )
        return
    if tls.client_cert_key and not tls.client_cert:
        raise ConfigurationError("option client_cert_key is given without client_cert (the certificate it belongs to)")
    ssl_context(tls)
    if not tls.verify:
        log.warning(
            "verify=false: the certificate of %s is not checked; anyone between this job and the server can read "
            "and change what is written (give the server's CA with ca_cert instead)",
            f"{parts.hostname}:{parts.port or 443}",
        )
