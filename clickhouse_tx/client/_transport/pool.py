"""One HTTP connection pool per server and process, shared by every client of that server.

A :class:`~clickhouse_tx.client.http.ClickHouseHTTP` is a view of a server (a target,
maybe a session): building one opens nothing. Its requests go through the pool of its
server, kept here for the life of the process (clickhouse-connect's shared pool
manager is the model), so a driver's commit of many partitions, its session checks,
its registry writes and its next batch reuse the same keep-alive connections instead
of each opening its own.

The pool is keyed by process id, scheme, host, port and (for ``https``) the TLS
context of the target's settings (:func:`~clickhouse_tx.client.tls.ssl_context`, one per
settings and version of their files): a forked Python worker never uses its parent's
sockets, two targets that trust different CAs never share a connection, and a CA file
renewed in place is used by the next request. The proxy variables of the environment
(``HTTPS_PROXY``, ``NO_PROXY``, ...) are part of the key too: the pool reads them once,
when it is made, where ``requests``' ``trust_env`` reads the whole environment twice a
request (docs/performance.md, "One connection pool per server", has what that costs).
Nothing else of ``requests``' environment lookups applies (``~/.netrc`` supplies no
password: the options do). Credentials are not part of the key: they travel per request
in the ``Authorization`` header, and a ClickHouse HTTP connection carries no login
state. ClickHouse sessions are request parameters, so one connection serves any session
in turn.

Connections a request broke (reset, timed out, reply cut) are discarded by ``urllib3``;
an idle connection the server closed is noticed before reuse and replaced.
"""

from __future__ import annotations

import os
import ssl
import threading
import urllib.parse

import requests
import requests.adapters
import requests.utils

from clickhouse_tx.client import tls
from clickhouse_tx.interfaces import TlsSettings

#: Connections kept open per server and process: the driver's commit runs up to
#: ``factory.COMMIT_PARALLELISM`` (8) requests at once, its keep-alive and registry a few more.
POOL_SIZE = 32

#: The environment variables that route a request through a proxy (``urllib.request.getproxies``).
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

_PoolKey = tuple[int, str, str, ssl.SSLContext | None, tuple[str | None, ...]]
_POOLS: dict[_PoolKey, requests.Session] = {}
_LOCK = threading.Lock()


def shared_session(url: str, tls_settings: TlsSettings) -> requests.Session:
    """The ``requests.Session`` (connection pool) of ``url``'s server in this process."""
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme.lower() == "https"
    context = tls.ssl_context(tls_settings) if https else None
    key = (os.getpid(), parts.scheme.lower(), f"{parts.hostname}:{parts.port}", context, _proxy_environment())
    session = _POOLS.get(key)
    if session is not None:
        return session
    with _LOCK:
        session = _POOLS.get(key)
        if session is None:
            session = _POOLS[key] = _new_session(url, https, tls_settings)
    return session


def _proxy_environment() -> tuple[str | None, ...]:
    env = os.environ
    return tuple(env.get(v) for name in PROXY_VARIABLES for v in (name, name.upper()))


def _new_session(url: str, https: bool, tls_settings: TlsSettings) -> requests.Session:
    session = requests.Session()
    # The environment's proxies for this server, read once (NO_PROXY applied); see the module doc.
    session.proxies = requests.utils.get_environ_proxies(url)
    session.trust_env = False
    if https:  # the trusted CAs and client certificate of the target's TLS settings
        session.mount("https://", tls.https_adapter(tls_settings, pool_size=POOL_SIZE))
        session.verify = tls_settings.verify
    else:
        session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=POOL_SIZE))
    return session


def close_all() -> None:
    """Close every pool of this process (their idle connections); the next request opens anew.

    For tests that count connections, and for a process about to stop."""
    with _LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for session in pools:
        session.close()


__all__ = ["POOL_SIZE", "PROXY_VARIABLES", "close_all", "shared_session"]
