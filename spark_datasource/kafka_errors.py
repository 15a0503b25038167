"""The errors of the ``kafka_py`` source's reads (driver and executors).

Raised by the offset planning (:mod:`spark_datasource.kafka_offsets`), the broker
access (:mod:`spark_datasource.kafka_consumers`) and the executors' reads
(:mod:`spark_datasource.kafka_fetch`). Bad options raise
:class:`clickhouse_tx.errors.ConfigurationError` instead, on the driver.
"""

from __future__ import annotations

from clickhouse_tx.errors import ClickHouseTxError


class KafkaSourceError(ClickHouseTxError):
    """Base of the errors raised by the ``kafka_py`` source."""


class KafkaUnavailableError(KafkaSourceError):
    """The brokers in ``bootstrap.servers`` did not answer within the bounded retries."""


class KafkaDataLossError(KafkaSourceError):
    """Records of a planned offset range are gone (retention, deleted topic/partition).

    Raised only with ``failOnDataLoss=true`` (the default).
    """
