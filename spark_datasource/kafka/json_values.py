"""JSON record values decoded by ``kafka_py`` itself: ``value.format=json``.

With ``value.format=json`` and ``value.schema`` (flat DDL: ``name TYPE, ...``), the
source's ``value`` column is a struct of those fields instead of the raw bytes, as
``from_json(col("value").cast("string"), schema)`` would give, but decoded on the
executor by Arrow's C++ JSON reader: one call per fetch, a fraction of the CPU Spark's
``from_json`` spends (docs/performance.md gives the measurement).

Decoding is strict, so no value is silently changed: a record whose value is not one
JSON object whose fields fit their types (``1.5`` or ``"5"`` for a ``BIGINT``,
``300`` for a ``TINYINT``, ``5`` for a ``STRING``, two objects, or an empty value)
fails the read, naming topic, partition, offset and Arrow's reason. Fields missing
from an object, and JSON ``null``, are null; fields not in the schema are ignored; a
record with no value (a tombstone) has a null struct.

Where things run
----------------
- :func:`parse_value_schema`: the driver, when the DataFrame is defined (errors name
  the option).
- :func:`decode_values`: executors, once per fetch of a range (up to
  ``maxRecordsPerBatch`` records), in :func:`spark_datasource.kafka.arrow.records_to_batch`.
  A pure function of the bytes, so a replayed range decodes to the same rows.
"""

from __future__ import annotations

import re
from typing import Sequence

import pyarrow as pa
import pyarrow.json as pa_json

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.errors import KafkaValueFormatError

#: DDL type names ``value.schema`` accepts (upper case) → canonical name: Spark's own
#: JSON name of the type, from which ``spark_datasource.kafka.reader`` builds the
#: Spark type (this module imports no pyspark).
_ALIASES = {
    "BOOLEAN": "boolean",
    "TINYINT": "byte",
    "BYTE": "byte",
    "SMALLINT": "short",
    "SHORT": "short",
    "INT": "integer",
    "INTEGER": "integer",
    "BIGINT": "long",
    "LONG": "long",
    "FLOAT": "float",
    "REAL": "float",
    "DOUBLE": "double",
    "STRING": "string",
}

#: Canonical name → the Arrow type Spark expects for it. Spelled out rather than
#: derived with pyspark's Arrow converter, whose import pulls in pandas (a test checks
#: the two agree).
_ARROW_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
}

_FIELD = re.compile(r"\s*(?:`((?:[^`]|``)+)`|([A-Za-z_][A-Za-z0-9_]*))\s*:?\s*([A-Za-z]+)\s*")

#: How much of a malformed value an error shows.
_SHOWN_BYTES = 200

ValueFields = tuple[tuple[str, str], ...]


def parse_value_schema(ddl: str) -> ValueFields:
    """``(name, canonical type)`` of each field of a flat DDL schema (driver).

    Raises
    ------
    ConfigurationError
        Naming ``value.schema`` and the part it cannot take: a nested or unsupported
        type, a repeated field, or text that is not ``name TYPE[, name TYPE ...]``.
    """
    fields: list[tuple[str, str]] = []
    for part in _split_fields(ddl):
        m = _FIELD.fullmatch(part)
        if m is None:
            raise _schema_error(f"cannot read {part.strip()!r} as `name TYPE`")
        name = m.group(1).replace("``", "`") if m.group(1) is not None else m.group(2)
        canonical = _ALIASES.get(m.group(3).upper())
        if canonical is None:
            raise _schema_error(
                f"field `{name}` has type {m.group(3)!r}; decoded in the source are "
                f"{', '.join(sorted(_ALIASES))}. For other types read the raw value "
                f"(no value.format) and use from_json"
            )
        if any(name.lower() == n.lower() for n, _ in fields):
            raise _schema_error(f"field `{name}` is given twice")
        fields.append((name, canonical))
    return tuple(fields)


def _split_fields(ddl: str) -> list[str]:
    if not ddl.strip():
        raise _schema_error("is empty")
    if "<" in ddl or "(" in ddl:
        raise _schema_error("nested and parameterised types are not decoded in the source; use from_json")
    return ddl.split(",")


def _schema_error(problem: str) -> ConfigurationError:
    return ConfigurationError(f"kafka_py option 'value.schema': {problem}")


def arrow_value_type(fields: ValueFields) -> pa.StructType:
    """The Arrow type Spark expects for the decoded ``value`` column
    (:func:`spark_datasource.kafka.reader.spark_value_type` is its Spark type)."""
    return pa.struct([pa.field(name, _ARROW_TYPES[t]) for name, t in fields])


def decode_values(
    values: Sequence[bytes | None], value_type: pa.StructType, topic: str, partition: int, offsets: Sequence[int]
) -> pa.Array:
    """The ``value`` column of one fetch: each record's JSON object as a struct (executor).

    ``offsets[i]`` is the offset of ``values[i]``; only errors use them. One Arrow JSON
    read decodes every present value; when it fails, or gives another number of rows
    than there are values (an empty value, two objects in one), halving finds the
    first value that fails alone, and the error names it.

    Raises
    ------
    KafkaValueFormatError
        Naming topic, partition and offset of the first value that does not decode.
    """
    objects = [v for v in values if v is not None]
    decoded = _decode_or_none(objects, value_type)
    if decoded is not None and len(objects) == len(values):
        return decoded
    # Tombstones, or a value that does not decode: only now the positions are needed.
    present = [i for i, v in enumerate(values) if v is not None]
    if decoded is None:
        bad = _first_undecodable(objects, value_type)
        raise _value_error(objects[bad], value_type, topic, partition, offsets[present[bad]])
    at: list[int | None] = [None] * len(values)
    for row, i in enumerate(present):
        at[i] = row
    return decoded.take(pa.array(at, pa.int32()))


def _read(values: Sequence[bytes], value_type: pa.StructType) -> pa.Table:
    body = b"\n".join(values)
    return pa_json.read_json(
        pa.BufferReader(body),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=max(1 << 20, len(body) + 1)),
        parse_options=pa_json.ParseOptions(
            explicit_schema=pa.schema(list(value_type)),
            unexpected_field_behavior="ignore",
            # a value printed over several lines would otherwise read as several rows
            newlines_in_values=body.count(b"\n") != len(values) - 1,
        ),
    )


def _decode_or_none(values: Sequence[bytes], value_type: pa.StructType) -> pa.StructArray | None:
    """The struct of ``values``, one row each, or None when any value does not decode."""
    if not values:
        return pa.array([], value_type)
    try:
        table = _read(values, value_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(values):
        return None
    return table.to_struct_array().combine_chunks()


def _first_undecodable(values: Sequence[bytes], value_type: pa.StructType) -> int:
    """The index of the first value that does not decode alone (halving: log2(n) reads)."""
    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _decode_or_none(values[lo:mid], value_type) is None:
            hi = mid
        else:
            lo = mid
    return lo


def _value_error(
    value: bytes, value_type: pa.StructType, topic: str, partition: int, offset: int
) -> KafkaValueFormatError:
    try:
        got = _read([value], value_type).num_rows
        reason = "not one JSON object" if got != 1 else "it decodes alone but not among its neighbours"
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        reason = str(e)
    shown = value[:_SHOWN_BYTES].decode("utf-8", "backslashreplace")
    more = f" ... ({len(value)} bytes)" if len(value) > _SHOWN_BYTES else ""
    return KafkaValueFormatError(
        f"kafka_py: the value at {topic}[{partition}] offset {offset} does not decode as "
        f"value.schema with value.format=json: {reason}; value: {shown!r}{more}. "
        f"Decoding is strict (no value is changed to fit); to read such records, leave "
        f"value.format unset and parse the raw value with from_json"
    )
