"""Arrow building of the ``kafka_py`` source: kafka-python records to record batches.

:func:`records_to_batch` runs on executors, once per fetch of a range (called by
:mod:`spark_datasource.kafka.fetch`); it builds one list per column, with no per-row
objects beyond the records kafka-python itself creates, and decodes ``value`` from
JSON (:mod:`spark_datasource.kafka.json_values`) when the schema says it is a struct. Pure
pyarrow: no pyspark, no broker.
"""

from __future__ import annotations

import functools
from typing import Any

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
    """One Arrow record batch from one fetch of one partition (columns built from lists;
    ``value`` decoded from JSON when ``schema`` says it is a struct)."""
    n = len(records)
    keys = [r.key for r in records]
    values = [r.value for r in records]
    offsets = [r.offset for r in records]
    stamps = [r.timestamp for r in records]
    stamp_types = [r.timestamp_type for r in records]

    # Microseconds built in Python rather than with pyarrow.compute, whose first call
    # in a fresh Python worker is far slower than this list comprehension.
    ts = pa.array([s * 1000 for s in stamps], schema.field("timestamp").type)
    value_type = schema.field("value").type
    if pa.types.is_struct(value_type):
        value_column = decode_values(values, value_type, topic, partition, offsets)
    else:
        value_column = pa.array(values, pa.binary())
    columns = [
        pa.array(keys, pa.binary()),
        value_column,
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        ts,
        pa.array(stamp_types, pa.int32()),
    ]
    if "headers" in schema.names:
        columns.append(_headers_column([r.headers for r in records], schema.field("headers").type))
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
