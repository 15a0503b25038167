"""The public face of the private transport (:mod:`clickhouse_tx._transport`).

Code outside ``clickhouse_tx`` (the Spark data sources, the benchmarks, the tests)
imports the ClickHouse HTTP client and the error codes it reacts to from here; inside
``clickhouse_tx`` modules import from ``clickhouse_tx._transport``. There is one client:
this module only names it (see ``docs/design.md``, "Transport").
"""

from clickhouse_tx._transport import (
    INVALID_TRANSACTION,
    KEEPER_EXCEPTION,
    NOT_IMPLEMENTED,
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

__all__ = [
    "INVALID_TRANSACTION",
    "KEEPER_EXCEPTION",
    "NOT_IMPLEMENTED",
    "SESSION_IS_LOCKED",
    "SESSION_NOT_FOUND",
    "TABLE_ALREADY_EXISTS",
    "UNKNOWN_DATABASE",
    "UNKNOWN_TABLE",
    "ClickHouseHTTP",
    "ReplyLostError",
    "RequestNotSentError",
    "safe_url",
]
