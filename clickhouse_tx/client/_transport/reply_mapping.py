"""The one mapping from a ClickHouse reply (HTTP status, exception code, text) to the errors.

Every request of the project goes through :class:`clickhouse_tx.client.http.ClickHouseHTTP`,
which calls :func:`error_from_reply` for every non-200 reply (or a reply carrying
``X-ClickHouse-Exception-Code``) and :func:`error_from_connection` for every request
without a complete reply, and raises what they return. Callers then branch on the
error class (what is known of the outcome) and, for the few codes the protocol reacts
to, on ``code`` (:mod:`clickhouse_tx.client.codes`). No other module parses ClickHouse
error text (:func:`clickhouse_tx.client.codes.keeper_error` reads the Keeper texts).

Outcome certainty
-----------------
- :class:`~clickhouse_tx.errors.ServerBusyError` (a ``TransientError``): the server
  refused the request before running it: HTTP 503/429 without a ClickHouse exception
  (a proxy or an overloaded server), ``TOO_MANY_SIMULTANEOUS_QUERIES``,
  ``SESSION_IS_LOCKED``, ``PART_IS_TEMPORARILY_LOCKED``, no Keeper connection at all.
  Nothing was done; the retry helper retries it.
- :class:`~clickhouse_tx.errors.ServerOutcomeUnknownError` (an ``OutcomeUnknownError``):
  the Keeper connection was lost, the Keeper session expired or a Keeper operation
  timed out while the request ran; a write may or may not have reached Keeper. Reads
  retry it; writes resolve it by reading back.
- :class:`~clickhouse_tx.errors.ServerError`: any other exception; the request failed
  as a whole (the caller decides by code).
"""

from __future__ import annotations

import json
import re
import ssl
from typing import Iterator

import requests
import urllib3.exceptions as u3

from clickhouse_tx.client.codes import (
    ALL_CONNECTION_TRIES_FAILED,
    NO_ZOOKEEPER,
    PART_IS_TEMPORARILY_LOCKED,
    SESSION_IS_LOCKED,
    TABLE_IS_READ_ONLY,
    TOO_MANY_SIMULTANEOUS_QUERIES,
    KeeperError,
    keeper_error,
)
from clickhouse_tx.errors import (
    ClickHouseTxError,
    ConfigurationError,
    ReplyLostError,
    RequestNotSentError,
    RowsNotWrittenError,
    ServerBusyError,
    ServerError,
    ServerOutcomeUnknownError,
)

_CH_ERROR = re.compile(
    r"Code:\s*(\d+)\.\s*(?:DB::Exception:\s*)?(.*?)(?:\s*\(([A-Z_0-9]+)\))?"
    r"(?:\s*\(version [^)]*\))?\s*$",
    re.DOTALL,
)

#: Codes whose query was refused before it ran: retrying cannot do anything twice.
#: (SESSION_IS_LOCKED: another request holds the session; this one never started.
#: PART_IS_TEMPORARILY_LOCKED: an ALTER found a part it needs locked, and did nothing.)
_REFUSED_BEFORE_RUNNING = frozenset(
    {
        TOO_MANY_SIMULTANEOUS_QUERIES,
        NO_ZOOKEEPER,
        TABLE_IS_READ_ONLY,
        ALL_CONNECTION_TRIES_FAILED,
        SESSION_IS_LOCKED,
        PART_IS_TEMPORARILY_LOCKED,
    }
)
#: HTTP statuses that, without a ClickHouse exception, mean "not run, come back later".
_BUSY_STATUSES = frozenset({429, 503})


#: Keeper errors after which a write may or may not have been applied.
_KEEPER_OUTCOME_UNKNOWN = frozenset(
    {KeeperError.CONNECTION_LOSS, KeeperError.SESSION_EXPIRED, KeeperError.OPERATION_TIMEOUT}
)


def parse_clickhouse_error(text: str) -> tuple[int | None, str | None, str]:
    """Split ``Code: 60. DB::Exception: ... (UNKNOWN_TABLE)`` into (code, name, message)."""
    text = text.strip()
    m = _CH_ERROR.search(text)
    if not m:
        return None, None, text
    return int(m.group(1)), m.group(3), m.group(2).strip()


def error_from_reply(
    status: int, header_code: str | None, body: str, *, what: str, xid: str | None
) -> ClickHouseTxError:
    """The error to raise for one failed reply; pure (no I/O), called once per failed request.

    Parameters
    ----------
    status
        HTTP status of the reply.
    header_code
        ``X-ClickHouse-Exception-Code`` header (None if absent): wins over the code
        in the body, which a proxy may have rewritten.
    body
        The reply text (``Code: N. DB::Exception: ... (NAME)`` from ClickHouse).
    what
        A short label of the request for the message (no values, no URL).
    xid
        The session (transaction) the request ran in, if any.
    """
    code, name, message = parse_clickhouse_error(body)
    if header_code and header_code.strip().isdigit():
        code = int(header_code)
    if not message:
        message = f"HTTP {status}"
    text = f"{what}: {message}"
    if code is None and status in _BUSY_STATUSES:
        return ServerBusyError(f"{text} (HTTP {status}: not run, try again later)", xid=xid, code=None, name=None)
    keeper = keeper_error(code, message)
    if code in _REFUSED_BEFORE_RUNNING or keeper is KeeperError.NOT_CONNECTED:
        return ServerBusyError(text, xid=xid, code=code, name=name)
    if keeper in _KEEPER_OUTCOME_UNKNOWN:
        return ServerOutcomeUnknownError(text, xid=xid, code=code, name=name)
    return ServerError(text, xid=xid, code=code, name=name)


def unwritten_rows_error(
    summary: str | None, sent: int, *, may_deduplicate: bool, what: str, xid: str | None
) -> ClickHouseTxError | None:
    """The error of an INSERT answered with success that did not write what it was sent; pure.

    Parameters
    ----------
    summary
        The reply's ``X-ClickHouse-Summary`` header (None if absent).
    sent
        Rows in the request body.
    may_deduplicate
        The INSERT carried a deduplication token (or goes where ClickHouse drops
        repeated blocks by themselves): ``written_rows = 0`` is then a block the
        server already held. Each such INSERT of the project is one block, so it
        is all or nothing.

    Returns None when the summary accounts for the rows: ``written_rows`` at least
    ``sent`` (a target's materialized views add their own rows), or 0 where that is a
    deduplicated block. A reply without a summary cannot show the rows were taken:
    :class:`ReplyLostError` (outcome unknown), as for a reply cut off.
    """
    try:
        written = int(json.loads(summary or "")["written_rows"])
    except (ValueError, KeyError, TypeError):
        return ReplyLostError(
            f"{what}: the reply says success but carries no X-ClickHouse-Summary with written_rows, so it "
            f"cannot show that the {sent} rows sent were written",
            xid=xid,
        )
    if written >= sent or (written == 0 and may_deduplicate):
        return None
    return RowsNotWrittenError(
        f"{what}: the server answered success but wrote {written} of the {sent} rows sent (X-ClickHouse-Summary); "
        "nothing of this attempt is claimed written. An error the server did not report (a read-only replica, "
        "a refused part), asynchronous inserts (async_insert=1 in the user's profile), or a table whose own "
        "deduplication window dropped identical blocks",
        sent=sent,
        written=written,
        xid=xid,
    )


def error_from_connection(
    exc: requests.RequestException, *, what: str, server: str, request_timeout_s: float, xid: str | None
) -> ClickHouseTxError:
    """The error to raise for a request that got no complete reply; pure, once per failure.

    Only a failure while connecting is "not sent" (:class:`RequestNotSentError`, retried
    by the retry helper): a fresh connection to a stopped or restarting server is
    refused. Everything later (reset, timeout, reply cut off) may have run on the
    server: :class:`ReplyLostError`. urllib3 checks a pooled connection before reusing
    it, so one closed by a restarted server is replaced by a new (refused) connection
    rather than failing after the request was written. ``server`` is the safe URL.
    """
    refused = _tls_refusal(exc, what=what, server=server)
    if refused is not None:
        return refused
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return RequestNotSentError(f"{what}: connect timeout to {server}", xid=xid)
    if isinstance(exc, requests.exceptions.ConnectionError):
        if _never_connected(exc):
            return RequestNotSentError(f"{what}: cannot connect to {server} ({_reason(exc)})", xid=xid)
        return ReplyLostError(f"{what}: connection to {server} lost before the reply ({_reason(exc)})", xid=xid)
    if isinstance(exc, requests.exceptions.Timeout):
        return ReplyLostError(f"{what}: no reply from {server} within {request_timeout_s:g} s", xid=xid)
    return ReplyLostError(f"{what}: reply from {server} cut off ({_reason(exc)})", xid=xid)


#: TLS alerts a server sends when it does not accept this client's certificate (or its absence).
_CLIENT_CERT_ALERTS = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
    }
)


def _tls_refusal(exc: BaseException, *, what: str, server: str) -> ConfigurationError | None:
    """The error of a TLS handshake refused for its certificates (None for anything else).

    Retrying cannot change a certificate, so it is a :class:`ConfigurationError`
    naming the options that decide it; other TLS failures (a handshake cut off by a
    restarting server) keep the connection mapping below.
    """
    for e in _causes(exc):
        if isinstance(e, ssl.SSLCertVerificationError):
            return ConfigurationError(
                f"{what}: the TLS certificate of {server} is not trusted ({e.verify_message or e.reason}): give the CA "
                "that signed it with option ca_cert (a PEM file; ca_cert=certifi for the public CAs), or set "
                "verify=false to skip the check"
            )
        if isinstance(e, ssl.SSLError) and e.reason in _CLIENT_CERT_ALERTS:
            return ConfigurationError(
                f"{what}: {server} refused the TLS connection ({e.reason}): it requires a client certificate it "
                "trusts; give it with options client_cert and client_cert_key"
            )
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (urllib3's reasons, args, causes), each once."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, u3.MaxRetryError):
            stack.append(e.reason)
        stack.extend(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))
        stack.append(e.__cause__)
        stack.append(e.__context__)


def _never_connected(exc: BaseException) -> bool:
    """True when a ``requests`` ConnectionError happened while connecting."""
    never = (u3.NewConnectionError, u3.ConnectTimeoutError, ConnectionRefusedError)
    return any(isinstance(e, never) for e in _causes(exc))


def _reason(exc: BaseException) -> str:
    """The innermost cause's class name: never the URL (it carries query parameters)."""
    e: BaseException = exc
    while True:
        nxt = (
            getattr(e, "reason", None)
            or e.__cause__
            or next((a for a in getattr(e, "args", ()) if isinstance(a, BaseException)), None)
        )
        if nxt is None or nxt is e or not isinstance(nxt, BaseException):
            return type(e).__name__
        e = nxt


__all__ = ["error_from_connection", "error_from_reply", "parse_clickhouse_error", "unwritten_rows_error"]
