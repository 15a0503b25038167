"""The value converter (pure pyarrow): every ClickHouse type, values that fit and not."""

from __future__ import annotations

import datetime
import pickle
from decimal import Decimal

import pyarrow as pa
import pytest

from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.errors import NotCommittedError, ValueDoesNotFitError

UTC = "UTC"


def ts(*args: int) -> datetime.datetime:
    return datetime.datetime(*args, tzinfo=datetime.UTC)


def convert(ch: str, arr: pa.Array, **kw: bool) -> pa.Array:
    plan = ConversionPlan("db.t", (("c", ch),), **kw)
    return plan.convert(pa.record_batch([arr], names=["c"])).column(0)


# (ClickHouse type, data that fits, Arrow type sent, the values sent)
FITS = [
    ("UInt64", pa.array([0, 2**62], pa.int64()), pa.uint64(), [0, 2**62]),
    ("UInt32", pa.array([0, 2**32 - 1], pa.int64()), pa.uint32(), [0, 2**32 - 1]),
    ("UInt8", pa.array([0, 255], pa.int64()), pa.uint8(), [0, 255]),
    ("Int32", pa.array([-(2**31), 2**31 - 1], pa.int64()), pa.int32(), [-(2**31), 2**31 - 1]),
    ("Int16", pa.array([-32768, 32767], pa.int32()), pa.int16(), [-32768, 32767]),
    (
        "Float32",
        pa.array([1.5, -3.0e38, float("inf")]),
        pa.float32(),
        [1.5, pytest.approx(-3.0e38, rel=1e-6), float("inf")],
    ),
    ("Float64", pa.array([2**53], pa.int64()), pa.float64(), [float(2**53)]),
    (
        "Date",
        pa.array([datetime.date(1970, 1, 1), datetime.date(2149, 6, 6)]),
        pa.date32(),
        [datetime.date(1970, 1, 1), datetime.date(2149, 6, 6)],
    ),
    ("Date32", pa.array([datetime.date(1900, 1, 1)]), pa.date32(), [datetime.date(1900, 1, 1)]),
    (
        "DateTime",
        pa.array([ts(2024, 1, 1, 1, 2, 3, 999_999)], pa.timestamp("us", UTC)),
        pa.timestamp("s", UTC),
        [ts(2024, 1, 1, 1, 2, 3)],
    ),
    (
        "DateTime('Asia/Tokyo')",
        pa.array([ts(2106, 2, 7, 6, 28, 15)], pa.timestamp("us", UTC)),
        pa.timestamp("s", UTC),
        [ts(2106, 2, 7, 6, 28, 15)],
    ),
    (
        "DateTime64(3)",
        pa.array([ts(1960, 1, 1, 0, 0, 0, 1_999)], pa.timestamp("us", UTC)),
        pa.timestamp("ms", UTC),
        [ts(1960, 1, 1, 0, 0, 0, 1_000)],
    ),
    (
        "DateTime64(6, 'UTC')",
        pa.array([ts(2024, 1, 1, 0, 0, 0, 7)], pa.timestamp("us", UTC)),
        pa.timestamp("us", UTC),
        [ts(2024, 1, 1, 0, 0, 0, 7)],
    ),
    (
        "DateTime64(2)",
        pa.array([datetime.datetime(1969, 12, 31, 23, 59, 59, 999_999)], pa.timestamp("us")),
        pa.timestamp("ms"),
        [datetime.datetime(1969, 12, 31, 23, 59, 59, 990_000)],
    ),
    ("LowCardinality(String)", pa.array(["a", "b"]), pa.string(), ["a", "b"]),
    ("FixedString(3)", pa.array(["ab", "abc"]), pa.string(), ["ab", "abc"]),
    ("Bool", pa.array([0, 1], pa.int64()), pa.bool_(), [False, True]),
    (
        "Decimal(18, 2)",
        pa.array([Decimal("1.5"), Decimal("-2.25")], pa.decimal128(38, 10)),
        pa.decimal128(18, 2),
        [Decimal("1.50"), Decimal("-2.25")],
    ),
    ("Decimal(18, 2)", pa.array([7], pa.int64()), pa.decimal128(18, 2), [Decimal("7.00")]),
    ("Enum8('a' = 1, 'b' = -2)", pa.array(["a", "b"]), pa.string(), ["a", "b"]),
    ("Enum16('a' = 1000)", pa.array([1000], pa.int64()), pa.int16(), [1000]),
    ("UUID", pa.array(["61f0c404-5cb3-11e7-907b-a6006ad3dba0"]), pa.string(), ["61f0c404-5cb3-11e7-907b-a6006ad3dba0"]),
    ("IPv4", pa.array(["0.0.0.0", "255.255.255.255"]), pa.string(), ["0.0.0.0", "255.255.255.255"]),
    ("IPv6", pa.array(["::1", "2001:db8::8a2e:370:7334"]), pa.string(), ["::1", "2001:db8::8a2e:370:7334"]),
    ("Nullable(UInt64)", pa.array([None, 5], pa.int64()), pa.uint64(), [None, 5]),
    ("Array(UInt8)", pa.array([[1, 2], [], [255]]), pa.list_(pa.field("item", pa.uint8())), [[1, 2], [], [255]]),
    (
        "Map(String, UInt64)",
        pa.array([[("a", 1)], []], pa.map_(pa.string(), pa.int64())),
        pa.map_(pa.string(), pa.uint64()),
        [[("a", 1)], []],
    ),
    (
        "Tuple(a UInt8, b DateTime)",
        pa.array([{"a": 1, "b": ts(2000, 1, 1)}], pa.struct([("a", pa.int64()), ("b", pa.timestamp("us", UTC))])),
        pa.struct([("a", pa.uint8()), ("b", pa.timestamp("s", UTC))]),
        [{"a": 1, "b": ts(2000, 1, 1)}],
    ),
]


@pytest.mark.parametrize("ch, data, sent_type, sent", FITS, ids=[f[0] + f"-{i}" for i, f in enumerate(FITS)])
def test_values_that_fit_are_sent_as_the_columns_own_arrow_type(ch, data, sent_type, sent):
    out = convert(ch, data)
    assert out.type.equals(sent_type) or out.type.id == sent_type.id and str(out.type) == str(sent_type)
    assert out.to_pylist() == sent


# (ClickHouse type, data with one bad value at index 1, the bad value as printed, reason)
DOES_NOT_FIT = [
    ("UInt64", pa.array([1, -1], pa.int64()), "-1", "outside the range of UInt64"),
    ("UInt32", pa.array([1, 2**32], pa.int64()), str(2**32), "outside the range of UInt32"),
    ("UInt8", pa.array([1, 256], pa.int64()), "256", "outside the range of UInt8"),
    ("Int32", pa.array([1, 2**31], pa.int64()), str(2**31), "outside the range of Int32"),
    ("Int16", pa.array([1, -32769], pa.int32()), "-32769", "outside the range of Int16"),
    ("Float32", pa.array([1.0, 1e39]), "1e+39", "beyond the range of Float32"),
    ("Float64", pa.array([1, 2**53 + 1], pa.int64()), str(2**53 + 1), "not exact"),
    ("Date", pa.array([datetime.date(1970, 1, 1), datetime.date(1969, 12, 31)]), "1969, 12, 31", "Date's range"),
    ("Date32", pa.array([datetime.date(2000, 1, 1), datetime.date(1899, 12, 31)]), "1899, 12, 31", "Date32's range"),
    (
        "DateTime",
        pa.array([ts(2000, 1, 1), ts(1969, 12, 31, 23, 59, 59)], pa.timestamp("us", UTC)),
        "1969, 12, 31, 23, 59, 59",
        "DateTime's range",
    ),
    (
        "DateTime",
        pa.array([ts(2000, 1, 1), ts(2106, 2, 7, 6, 28, 16)], pa.timestamp("us", UTC)),
        "2106, 2, 7, 6, 28, 16",
        "DateTime's range",
    ),
    (
        "DateTime64(3)",
        pa.array([ts(2000, 1, 1), ts(1899, 12, 31)], pa.timestamp("us", UTC)),
        "1899, 12, 31",
        "DateTime64's range",
    ),
    ("LowCardinality(String)", pa.array(["a", None]), "None", "null into a non-Nullable column"),
    ("FixedString(3)", pa.array(["abc", "abcd"]), "'abcd'", "longer than 3 bytes"),
    ("Bool", pa.array([1, 2], pa.int64()), "2", "Bool holds 0 or 1"),
    (
        "Decimal(18, 2)",
        pa.array([Decimal("1"), Decimal("1.005")], pa.decimal128(38, 10)),
        "1.005",
        "digits would be lost",
    ),
    ("Decimal(4, 2)", pa.array([Decimal("1"), Decimal("100")], pa.decimal128(38, 10)), "100", "digits would be lost"),
    ("Enum8('a' = 1, 'b' = 2)", pa.array(["a", "c"]), "'c'", "not a label of the Enum"),
    ("Enum8('a' = 1, 'b' = 2)", pa.array([1, 3]), "3", "not a value of the Enum"),
    ("UUID", pa.array(["61f0c404-5cb3-11e7-907b-a6006ad3dba0", "61f0c404"]), "'61f0c404'", "not a UUID"),
    ("IPv4", pa.array(["1.2.3.4", "1.2.3.256"]), "'1.2.3.256'", "not an IPv4 address"),
    ("IPv6", pa.array(["::1", "g::1"]), "'g::1'", "not an IPv6 address"),
    ("String", pa.array(["a", None]), "None", "null into a non-Nullable column"),
    ("Array(UInt8)", pa.array([[1], [2, -3]]), "-3", "outside the range of UInt8"),
    (
        "Map(String, UInt64)",
        pa.array([[("a", 1)], [("b", -1)]], pa.map_(pa.string(), pa.int64())),
        "-1",
        "outside the range of UInt64",
    ),
    (
        "Tuple(a UInt8, b String)",
        pa.array([{"a": 1, "b": "x"}, {"a": 256, "b": "y"}]),
        "256",
        "outside the range of UInt8",
    ),
]
PATHS = {"Array(UInt8)": "`c[]`", "Map(String, UInt64)": "`c.value`", "Tuple(a UInt8, b String)": "`c.a`"}


@pytest.mark.parametrize(
    "ch, data, value, reason", DOES_NOT_FIT, ids=[f[0] + f"-{i}" for i, f in enumerate(DOES_NOT_FIT)]
)
def test_a_value_that_does_not_fit_is_named_with_table_column_type_and_row(ch, data, value, reason):
    plan = ConversionPlan("db.t", (("c", ch),))
    batch = pa.record_batch([data], names=["c"])
    with pytest.raises(ValueDoesNotFitError) as e:
        plan.convert(batch, first_row=40)
    msg = str(e.value)
    assert msg.startswith("db.t: value ") and value in msg and reason in msg
    assert f"of column {PATHS.get(ch, '`c`')} at row 41 of this partition" in msg
    assert f"ClickHouse type {ch}" in msg
    assert isinstance(e.value, NotCommittedError)


def test_sub_second_digits_are_truncated_toward_the_past_unless_strict_precision():
    before_1970 = pa.array([datetime.datetime(1969, 12, 31, 23, 59, 59, 500_000)], pa.timestamp("us"))
    assert convert("DateTime64(0)", before_1970).to_pylist() == [datetime.datetime(1969, 12, 31, 23, 59, 59)]
    assert convert("DateTime64(3)", before_1970, strict_precision=True).to_pylist() == [
        datetime.datetime(1969, 12, 31, 23, 59, 59, 500_000)
    ]
    with pytest.raises(ValueDoesNotFitError, match="strict_precision"):
        convert("DateTime64(0)", before_1970, strict_precision=True)
    with pytest.raises(ValueDoesNotFitError, match="strict_precision"):
        convert("DateTime", pa.array([ts(2024, 1, 1, 0, 0, 0, 1)], pa.timestamp("us", UTC)), strict_precision=True)


def test_a_nullable_column_without_nulls_goes_into_a_non_nullable_one_and_nulls_only_when_allowed():
    assert convert("UInt64", pa.array([1, 2], pa.int64())).to_pylist() == [1, 2]
    with pytest.raises(ValueDoesNotFitError, match="allow_nullable_into_non_nullable"):
        convert("UInt64", pa.array([1, None], pa.int64()))
    # Allowed: the null is sent, and the server stores the column's default.
    out = convert("UInt64", pa.array([1, None], pa.int64()), allow_nullable_into_non_nullable=True)
    assert out.type == pa.uint64() and out.to_pylist() == [1, None]
    # A bad value is still refused when nulls are allowed.
    with pytest.raises(ValueDoesNotFitError):
        convert("UInt64", pa.array([-1, None], pa.int64()), allow_nullable_into_non_nullable=True)


def test_the_row_is_counted_across_batches_and_kafka_coordinates_are_named():
    plan = ConversionPlan("db.t", (("v", "UInt8"),))
    schema = pa.schema([("v", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])
    good = pa.record_batch(
        [pa.array([1, 2]), pa.array(["t", "t"]), pa.array([3, 3], pa.int32()), pa.array([10, 11])], schema=schema
    )
    bad = pa.record_batch(
        [pa.array([3, 999]), pa.array(["t", "t"]), pa.array([3, 3], pa.int32()), pa.array([12, 13])], schema=schema
    )
    out = plan.apply(iter([good, bad]))
    assert next(out).column(0).to_pylist() == [1, 2]  # lazy: the first batch is fine
    with pytest.raises(ValueDoesNotFitError) as e:
        next(out)
    assert "at row 3 of this partition (Kafka topic 't' partition 3 offset 13)" in str(e.value)


def test_eager_apply_checks_the_whole_partition_before_yielding_anything():
    plan = ConversionPlan("db.t", (("v", "UInt8"),))
    batches = [pa.record_batch([pa.array([1])], names=["v"]), pa.record_batch([pa.array([-1])], names=["v"])]
    with pytest.raises(ValueDoesNotFitError, match="at row 1 "):
        plan.apply(iter(batches), eager=True)


def test_columns_the_plan_does_not_list_pass_through_and_sliced_nested_arrays_convert():
    plan = ConversionPlan("db.t", (("a", "Array(UInt16)"),))
    lists = pa.array([[-1], None, [1, 2], [3]]).slice(1)
    batch = pa.record_batch([lists, pa.array(["x", "y", "z"])], names=["a", "dest"])
    out = plan.convert(batch)
    assert out.column(0).to_pylist() == [None, [1, 2], [3]]
    assert out.column(0).type.value_type == pa.uint16()
    assert out.column(1).to_pylist() == ["x", "y", "z"]


def test_a_plan_is_plain_picklable_data():
    plan = ConversionPlan("db.t", (("a", "UInt64"),), strict_precision=True)
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_batch_rows_and_batch_bytes_bound_every_batch_sent_as_zero_copy_slices():
    batch = pa.record_batch([pa.array(range(1000), pa.int64())], names=["v"])  # 8000 bytes
    by_rows = ConversionPlan("db.t", (("v", "UInt64"),), batch_rows=300)
    assert [b.num_rows for b in by_rows.apply(iter([batch]))] == [300, 300, 300, 100]
    by_bytes = ConversionPlan("db.t", (("v", "Int64"),), batch_bytes=800)
    sizes = [b.num_rows for b in by_bytes.apply(iter([batch]))]
    assert sizes == [100] * 10
    both = list(ConversionPlan("db.t", (), batch_rows=50, batch_bytes=800).apply(iter([batch])))
    assert [b.num_rows for b in both] == [50] * 20
    assert pa.Table.from_batches(both).column("v").to_pylist() == list(range(1000))


def test_with_a_dead_letter_table_bad_rows_are_set_aside_whole_and_the_rest_converts():
    plan = ConversionPlan("db.t", (("id", "UInt64"), ("v", "UInt8")), dead_letter_table=("db", "dlq"))
    b1 = pa.record_batch([pa.array([1, -2, 3]), pa.array([1, 2, 300])], names=["id", "v"])
    b2 = pa.record_batch([pa.array([4]), pa.array([None], pa.int64())], names=["id", "v"])
    converted = plan.apply(iter([b1, b2]))
    out = pa.Table.from_batches(list(converted))
    assert out.column("id").to_pylist() == [1] and out.schema.field("id").type == pa.uint64()
    letters = converted.dead_letters
    assert [(d["row"], d["column"], d["clickhouse_type"]) for d in letters] == [
        (1, "id", "UInt64"),
        (2, "v", "UInt8"),
        (3, "v", "UInt8"),
    ]
    assert "outside the range of UInt64" in letters[0]["reason"]
    assert "null into a non-Nullable column" in letters[2]["reason"]
    assert letters[0]["row_json"] == '{"id": -2, "v": 2}' and letters[2]["row_json"] == '{"id": 4, "v": null}'


def test_without_a_dead_letter_table_the_first_bad_row_fails_the_partition():
    plan = ConversionPlan("db.t", (("id", "UInt64"),))
    with pytest.raises(ValueDoesNotFitError):
        list(plan.apply(iter([pa.record_batch([pa.array([1, -2])], names=["id"])])))


def test_datetime64_9_ends_in_2262_where_nanoseconds_leave_an_int64():
    ok = pa.array([ts(2262, 4, 11, 23, 47, 16)], pa.timestamp("us", UTC))
    assert convert("DateTime64(9)", ok).to_pylist() == [ts(2262, 4, 11, 23, 47, 16)]
    with pytest.raises(ValueDoesNotFitError, match="DateTime64's range .*2262-04-11 23:47:16"):
        convert("DateTime64(9)", pa.array([ts(2262, 4, 11, 23, 47, 17)], pa.timestamp("us", UTC)))
    assert convert("DateTime64(6)", pa.array([ts(2299, 1, 1)], pa.timestamp("us", UTC))).to_pylist() == [ts(2299, 1, 1)]
