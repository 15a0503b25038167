"""Kept only as a re-export of :mod:`clickhouse_tx._transport` while parallel branches
that still import ``clickhouse_tx.http_client`` are merged; new code imports from
``clickhouse_tx._transport``. Delete once nothing imports it."""

from clickhouse_tx._transport import *  # noqa: F401,F403
from clickhouse_tx._transport import __all__  # noqa: F401
