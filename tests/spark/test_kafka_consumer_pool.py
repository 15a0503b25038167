"""The executors' pool of consumers, against the real dev broker, with both clients.

A Python worker keeps the consumer of each topic-partition it read and reuses it for
the next range of that partition (the next micro-batch), positioned by ``seek``
(kafka-python) or by its assignment (librdkafka). The replacement of a consumer whose
connections died is kafka-python's (librdkafka reconnects by itself). What
must hold: the same offsets give the same rows whether the consumer is new or pooled;
idle consumers close; a consumer whose connection died is replaced; one that failed is
never reused; consumers of different settings are never shared.
"""

from __future__ import annotations

import time

import pytest

from spark_datasource.kafka.arrow import arrow_schema
from spark_datasource.kafka.consumers import ConsumerPool
from spark_datasource.kafka.errors import KafkaDataLossError
from spark_datasource.kafka.fetch import read_range
from spark_datasource.kafka.offsets import KafkaOffsetRange
from spark_datasource.kafka.options import parse_kafka_options
from spark_datasource.kafka.reader import SCHEMA
from tests.helpers.kafka import CLIENTS, new_topic, produce, produce_then_delete_head, rows_of


def _opts(bootstrap: str, topic: str, client: str = "kafka-python", **extra: str):  # type: ignore[no-untyped-def]
    options = {"bootstrap.servers": bootstrap, "subscribe": topic, "kafka.client": client, **extra}
    return parse_kafka_options(options, streaming=True)


def _read(opts, rng: KafkaOffsetRange, pool: ConsumerPool) -> list[tuple]:  # type: ignore[no-untyped-def]
    return rows_of(list(read_range(opts, rng, pool)))


@pytest.mark.parametrize("client", CLIENTS)
def test_the_same_offsets_read_twice_through_the_pool_give_the_same_rows_in_the_same_order(
    broker: tuple[str, str],
    client: str,
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    produce(bootstrap, topic, {0: 300, 1: 40})
    opts, pool = _opts(bootstrap, topic, client), ConsumerPool()
    try:
        rng = KafkaOffsetRange(topic, 0, 17, 230)
        fresh = _read(opts, rng, ConsumerPool())
        first = _read(opts, rng, pool)
        second = _read(opts, rng, pool)  # pooled consumer, sought back to 17
    finally:
        pool.close_all()
    assert first == second == fresh
    assert [o for _, o, _ in first] == list(range(17, 230))
    assert (pool.stats.created, pool.stats.reused) == (1, 1)


@pytest.mark.parametrize("client", CLIENTS)
def test_consecutive_ranges_of_a_partition_reuse_one_consumer_and_read_every_record_once(
    broker: tuple[str, str],
    client: str,
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    produce(bootstrap, topic, {0: 500, 1: 500})
    opts, pool = _opts(bootstrap, topic, client, maxRecordsPerBatch="64"), ConsumerPool()
    rows = []
    try:
        for start in range(0, 500, 125):  # as four micro-batches over two partitions
            for part in (0, 1):
                rows += _read(opts, KafkaOffsetRange(topic, part, start, start + 125), pool)
    finally:
        pool.close_all()
    for part in (0, 1):
        assert [o for p, o, _ in rows if p == part] == list(range(500))
    assert (pool.stats.created, pool.stats.reused) == (2, 6)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_consumer_idle_longer_than_the_idle_time_is_closed(broker: tuple[str, str], client: str) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce(bootstrap, topic, {0: 10})
    opts, pool = _opts(bootstrap, topic, client), ConsumerPool(idle_s=0.2)
    _read(opts, KafkaOffsetRange(topic, 0, 0, 10), pool)
    assert pool.idle_count() == 1
    time.sleep(0.4)
    pool.close_idle()
    assert pool.idle_count() == 0 and pool.stats.closed_idle == 1
    assert [o for _, o, _ in _read(opts, KafkaOffsetRange(topic, 0, 0, 10), pool)] == list(range(10))
    assert pool.stats.created == 2 and pool.stats.reused == 0
    pool.close_all()


def test_a_pooled_consumer_whose_broker_connection_died_is_replaced_and_still_reads_every_record(
    broker: tuple[str, str],
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce(bootstrap, topic, {0: 200})
    opts, pool = _opts(bootstrap, topic), ConsumerPool()
    try:
        _read(opts, KafkaOffsetRange(topic, 0, 0, 100), pool)
        ((_, pooled),) = pool._idle.values()
        for conn in list(pooled._client._conns.values()):
            conn.close()  # as when the broker resets an idle connection
        rows = _read(opts, KafkaOffsetRange(topic, 0, 100, 200), pool)
        ((_, now_pooled),) = pool._idle.values()
    finally:
        pool.close_all()
    assert [o for _, o, _ in rows] == list(range(100, 200))
    assert pool.stats.replaced == 1 and pool.stats.created == 2
    assert now_pooled is not pooled


@pytest.mark.parametrize("client", CLIENTS)
def test_a_read_that_fails_closes_its_consumer_instead_of_pooling_it(broker: tuple[str, str], client: str) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce_then_delete_head(bootstrap, control, topic, 20, deleted=8)
    opts, pool = _opts(bootstrap, topic, client), ConsumerPool()
    with pytest.raises(KafkaDataLossError):
        _read(opts, KafkaOffsetRange(topic, 0, 2, 20), pool)
    assert pool.idle_count() == 0 and pool.stats.discarded == 1
    assert [o for _, o, _ in _read(opts, KafkaOffsetRange(topic, 0, 8, 20), pool)] == list(range(8, 20))
    pool.close_all()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_reader_that_stops_early_returns_its_consumer_and_the_next_range_is_still_exact(
    broker: tuple[str, str],
    client: str,
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce(bootstrap, topic, {0: 300})
    opts, pool = _opts(bootstrap, topic, client, maxRecordsPerBatch="50"), ConsumerPool()
    try:
        it = read_range(opts, KafkaOffsetRange(topic, 0, 0, 300), pool)
        next(it)
        it.close()  # as Spark does under a LIMIT
        assert pool.idle_count() == 1
        rows = _read(opts, KafkaOffsetRange(topic, 0, 120, 300), pool)
    finally:
        pool.close_all()
    assert [o for _, o, _ in rows] == list(range(120, 300))
    assert pool.stats.reused == 1


def test_an_idle_librdkafka_consumer_is_unassigned_so_it_fetches_nothing_until_the_next_read(
    broker: tuple[str, str],
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce(bootstrap, topic, {0: 50})
    opts, pool = _opts(bootstrap, topic, "librdkafka"), ConsumerPool()
    try:
        assert len(_read(opts, KafkaOffsetRange(topic, 0, 0, 20), pool)) == 20
        ((_, pooled),) = pool._idle.values()
        assert pooled.assignment() == []
        produce(bootstrap, topic, {0: 5})
        assert [o for _, o, _ in _read(opts, KafkaOffsetRange(topic, 0, 20, 55), pool)] == list(range(20, 55))
    finally:
        pool.close_all()
    assert (pool.stats.created, pool.stats.reused) == (1, 1)


def test_the_spelled_out_arrow_schema_is_the_one_pyspark_derives_from_the_spark_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert arrow_schema().equals(to_arrow_schema(SCHEMA, timezone="UTC"), check_metadata=True)


def test_executors_never_wait_for_records_the_range_knows_exist() -> None:
    cfg = parse_kafka_options({"bootstrap.servers": "h:1", "subscribe": "a"}).consumer_config()
    assert cfg["fetch_max_wait_ms"] <= 10
    raised = parse_kafka_options(
        {"bootstrap.servers": "h:1", "subscribe": "a", "kafka.fetch.max.wait.ms": "500"}
    ).consumer_config()
    assert raised["fetch_max_wait_ms"] == 500
