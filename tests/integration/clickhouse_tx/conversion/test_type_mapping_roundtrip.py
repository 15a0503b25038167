"""Every Spark type through the real ClickHouse engine (chdb 26.9, in-process).

The table comes from :func:`create_table_sql`, the data is the Arrow Spark would
send (``to_arrow_schema``), it goes in with ``INSERT ... FORMAT ArrowStream`` and
comes back with ``FORMAT Arrow``. The check runs against the server's own
``system.columns`` text, so the parser meets the type strings ClickHouse prints.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Iterator

import chdb
import pyarrow as pa
import pytest
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.conversion.schema import Column, TableInfo, check_schema, conversion_columns
from clickhouse_tx.errors import ConfigurationError, ValueDoesNotFitError
from spark_datasource.sink.table_ddl import create_table_sql
from spark_datasource.sink.type_mapping import spark_schema_to_arrow

UTC = dt.UTC


@pytest.fixture()
def ch(tmp_path) -> Iterator[object]:
    # chdb serves one data path per process: close it so later tests can open theirs.
    conn = chdb.connect(f"file:{tmp_path / 'chdb'}")
    conn.query("CREATE DATABASE `we``ird db`")
    try:
        yield conn
    finally:
        conn.close()


def insert_arrow(conn, table_sql: str, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    ins = conn.send_insert(f"INSERT INTO {table_sql}", "ArrowStream")
    ins.append(sink.getvalue().to_pybytes())
    ins.finish()


def read_arrow(conn, sql: str) -> pa.Table:
    # Strings come back as binary so non-UTF-8 BinaryType values survive the trip.
    r = conn.query(sql + " SETTINGS output_format_arrow_string_as_string = 0", "Arrow")
    return pa.ipc.open_file(pa.py_buffer(r.bytes())).read_all()


def table_columns(conn, db: str, table: str) -> list[tuple[str, str, str]]:
    r = conn.query(
        "SELECT name, type, default_kind FROM system.columns "
        f"WHERE database = '{db}' AND table = '{table}' ORDER BY position "
        "SETTINGS output_format_arrow_string_as_string = 1",
        "Arrow",
    )
    t = pa.ipc.open_file(pa.py_buffer(r.bytes())).read_all()
    return [(n, ty, k) for n, ty, k in zip(*(t.column(i).to_pylist() for i in range(3)))]


def info_of(conn, db: str, table: str) -> TableInfo:
    """The table as the server's ``system.columns`` describes it."""
    cols = tuple(Column(*c) for c in table_columns(conn, db, table))
    return TableInfo(db, table, "MergeTree", cols, "", 0, 0)


def normalise(v: object) -> object:
    """Compare values across the trip: str vs bytes, naive NTZ vs UTC, durations in µs."""
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
    if isinstance(v, dt.timedelta):
        return v // dt.timedelta(microseconds=1)
    if isinstance(v, dict):
        return {k: normalise(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [normalise(x) for x in v]
    return v


EVERY_TYPE = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("i8", T.ByteType()),
        T.StructField("i16", T.ShortType()),
        T.StructField("i32", T.IntegerType()),
        T.StructField("i64", T.LongType()),
        T.StructField("f32", T.FloatType()),
        T.StructField("f64", T.DoubleType()),
        T.StructField("dec", T.DecimalType(10, 2)),
        T.StructField("dec38", T.DecimalType(38, 18), False),
        T.StructField("s", T.StringType()),
        T.StructField("bin", T.BinaryType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("d", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("ntz", T.TimestampNTZType()),
        T.StructField("dti", T.DayTimeIntervalType()),
        T.StructField("tm", T.TimeType(6)),
        T.StructField("arr", T.ArrayType(T.IntegerType(), True)),
        T.StructField("arr2", T.ArrayType(T.ArrayType(T.StringType(), False), False)),
        T.StructField("m", T.MapType(T.StringType(), T.LongType(), True)),
        T.StructField(
            "st",
            T.StructType(
                [
                    T.StructField("a b", T.IntegerType()),
                    T.StructField("c`d", T.StringType()),
                    T.StructField("nested", T.ArrayType(T.StructType([T.StructField("x", T.DoubleType())]))),
                ]
            ),
        ),
        T.StructField("geo", T.GeometryType(4326)),
    ]
)

ROWS = [
    {
        "id": 1,
        "i8": -128,
        "i16": 32767,
        "i32": -(2**31),
        "i64": 2**63 - 1,
        "f32": 1.5,
        "f64": -2.25e300,
        "dec": decimal.Decimal("-12345678.90"),
        "dec38": decimal.Decimal("12345678901234567890.123456789012345678"),
        "s": "héllo ✓",
        "bin": b"\x00\xff\x80binary",
        "flag": True,
        "d": dt.date(1900, 1, 1),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        "ntz": dt.datetime(1969, 12, 31, 12, 30, 0, 1),
        "dti": dt.timedelta(days=-3, microseconds=7),
        "tm": dt.time(23, 59, 59, 123456),
        "arr": [1, None, 3],
        "arr2": [["a"], [], ["b", "c"]],
        "m": [("k1", 1), ("k2", None)],
        "st": {"a b": 7, "c`d": "x", "nested": [{"x": 0.5}, {"x": None}]},
        "geo": {"srid": 4326, "wkb": bytes.fromhex("0101000000000000000000f03f0000000000000040")},
    },
    {
        "id": 2,
        "i8": None,
        "i16": None,
        "i32": None,
        "i64": None,
        "f32": None,
        "f64": None,
        "dec": None,
        "dec38": decimal.Decimal("0"),
        "s": None,
        "bin": None,
        "flag": None,
        "d": None,
        "ts": None,
        "ntz": None,
        "dti": None,
        "tm": None,
        "arr": [],
        "arr2": [],
        "m": [],
        "st": {"a b": None, "c`d": None, "nested": []},
        "geo": {"srid": 0, "wkb": b""},
    },
]


def test_a_table_created_from_the_ddl_takes_every_spark_type_and_gives_the_values_back(ch):
    ch.query(create_table_sql("we`ird db", "all types", EVERY_TYPE, order_by="id"))
    arrow_schema = to_arrow_schema(EVERY_TYPE, timezone="UTC")
    insert_arrow(ch, "`we\\`ird db`.`all types`", pa.Table.from_pylist(ROWS, schema=arrow_schema))

    back = read_arrow(ch, "SELECT * FROM `we\\`ird db`.`all types` ORDER BY id")

    assert back.column_names == EVERY_TYPE.names
    got = back.to_pylist()
    for expected, row in zip(ROWS, got):
        for name in EVERY_TYPE.names:
            assert normalise(row[name]) == normalise(expected[name]), name
    assert len(got) == len(ROWS)


def test_the_check_accepts_the_table_the_ddl_created_as_the_server_describes_it(ch):
    ch.query(create_table_sql("we`ird db", "all types", EVERY_TYPE))
    info = info_of(ch, "we`ird db", "all types")
    assert len(info.columns) == len(EVERY_TYPE.fields)
    check_schema(info, spark_schema_to_arrow(EVERY_TYPE))
    # The converter sends the same rows through unchanged in value.
    arrow_schema = to_arrow_schema(EVERY_TYPE, timezone="UTC")
    batch = pa.Table.from_pylist(ROWS, schema=arrow_schema).to_batches()[0]
    plan = ConversionPlan(info.display, conversion_columns(info, arrow_schema), allow_nullable_into_non_nullable=False)
    out = plan.convert(batch)
    for name in EVERY_TYPE.names:
        assert [normalise(v) for v in out.column(name).to_pylist()] == [normalise(r[name]) for r in ROWS], name


# (data type, value, ClickHouse column): what the engine does when our converter refuses.
SILENTLY_LOSSY = [
    (pa.int64(), 300, "Int8", 44),
    (pa.int32(), None, "Int32", 0),
    (pa.float64(), 1e300, "Float32", float("inf")),
]


@pytest.mark.parametrize("arrow_type,value,ch_type,stored", SILENTLY_LOSSY)
def test_the_engine_silently_stores_what_the_converter_refuses(ch, arrow_type, value, ch_type, stored):
    ch.query(f"CREATE TABLE `we\\`ird db`.t (x {ch_type}) ENGINE = MergeTree ORDER BY tuple()")
    data = pa.table({"x": pa.array([value], arrow_type)})
    insert_arrow(ch, "`we\\`ird db`.t", data)
    assert read_arrow(ch, "SELECT x FROM `we\\`ird db`.t").column("x").to_pylist() == [stored]
    info = info_of(ch, "we`ird db", "t")
    check_schema(info, data.schema)  # the kinds may fit: the values decide
    with pytest.raises(ValueDoesNotFitError) as e:
        ConversionPlan(info.display, conversion_columns(info, data.schema)).convert(data.to_batches()[0])
    assert "`x`" in str(e.value) and ch_type in str(e.value) and repr(value) in str(e.value)


def test_the_engine_drops_unknown_columns_and_struct_fields_which_the_check_refuses(ch):
    ch.query("CREATE TABLE `we\\`ird db`.t (x Int32, tup Tuple(a Int32, c String)) ENGINE = MergeTree ORDER BY tuple()")
    data = pa.table(
        {
            "x": pa.array([1], pa.int32()),
            "extra": pa.array([2], pa.int32()),
            "tup": pa.array(
                [{"a": 1, "b": "lost"}],
                pa.struct([pa.field("a", pa.int32(), False), pa.field("b", pa.string(), False)]),
            ),
        },
        schema=pa.schema(
            [
                pa.field("x", pa.int32(), False),
                pa.field("extra", pa.int32(), False),
                pa.field(
                    "tup", pa.struct([pa.field("a", pa.int32(), False), pa.field("b", pa.string(), False)]), False
                ),
            ]
        ),
    )
    insert_arrow(ch, "`we\\`ird db`.t", data)
    assert read_arrow(ch, "SELECT x, tup FROM `we\\`ird db`.t").to_pylist() == [{"x": 1, "tup": {"a": 1, "c": b""}}]
    with pytest.raises(ConfigurationError) as e:
        check_schema(info_of(ch, "we`ird db", "t"), data.schema)
    msg = str(e.value)
    assert "`extra` (int32) is not a column of we`ird db.t" in msg
    assert "struct fields ['a', 'b'] are not the Tuple's elements ['a', 'c']" in msg


@pytest.mark.parametrize(
    "arrow_type,value,ch_type",
    [
        (pa.int8(), -5, "Int64"),
        (pa.uint16(), 65535, "Int32"),
        (pa.int32(), 7, "Decimal(12, 2)"),
        (pa.float32(), 0.5, "Float64"),
        (pa.decimal128(10, 2), decimal.Decimal("12.34"), "Decimal(20, 4)"),
        (pa.date32(), dt.date(1950, 6, 1), "Date32"),
        (pa.timestamp("ms", tz="Europe/Paris"), dt.datetime(2020, 1, 1, 12, tzinfo=UTC), "DateTime64(6, 'Asia/Tokyo')"),
        (pa.large_string(), "lc", "LowCardinality(String)"),
        (pa.string(), "b", "Enum8('a' = 1, 'b' = 2)"),
        (pa.bool_(), True, "UInt8"),
        (pa.binary(), b"\x01\x02", "FixedString(2)"),
        (pa.int32(), 3, "Nullable(Int64)"),
        (pa.string(), "v", "Variant(Int64, String)"),
        (pa.duration("us"), dt.timedelta(seconds=1), "Int64"),
    ],
)
def test_every_widening_the_converter_accepts_is_stored_exactly(ch, arrow_type, value, ch_type):
    data = pa.table({"x": pa.array([value], arrow_type)}, schema=pa.schema([pa.field("x", arrow_type, False)]))
    ch.query(
        f"CREATE TABLE `we\\`ird db`.t (x {ch_type}) ENGINE = MergeTree ORDER BY tuple() "
        "SETTINGS allow_nullable_key = 1"
    )
    info = info_of(ch, "we`ird db", "t")
    check_schema(info, data.schema)
    plan = ConversionPlan(info.display, conversion_columns(info, data.schema))
    insert_arrow(ch, "`we\\`ird db`.t", pa.Table.from_batches([plan.convert(data.to_batches()[0])]))
    # Arrow output sends an Enum as its number: read the label back as text.
    expr = "CAST(x, 'String') AS x" if ch_type.startswith("Enum") else "x"
    got = read_arrow(ch, f"SELECT {expr} FROM `we\\`ird db`.t").column("x").to_pylist()[0]
    if isinstance(value, bool):
        assert got == 1
    elif isinstance(value, dt.timedelta):
        assert got == 1_000_000
    elif isinstance(got, decimal.Decimal) or isinstance(value, decimal.Decimal):
        assert decimal.Decimal(got) == decimal.Decimal(value)
    else:
        assert normalise(got) == normalise(value)
