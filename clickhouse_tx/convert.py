"""Values into the column types of an existing table: checked by value, vectorised.

Spark has no unsigned types, keeps microseconds and marks nearly every derived column
nullable, so a check of *declared* types refuses almost every real ClickHouse table.
ClickHouse itself converts on ``INSERT ... FORMAT ArrowStream`` but silently: a
negative into ``UInt64`` wraps, a null into ``String`` becomes ``''``, a date before
1970 into ``Date`` is refused only by some servers. So this module checks **values**:

- :func:`fit_problem` (driver, once per column and query): what can never fit, by
  kind (a string into ``Int32``, an array into a scalar). Used by
  :func:`clickhouse_tx.schema.check_schema`.
- :class:`ConversionPlan` (built on the driver, pickled to executors): for each Arrow
  batch, every column is converted with ``pyarrow.compute`` (no Python per row) to the
  exact Arrow type of its ClickHouse column, after range / membership / length / null
  checks, so the server receives its own types and converts nothing. A value that
  does not fit raises :class:`~clickhouse_tx.errors.ValueDoesNotFitError` naming the
  table, the column (with its path inside Array/Map/Tuple), the ClickHouse type, the
  value and its row in the partition (and Kafka topic/partition/offset when the data
  has those columns). It is raised while the mode's prepare reads the batches, so the
  partition's transaction (or stage) is rolled back and nothing becomes visible.

Sub-second digits the column cannot hold are truncated toward the past (as
ClickHouse does) unless ``strict_precision``; then they do not fit.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clickhouse_tx.chtypes import CHType, parse_clickhouse_type, strip_wrappers
from clickhouse_tx.errors import ValueDoesNotFitError

__all__ = ["ConversionPlan", "ConvertedBatches", "KAFKA_COLUMNS", "fit_problem"]

#: Columns that, when the data has them, locate a bad row in its Kafka source.
KAFKA_COLUMNS = ("topic", "partition", "offset")

_INT_TYPES = {
    "Int8": pa.int8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "UInt8": pa.uint8(),
    "UInt16": pa.uint16(),
    "UInt32": pa.uint32(),
    "UInt64": pa.uint64(),
}
_WIDE_INTS = {"Int128", "Int256", "UInt128", "UInt256"}  # no Arrow type: checked, sent as is
_CONTAINERS = ("Array", "Map", "Tuple")
_ANY = {"Dynamic", "JSON", "Object"}
_FLOAT32_MAX = 3.4028234663852886e38
_UNIT_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_DAY = 86_400
_EPOCH = datetime.date(1970, 1, 1)
_EPOCH_DT = datetime.datetime(1970, 1, 1)
# Ranges from the ClickHouse documentation (Date: UInt16 days, DateTime: UInt32 seconds).
_DATE_DAYS = (0, 65_535)
_DATE32_DAYS = ((datetime.date(1900, 1, 1) - _EPOCH).days, (datetime.date(2299, 12, 31) - _EPOCH).days)
_DATETIME_S = (0, 4_294_967_295)
_DATETIME64_S = (_DATE32_DAYS[0] * _DAY, (_DATE32_DAYS[1] + 1) * _DAY - 1)
_DATETIME64_9_MAX_S = 9_223_372_036  # 2262-04-11 23:47:16: nanoseconds in an Int64
_UUID_RE = r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RE = rf"^{_OCTET}(\.{_OCTET}){{3}}$"
# The server parses IPv6 text strictly and fails loudly; this only catches the obvious.
_IPV6_RE = r"^[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*$|" + _IPV4_RE[1:-1].join("^$")


# --------------------------------------------------------------------------- kinds


def _is_any_of(at: pa.DataType, *names: str) -> bool:
    """True if ``pa.types.is_<name>(at)`` for one of ``names``; a check this pyarrow lacks
    (``is_string_view`` in an older pyarrow) is False."""
    return any(getattr(pa.types, f"is_{name}", lambda _: False)(at) for name in names)


def _kind(at: pa.DataType) -> str:
    """The family of an Arrow type, as far as the relation below cares."""
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
    **_accepting("bool int decimal", *_INT_TYPES, *_WIDE_INTS),
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
    kind = _kind(at)
    if kind == "null" or inner.name in _ANY:
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
        need = min(_UNIT_DIGITS[at.unit], 6)  # Spark's TimeType holds 6 digits in time64[ns]
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


# --------------------------------------------------------------------------- errors


@dataclasses.dataclass(frozen=True)
class _Where:
    """Where an array sits: its path, and how its elements map to rows of the batch."""

    plan: "ConversionPlan"
    batch: pa.RecordBatch
    first_row: int
    column: str
    ch_type: str
    path: str
    rows: np.ndarray | None = None  # element index -> row index in the batch (None: same)

    def child(self, suffix: str, rows: np.ndarray | None) -> "_Where":
        if rows is not None and self.rows is not None:
            rows = self.rows[rows]
        elif rows is None:
            rows = self.rows
        return dataclasses.replace(self, path=self.path + suffix, rows=rows)

    def fail(self, arr: pa.Array, bad: pa.Array, reason: str) -> ValueDoesNotFitError:
        """The error for the first element where ``bad`` is true."""
        i = int(pc.index(bad.fill_null(False), True).as_py())
        row = int(self.rows[i]) if self.rows is not None else i
        value = arr[i].as_py()
        shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
        kafka = ""
        names = self.batch.schema.names
        if all(k in names for k in KAFKA_COLUMNS):
            topic, part, off = (self.batch.column(k)[row].as_py() for k in KAFKA_COLUMNS)
            kafka = f" (Kafka topic {topic!r} partition {part} offset {off})"
        where = f"`{self.column}{self.path}`"
        err = ValueDoesNotFitError(
            f"{self.plan.table}: value {shown} of column {where} at row {self.first_row + row} "
            f"of this partition{kafka} does not fit ClickHouse type {self.ch_type}: {reason}; "
            "nothing of this partition was written"
        )
        # Plain data for dead letters: where the bad row is and why.
        err.row, err.column, err.ch_type, err.reason = row, self.column + self.path, self.ch_type, reason
        return err


def _not_in(arr: pa.Array, values: pa.Array) -> pa.Array:
    """True where a non-null value of ``arr`` is not one of ``values``."""
    return pc.and_(pc.is_valid(arr), pc.invert(pc.is_in(arr, value_set=values)))


def _check(where: _Where, arr: pa.Array, bad: pa.Array | None, reason: str) -> None:
    if bad is not None and pc.any(bad).as_py():
        raise where.fail(arr, bad, reason)


def _check_range(where: _Where, arr: pa.Array, values: pa.Array, lo: float, hi: float, reason: str) -> tuple[Any, Any]:
    """Fail unless every value is in ``[lo, hi]``; (min, max) of the values.

    One ``min_max`` pass in the common case; the element-wise mask only on failure.
    """
    mm = pc.min_max(values)
    vmin, vmax = mm["min"].as_py(), mm["max"].as_py()
    if vmin is not None and (vmin < lo or vmax > hi):
        raise where.fail(arr, pc.or_(pc.less(values, lo), pc.greater(values, hi)), reason)
    return vmin, vmax


def _checked_cast(where: _Where, arr: pa.Array, to: pa.DataType, reason: str) -> pa.Array:
    """A safe Arrow cast; on failure, find the first value that breaks it (bisection)."""
    try:
        return arr.cast(to, safe=True)
    except pa.ArrowInvalid:  # a value does not fit (an unsupported cast is a bug: raised)
        lo, hi = 0, len(arr)  # invariant: the first bad element is in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                arr.slice(lo, mid - lo).cast(to, safe=True)
                lo = mid
            except pa.ArrowInvalid:
                hi = mid
        mask = np.zeros(len(arr), dtype=bool)
        mask[lo] = True
        raise where.fail(arr, pa.array(mask), reason) from None


# --------------------------------------------------------------------------- scalars


def _convert_int(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    if ch.name in _WIDE_INTS:
        if ch.name.startswith("U") and _kind(arr.type) == "int":
            _check(where, arr, pc.less(arr, 0), "negative into an unsigned type")
        return arr if _kind(arr.type) == "int" else _checked_cast(where, arr, pa.int64(), "not an integer in range")
    to = _INT_TYPES[ch.name]
    return _checked_cast(where, arr, to, f"outside the range of {ch.name}")


def _convert_float(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    if _kind(arr.type) in ("int", "bool"):
        out = _checked_cast(where, arr, pa.float64(), "not exact in floating point (beyond 2^53)")
        if ch.name == "Float64":
            return out
        _check(where, arr, pc.greater(pc.abs(out), 2.0**24), "not exact in Float32 (beyond 2^24)")
        return out.cast(pa.float32())
    if ch.name == "Float64":
        return arr.cast(pa.float64())
    mm = pc.min_max(arr)  # NaN is skipped; ±inf fit (Float32 has them)
    vmin, vmax = mm["min"].as_py(), mm["max"].as_py()
    if vmin is not None and (abs(vmin) > _FLOAT32_MAX or abs(vmax) > _FLOAT32_MAX):
        _check(
            where, arr, pc.and_(pc.is_finite(arr), pc.greater(pc.abs(arr), _FLOAT32_MAX)), "beyond the range of Float32"
        )
    return arr.cast(pa.float32())


def _convert_bool(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    if _kind(arr.type) == "bool":
        return arr
    _check(where, arr, _not_in(arr, pa.array([0, 1], arr.type)), "Bool holds 0 or 1")
    return arr.cast(pa.bool_())


def _convert_decimal(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    p, s = ch.args
    to = pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    if _kind(arr.type) == "int":
        # Arrow casts an integer only into a decimal wide enough for its whole type;
        # go through that exact decimal, then check the value against (p, s).
        arr = arr.cast(pa.decimal128(len(str(2**arr.type.bit_width)), 0))
    return _checked_cast(where, arr, to, f"does not fit Decimal({p}, {s}) (digits would be lost)")


def _convert_string(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    if ch.name == "FixedString":
        n = ch.args[0]
        length = pc.binary_length(arr) if not pa.types.is_fixed_size_binary(arr.type) else None
        if length is not None:
            _check(where, arr, pc.greater(length, n), f"longer than {n} bytes")
        elif arr.type.byte_width > n:
            _check(where, arr, pc.is_valid(arr), f"longer than {n} bytes")
    return arr


def _convert_text(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    pattern, what = {
        "UUID": (_UUID_RE, "not a UUID"),
        "IPv4": (_IPV4_RE, "not an IPv4 address"),
        "IPv6": (_IPV6_RE, "not an IPv6 address"),
    }[ch.name]
    _check(where, arr, pc.invert(pc.match_substring_regex(arr, pattern)), what)
    return arr


def _convert_enum(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    if _kind(arr.type) == "string":
        members = pa.array([label for label, _ in ch.args], arr.type)
        _check(where, arr, _not_in(arr, members), "not a label of the Enum")
        return arr
    members = pa.array([v for _, v in ch.args], pa.int64())
    _check(where, arr, _not_in(arr.cast(pa.int64()), members), "not a value of the Enum")
    return arr.cast(pa.int8() if ch.name == "Enum8" else pa.int16())


def _convert_date(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    days = arr.cast(pa.date32()).cast(pa.int32())
    lo, hi = _DATE_DAYS if ch.name == "Date" else _DATE32_DAYS
    _check_range(
        where,
        arr,
        days,
        lo,
        hi,
        f"outside {ch.name}'s range {_EPOCH + datetime.timedelta(lo)}..{_EPOCH + datetime.timedelta(hi)}",
    )
    return arr.cast(pa.date32())


def _convert_datetime(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    unit = arr.type.unit
    digits = 0 if ch.name == "DateTime" else ch.args[0]
    ticks = arr.cast(pa.int64())
    lo, hi = _DATETIME_S if ch.name == "DateTime" else _DATETIME64_S
    if digits == 9:
        hi = _DATETIME64_9_MAX_S
    per_s = _UNIT_PER_S[unit]
    vmin, _ = _check_range(
        where,
        arr,
        ticks,
        lo * per_s,
        hi * per_s + per_s - 1,
        f"outside {ch.name}'s range {_EPOCH_DT + datetime.timedelta(seconds=lo)}.."
        f"{_EPOCH_DT + datetime.timedelta(seconds=hi)} UTC",
    )
    if digits >= _UNIT_DIGITS[unit]:
        return arr
    step = 10 ** (_UNIT_DIGITS[unit] - digits)
    q = _floor_div(ticks, step, negative=vmin is not None and vmin < 0)
    if where.plan.strict_precision:
        _check(
            where,
            arr,
            pc.not_equal(pc.multiply(q, step), ticks),
            f"has sub-second digits {ch.name} cannot hold (strict_precision=true)",
        )
    out_unit = next(u for u in ("s", "ms", "us", "ns") if _UNIT_DIGITS[u] >= digits)
    scale = 10 ** (_UNIT_DIGITS[out_unit] - digits)  # q counts 10^-digits s; out_unit is finer or equal
    out = q if scale == 1 else pc.multiply(q, scale)
    return out.cast(pa.timestamp(out_unit, arr.type.tz))


def _floor_div(ticks: pa.Array, step: int, *, negative: bool) -> pa.Array:
    """``ticks // step`` rounded toward the past (also before 1970)."""
    q = pc.divide(ticks, step)  # integer division truncates toward zero
    if not negative:
        return q  # truncation is the floor when nothing is negative
    exact = pc.equal(pc.multiply(q, step), ticks)
    return pc.if_else(pc.or_(exact, pc.greater_equal(ticks, 0)), q, pc.subtract(q, 1))


_SCALARS: dict[str, Callable[[_Where, pa.Array, CHType], pa.Array]] = {
    **{n: _convert_int for n in (*_INT_TYPES, *_WIDE_INTS)},
    "Float32": _convert_float,
    "Float64": _convert_float,
    "Bool": _convert_bool,
    "Decimal": _convert_decimal,
    "String": _convert_string,
    "FixedString": _convert_string,
    "UUID": _convert_text,
    "IPv4": _convert_text,
    "IPv6": _convert_text,
    "Enum8": _convert_enum,
    "Enum16": _convert_enum,
    "Date": _convert_date,
    "Date32": _convert_date,
    "DateTime": _convert_datetime,
    "DateTime64": _convert_datetime,
}


# --------------------------------------------------------------------------- nested


def _convert(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    """``arr`` converted to the Arrow type of ``ch``, every value checked."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    inner, nullable = strip_wrappers(ch)
    if pa.types.is_null(arr.type):
        if len(arr) and not nullable and not where.plan.allow_nullable_into_non_nullable:
            raise where.fail(arr, pc.is_null(arr), "null into a non-Nullable column")
        return arr
    # Array/Map/Tuple cannot be Nullable on most servers: a null there becomes an
    # empty value (documented); a null scalar into a non-Nullable column does not fit.
    if (
        arr.null_count
        and not nullable
        and inner.name not in _CONTAINERS
        and not where.plan.allow_nullable_into_non_nullable
    ):
        raise where.fail(
            arr,
            pc.is_null(arr),
            "null into a non-Nullable column (set allow_nullable_into_non_nullable="
            "true to store the column's default instead)",
        )
    if inner.name == "Array":
        return _convert_list(where, arr, inner)
    if inner.name == "Map":
        return _convert_map(where, arr, inner)
    if inner.name == "Tuple":
        return _convert_struct(where, arr, inner)
    fn = _SCALARS.get(inner.name)
    if fn is None or _kind(arr.type) in ("duration", "time"):
        return arr  # Dynamic, JSON, Variant, Time64, Interval: the server's own parsing
    return fn(where, arr, inner)


def _flat_children(arr: pa.Array) -> tuple[np.ndarray, int]:
    """(offsets relative to the first child, first child index) of a (large) list or map."""
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets - offsets[0], int(offsets[0])


def _parents(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _convert_list(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    if pa.types.is_fixed_size_list(arr.type):
        values = arr.flatten()
        size = arr.type.list_size
        parents = np.repeat(np.arange(len(arr)), size)
        out = _convert(where.child("[]", parents), values, ch.args[0])
        return pa.FixedSizeListArray.from_arrays(out, size, mask=arr.is_null() if arr.null_count else None)
    offsets, start = _flat_children(arr)
    values = arr.values.slice(start, int(offsets[-1]))
    out = _convert(where.child("[]", _parents(offsets)), values, ch.args[0])
    mask = arr.is_null() if arr.null_count else None
    cls = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
    return cls.from_arrays(pa.array(offsets, pa.int64() if cls is pa.LargeListArray else pa.int32()), out, mask=mask)


def _convert_map(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    offsets, start = _flat_children(arr)
    n = int(offsets[-1])
    inner = where.child("", _parents(offsets))
    keys = _convert(inner.child(".key", None), arr.keys.slice(start, n), ch.args[0])
    items = _convert(inner.child(".value", None), arr.items.slice(start, n), ch.args[1])
    mask = arr.is_null() if arr.null_count else None
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items, mask=mask)


def _convert_struct(where: _Where, arr: pa.Array, ch: CHType) -> pa.Array:
    fields = [arr.type.field(i) for i in range(arr.type.num_fields)]
    by_name = dict(zip(ch.names, ch.args)) if ch.names else None
    children = arr.flatten()  # respects the slice offset
    out = []
    for i, (f, child) in enumerate(zip(fields, children)):
        element = by_name[f.name] if by_name is not None else ch.args[i]
        out.append(_convert(where.child(f".{f.name}", None), child, element))
    new_fields = [pa.field(f.name, a.type, nullable=True) for f, a in zip(fields, out)]
    mask = arr.is_null() if arr.null_count else None
    return pa.StructArray.from_arrays(out, fields=new_fields, mask=mask)


# --------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    """How the data's columns become the table's column types (plain, picklable).

    Built on the driver once per query (from ``system.columns``) and pickled to the
    executors with the writer, so no task queries the table. Columns of the data
    that the plan does not list (a routing column) pass through unchanged.

    Attributes
    ----------
    table
        ``db.table`` for messages.
    columns
        ``(name, ClickHouse type)`` of each column the data writes.
    allow_nullable_into_non_nullable
        Nulls into non-Nullable columns are sent as nulls (the server stores the
        column's default) instead of failing.
    strict_precision
        Sub-second digits the column cannot hold fail instead of being truncated.
    batch_rows, batch_bytes
        Upper bounds of each record batch sent (one ArrowStream message each): larger
        batches are cut into zero-copy slices (None: as they come).
    dead_letter_table
        ``(database, table)``: a row with a value that does not fit is taken out of
        the data and kept as a dead letter (see :class:`ConvertedBatches`) instead of
        failing the task (option ``bad_rows=dead_letter``).
    """

    table: str
    columns: tuple[tuple[str, str], ...]
    allow_nullable_into_non_nullable: bool = False
    strict_precision: bool = False
    batch_rows: int | None = None
    batch_bytes: int | None = None
    dead_letter_table: tuple[str, str] | None = None

    def convert(self, batch: pa.RecordBatch, first_row: int = 0) -> pa.RecordBatch:
        """Executor, once per Arrow batch: every planned column converted and checked.

        Parameters
        ----------
        batch
            One batch of the partition.
        first_row
            Position of the batch's first row in the partition (for messages).

        Raises
        ------
        ValueDoesNotFitError
            Naming table, column path, ClickHouse type, value and row.
        """
        types = dict(self.columns)
        arrays, fields = [], []
        for f, arr in zip(batch.schema, batch.columns):
            ch_text = types.get(f.name)
            if ch_text is not None:
                where = _Where(self, batch, first_row, f.name, ch_text, "")
                arr = _convert(where, arr, parse_clickhouse_type(ch_text))
            arrays.append(arr)
            fields.append(pa.field(f.name, arr.type, nullable=True))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def apply(self, batches: Iterable[pa.RecordBatch], *, eager: bool = False) -> "ConvertedBatches":
        """Executor, once per partition: the converted batches, lazily or all up front.

        ``eager`` converts (and checks) the whole partition before the first batch is
        yielded, for modes whose inserts become visible one by one (``dedup``,
        ``none``): a bad value then fails before anything is sent. It holds the
        converted partition in memory.
        """
        return ConvertedBatches(self, batches, eager=eager)

    def bounded(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """``batch`` in zero-copy slices of at most ``batch_rows`` rows and ~``batch_bytes`` bytes.

        The byte bound uses the batch's average row size (a single row larger than
        ``batch_bytes`` still goes as one slice).
        """
        rows = batch.num_rows
        step = rows if self.batch_rows is None else self.batch_rows
        if self.batch_bytes is not None and rows and batch.nbytes > self.batch_bytes:
            step = min(step, max(1, self.batch_bytes * rows // batch.nbytes))
        if step >= rows:
            yield batch
            return
        for start in range(0, rows, step):
            yield batch.slice(start, step)


# --------------------------------------------------------------------------- dead letters


class ConvertedBatches(Iterator[pa.RecordBatch]):
    """One partition's batches, converted (what :meth:`ConversionPlan.apply` returns).

    With ``plan.dead_letter_table``, a row holding a value that does not fit is taken
    out of its batch and kept in :attr:`dead_letters` (the batch is converted again
    without it: the cost grows with the bad rows of a batch, which are expected to be
    few); the mode writes them with :func:`clickhouse_tx.dead_letters.write_dead_letters`
    in the same transaction as the good rows, once every batch has been read.
    """

    def __init__(self, plan: ConversionPlan, batches: Iterable[pa.RecordBatch], *, eager: bool) -> None:
        self.plan = plan
        self.dead_letters: list[dict[str, Any]] = []
        self._it: Iterator[pa.RecordBatch] = self._lazy(batches)
        if eager:
            self._it = iter(list(self._it))

    def __next__(self) -> pa.RecordBatch:
        return next(self._it)

    def _lazy(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        first_row = 0
        for b in batches:
            converted = self._convert(b, first_row)
            if converted.num_rows:
                yield from self.plan.bounded(converted)
            first_row += b.num_rows

    def _convert(self, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
        if self.plan.dead_letter_table is None:
            return self.plan.convert(batch, first_row)
        keep = np.arange(batch.num_rows)
        current = batch
        while True:
            try:
                return self.plan.convert(current, first_row)
            except ValueDoesNotFitError as e:
                original = int(keep[e.row])
                self.dead_letters.append(
                    {
                        "row": first_row + original,
                        "column": e.column,
                        "clickhouse_type": e.ch_type,
                        "reason": e.reason,
                        "row_json": _row_json(batch, original),
                    }
                )
                keep = np.delete(keep, e.row)
                current = batch.take(pa.array(keep, pa.int64()))


def _row_json(batch: pa.RecordBatch, i: int) -> str:
    """The whole row as JSON (bytes as latin-1 text, other values by ``str``)."""

    def plain(v: object) -> object:
        if isinstance(v, bytes):
            return v.decode("latin-1")
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    row = {k: plain(v) for k, v in batch.slice(i, 1).to_pylist()[0].items()}
    return json.dumps(row, default=str, ensure_ascii=False, sort_keys=True)
