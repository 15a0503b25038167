"""Values into the Arrow types of their ClickHouse columns, checked value by value (executor).

:func:`convert_array` converts one column of a record batch with ``pyarrow.compute``
(no Python per row) to the exact Arrow type of its ClickHouse column, after range /
membership / length / null checks, so the server receives its own types and converts
nothing. A value that does not fit raises
:class:`~clickhouse_tx.errors.ValueDoesNotFitError` built by :meth:`ValueSite.fail`:
the table, the column (with its path inside Array/Map/Tuple), the ClickHouse type, the
value and its row in the partition (and Kafka topic/partition/offset when the data has
those columns). :class:`clickhouse_tx.conversion.convert.ConversionPlan` calls it per column.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clickhouse_tx.conversion.chtypes import CHType, strip_wrappers
from clickhouse_tx.conversion.column_fit import INT_TYPES, UNIT_DIGITS, WIDE_INTS, arrow_kind
from clickhouse_tx.errors import ValueDoesNotFitError

#: Columns that, when the data has them, locate a bad row in its Kafka source.
KAFKA_COLUMNS = ("topic", "partition", "offset")

_CONTAINERS = ("Array", "Map", "Tuple")
_FLOAT32_MAX = 3.4028234663852886e38
_UNIT_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
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


# --------------------------------------------------------------------------- errors


@dataclasses.dataclass(frozen=True)
class ValueSite:
    """Where an array sits: its path, and how its elements map to rows of the batch."""

    table: str  # ``db.table``, for messages
    strict_precision: bool
    allow_nullable_into_non_nullable: bool
    batch: pa.RecordBatch
    first_row: int
    column: str
    ch_type: str
    path: str
    rows: np.ndarray | None = None  # element index -> row index in the batch (None: same)

    def child(self, suffix: str, rows: np.ndarray | None) -> "ValueSite":
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
            f"{self.table}: value {shown} of column {where} at row {self.first_row + row} "
            f"of this partition{kafka} does not fit ClickHouse type {self.ch_type}: {reason}; "
            "nothing of this partition was written"
        )
        # Plain data for dead letters: where the bad row is and why.
        err.row, err.column, err.ch_type, err.reason = row, self.column + self.path, self.ch_type, reason
        return err


def _not_in(arr: pa.Array, values: pa.Array) -> pa.Array:
    """True where a non-null value of ``arr`` is not one of ``values``."""
    return pc.and_(pc.is_valid(arr), pc.invert(pc.is_in(arr, value_set=values)))


def _check(where: ValueSite, arr: pa.Array, bad: pa.Array | None, reason: str) -> None:
    if bad is not None and pc.any(bad).as_py():
        raise where.fail(arr, bad, reason)


def _check_range(
    where: ValueSite, arr: pa.Array, values: pa.Array, lo: float, hi: float, reason: str
) -> tuple[Any, Any]:
    """Fail unless every value is in ``[lo, hi]``; (min, max) of the values.

    One ``min_max`` pass in the common case; the element-wise mask only on failure.
    """
    mm = pc.min_max(values)
    vmin, vmax = mm["min"].as_py(), mm["max"].as_py()
    if vmin is not None and (vmin < lo or vmax > hi):
        raise where.fail(arr, pc.or_(pc.less(values, lo), pc.greater(values, hi)), reason)
    return vmin, vmax


def _checked_cast(where: ValueSite, arr: pa.Array, to: pa.DataType, reason: str) -> pa.Array:
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


def _convert_int(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    if ch.name in WIDE_INTS:
        if ch.name.startswith("U") and arrow_kind(arr.type) == "int":
            _check(where, arr, pc.less(arr, 0), "negative into an unsigned type")
        return (
            arr if arrow_kind(arr.type) == "int" else _checked_cast(where, arr, pa.int64(), "not an integer in range")
        )
    to = INT_TYPES[ch.name]
    return _checked_cast(where, arr, to, f"outside the range of {ch.name}")


def _convert_float(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    if arrow_kind(arr.type) in ("int", "bool"):
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


def _convert_bool(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    if arrow_kind(arr.type) == "bool":
        return arr
    _check(where, arr, _not_in(arr, pa.array([0, 1], arr.type)), "Bool holds 0 or 1")
    return arr.cast(pa.bool_())


def _convert_decimal(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    p, s = ch.args
    to = pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    if arrow_kind(arr.type) == "int":
        # Arrow casts an integer only into a decimal wide enough for its whole type;
        # go through that exact decimal, then check the value against (p, s).
        arr = arr.cast(pa.decimal128(len(str(2**arr.type.bit_width)), 0))
    return _checked_cast(where, arr, to, f"does not fit Decimal({p}, {s}) (digits would be lost)")


def _convert_string(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    if ch.name == "FixedString":
        n = ch.args[0]
        length = pc.binary_length(arr) if not pa.types.is_fixed_size_binary(arr.type) else None
        if length is not None:
            _check(where, arr, pc.greater(length, n), f"longer than {n} bytes")
        elif arr.type.byte_width > n:
            _check(where, arr, pc.is_valid(arr), f"longer than {n} bytes")
    return arr


def _convert_text(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    pattern, what = {
        "UUID": (_UUID_RE, "not a UUID"),
        "IPv4": (_IPV4_RE, "not an IPv4 address"),
        "IPv6": (_IPV6_RE, "not an IPv6 address"),
    }[ch.name]
    _check(where, arr, pc.invert(pc.match_substring_regex(arr, pattern)), what)
    return arr


def _convert_enum(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    if arrow_kind(arr.type) == "string":
        members = pa.array([label for label, _ in ch.args], arr.type)
        _check(where, arr, _not_in(arr, members), "not a label of the Enum")
        return arr
    members = pa.array([v for _, v in ch.args], pa.int64())
    _check(where, arr, _not_in(arr.cast(pa.int64()), members), "not a value of the Enum")
    return arr.cast(pa.int8() if ch.name == "Enum8" else pa.int16())


def _convert_date(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
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


def _convert_datetime(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
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
    if digits >= UNIT_DIGITS[unit]:
        return arr
    step = 10 ** (UNIT_DIGITS[unit] - digits)
    q = _floor_div(ticks, step, negative=vmin is not None and vmin < 0)
    if where.strict_precision:
        _check(
            where,
            arr,
            pc.not_equal(pc.multiply(q, step), ticks),
            f"has sub-second digits {ch.name} cannot hold (strict_precision=true)",
        )
    out_unit = next(u for u in ("s", "ms", "us", "ns") if UNIT_DIGITS[u] >= digits)
    scale = 10 ** (UNIT_DIGITS[out_unit] - digits)  # q counts 10^-digits s; out_unit is finer or equal
    out = q if scale == 1 else pc.multiply(q, scale)
    return out.cast(pa.timestamp(out_unit, arr.type.tz))


def _floor_div(ticks: pa.Array, step: int, *, negative: bool) -> pa.Array:
    """``ticks // step`` rounded toward the past (also before 1970)."""
    q = pc.divide(ticks, step)  # integer division truncates toward zero
    if not negative:
        return q  # truncation is the floor when nothing is negative
    exact = pc.equal(pc.multiply(q, step), ticks)
    return pc.if_else(pc.or_(exact, pc.greater_equal(ticks, 0)), q, pc.subtract(q, 1))


_SCALARS: dict[str, Callable[[ValueSite, pa.Array, CHType], pa.Array]] = {
    **{n: _convert_int for n in (*INT_TYPES, *WIDE_INTS)},
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


def convert_array(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    """``arr`` converted to the Arrow type of ``ch``, every value checked."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    inner, nullable = strip_wrappers(ch)
    if pa.types.is_null(arr.type):
        if len(arr) and not nullable and not where.allow_nullable_into_non_nullable:
            raise where.fail(arr, pc.is_null(arr), "null into a non-Nullable column")
        return arr
    # Array/Map/Tuple cannot be Nullable on most servers: a null there becomes an
    # empty value (documented); a null scalar into a non-Nullable column does not fit.
    if arr.null_count and not nullable and inner.name not in _CONTAINERS and not where.allow_nullable_into_non_nullable:
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
    if fn is None or arrow_kind(arr.type) in ("duration", "time"):
        return arr  # Dynamic, JSON, Variant, Time64, Interval: the server's own parsing
    return fn(where, arr, inner)


def _flat_children(arr: pa.Array) -> tuple[np.ndarray, int]:
    """(offsets relative to the first child, first child index) of a (large) list or map."""
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets - offsets[0], int(offsets[0])


def _parents(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _convert_list(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    if pa.types.is_fixed_size_list(arr.type):
        values = arr.flatten()
        size = arr.type.list_size
        parents = np.repeat(np.arange(len(arr)), size)
        out = convert_array(where.child("[]", parents), values, ch.args[0])
        return pa.FixedSizeListArray.from_arrays(out, size, mask=arr.is_null() if arr.null_count else None)
    offsets, start = _flat_children(arr)
    values = arr.values.slice(start, int(offsets[-1]))
    out = convert_array(where.child("[]", _parents(offsets)), values, ch.args[0])
    mask = arr.is_null() if arr.null_count else None
    cls = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
    return cls.from_arrays(pa.array(offsets, pa.int64() if cls is pa.LargeListArray else pa.int32()), out, mask=mask)


def _convert_map(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    offsets, start = _flat_children(arr)
    n = int(offsets[-1])
    inner = where.child("", _parents(offsets))
    keys = convert_array(inner.child(".key", None), arr.keys.slice(start, n), ch.args[0])
    items = convert_array(inner.child(".value", None), arr.items.slice(start, n), ch.args[1])
    mask = arr.is_null() if arr.null_count else None
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items, mask=mask)


def _convert_struct(where: ValueSite, arr: pa.Array, ch: CHType) -> pa.Array:
    fields = [arr.type.field(i) for i in range(arr.type.num_fields)]
    by_name = dict(zip(ch.names, ch.args)) if ch.names else None
    children = arr.flatten()  # respects the slice offset
    out = []
    for i, (f, child) in enumerate(zip(fields, children)):
        element = by_name[f.name] if by_name is not None else ch.args[i]
        out.append(convert_array(where.child(f".{f.name}", None), child, element))
    new_fields = [pa.field(f.name, a.type, nullable=True) for f, a in zip(fields, out)]
    mask = arr.is_null() if arr.null_count else None
    return pa.StructArray.from_arrays(out, fields=new_fields, mask=mask)


__all__ = ["KAFKA_COLUMNS", "ValueSite", "convert_array"]
