"""The errors of the ``kafka_py`` source's reads (driver and executors).

Raised by the offset planning (:mod:`spark_datasource.kafka.offsets`), the broker
access (:mod:`spark_datasource.kafka.consumers`) and the executors' reads
(:mod:`spark_datasource.kafka.fetch`). Bad options raise
:class:`clickhouse_tx.errors.ConfigurationError` instead, on the driver.
"""

from __future__ import annotations

from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError


class KafkaSourceError(ClickHouseTxError):
    """Base of the errors raised by the ``kafka_py`` source."""


class KafkaUnavailableError(KafkaSourceError):
    """The brokers in ``bootstrap.servers`` did not answer within the bounded retries."""


class KafkaDataLossError(KafkaSourceError):
    """Records of a planned offset range are gone (retention, deleted topic/partition).

    Raised only with ``failOnDataLoss=true`` (the default).
    """


class KafkaValueFormatError(ClickHouseTxError):
    """A record's value is not a JSON object whose fields fit ``value.schema``."""


class KafkaAuthenticationError(ConfigurationError):
    """The broker refused the SASL credentials, or TLS could not be set up with the given
    files (untrusted server certificate, unreadable client key); raised on the driver
    before any task runs, naming the option to fix."""
