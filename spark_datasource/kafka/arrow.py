"""Arrow building of the ``kafka_py`` source: fetched records to record batches.

:func:`records_to_batch` (kafka-python's records) and :func:`messages_to_batch`
(librdkafka's messages) run on executors, once per fetch of a range (called by
:mod:`spark_datasource.kafka.fetch` and :mod:`spark_datasource.kafka.librdkafka_fetch`);
both build one list per column, with no per-row objects beyond the records the client
itself creates, and share :func:`columns_to_batch`, which decodes ``value`` from JSON
(:mod:`spark_datasource.kafka.json_values`) when the schema says it is a struct. Pure
pyarrow and numpy: no pyspark, no broker.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import numpy as np
import pyarrow as pa

from spark_datasource.kafka.json_values import ValueFields, arrow_value_type, decode_values


@functools.lru_cache(maxsize=8)
def arrow_schema(value_fields: ValueFields | None = None, include_headers: bool = True) -> pa.Schema:
    """The Arrow schema Spark expects for the source's Spark schema
    (:func:`spark_datasource.kafka.reader.source_schema`; checked field by field).

    Spelled out in pyarrow rather than derived with ``pyspark.sql.pandas.types``, whose
    import pulls in pandas and would slow every fresh Python worker's first read (a
    test checks the two agree).
    """
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    value = pa.binary() if value_fields is None else arrow_value_type(value_fields)
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", value),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


def records_to_batch(records: list[Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """One Arrow record batch from one fetch of one partition by kafka-python (columns
    built from lists; ``value`` decoded from JSON when ``schema`` says it is a struct)."""
    # Microseconds built in Python rather than with pyarrow.compute, whose first call
    # in a fresh Python worker is far slower than this list comprehension.
    ts = pa.array([r.timestamp * 1000 for r in records], schema.field("timestamp").type)
    return columns_to_batch(
        Columns(
            keys=[r.key for r in records],
            values=[r.value for r in records],
            offsets=[r.offset for r in records],
            timestamps=ts,
            timestamp_types=pa.array([r.timestamp_type for r in records], pa.int32()),
            headers=[r.headers for r in records] if "headers" in schema.names else None,
        ),
        topic,
        partition,
        schema,
    )


def messages_to_batch(messages: list[Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """One Arrow record batch from ``confluent_kafka.Message`` objects of one partition.

    Each column is one ``map`` of the message's C accessor over the list (no Python
    frame per record); timestamps and their types come out of one numpy array filled
    from the ``(type, ms)`` pairs. librdkafka's timestamp types are 1 (create time) and 2
    (log-append time), Spark's 0 and 1.
    """
    from confluent_kafka import Message

    stamps = map(Message.timestamp, messages)
    pairs = np.fromiter(itertools.chain.from_iterable(stamps), np.int64, 2 * len(messages)).reshape(-1, 2)
    return columns_to_batch(
        Columns(
            keys=list(map(Message.key, messages)),
            values=list(map(Message.value, messages)),
            offsets=list(map(Message.offset, messages)),  # type: ignore[arg-type]  # never None for a record
            timestamps=pa.array(pairs[:, 1] * 1000, schema.field("timestamp").type),
            timestamp_types=pa.array((pairs[:, 0] == _LOG_APPEND_TIME).astype(np.int32), pa.int32()),
            headers=list(map(Message.headers, messages)) if "headers" in schema.names else None,
        ),
        topic,
        partition,
        schema,
    )


#: librdkafka's ``TIMESTAMP_LOG_APPEND_TIME``.
_LOG_APPEND_TIME = 2


@dataclasses.dataclass
class Columns:
    """The per-record columns of one fetch, whichever client read it."""

    keys: list[Any]
    values: list[Any]
    offsets: list[int]
    timestamps: pa.Array
    timestamp_types: pa.Array
    headers: list[Any] | None


def columns_to_batch(c: Columns, topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """The record batch of ``schema`` from one fetch's columns (``value`` decoded from JSON
    when ``schema`` says it is a struct; ``headers`` when it has them)."""
    n = len(c.offsets)
    value_type = schema.field("value").type
    if pa.types.is_struct(value_type):
        value_column = decode_values(c.values, value_type, topic, partition, c.offsets)
    else:
        value_column = pa.array(c.values, pa.binary())
    columns = [
        pa.array(c.keys, pa.binary()),
        value_column,
        pa.repeat(topic, n) if n else pa.array([], pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(c.offsets, pa.int64()),
        c.timestamps,
        c.timestamp_types,
    ]
    if "headers" in schema.names:
        columns.append(_headers_column(c.headers or [None] * n, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _headers_column(header_lists: list[Any], headers_type: pa.DataType) -> pa.Array:
    """The ``headers`` column (``includeHeaders=true``): a list of (key, value) structs per record."""
    n = len(header_lists)
    lengths = [len(h) if h else 0 for h in header_lists]
    if any(lengths):
        flat = [kv for h in header_lists if h for kv in h]
        hkeys = pa.array([k for k, _ in flat], pa.string())
        hvalues = pa.array([v for _, v in flat], pa.binary())
        struct = pa.StructArray.from_arrays([hkeys, hvalues], fields=list(headers_type.value_type))
        bounds = [0] * (n + 1)
        acc = 0
        for i, ln in enumerate(lengths):
            acc += ln
            bounds[i + 1] = acc
        return pa.ListArray.from_arrays(pa.array(bounds, pa.int32()), struct, type=headers_type)
    return pa.array([[]] * n, headers_type)
