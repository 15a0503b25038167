"""The ``kafka_py`` source: options, offsets, consumers, fetching, Arrow and JSON rows,
security, and its errors.
"""

from spark_datasource.kafka.errors import (
    KafkaAuthenticationError,
    KafkaDataLossError,
    KafkaSourceError,
    KafkaUnavailableError,
    KafkaValueFormatError,
)

__all__ = [
    "KafkaAuthenticationError",
    "KafkaDataLossError",
    "KafkaSourceError",
    "KafkaUnavailableError",
    "KafkaValueFormatError",
]
