"""Kafka topics with known records, and streaming queries from them into ClickHouse.

The records are ``"<partition>:<i>"`` at offset ``i``, so a target must hold each
(partition, offset) once with that value, whatever happened to the query in between.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from kafka import KafkaProducer

from spark_datasource.testing.credentials import target_fields, writer_options
from tests.helpers.external import create_topic
from tests.helpers.spark_writes import open_registry_entries, read_committed, run_sql


def make_topic(stack, bootstrap: str, partitions: int, per_partition: int) -> tuple[str, set[tuple[int, int, str]]]:
    """A new topic filled with ``per_partition`` records per partition; the expected rows."""
    topic = f"{os.environ.get('CLICKHOUSE_TX_RUN_PREFIX', '')}w_{uuid.uuid4().hex[:10]}"
    create_topic(stack, topic, partitions)
    return topic, extend_topic(bootstrap, topic, partitions, 0, per_partition)


def extend_topic(
    bootstrap: str, topic: str, partitions: int, start: int, per_partition: int
) -> set[tuple[int, int, str]]:
    """Append ``per_partition`` records to each partition, whose next offset is ``start``; their expected rows."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    expected = set()
    for p in range(partitions):
        for i in range(start, start + per_partition):
            producer.send(topic, value=f"{p}:{i}".encode(), partition=p)
            expected.add((p, i, f"{p}:{i}"))
    producer.flush()
    producer.close()
    return expected


def new_stream(
    stack, bootstrap: str, url: str, database: str, chk: Path, prefix: str, per_partition: int
) -> tuple[set[tuple[int, int, str]], dict]:
    """A 2-partition topic of ``per_partition`` records each and an empty target: the
    expected rows, and the :func:`start_query` arguments of a query named ``prefix_<random>``."""
    topic, expected = make_topic(stack, bootstrap, partitions=2, per_partition=per_partition)
    create_target(url, database)
    name = f"{prefix}_{uuid.uuid4().hex[:6]}"
    return expected, dict(bootstrap=bootstrap, topic=topic, url=url, database=database, chk=chk, name=name)


def create_target(url: str, database: str, table: str = "events", dedup_window: bool = False) -> None:
    """The ``(p, o, v)`` table of the Kafka streams; ``dedup_window``: one that drops a block by its token."""
    window = " SETTINGS non_replicated_deduplication_window = 1000" if dedup_window else ""
    run_sql(
        url,
        f"CREATE TABLE `{database}`.`{table}` (p Int32, o Int64, v String) ENGINE = MergeTree ORDER BY (p, o){window}",
    )


def start_query(
    sp,
    *,
    bootstrap: str,
    topic: str,
    url: str,
    database: str,
    chk: Path,
    name: str,
    max_offsets: int | None = None,
    available_now: bool = False,
    **extra: str,
):
    reader = (
        sp.readStream.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        # One Spark partition per Kafka partition even in small batches, so every
        # protocol step between two partitions' commits is reached.
        .option("minRecordsPerPartition", "1")
    )
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    writer = (
        reader.load()
        .selectExpr("partition as p", "offset as o", "cast(value as string) as v")
        .writeStream.format("clickhouse_tx")
        .queryName(name)
        .option("url", url)
        .options(**writer_options())
        .option("database", database)
        .option("table", "events")
        .option("allow_nullable_into_non_nullable", "true")
        .option("checkpointLocation", str(chk))
    )
    for k, v in extra.items():
        writer = writer.option(k, v)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def target_rows(url: str, database: str, table: str = "events") -> list[tuple[int, int, str]]:
    return [(int(p), int(o), v) for p, o, v in read_committed(url, f"SELECT p, o, v FROM `{database}`.`{table}`")]


def assert_exactly(url: str, database: str, expected: set[tuple[int, int, str]], table: str = "events") -> None:
    rows = target_rows(url, database, table)
    assert len(rows) == len(set(rows)), f"duplicates in {table}: {len(rows) - len(set(rows))}"
    missing, extra = expected - set(rows), set(rows) - expected
    assert not missing and not extra, f"{table}: {len(missing)} missing, {len(extra)} unexpected rows"


def assert_exactly_once_by_offsets(url: str, database: str, expected: set[tuple[int, int, str]]) -> None:
    """Every expected ``(p, o, v)`` row once, ``python -m clickhouse_tx verify``'s offset
    checks clean over the same partitions and offsets, no registry entry left open."""
    from clickhouse_tx.verify.verifier import verify

    assert_exactly(url, database, expected)
    spans: dict[tuple[None, int], tuple[int, int]] = {}
    for p, o, _ in expected:
        lo, hi = spans.get((None, p), (o, o + 1))
        spans[(None, p)] = (min(lo, o), max(hi, o + 1))
    report = verify(
        url, f"{database}.events", topic_col=None, partition_col="p", offset_col="o", expected=spans, **target_fields()
    )
    assert report.clean, report.summary()
    assert open_registry_entries(url, database) == 0
