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
    ClickHouseTxError,
    ConfigurationError,
    DecisionConflictError,
    LostTransactionError,
    NotCommittedError,
    OutcomeUnknownError,
    ServerBusyError,
    ServerError,
    ServerOutcomeUnknownError,
    TransientError,
    ValueDoesNotFitError,
)
from clickhouse_tx.verify import verify
from clickhouse_tx.verify_report import VerifyReport

#: The package's version; pyproject.toml reads it from here (``[tool.setuptools.dynamic]``).
__version__ = "0.1.0"

__all__ = [
    "ClickHouseTxError",
    "ConfigurationError",
    "DecisionConflictError",
    "LostTransactionError",
    "NotCommittedError",
    "OutcomeUnknownError",
    "ServerBusyError",
    "ServerError",
    "ServerOutcomeUnknownError",
    "TransientError",
    "ValueDoesNotFitError",
    "VerifyReport",
    "__version__",
    "verify",
]
