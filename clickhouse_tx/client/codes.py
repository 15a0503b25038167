"""What the HTTP client's failures mean: the ClickHouse codes callers branch on, and Keeper's.

A failed request raises an error of :mod:`clickhouse_tx.errors` by what is known of
its outcome (the mapping is the private :mod:`clickhouse_tx.client._transport.reply_mapping`;
:class:`~clickhouse_tx.errors.RequestNotSentError` and
:class:`~clickhouse_tx.errors.ReplyLostError` when no complete reply came back);
callers that react to a particular ClickHouse exception compare its ``code`` with the
constants below, or ask :func:`keeper_error` which Keeper error it carries.

ClickHouse sends a Keeper error as ``KEEPER_EXCEPTION`` (999) with the Keeper
client's text for the Keeper code (``Coordination::errorMessage``: ``Bad version``,
``Node exists``, ``Connection loss``...); the HTTP reply carries no Keeper code
number, so :func:`keeper_error` reads those fixed texts, here only.
"""

from __future__ import annotations

import enum

from clickhouse_tx.errors import ServerError

#: ClickHouse error codes the project reacts to (ClickHouse's numbering).
NOT_IMPLEMENTED = 48
TABLE_ALREADY_EXISTS = 57
UNKNOWN_TABLE = 60
UNKNOWN_DATABASE = 81
TOO_MANY_SIMULTANEOUS_QUERIES = 202
NO_ZOOKEEPER = 225
TABLE_IS_READ_ONLY = 242
ALL_CONNECTION_TRIES_FAILED = 279
SESSION_NOT_FOUND = 372
SESSION_IS_LOCKED = 373
PART_IS_TEMPORARILY_LOCKED = 384
FUNCTION_THROW_IF_VALUE_IS_NON_ZERO = 395
INVALID_TRANSACTION = 649
KEEPER_EXCEPTION = 999


class KeeperError(enum.Enum):
    """The Keeper errors the protocol tells apart, by ``Coordination::errorMessage`` text."""

    BAD_VERSION = "Bad version"
    NODE_EXISTS = "Node exists"
    NO_NODE = "No node"
    CONNECTION_LOSS = "Connection loss"
    SESSION_EXPIRED = "Session expired"
    OPERATION_TIMEOUT = "Operation timeout"
    NOT_CONNECTED = "All connection tries failed"


def keeper_error(code: int | None, message: str) -> KeeperError | None:
    """The Keeper error of a ``KEEPER_EXCEPTION`` reply (None for any other reply).

    ``NOT_CONNECTED`` is checked first: its text also names ``Connection loss``, but
    no request reached Keeper.
    """
    if code != KEEPER_EXCEPTION:
        return None
    if KeeperError.NOT_CONNECTED.value in message:
        return KeeperError.NOT_CONNECTED
    return next((k for k in KeeperError if k.value in message), None)


def is_keeper_error(exc: BaseException, kind: KeeperError) -> bool:
    """True if ``exc`` is a server error carrying the Keeper error ``kind``."""
    return isinstance(exc, ServerError) and keeper_error(exc.code, exc.message) is kind


def no_current_transaction(exc: BaseException) -> bool:
    """True if ``exc`` says the session holds no transaction (a ``COMMIT``/``ROLLBACK`` with none open).

    ``INVALID_TRANSACTION`` also answers a statement sent into a transaction that failed
    (``Cannot execute query because current transaction failed``): that transaction is
    still open, so the code alone does not say "none".
    """
    return (
        isinstance(exc, ServerError)
        and exc.code == INVALID_TRANSACTION
        and "There is no current transaction" in exc.message
    )


def transactions_unsupported(exc: BaseException) -> bool:
    """True if ``exc`` is a server refusing transactions (no ``allow_experimental_transactions``)."""
    return (
        isinstance(exc, ServerError) and exc.code == NOT_IMPLEMENTED and "Transactions are not supported" in exc.message
    )


__all__ = [
    "ALL_CONNECTION_TRIES_FAILED",
    "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
    "INVALID_TRANSACTION",
    "KEEPER_EXCEPTION",
    "NOT_IMPLEMENTED",
    "NO_ZOOKEEPER",
    "PART_IS_TEMPORARILY_LOCKED",
    "SESSION_IS_LOCKED",
    "SESSION_NOT_FOUND",
    "TABLE_ALREADY_EXISTS",
    "TABLE_IS_READ_ONLY",
    "TOO_MANY_SIMULTANEOUS_QUERIES",
    "UNKNOWN_DATABASE",
    "UNKNOWN_TABLE",
    "KeeperError",
    "is_keeper_error",
    "keeper_error",
    "no_current_transaction",
    "transactions_unsupported",
]
