"""Kept only as a re-export of :mod:`clickhouse_tx._transport` while parallel branches
that still import ``clickhouse_tx.http_client`` are merged; new code imports from
``clickhouse_tx._transport``. Delete once nothing imports it."""

from clickhouse_tx._transport import (
    INVALID_TRANSACTION,
    KEEPER_EXCEPTION,
    SESSION_IS_LOCKED,
    SESSION_NOT_FOUND,
    TABLE_ALREADY_EXISTS,
    UNKNOWN_DATABASE,
    UNKNOWN_TABLE,
    ClickHouseHTTP,
    ReplyLostError,
    RequestNotSentError,
    safe_url,
)

__all__ = ["INVALID_TRANSACTION", "KEEPER_EXCEPTION", "SESSION_IS_LOCKED", "SESSION_NOT_FOUND",
           "TABLE_ALREADY_EXISTS", "UNKNOWN_DATABASE", "UNKNOWN_TABLE", "ClickHouseHTTP", "ReplyLostError",
           "RequestNotSentError", "safe_url"]
