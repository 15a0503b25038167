"""The run's Kafka topic (created, filled, its end offsets) and its ClickHouse target table.

Calling process of :func:`spark_datasource.testing.pipeline.run_pipeline` and of chaos runs.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import requests

from clickhouse_tx.client.sql import qualified, quote_identifier, split_table
from spark_datasource.testing.credentials import http_auth
from spark_datasource.testing.streaming_job import TABLE_COLUMNS


def event_json(event_id: int, ts_ms: int) -> bytes:
    """One event, ~60 bytes: small, because the dev broker keeps ~5 MiB per partition."""
    return (
        f'{{"event_id":{event_id},"user_id":{event_id * 7919 % 100000},'
        f'"amount":{event_id % 10000 / 100:.2f},"ts":{ts_ms}}}'
    ).encode()


# ------------------------------------------------------------------------------ Kafka


def create_topic(bootstrap: str, control: str | None, topic: str, partitions: int) -> None:
    """Create ``topic`` through the dev broker's control endpoint, else the Kafka admin API."""
    if control:
        from server_patches.kafka_broker import create_topic as mock_create

        mock_create(control, topic, partitions)
        return
    from confluent_kafka.admin import AdminClient, NewTopic

    fut = AdminClient({"bootstrap.servers": bootstrap}).create_topics([NewTopic(topic, partitions, 1)])
    fut[topic].result(30)


def produce(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: int,
    *,
    first_id: int = 0,
    rate: float | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Produce events ``first_id .. first_id+n-1``, event i to partition i % partitions.

    ``rate`` paces production (events/s) so a running job sees a steady stream.
    Returns how many were acknowledged; raises if any delivery failed.
    """
    from confluent_kafka import Producer

    prod = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "none",
            "enable.idempotence": False,
            "acks": 1,
        }
    )
    errors: list[str] = []
    acked = [0]

    def cb(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[0] += 1

    t0 = time.monotonic()
    step = 1000 if rate is None else max(1, int(rate / 20))
    for start in range(first_id, first_id + n, step):
        if stop is not None and stop.is_set():
            break
        now_ms = int(time.time() * 1000)
        for i in range(start, min(start + step, first_id + n)):
            while True:
                try:
                    prod.produce(topic, event_json(i, now_ms), partition=i % partitions, on_delivery=cb)
                    break
                except BufferError:
                    prod.poll(0.05)
        prod.poll(0)
        if rate is not None:
            due = t0 + (start + step - first_id) / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if on_progress:
            on_progress(acked[0])
    prod.flush(60)
    if errors:
        raise RuntimeError(f"{len(errors)} events were not delivered to {topic}; first: {errors[0]}")
    return acked[0]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, dict[str, list[int]]]:
    """``{topic: {partition: [low, high]}}`` watermarks, from Kafka."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "clickhouse-tx-pipeline-verify", "enable.auto.commit": False}
    )
    try:
        out = {}
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            out[str(p)] = [int(lo), int(hi)]
        return {topic: out}
    finally:
        c.close()


# ------------------------------------------------------------------------- ClickHouse


def _ddl(url: str, sql: str) -> None:
    r = requests.post(url.rstrip("/") + "/", data=sql.encode(), timeout=120, auth=http_auth())
    if r.status_code != 200:
        raise RuntimeError(f"ClickHouse refused {sql.split('(')[0].strip()!r}: {r.text.strip()}")


def create_target(url: str, table: str, mode: str) -> None:
    """The events table: a MergeTree; with a dedup window only for the ``dedup`` mode.

    A dedup window must not be set for the other modes: ClickHouse remembers the block
    hash of an insert made in a transaction that is later rolled back, so the replay of
    the same rows after a crash is silently dropped as a duplicate (seen: a whole
    batch lost while its markers committed).
    """
    db, t = split_table(table)
    _ddl(url, f"CREATE DATABASE IF NOT EXISTS {quote_identifier(db)}")
    cols = ",\n  ".join(f"{quote_identifier(n)} {ty}" for n, ty in TABLE_COLUMNS)
    _ddl(
        url,
        f"CREATE TABLE IF NOT EXISTS {qualified(db, t)} (\n  {cols}\n) "
        "ENGINE = MergeTree ORDER BY (`topic`, `partition`, `offset`)"
        + (" SETTINGS non_replicated_deduplication_window = 10000" if mode == "dedup" else ""),
    )
