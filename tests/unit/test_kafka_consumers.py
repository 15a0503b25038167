"""The executors' consumer pool without a broker: which consumers may be shared, and
that a worker reading through librdkafka never imports kafka-python.

The pool's behaviour against the dev broker (reuse, idle close, replacement, failed
reads) is in ``tests/spark/test_kafka_consumer_pool.py``.
"""

from __future__ import annotations

import sys

import pytest

from spark_datasource.kafka import consumers
from spark_datasource.kafka.consumers import ConsumerPool, settings_key
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


class _Librdkafka:
    """What the pool calls on a librdkafka consumer."""

    def __init__(self, closed: list[object]) -> None:
        self.closed = closed

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        self.closed.append(self)


def test_a_librdkafka_checkout_give_back_and_close_never_import_kafka_python(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = parse_kafka_options({"bootstrap.servers": "127.0.0.1:9092", "subscribe": "a"})
    closed: list[object] = []
    monkeypatch.setattr(consumers, "new_librdkafka_consumer", lambda _opts: _Librdkafka(closed))
    monkeypatch.setitem(sys.modules, "kafka", None)  # from here on, importing kafka-python fails
    pool = ConsumerPool(idle_s=0.0)
    first, reused = pool.checkout(opts, ("a", 0), "librdkafka")
    assert not reused
    pool.give_back(opts, ("a", 0), first, "librdkafka")
    second, _ = pool.checkout(opts, ("a", 0), "librdkafka")  # the idle one is closed, a new one made
    pool.discard(second, "librdkafka")
    third, _ = pool.checkout(opts, ("a", 1), "librdkafka")
    pool.give_back(opts, ("a", 1), third, "librdkafka")
    pool.close_all()
    assert closed == [first, second, third]
