"""Which Arrow types can go into which ClickHouse column types, judged by kind (pure).

:func:`fit_problem` (driver, once per column and query, from
:func:`clickhouse_tx.conversion.schema.check_schema`) says what can never fit, by kind: a string
into ``Int32``, an array into a scalar. Whatever may fit is checked value by value
when the rows are written (:mod:`clickhouse_tx.conversion.values`).
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

from clickhouse_tx.conversion.chtypes import CHType, strip_wrappers

#: ClickHouse integer types with an Arrow type of the same width.
INT_TYPES = {
    "Int8": pa.int8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "UInt8": pa.uint8(),
    "UInt16": pa.uint16(),
    "UInt32": pa.uint32(),
    "UInt64": pa.uint64(),
}
WIDE_INTS = {"Int128", "Int256", "UInt128", "UInt256"}  # no Arrow type: checked, sent as is
#: Sub-second digits of each Arrow time unit.
UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_ANY_TYPE = {"Dynamic", "JSON", "Object"}


def _is_any_of(at: pa.DataType, *names: str) -> bool:
    """True if ``pa.types.is_<name>(at)`` for one of ``names``; a check this pyarrow lacks
    (``is_string_view`` in an older pyarrow) is False."""
    return any(getattr(pa.types, f"is_{name}", lambda _: False)(at) for name in names)


def arrow_kind(at: pa.DataType) -> str:
    """The family of an Arrow type (``int``, ``string``, ``list``...), as far as conversions care."""
    checks: list[tuple[Callable[[pa.DataType], bool], str]] = [
        (pa.types.is_boolean, "bool"),
        (pa.types.is_integer, "int"),
        (pa.types.is_floating, "float"),
        (pa.types.is_decimal, "decimal"),
        (lambda t: _is_any_of(t, "string", "large_string", "string_view"), "string"),
        (pa.types.is_fixed_size_binary, "binary"),
        (lambda t: _is_any_of(t, "binary", "large_binary", "binary_view"), "binary"),
        (pa.types.is_date, "date"),
        (pa.types.is_timestamp, "timestamp"),
        (pa.types.is_duration, "duration"),
        (pa.types.is_time, "time"),
        (pa.types.is_map, "map"),
        (lambda t: pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t), "list"),
        (pa.types.is_struct, "struct"),
        (pa.types.is_null, "null"),
    ]
    return next((kind for fn, kind in checks if fn(at)), "other")


def _accepting(kinds: str, *names: str) -> dict[str, frozenset[str]]:
    """ClickHouse types ``names``, each accepting the Arrow kinds ``kinds`` (space-separated)."""
    return dict.fromkeys(names, frozenset(kinds.split()))


#: ClickHouse type name -> Arrow kinds whose values may fit (checked value by value).
_ACCEPTS: dict[str, frozenset[str]] = {
    **_accepting("bool int decimal", *INT_TYPES, *WIDE_INTS),
    **_accepting("bool int float", "Float32", "Float64"),
    **_accepting("bool int", "Bool"),
    **_accepting("int decimal", "Decimal"),
    **_accepting("string binary", "String", "FixedString"),
    **_accepting("string int", "Enum8", "Enum16"),
    **_accepting("string", "UUID", "IPv4", "IPv6"),
    **_accepting("date", "Date", "Date32"),
    **_accepting("timestamp", "DateTime", "DateTime64"),
    **_accepting("time", "Time", "Time64"),
    **_accepting("list", "Array"),
    **_accepting("map", "Map"),
    **_accepting("struct", "Tuple"),
}
_HINTS = {
    ("float", "int"): "floats are never rounded into integers: round or cast in Spark first",
    ("float", "decimal"): "cast to a decimal in Spark first",
    ("decimal", "float"): "cast to double in Spark first if rounding is acceptable",
    ("date", "timestamp"): "cast to a timestamp in Spark first (and pick its time zone)",
    ("timestamp", "date"): "cast to a date in Spark first (and pick its time zone)",
    ("string", "int"): "parse it in Spark first",
    ("string", "date"): "parse it in Spark first",
}


def fit_problem(at: pa.DataType, ch: CHType) -> str | None:
    """Why no value of Arrow type ``at`` can ever go into ``ch`` (None: values are checked).

    Driver, once per column and query, before any task runs. Nullability is not
    judged here: whether a null is present is a property of the values.
    """
    if pa.types.is_dictionary(at):
        at = at.value_type
    inner, _ = strip_wrappers(ch)
    kind = arrow_kind(at)
    if kind == "null" or inner.name in _ANY_TYPE:
        return None
    if inner.name == "Variant":
        ok = any(fit_problem(at, a) is None for a in inner.args)
        return None if ok else "no Variant alternative accepts it"
    if kind == "duration":
        ok = inner.name == "Int64" or inner.name.startswith("Interval")
        return None if ok else "durations go into Int64 (in their Arrow unit) or an Interval"
    accepted = _ACCEPTS.get(inner.name)
    if accepted is None:
        return f"no known conversion into {inner.name}"
    if kind not in accepted:
        target_kind = next((k for k in ("int", "float", "decimal", "date", "timestamp") if k in accepted), "")
        hint = _HINTS.get((kind, target_kind))
        return "cross-kind" + (f": {hint}" if hint else "")
    if kind == "time" and inner.name == "Time64":
        need = min(UNIT_DIGITS[at.unit], 6)  # Spark's TimeType holds 6 digits in time64[ns]
        return None if inner.args[0] >= need else "sub-second digits would be lost"
    return _nested_fit_problem(at, inner)


def _nested_fit_problem(at: pa.DataType, inner: CHType) -> str | None:
    if inner.name == "Array":
        p = fit_problem(at.value_type, inner.args[0])
        return p and f"[]: {p}"
    if inner.name == "Map":
        p = fit_problem(at.key_type, inner.args[0])
        if p:
            return f".key: {p}"
        p = fit_problem(at.item_type, inner.args[1])
        return p and f".value: {p}"
    if inner.name == "Tuple":
        fields = [at.field(i) for i in range(at.num_fields)]
        if inner.names:
            # Measured: the server matches struct fields to Tuple elements by name and
            # silently drops fields the Tuple lacks; so require the same names.
            if sorted(f.name for f in fields) != sorted(inner.names):
                return f"struct fields {[f.name for f in fields]} are not the Tuple's elements {list(inner.names)}"
            pairs = [(f, dict(zip(inner.names, inner.args))[f.name]) for f in fields]
        elif len(fields) != len(inner.args):
            return f"{len(fields)} struct fields into a Tuple of {len(inner.args)} elements"
        else:
            pairs = list(zip(fields, inner.args))
        for f, a in pairs:
            p = fit_problem(f.type, a)
            if p:
                return f".{f.name}: {p}"
    return None


__all__ = ["INT_TYPES", "UNIT_DIGITS", "WIDE_INTS", "arrow_kind", "fit_problem"]
