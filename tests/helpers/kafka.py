"""Topics on the dev Kafka broker with known records, and the rows the ``kafka_py`` reader gives back."""

from __future__ import annotations

import uuid
from typing import Any, Mapping

import pyarrow as pa
from kafka import KafkaProducer

from server_patches.kafka_broker import create_topic, delete_records
from spark_datasource.kafka.arrow import arrow_schema

#: Both clients ``kafka_py`` reads with (``kafka.client``), for tests parametrized over them.
CLIENTS = ("kafka-python", "librdkafka")


def produce(
    bootstrap: str, topic: str, counts: dict[int, int], tag: str = "v", client: Mapping[str, Any] | None = None
) -> set:
    """Produce ``counts[p]`` records to each partition; return {(partition, value)}.

    ``client``: extra kafka-python settings (TLS, SASL) for a broker behind a front.
    """
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **dict(client or {}))
    sent = set()
    for part, n in counts.items():
        for i in range(n):
            value = f"{tag}-{part}-{i}".encode()
            p.send(topic, key=b"k%d" % i, value=value, partition=part, headers=[("i", str(i).encode())])
            sent.add((part, value))
    p.flush()
    p.close()
    return sent


def produce_then_delete_head(bootstrap: str, control: str, topic: str, n: int, deleted: int) -> None:
    """Produce ``n`` records to partition 0, one producer batch each, then delete the
    first ``deleted`` of them (as retention does) through the broker's control address."""
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    for i in range(n):
        p.send(topic, value=b"%d" % i, partition=0).get(timeout=10)  # one batch each
    p.close()
    delete_records(control, topic, 0, deleted)


def new_topic(control: str, partitions: int) -> str:
    """A new topic of ``partitions`` partitions, created through the broker's control address."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    create_topic(control, name, partitions)
    return name


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple]:
    """(partition, offset, value) of every record the reader returned."""
    t = pa.Table.from_batches(batches, schema=batches[0].schema if batches else arrow_schema(None, False))
    return list(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), t["value"].to_pylist()))
