"""clickhouse-tx: exactly-once delivery from Spark (PySpark) into ClickHouse.

This package is the transaction protocol without Spark (it imports no pyspark): the
commit modes, the KeeperMap registry, the decision log, recovery and the verifier,
and ``python -m clickhouse_tx verify|status|recover|gc``. The Spark data sources
(``format("clickhouse_tx")``, ``format("kafka_py")``) are in :mod:`spark_datasource`.

>>> import clickhouse_tx
>>> report = clickhouse_tx.verify("http://127.0.0.1:8123", "db.events")
>>> report.clean
True

The names below are the public API; every error the writer raises is a
:class:`ClickHouseTxError`, and the subclass says what is known of the outcome.
"""

from __future__ import annotations

from clickhouse_tx.errors import (
    AlreadyRegisteredError,
    ClickHouseTxError,
    ConfigurationError,
    DecisionConflictError,
    DedupLayoutError,
    DedupWindowError,
    IllegalTransitionError,
    LostTransactionError,
    NotCommittedError,
    OutcomeUnknownError,
    ReplyLostError,
    RequestNotSentError,
    RowsNotWrittenError,
    ServerBusyError,
    ServerError,
    ServerOutcomeUnknownError,
    TornDecisionError,
    TransactionFinishedError,
    TransientError,
    ValueDoesNotFitError,
)
from clickhouse_tx.verify.report import VerifyReport
from clickhouse_tx.verify.verifier import verify

#: The package's version; pyproject.toml reads it from here (``[tool.setuptools.dynamic]``).
__version__ = "0.1.0"

__all__ = [
    "AlreadyRegisteredError",
    "ClickHouseTxError",
    "ConfigurationError",
    "DecisionConflictError",
    "DedupLayoutError",
    "DedupWindowError",
    "IllegalTransitionError",
    "LostTransactionError",
    "NotCommittedError",
    "OutcomeUnknownError",
    "ReplyLostError",
    "RequestNotSentError",
    "RowsNotWrittenError",
    "ServerBusyError",
    "ServerError",
    "ServerOutcomeUnknownError",
    "TornDecisionError",
    "TransactionFinishedError",
    "TransientError",
    "ValueDoesNotFitError",
    "VerifyReport",
    "verify",
    "__version__",
]
