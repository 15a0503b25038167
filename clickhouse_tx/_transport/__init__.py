"""The private transport: the one ClickHouse HTTP client and the one error mapping.

Import the names below from here (``from clickhouse_tx._transport import ClickHouseHTTP``);
the modules inside are an implementation detail. The layout follows
clickhouse-connect's ``driver/``: a client (:mod:`.http`) and the classification of
what the server or the connection answered (:mod:`.errors`).
"""

from clickhouse_tx._transport.errors import (
    INVALID_TRANSACTION,
    KEEPER_EXCEPTION,
    NOT_IMPLEMENTED,
    SESSION_IS_LOCKED,
    SESSION_NOT_FOUND,
    TABLE_ALREADY_EXISTS,
    TOO_MANY_SIMULTANEOUS_QUERIES,
    UNKNOWN_DATABASE,
    UNKNOWN_TABLE,
    KeeperError,
    ReplyLostError,
    RequestNotSentError,
    error_from_connection,
    error_from_reply,
    is_keeper_error,
    keeper_error,
    transactions_unsupported,
)
from clickhouse_tx._transport.http import ClickHouseHTTP, safe_url

__all__ = [
    "INVALID_TRANSACTION",
    "KEEPER_EXCEPTION",
    "NOT_IMPLEMENTED",
    "SESSION_IS_LOCKED",
    "SESSION_NOT_FOUND",
    "TABLE_ALREADY_EXISTS",
    "TOO_MANY_SIMULTANEOUS_QUERIES",
    "UNKNOWN_DATABASE",
    "UNKNOWN_TABLE",
    "ClickHouseHTTP",
    "KeeperError",
    "ReplyLostError",
    "RequestNotSentError",
    "error_from_connection",
    "error_from_reply",
    "is_keeper_error",
    "keeper_error",
    "safe_url",
    "transactions_unsupported",
]
