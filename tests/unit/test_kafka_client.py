"""``kafka.client``: the choice of client on the driver and librdkafka's settings (no broker).

Reads through both clients against the dev broker are in ``tests/spark/test_kafka_reader.py``,
``test_kafka_consumer_pool.py`` and ``test_kafka_security.py``.
"""

from __future__ import annotations

import pickle

import pytest

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka import librdkafka_settings
from spark_datasource.kafka.fetch import reading_client
from spark_datasource.kafka.librdkafka_settings import librdkafka_config
from spark_datasource.kafka.options import parse_kafka_options

BASE = {"bootstrap.servers": "h1:9092,h2:9092", "subscribe": "a"}


def test_auto_reads_with_librdkafka_where_confluent_kafka_imports_and_both_can_be_asked_for() -> None:
    assert (parse_kafka_options(BASE).client, parse_kafka_options(BASE).client_auto) == ("librdkafka", True)
    for client in ("kafka-python", "librdkafka", "LIBRDKAFKA"):
        opts = parse_kafka_options({**BASE, "kafka.client": client})
        assert (opts.client, opts.client_auto) == (client.lower(), False)
    assert pickle.loads(pickle.dumps(parse_kafka_options(BASE))).client == "librdkafka"


def test_a_bad_client_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigurationError, match="kafka.client='rdkafka': expected auto, kafka-python or librdkafka"):
        parse_kafka_options({**BASE, "kafka.client": "rdkafka"})


def test_without_confluent_kafka_librdkafka_is_refused_on_the_driver_and_auto_reads_with_kafka_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(librdkafka_settings, "librdkafka_available", lambda: False)
    with pytest.raises(ConfigurationError, match="'kafka.client': librdkafka needs the confluent-kafka package"):
        parse_kafka_options({**BASE, "kafka.client": "librdkafka"})
    assert parse_kafka_options(BASE).client == "kafka-python"


def test_an_executor_without_confluent_kafka_falls_back_to_kafka_python_only_when_auto_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auto, asked = parse_kafka_options(BASE), parse_kafka_options({**BASE, "kafka.client": "librdkafka"})
    assert reading_client(auto) == reading_client(asked) == "librdkafka"
    monkeypatch.setattr("spark_datasource.kafka.fetch.librdkafka_available", lambda: False)
    assert reading_client(auto) == "kafka-python"
    assert reading_client(asked) == "librdkafka"  # then fails importing confluent_kafka, as asked


def test_a_setting_librdkafka_has_no_equivalent_of_is_refused_with_librdkafka_and_makes_auto_choose_kafka_python() -> (
    None
):
    extra = {"kafka.metrics.num.samples": "3"}
    with pytest.raises(ConfigurationError, match="'kafka.metrics.num.samples': has no librdkafka equivalent"):
        parse_kafka_options({**BASE, **extra, "kafka.client": "librdkafka"})
    assert parse_kafka_options({**BASE, **extra}).client == "kafka-python"
    # kafka-python's own machinery (version probe, records per poll) is accepted and left out
    opts = parse_kafka_options({**BASE, "kafka.api.version": "2.5.0", "kafka.max.poll.records": "7"})
    assert opts.client == "librdkafka"
    cfg = librdkafka_config(opts.consumer_config(), opts.max_records_per_batch)
    assert not any("api" in k or "poll" in k for k in cfg)


def test_options_map_to_librdkafkas_names_with_the_sources_own_settings() -> None:
    opts = parse_kafka_options(
        {
            **BASE,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.plain.username": "u",
            "kafka.sasl.plain.password": "hunter2",
            "kafka.ssl.cafile": __file__,
            "kafka.ssl.check.hostname": "false",
            "kafka.isolation.level": "read_uncommitted",
            "kafka.check.crcs": "false",
            "kafka.request.timeout.ms": "1234",
            "maxRecordsPerBatch": "5000",
        }
    )
    cfg = librdkafka_config(opts.consumer_config(), opts.max_records_per_batch)
    assert cfg == {
        "bootstrap.servers": "h1:9092,h2:9092",
        "group.id": "kafka_py",
        "client.id": "kafka_py",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        "allow.auto.create.topics": "false",
        "queued.min.messages": 10_000,
        "fetch.queue.backoff.ms": 5,
        "log.connection.close": False,
        "fetch.wait.max.ms": 10,
        "socket.timeout.ms": 1234,
        "isolation.level": "read_uncommitted",
        "check.crcs": "false",
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "hunter2",
        "ssl.ca.location": __file__,
        "ssl.endpoint.identification.algorithm": "none",
    }
    assert "hunter2" not in repr(opts)
    default = librdkafka_config(parse_kafka_options(BASE).consumer_config(), 10_000)
    assert default["isolation.level"] == "read_committed" and default["queued.min.messages"] == 20_000
