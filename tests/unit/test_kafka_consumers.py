"""The key of the executors' consumer pool (no broker): which consumers may be shared.

The pool's behaviour against the dev broker (reuse, idle close, replacement, failed
reads) is in ``tests/spark/test_kafka_consumer_pool.py``.
"""

from __future__ import annotations

from spark_datasource.kafka.consumers import settings_key
from spark_datasource.kafka.options import parse_kafka_options


def test_consumers_of_different_settings_are_never_shared_and_the_key_holds_no_secret() -> None:
    base = {
        "bootstrap.servers": "127.0.0.1:9092",
        "subscribe": "a",
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.plain.username": "u",
    }
    one = parse_kafka_options({**base, "kafka.sasl.plain.password": "hunter2"})
    other = parse_kafka_options({**base, "kafka.sasl.plain.password": "hunter3"})
    same = parse_kafka_options({**base, "kafka.sasl.plain.password": "hunter2"})
    assert settings_key(one) != settings_key(other)
    assert settings_key(one) == settings_key(same)
    assert "hunter2" not in settings_key(one)
    elsewhere = parse_kafka_options(
        {**base, "bootstrap.servers": "127.0.0.1:9093", "kafka.sasl.plain.password": "hunter2"}
    )
    assert settings_key(one) != settings_key(elsewhere)
