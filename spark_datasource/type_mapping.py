"""Spark and Arrow types to ClickHouse types, and whether a column can be inserted.

Three things live here, all pure (no I/O, no SparkSession):

- :func:`spark_to_clickhouse` / :func:`arrow_to_clickhouse`: the ClickHouse type a
  new table column gets for a Spark or Arrow type (used by ``create_table``).
- :func:`parse_clickhouse_type`: a small parser for ClickHouse type expressions as
  ``system.columns`` prints them (``Nullable(...)``, ``Array(...)``, named
  ``Tuple(...)``, ``Enum8('a' = 1)``, ``DateTime64(6, 'UTC')``, ...).
- :func:`check_compatible`: a data schema against an existing table's columns.

Why a relation of our own instead of letting the server decide: measured on
ClickHouse 26.9 (chdb), ``INSERT ... FORMAT ArrowStream`` converts almost anything
silently: int64 300 into ``Int8`` stores 44, a null into ``Int32`` stores 0, an Arrow
column the table does not have is dropped, a struct field whose name the ``Tuple``
does not have is dropped. :func:`check_compatible` refuses those up front, naming the
column and both types. See ``docs/options.md`` for the measured pairs.

All functions run on the driver, once per query or job (``validate``); they may
also run on executors. Nothing here holds state; every value is picklable.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Iterable, Sequence, Union

import pyarrow as pa
from pyspark.sql import types as T

from clickhouse_tx.errors import ConfigurationError

__all__ = [
    "CHType",
    "TableColumn",
    "arrow_to_clickhouse",
    "check_compatible",
    "parse_clickhouse_type",
    "spark_schema_to_arrow",
    "spark_to_clickhouse",
]

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


def _tuple_element_name(name: str) -> str:
    # A Tuple element name is an identifier inside a type string: quote it the way
    # ClickHouse itself prints such names (backslash escapes inside backticks).
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


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
    simple: list[tuple[type, str]] = [
        (T.BooleanType, "Bool"), (T.ByteType, "Int8"), (T.ShortType, "Int16"),
        (T.IntegerType, "Int32"), (T.LongType, "Int64"), (T.FloatType, "Float32"),
        (T.DoubleType, "Float64"), (T.StringType, "String"), (T.CharType, "String"),
        (T.VarcharType, "String"), (T.BinaryType, "String"), (T.DateType, "Date32"),
        # Both timestamp kinds go to a UTC column: Spark ships them as epoch micros,
        # and a column without a zone is displayed in the *server's* zone, which
        # would shift a TimestampNTZ wall-clock value on any non-UTC server.
        (T.TimestampType, "DateTime64(6, 'UTC')"), (T.TimestampNTZType, "DateTime64(6, 'UTC')"),
        # Spark ships DayTimeInterval as Arrow duration[us]: stored as Int64 microseconds.
        (T.DayTimeIntervalType, "Int64"),
    ]
    for cls, ch in simple:
        if isinstance(dt, cls):
            return _nullable(ch, nullable)
    if isinstance(dt, T.DecimalType):
        return _nullable(f"Decimal({dt.precision}, {dt.scale})", nullable)
    if isinstance(dt, T.TimeType):
        return _nullable(f"Time64({dt.precision})", nullable)
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
            f"{_tuple_element_name(f.name)} {spark_to_clickhouse(f.dataType, f.nullable, column=column)}"
            for f in dt.fields
        ]
        return f"Tuple({', '.join(parts)})"
    if isinstance(dt, (T.GeometryType, T.GeographyType)):
        # Spark ships these as struct<srid int32, wkb binary>; ClickHouse reads WKB
        # with readWKB(), so keep the bytes as they come.
        return "Tuple(srid Int32, wkb String)"
    hints = {
        T.NullType: "cast it to a concrete type (a ClickHouse column cannot be Nullable(Nothing))",
        T.VariantType: "convert it with to_json() and write a String (or JSON) column",
        T.YearMonthIntervalType: "Spark cannot send it to a Python data source; cast it to an integer",
        T.CalendarIntervalType: "Spark cannot send it to a Python data source; cast it to a string",
    }
    for cls, hint in hints.items():
        if isinstance(dt, cls):
            raise ConfigurationError(
                f"column `{column}`: Spark type {dt.simpleString()} has no ClickHouse column type: {hint}"
            )
    raise ConfigurationError(f"column `{column}`: unsupported Spark type {dt.simpleString()}")


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
            f"{_tuple_element_name(at.field(i).name)} "
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
        return T.MapType(_char_as_string(dt.keyType), _char_as_string(dt.valueType),
                         dt.valueContainsNull)
    if isinstance(dt, T.StructType):
        return T.StructType([T.StructField(f.name, _char_as_string(f.dataType), f.nullable,
                                           f.metadata) for f in dt.fields])
    return dt


# ---------------------------------------------------------------------------
# ClickHouse type expressions
# ---------------------------------------------------------------------------

# Hostile input bounds: the parser is recursive.
_MAX_TYPE_LEN = 1 << 16
_MAX_DEPTH = 64

# Aliases system.columns never prints but users may type.
_ALIASES = {
    "boolean": "Bool", "bool": "Bool", "tinyint": "Int8", "smallint": "Int16",
    "int": "Int32", "integer": "Int32", "bigint": "Int64", "float": "Float32",
    "double": "Float64", "real": "Float32", "text": "String", "varchar": "String",
    "char": "String", "blob": "String", "bytea": "String", "date": "Date",
    "datetime": "DateTime", "timestamp": "DateTime",
}
_DECIMAL_N = {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38, "Decimal256": 76}
# Bodies we keep as raw text: settings-like arguments the relation never inspects.
_RAW_BODY = {"JSON", "Object", "Dynamic", "AggregateFunction", "SimpleAggregateFunction"}


@dataclasses.dataclass(frozen=True)
class CHType:
    """A parsed ClickHouse type expression.

    Attributes
    ----------
    name
        Canonical type name (``Int32``, ``Nullable``, ``Tuple``, ``Decimal`` ...).
    args
        Type arguments: nested :class:`CHType` for ``Nullable``/``Array``/``Map``/
        ``Tuple``/``Variant``/``LowCardinality``; ints and strings for ``Decimal``,
        ``DateTime64``, ``FixedString``; ``(label, value)`` pairs for ``Enum``; the raw
        body text for JSON-like types.
    names
        Element names of a named ``Tuple`` (``None`` for unnamed elements).
    """

    name: str
    args: tuple = ()
    names: tuple = ()

    def __str__(self) -> str:
        if not self.args:
            return self.name
        if self.name in _RAW_BODY:
            return f"{self.name}({self.args[0]})"
        parts = []
        for i, a in enumerate(self.args):
            if self.name.startswith("Enum"):
                parts.append(f"{_sql_string(a[0])} = {a[1]}")
            elif isinstance(a, CHType):
                n = self.names[i] if i < len(self.names) else None
                parts.append(f"{_tuple_element_name(n)} {a}" if n is not None else str(a))
            elif isinstance(a, str):
                parts.append(_sql_string(a))
            else:
                parts.append(str(a))
        return f"{self.name}({', '.join(parts)})"


def _sql_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ConfigurationError:
        shown = self.text if len(self.text) <= 200 else self.text[:200] + "..."
        return ConfigurationError(f"cannot parse ClickHouse type {shown!r}: {what} at offset {self.pos}")

    def ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise self.fail(f"expected {ch!r}")
        self.pos += 1

    def ident(self) -> str:
        """A bare or backquoted identifier."""
        self.ws()
        t = self.text
        if self.pos < len(t) and t[self.pos] in "`\"":
            return self.quoted(t[self.pos])
        start = self.pos
        while self.pos < len(t) and (t[self.pos].isalnum() or t[self.pos] in "_."):
            self.pos += 1
        if start == self.pos:
            raise self.fail("expected a name")
        return t[start:self.pos]

    def quoted(self, q: str) -> str:
        t = self.text
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(t):
                raise self.fail("unterminated quote")
            c = t[self.pos]
            if c == "\\":
                if self.pos + 1 >= len(t):
                    raise self.fail("dangling backslash")
                out.append(t[self.pos + 1])
                self.pos += 2
            elif c == q:
                if self.pos + 1 < len(t) and t[self.pos + 1] == q:  # doubled quote
                    out.append(q)
                    self.pos += 2
                else:
                    self.pos += 1
                    return "".join(out)
            else:
                out.append(c)
                self.pos += 1

    def number(self) -> int:
        self.ws()
        t = self.text
        start = self.pos
        if self.pos < len(t) and t[self.pos] in "+-":
            self.pos += 1
        while self.pos < len(t) and t[self.pos].isdigit():
            self.pos += 1
        if self.pos == start or not t[start:self.pos].lstrip("+-"):
            raise self.fail("expected a number")
        return int(t[start:self.pos])

    def raw_body(self) -> str:
        """Text up to the matching ')' (quotes respected); the ')' is consumed."""
        t = self.text
        depth = 0
        start = self.pos
        while self.pos < len(t):
            c = t[self.pos]
            if c in "'`\"":
                self.quoted(c)
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    body = t[start:self.pos].strip()
                    self.pos += 1
                    return body
                depth -= 1
            self.pos += 1
        raise self.fail("unbalanced parentheses")

    def type_(self, depth: int) -> CHType:
        if depth > _MAX_DEPTH:
            raise self.fail(f"nesting deeper than {_MAX_DEPTH}")
        name = self.ident()
        name = _ALIASES.get(name.lower(), name)
        if self.peek() != "(":
            if name in _DECIMAL_N or name in ("Nullable", "Array", "LowCardinality", "Map",
                                              "FixedString", "Enum8", "Enum16", "Decimal"):
                raise self.fail(f"{name} needs arguments")
            return CHType(name)
        self.pos += 1
        if name in _RAW_BODY:
            return CHType(name, (self.raw_body(),))
        if name in ("Enum8", "Enum16", "Enum"):
            return self.enum_body(name)
        args: list = []
        names: list = []
        if self.peek() == ")":
            self.pos += 1
        else:
            while True:
                n, a = self.argument(name, depth)
                args.append(a)
                names.append(n)
                c = self.peek()
                if c == ",":
                    self.pos += 1
                    continue
                if c == ")":
                    self.pos += 1
                    break
                raise self.fail("expected ',' or ')'")
        return self.normalise(name, tuple(args), tuple(names))

    def argument(self, owner: str, depth: int) -> tuple[str | None, object]:
        c = self.peek()
        if c == "'":
            return None, self.quoted("'")
        if c and (c.isdigit() or c in "+-"):
            return None, self.number()
        if owner in ("Tuple", "Nested"):
            # `name Type` or just `Type`: a name is followed by another name.
            save = self.pos
            first = self.ident()
            nxt = self.peek()
            if nxt and (nxt.isalpha() or nxt in "_`\""):
                return first, self.type_(depth + 1)
            self.pos = save
        return None, self.type_(depth + 1)

    def enum_body(self, name: str) -> CHType:
        pairs = []
        while True:
            if self.peek() != "'":
                raise self.fail("expected an enum label")
            label = self.quoted("'")
            if self.peek() == "=":
                self.pos += 1
                value = self.number()
            else:
                value = len(pairs) + 1  # ClickHouse numbers unlabelled values from 1
            pairs.append((label, value))
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            if c == ")":
                self.pos += 1
                break
            raise self.fail("expected ',' or ')'")
        return CHType("Enum8" if name == "Enum" else name, tuple(pairs))

    def normalise(self, name: str, args: tuple, names: tuple) -> CHType:
        def types_only(n: int | None = None) -> None:
            if n is not None and len(args) != n:
                raise self.fail(f"{name} takes {n} type argument(s), got {len(args)}")
            if not all(isinstance(a, CHType) for a in args):
                raise self.fail(f"{name} takes types as arguments")

        def ints(lo: int, hi: int) -> None:
            if not lo <= len(args) <= hi or not all(isinstance(a, int) for a in args):
                raise self.fail(f"{name} takes {lo}..{hi} integer argument(s)")

        if name in ("Nullable", "Array", "LowCardinality"):
            types_only(1)
        elif name == "Map":
            types_only(2)
        elif name in ("Tuple", "Variant", "Nested"):
            types_only()
            if name == "Tuple" and names and any(n is not None for n in names) \
                    and any(n is None for n in names):
                raise self.fail("Tuple mixes named and unnamed elements")
            return CHType(name, args, names if any(n is not None for n in names) else ())
        elif name in _DECIMAL_N:
            ints(1, 1)
            return CHType("Decimal", (_DECIMAL_N[name], args[0]))
        elif name == "Decimal":
            ints(1, 2)
            p, s = args[0], args[1] if len(args) > 1 else 0
            if not (1 <= p <= 76 and 0 <= s <= p):
                raise self.fail(f"bad Decimal precision/scale ({p}, {s})")
            return CHType("Decimal", (p, s))
        elif name == "FixedString":
            ints(1, 1)
            if args[0] < 1:
                raise self.fail("FixedString length must be positive")
        elif name in ("DateTime64", "Time64"):
            if not args or not isinstance(args[0], int) or len(args) > 2 or \
                    (len(args) == 2 and not isinstance(args[1], str)):
                raise self.fail(f"{name} takes (precision[, 'timezone'])")
            if not 0 <= args[0] <= 9:
                raise self.fail(f"{name} precision must be 0..9")
        elif name == "DateTime":
            if len(args) > 1 or (args and not isinstance(args[0], str)):
                raise self.fail("DateTime takes (['timezone'])")
        return CHType(name, args)


def parse_clickhouse_type(text: str) -> CHType:
    """Parse a ClickHouse type expression (as ``system.columns.type`` prints it).

    Raises
    ------
    ConfigurationError
        On anything malformed, with the (truncated) text and the offset.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"a ClickHouse type must be a string, got {type(text).__name__}")
    if len(text) > _MAX_TYPE_LEN:
        raise ConfigurationError(f"ClickHouse type expression is too long ({len(text)} characters)")
    p = _Parser(text)
    t = p.type_(0)
    if p.peek():
        raise p.fail("unexpected text after the type")
    return t


# ---------------------------------------------------------------------------
# The compatibility relation
# ---------------------------------------------------------------------------

_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}
_CH_INT_BITS = {f"{p}{b}": (p == "Int", b) for p in ("Int", "UInt") for b in (8, 16, 32, 64, 128, 256)}
_STRING_TARGETS = {"String", "FixedString", "Enum8", "Enum16", "UUID", "IPv4", "IPv6", "JSON", "Object"}
# Spark's TimeType holds at most 6 sub-second digits but travels as Arrow
# time64[ns]: accept Time64(6) for it rather than demand Time64(9).
_SPARK_TIME_DIGITS = 6


@dataclasses.dataclass(frozen=True)
class TableColumn:
    """One column of an existing table, as ``system.columns`` describes it.

    ``default_kind`` is ``''``, ``DEFAULT``, ``MATERIALIZED``, ``ALIAS`` or ``EPHEMERAL``.
    """

    name: str
    type: str
    default_kind: str = ""


ColumnSpec = Union[TableColumn, Sequence[str]]


def _strip(t: CHType) -> tuple[CHType, bool]:
    """(inner type, is Nullable) with LowCardinality removed at either level."""
    nullable = False
    while t.name in ("LowCardinality", "Nullable"):
        if t.name == "Nullable":
            nullable = True
        t = t.args[0]
    return t, nullable


def _arrow_int(at: pa.DataType) -> tuple[bool, int]:
    return (not pa.types.is_unsigned_integer(at), at.bit_width)


def _scalar_problem(at: pa.DataType, ch: CHType) -> str | None:
    """Why an Arrow scalar cannot go into ``ch`` (None when it can); ``ch`` is stripped."""
    n = ch.name
    if n == "Dynamic":
        return None
    if n == "Variant":
        if any(_problems(at, False, a, "", True) == [] for a in ch.args):
            return None
        return "no Variant alternative accepts it"
    if pa.types.is_boolean(at):
        return None if n == "Bool" or n in _CH_INT_BITS else "cross-kind"
    if pa.types.is_integer(at):
        signed, bits = _arrow_int(at)
        if n in _CH_INT_BITS:
            ch_signed, ch_bits = _CH_INT_BITS[n]
            if signed and not ch_signed:
                return "signed into unsigned (negative values would wrap)"
            if ch_bits > bits or (ch_bits == bits and ch_signed == signed):
                return None
            return "narrowing (values would wrap)"
        if n in ("Float32", "Float64"):
            exact = 24 if n == "Float32" else 53
            return None if bits < exact else "not exact in floating point"
        if n == "Decimal":
            p, s = ch.args
            return None if p - s >= _INT_DIGITS[bits] else "narrowing (integer digits)"
        if n == "Bool":
            return "narrowing (Bool holds 0/1)"
        return "cross-kind"
    if pa.types.is_floating(at):
        if n == "Float64" or (n == "Float32" and at.bit_width <= 32):
            return None
        return "narrowing" if n == "Float32" else "cross-kind"
    if pa.types.is_decimal(at):
        if n == "Decimal":
            p, s = ch.args
            if s >= at.scale and p - s >= at.precision - at.scale:
                return None
            return "narrowing (precision or scale)"
        return "cross-kind"
    if pa.types.is_string(at) or pa.types.is_large_string(at) or _is_view(at, "string"):
        # These targets parse the text and fail loudly on a bad value, never silently.
        return None if n in _STRING_TARGETS else "cross-kind"
    if pa.types.is_fixed_size_binary(at):
        if n == "String" or (n == "FixedString" and ch.args[0] >= at.byte_width):
            return None
        return "cross-kind" if n != "FixedString" else "narrowing"
    if pa.types.is_binary(at) or pa.types.is_large_binary(at) or _is_view(at, "binary"):
        return None if n in ("String", "FixedString") else "cross-kind"
    if pa.types.is_date(at):
        if n in ("Date32", "DateTime64"):
            return None
        if n in ("Date", "DateTime"):
            return "narrowing (Date/DateTime start at 1970; use Date32)"
        return "cross-kind"
    if pa.types.is_timestamp(at):
        if n == "DateTime64":
            return None if ch.args[0] >= _TS_PRECISION[at.unit] else "narrowing (sub-second digits)"
        if n == "DateTime":
            return "narrowing (DateTime has whole seconds from 1970; use DateTime64)"
        return "cross-kind"
    if pa.types.is_duration(at):
        if n == "Int64" or n == f"Interval{_duration_unit(at.unit)}":
            return None
        return "cross-kind (durations go into Int64 in their Arrow unit)"
    if pa.types.is_time(at):
        if n == "Time64":
            need = min(_TS_PRECISION[at.unit], _SPARK_TIME_DIGITS)
            return None if ch.args[0] >= need else "narrowing (sub-second digits)"
        return "cross-kind"
    return "unsupported Arrow type"


def _duration_unit(unit: str) -> str:
    return {"s": "Second", "ms": "Millisecond", "us": "Microsecond", "ns": "Nanosecond"}[unit]


def _problems(at: pa.DataType, nullable: bool, ch: CHType, path: str,
              allow_nullable: bool) -> list[str]:
    """Every reason ``at`` (nullable or not) cannot go into ``ch``; [] when it can."""
    if pa.types.is_dictionary(at):
        at = at.value_type
    inner, ch_nullable = _strip(ch)
    if pa.types.is_null(at):
        if ch_nullable or allow_nullable:
            return []
        return [f"{path}: all-null data into non-Nullable {ch}"]
    out: list[str] = []
    # Array/Map/Tuple cannot be Nullable on most servers: a null there becomes an
    # empty value, which is how Spark users expect arrays to land; scalars are strict.
    if nullable and not ch_nullable and not allow_nullable and inner.name not in _NEVER_NULLABLE:
        out.append(f"{path}: nullable data into non-Nullable {ch} (nulls would become "
                   f"default values; set allow_nullable_into_non_nullable=true to accept)")
    if pa.types.is_list(at) or pa.types.is_large_list(at) or pa.types.is_fixed_size_list(at):
        if inner.name != "Array":
            return out + [f"{path}: {at} into {ch} (cross-kind)"]
        f = at.value_field
        return out + _problems(f.type, f.nullable, inner.args[0], f"{path}[]", allow_nullable)
    if pa.types.is_map(at):
        if inner.name != "Map":
            return out + [f"{path}: {at} into {ch} (cross-kind)"]
        return out + _problems(at.key_type, False, inner.args[0], f"{path}.key", allow_nullable) \
            + _problems(at.item_type, at.item_field.nullable, inner.args[1], f"{path}.value",
                        allow_nullable)
    if pa.types.is_struct(at):
        if inner.name != "Tuple":
            return out + [f"{path}: {at} into {ch} (cross-kind)"]
        fields = [at.field(i) for i in range(at.num_fields)]
        if inner.names:
            # Measured: the server matches struct fields to Tuple elements by name and
            # silently drops fields the Tuple lacks; so require the same names.
            by_name = dict(zip(inner.names, inner.args))
            for f in fields:
                if f.name not in by_name:
                    out.append(f"{path}: struct field `{f.name}` is not an element of {ch}")
                else:
                    out += _problems(f.type, f.nullable, by_name[f.name], f"{path}.{f.name}",
                                     allow_nullable)
            missing = [n for n in inner.names if n not in {f.name for f in fields}]
            if missing:
                out.append(f"{path}: {ch} elements {missing} have no struct field")
            return out
        if len(inner.args) != len(fields):
            return out + [f"{path}: {at} has {len(fields)} fields, {ch} has {len(inner.args)}"]
        for f, a in zip(fields, inner.args):
            out += _problems(f.type, f.nullable, a, f"{path}.{f.name}", allow_nullable)
        return out
    why = _scalar_problem(at, inner)
    if why:
        out.append(f"{path}: {at} into {ch} ({why})")
    return out


def _columns(table_columns: Iterable[ColumnSpec]) -> list[TableColumn]:
    cols = []
    for c in table_columns:
        if isinstance(c, TableColumn):
            cols.append(c)
        else:
            c = tuple(c)
            cols.append(TableColumn(c[0], c[1], c[2] if len(c) > 2 else ""))
    return cols


def check_compatible(
    schema: pa.Schema | T.StructType,
    table_columns: Iterable[ColumnSpec],
    *,
    table: str = "the table",
    exclude: Iterable[str] = (),
    allow_nullable_into_non_nullable: bool = False,
) -> None:
    """Raise unless every data column can be inserted into the table without loss.

    Runs on the driver once per query/job (``validate``), before any task writes.

    Parameters
    ----------
    schema
        The data: an Arrow schema (what executors receive) or a Spark ``StructType``
        (converted with :func:`spark_schema_to_arrow`).
    table_columns
        ``(name, type)`` or ``(name, type, default_kind)`` tuples or
        :class:`TableColumn` values, from ``system.columns``.
    table
        Display name for messages (e.g. ``db.events``).
    exclude
        Data columns that are not inserted (the ``table_column`` routing column).
    allow_nullable_into_non_nullable
        Accept nullable data in non-Nullable scalar columns (nulls become defaults).

    Raises
    ------
    ConfigurationError
        Listing every problem: a data column the table lacks (with close matches), a
        type pair that is not insertable (naming the column and both types), an
        ALIAS/MATERIALIZED target, or a table column that would be silently filled
        (no data, no DEFAULT, not Nullable).
    """
    spark_types: dict[str, str] = {}
    if isinstance(schema, T.StructType):
        spark_types = {f.name: f.dataType.simpleString() for f in schema.fields}
        schema = spark_schema_to_arrow(schema)
    cols = _columns(table_columns)
    by_name = {c.name: c for c in cols}
    excluded = set(exclude)
    problems: list[str] = []
    seen: set[str] = set()
    for f in schema:
        if f.name in excluded:
            continue
        if f.name in seen:
            problems.append(f"data column `{f.name}` appears twice")
            continue
        seen.add(f.name)
        col = by_name.get(f.name)
        if col is None:
            close = [c.name for c in cols if c.name.lower() == f.name.lower()] or \
                difflib.get_close_matches(f.name, list(by_name), n=3)
            hint = f" (did you mean {', '.join(f'`{c}`' for c in close)}?)" if close else ""
            problems.append(f"data column `{f.name}` is not a column of {table}{hint}")
            continue
        if col.default_kind.upper() in ("MATERIALIZED", "ALIAS"):
            problems.append(f"column `{f.name}` of {table} is {col.default_kind.upper()}: "
                            f"it cannot be inserted into")
            continue
        ch = parse_clickhouse_type(col.type)
        found = _problems(f.type, f.nullable, ch, f"`{f.name}`", allow_nullable_into_non_nullable)
        if found:
            src = spark_types.get(f.name, str(f.type))
            kind = "Spark" if f.name in spark_types else "Arrow"
            problems.append(
                f"column `{f.name}`: {kind} type {src} cannot be inserted into ClickHouse type "
                f"{col.type} of {table}: " + "; ".join(found)
            )
    for c in cols:
        if c.name in seen or c.default_kind:
            continue
        inner, nullable = _strip(parse_clickhouse_type(c.type))
        if not nullable:
            problems.append(f"column `{c.name}` of {table} ({c.type}) has no data, no DEFAULT and "
                            f"is not Nullable: it would be silently filled with a default value")
    if problems:
        raise ConfigurationError(f"schema does not fit {table}:\n  - " + "\n  - ".join(problems))
