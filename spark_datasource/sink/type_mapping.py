"""The Spark edge of the type handling: Spark and Arrow types to new ClickHouse columns.

- :func:`spark_to_clickhouse` / :func:`arrow_to_clickhouse`: the ClickHouse type a
  new table column gets for a Spark or Arrow type (used by ``create_table``).
- :func:`spark_schema_to_arrow`: the Arrow schema executors will receive.

Whether data fits an *existing* table is decided in ``clickhouse_tx`` (one parser,
:mod:`clickhouse_tx.conversion.chtypes`; one check, :func:`clickhouse_tx.conversion.schema.check_schema`;
values checked on executors by :mod:`clickhouse_tx.conversion.convert`), which knows no Spark.

All functions are pure and run on the driver, once per query or job.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

from clickhouse_tx.client.sql import quote_option_identifier
from clickhouse_tx.errors import ConfigurationError

__all__ = ["arrow_to_clickhouse", "spark_schema_to_arrow", "spark_to_clickhouse"]

# ---------------------------------------------------------------------------
# Spark / Arrow -> ClickHouse (for CREATE TABLE)
# ---------------------------------------------------------------------------

# ClickHouse cannot wrap these in Nullable (Tuple can since 24.x, but older
# servers refuse it, so new tables never get Nullable(Tuple)).
_NEVER_NULLABLE = ("Array", "Map", "Tuple")

_TS_PRECISION = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _nullable(ch: str, nullable: bool) -> str:
    if not nullable or ch.startswith(_NEVER_NULLABLE):
        return ch
    return f"Nullable({ch})"


def spark_to_clickhouse(dt: T.DataType, nullable: bool = False, *, column: str = "?") -> str:
    """The ClickHouse type a new column gets for a Spark type.

    Parameters
    ----------
    dt
        A ``pyspark.sql.types`` data type (nested types are mapped recursively).
    nullable
        Whether the Spark field is nullable; scalar types become ``Nullable(...)``.
        ``Array``, ``Map`` and ``Tuple`` are never wrapped: a null there arrives as an
        empty value (documented in ``docs/options.md``).
    column
        Column name for error messages.

    Raises
    ------
    ConfigurationError
        For types with no faithful ClickHouse column (NullType, YearMonthInterval,
        CalendarInterval, Variant), naming the column and the type.
    """
    if isinstance(dt, T.UserDefinedType):
        return spark_to_clickhouse(dt.sqlType(), nullable, column=column)
    scalar = _scalar_type(dt)
    if scalar is not None:
        return _nullable(scalar, nullable)
    nested = _nested_type(dt, column)
    if nested is not None:
        return nested
    raise _no_column_type(dt, column)


def _scalar_type(dt: T.DataType) -> str | None:
    """The ClickHouse type of a scalar Spark type (before ``Nullable``), or None for any other type."""
    simple: list[tuple[type, str]] = [
        (T.BooleanType, "Bool"),
        (T.ByteType, "Int8"),
        (T.ShortType, "Int16"),
        (T.IntegerType, "Int32"),
        (T.LongType, "Int64"),
        (T.FloatType, "Float32"),
        (T.DoubleType, "Float64"),
        (T.StringType, "String"),
        (T.CharType, "String"),
        (T.VarcharType, "String"),
        (T.BinaryType, "String"),
        (T.DateType, "Date32"),
        # Both timestamp kinds go to a UTC column: Spark ships them as epoch micros,
        # and a column without a zone is displayed in the *server's* zone, which
        # would shift a TimestampNTZ wall-clock value on any non-UTC server.
        (T.TimestampType, "DateTime64(6, 'UTC')"),
        (T.TimestampNTZType, "DateTime64(6, 'UTC')"),
        # Spark ships DayTimeInterval as Arrow duration[us]: stored as Int64 microseconds.
        (T.DayTimeIntervalType, "Int64"),
    ]
    for cls, ch in simple:
        if isinstance(dt, cls):
            return ch
    if isinstance(dt, T.DecimalType):
        return f"Decimal({dt.precision}, {dt.scale})"
    if isinstance(dt, T.TimeType):
        return f"Time64({dt.precision})"
    return None


def _nested_type(dt: T.DataType, column: str) -> str | None:
    """The ClickHouse type of an array, map, struct or geo type (never ``Nullable``), or None."""
    if isinstance(dt, T.ArrayType):
        inner = spark_to_clickhouse(dt.elementType, dt.containsNull, column=column)
        return f"Array({inner})"
    if isinstance(dt, T.MapType):
        k = spark_to_clickhouse(dt.keyType, False, column=column)
        v = spark_to_clickhouse(dt.valueType, dt.valueContainsNull, column=column)
        return f"Map({k}, {v})"
    if isinstance(dt, T.StructType):
        if not dt.fields:
            raise ConfigurationError(f"column `{column}`: an empty struct has no ClickHouse type")
        parts = [
            f"{quote_option_identifier(f.name)} {spark_to_clickhouse(f.dataType, f.nullable, column=column)}"
            for f in dt.fields
        ]
        return f"Tuple({', '.join(parts)})"
    if isinstance(dt, (T.GeometryType, T.GeographyType)):
        # Spark ships these as struct<srid int32, wkb binary>; ClickHouse reads WKB
        # with readWKB(), so keep the bytes as they come.
        return "Tuple(srid Int32, wkb String)"
    return None


def _no_column_type(dt: T.DataType, column: str) -> ConfigurationError:
    """The error for a Spark type no ClickHouse column holds faithfully: what to do instead."""
    hints = {
        T.NullType: "cast it to a concrete type (a ClickHouse column cannot be Nullable(Nothing))",
        T.VariantType: "convert it with to_json() and write a String (or JSON) column",
        T.YearMonthIntervalType: "Spark cannot send it to a Python data source; cast it to an integer",
        T.CalendarIntervalType: "Spark cannot send it to a Python data source; cast it to a string",
    }
    for cls, hint in hints.items():
        if isinstance(dt, cls):
            return ConfigurationError(
                f"column `{column}`: Spark type {dt.simpleString()} has no ClickHouse column type: {hint}"
            )
    return ConfigurationError(f"column `{column}`: unsupported Spark type {dt.simpleString()}")


def arrow_to_clickhouse(at: pa.DataType, nullable: bool = False, *, column: str = "?") -> str:
    """The ClickHouse type a new column gets for an Arrow type (same rules as Spark's)."""
    if pa.types.is_dictionary(at):
        return arrow_to_clickhouse(at.value_type, nullable, column=column)
    if pa.types.is_boolean(at):
        ch = "Bool"
    elif pa.types.is_integer(at):
        ch = f"{'UInt' if pa.types.is_unsigned_integer(at) else 'Int'}{at.bit_width}"
    elif pa.types.is_float16(at) or pa.types.is_float32(at):
        ch = "Float32"
    elif pa.types.is_float64(at):
        ch = "Float64"
    elif pa.types.is_decimal(at):
        ch = f"Decimal({at.precision}, {at.scale})"
    elif pa.types.is_string(at) or pa.types.is_large_string(at) or _is_view(at, "string"):
        ch = "String"
    elif pa.types.is_fixed_size_binary(at):
        ch = f"FixedString({at.byte_width})"
    elif pa.types.is_binary(at) or pa.types.is_large_binary(at) or _is_view(at, "binary"):
        ch = "String"
    elif pa.types.is_date(at):
        ch = "Date32"
    elif pa.types.is_timestamp(at):
        ch = f"DateTime64({_TS_PRECISION[at.unit]}, 'UTC')"
    elif pa.types.is_duration(at):
        ch = "Int64"
    elif pa.types.is_time(at):
        ch = f"Time64({min(_TS_PRECISION[at.unit], 9)})"
    elif pa.types.is_list(at) or pa.types.is_large_list(at) or pa.types.is_fixed_size_list(at):
        f = at.value_field
        return f"Array({arrow_to_clickhouse(f.type, f.nullable, column=column)})"
    elif pa.types.is_map(at):
        k = arrow_to_clickhouse(at.key_type, False, column=column)
        v = arrow_to_clickhouse(at.item_type, at.item_field.nullable, column=column)
        return f"Map({k}, {v})"
    elif pa.types.is_struct(at):
        if at.num_fields == 0:
            raise ConfigurationError(f"column `{column}`: an empty struct has no ClickHouse type")
        parts = [
            f"{quote_option_identifier(at.field(i).name)} "
            f"{arrow_to_clickhouse(at.field(i).type, at.field(i).nullable, column=column)}"
            for i in range(at.num_fields)
        ]
        return f"Tuple({', '.join(parts)})"
    elif pa.types.is_null(at):
        raise ConfigurationError(
            f"column `{column}`: Arrow type null has no ClickHouse column type: cast it to a concrete type"
        )
    else:
        raise ConfigurationError(f"column `{column}`: unsupported Arrow type {at}")
    return _nullable(ch, nullable)


def _is_view(at: pa.DataType, kind: str) -> bool:
    fn = getattr(pa.types, f"is_{kind}_view", None)
    return bool(fn and fn(at))


def spark_schema_to_arrow(schema: T.StructType) -> pa.Schema:
    """The Arrow schema Spark sends to a Python Arrow writer for ``schema``.

    Uses pyspark's own converter (timestamps tagged UTC, the zone does not change the
    instant), so the check runs on exactly the types the executors will receive.

    Raises
    ------
    ConfigurationError
        Naming the column whose type Spark cannot convert to Arrow.
    """
    from pyspark.sql.pandas.types import to_arrow_type

    fields = []
    for f in schema.fields:
        try:
            at = to_arrow_type(_char_as_string(f.dataType), timezone="UTC")
        except Exception as e:  # pyspark raises its own error classes here
            raise ConfigurationError(
                f"column `{f.name}`: Spark type {f.dataType.simpleString()} cannot be sent "
                f"as Arrow to a Python data source ({type(e).__name__})"
            ) from None
        fields.append(pa.field(f.name, at, nullable=f.nullable))
    return pa.schema(fields)


def _char_as_string(dt: T.DataType) -> T.DataType:
    # Spark reads char/varchar data as plain strings; pyspark's Arrow converter
    # refuses the declared types, so convert them the way Spark's runtime does.
    if isinstance(dt, (T.CharType, T.VarcharType)):
        return T.StringType()
    if isinstance(dt, T.ArrayType):
        return T.ArrayType(_char_as_string(dt.elementType), dt.containsNull)
    if isinstance(dt, T.MapType):
        return T.MapType(_char_as_string(dt.keyType), _char_as_string(dt.valueType), dt.valueContainsNull)
    if isinstance(dt, T.StructType):
        return T.StructType(
            [T.StructField(f.name, _char_as_string(f.dataType), f.nullable, f.metadata) for f in dt.fields]
        )
    return dt
