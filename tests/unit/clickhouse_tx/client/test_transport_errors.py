"""The one error mapping of the transport (pure: no server), row by row.

The same classes against the embedded server: ``tests/integration/clickhouse_tx/client/test_transport_faults.py``.
"""

from __future__ import annotations

import pytest
import requests
import urllib3.exceptions as u3

from clickhouse_tx.client._transport.reply_mapping import (
    error_from_connection,
    error_from_reply,
    parse_clickhouse_error,
)
from clickhouse_tx.client.codes import KeeperError, is_keeper_error, keeper_error
from clickhouse_tx.errors import (
    NotCommittedError,
    OutcomeUnknownError,
    ReplyLostError,
    RequestNotSentError,
    ServerBusyError,
    ServerError,
    ServerOutcomeUnknownError,
    TransientError,
)
from clickhouse_tx.retry import is_transient, is_transient_or_unknown


def reply(status: int, body: str, header: str | None = None) -> Exception:
    return error_from_reply(status, header, body, what="SELECT 1", xid="x1")


@pytest.mark.parametrize(
    "status,body,header,expected",
    [
        (503, "Service Unavailable", None, ServerBusyError),
        (429, "Too Many Requests", None, ServerBusyError),
        (
            500,
            (
                "Code: 202. DB::Exception: Too many simultaneous queries for user default. Current: 1, "
                "maximum: 1. (TOO_MANY_SIMULTANEOUS_QUERIES)"
            ),
            "202",
            ServerBusyError,
        ),
        (
            500,
            "Code: 373. DB::Exception: Session is locked by a concurrent client. (SESSION_IS_LOCKED)",
            "373",
            ServerBusyError,
        ),
        (
            500,
            (
                "Code: 999. DB::Exception: All connection tries failed while connecting to ZooKeeper. "
                "nodes: 127.0.0.1:2181, Connection loss. (KEEPER_EXCEPTION)"
            ),
            "999",
            ServerBusyError,
        ),
        (
            500,
            "Code: 999. DB::Exception: Coordination::Exception: Connection loss, path /x. (KEEPER_EXCEPTION)",
            "999",
            ServerOutcomeUnknownError,
        ),
        (500, "Code: 999. DB::Exception: Session expired. (KEEPER_EXCEPTION)", "999", ServerOutcomeUnknownError),
        (
            500,
            "Code: 999. DB::Exception: Operation timeout, path /x. (KEEPER_EXCEPTION)",
            "999",
            ServerOutcomeUnknownError,
        ),
        (
            500,
            "Code: 999. DB::Exception: Transaction failed (Bad version): Op #0, path: /k. (KEEPER_EXCEPTION)",
            "999",
            ServerError,
        ),
        (404, "Code: 60. DB::Exception: Unknown table expression identifier 't'. (UNKNOWN_TABLE)", "60", ServerError),
        (
            503,
            "Code: 209. DB::Exception: Timeout exceeded while reading from socket. (SOCKET_TIMEOUT)",
            "209",
            ServerError,
        ),
        (200, "Code: 159. DB::Exception: Timeout exceeded. (TIMEOUT_EXCEEDED)", "159", ServerError),
    ],
)
def test_each_reply_maps_to_one_error_class_with_its_outcome_certainty(
    status: int, body: str, header: str | None, expected: type
) -> None:
    err = reply(status, body, header)
    assert type(err) is expected
    assert isinstance(err, ServerError) and err.xid == "x1"
    if header:
        assert err.code == int(header)
    # what the retry helper does with it follows from the class alone
    assert is_transient(err) == (expected is ServerBusyError)
    assert is_transient_or_unknown(err) == (expected in (ServerBusyError, ServerOutcomeUnknownError))
    assert isinstance(err, NotCommittedError) == (expected is ServerBusyError)
    assert isinstance(err, OutcomeUnknownError) == (expected is ServerOutcomeUnknownError)


def test_the_exception_code_header_wins_over_the_code_in_the_text() -> None:
    err = reply(500, "Code: 60. DB::Exception: rewritten by a proxy. (UNKNOWN_TABLE)", "202")
    assert isinstance(err, ServerBusyError) and err.code == 202


def test_a_busy_reply_without_an_exception_says_it_was_not_run() -> None:
    err = reply(503, "")
    assert isinstance(err, TransientError) and err.code is None
    assert "HTTP 503" in str(err) and "not run" in str(err)


@pytest.mark.parametrize(
    "text,kind",
    [
        ("Transaction failed (Bad version): Op #0, path: /a", KeeperError.BAD_VERSION),
        ("Transaction failed (Node exists): Op #0, path: /a", KeeperError.NODE_EXISTS),
        ("Coordination::Exception: No node, path /a", KeeperError.NO_NODE),
        ("Connection loss, path /a", KeeperError.CONNECTION_LOSS),
        ("All connection tries failed while connecting to ZooKeeper (Connection loss)", KeeperError.NOT_CONNECTED),
        ("Session expired", KeeperError.SESSION_EXPIRED),
    ],
)
def test_keeper_errors_are_told_apart_only_for_the_keeper_exception_code(text: str, kind: KeeperError) -> None:
    assert keeper_error(999, text) is kind
    assert keeper_error(60, text) is None
    err = reply(500, f"Code: 999. DB::Exception: {text}. (KEEPER_EXCEPTION)", "999")
    assert is_keeper_error(err, kind)


def test_parse_splits_code_message_and_name_of_a_reply() -> None:
    assert parse_clickhouse_error("Code: 60. DB::Exception: no table t. (UNKNOWN_TABLE) (version 26.9.1)\n") == (
        60,
        "UNKNOWN_TABLE",
        "no table t.",
    )
    assert parse_clickhouse_error("Bad Gateway") == (None, None, "Bad Gateway")


def _connection_error(cause: BaseException) -> requests.exceptions.ConnectionError:
    return requests.exceptions.ConnectionError(u3.MaxRetryError(None, "/", cause))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "exc,expected",
    [
        (_connection_error(u3.NewConnectionError(None, "Connection refused")), RequestNotSentError),
        (requests.exceptions.ConnectTimeout("connect timeout"), RequestNotSentError),
        (
            _connection_error(u3.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))),
            ReplyLostError,
        ),
        (requests.exceptions.ReadTimeout("read timeout"), ReplyLostError),
        (requests.exceptions.ChunkedEncodingError("cut"), ReplyLostError),
    ],
)
def test_only_a_failure_while_connecting_is_not_sent_everything_later_is_a_lost_reply(
    exc: requests.RequestException, expected: type
) -> None:
    err = error_from_connection(exc, what="COMMIT", server="http://h:8123/", request_timeout_s=5, xid="x1")
    assert type(err) is expected and err.xid == "x1"
    assert "http://h:8123/" in str(err)
    assert is_transient(err) == (expected is RequestNotSentError)


def test_a_coordinator_retry_is_logged_with_the_step_attempt_limit_and_error(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from tests.unit.fakes import World

    ops = World().coordinator().ops
    calls = iter([RequestNotSentError("SELECT: cannot connect to http://h:8123/ (NewConnectionError)"), None])

    def flaky() -> str:
        err = next(calls)
        if err is not None:
            raise err
        return "ok"

    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.retry"):
        assert ops.call(lambda: flaky()) == "ok"
    (msg,) = [r.getMessage() for r in caplog.records]
    assert (
        msg.startswith(
            "test_a_coordinator_retry_is_logged_with_the_step_attempt_limit_and_error failed (attempt 1 of 3)"
        )
        and "RequestNotSentError" in msg
        and "http://h:8123/" in msg
    )
