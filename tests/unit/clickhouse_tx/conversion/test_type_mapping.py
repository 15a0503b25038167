"""Type mapping, the ClickHouse type parser and the driver-side schema check (pure)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from clickhouse_tx.conversion.chtypes import CHType, parse_clickhouse_type
from clickhouse_tx.conversion.schema import Column, TableInfo, check_schema
from clickhouse_tx.errors import ConfigurationError
from spark_datasource.sink.table_ddl import create_table_sql, quote_identifier
from spark_datasource.sink.type_mapping import arrow_to_clickhouse, spark_schema_to_arrow, spark_to_clickhouse

# ---------------------------------------------------------------- Spark -> ClickHouse


@pytest.mark.parametrize(
    "spark,ch",
    [
        (T.ByteType(), "Int8"),
        (T.ShortType(), "Int16"),
        (T.IntegerType(), "Int32"),
        (T.LongType(), "Int64"),
        (T.FloatType(), "Float32"),
        (T.DoubleType(), "Float64"),
        (T.DecimalType(10, 2), "Decimal(10, 2)"),
        (T.DecimalType(38, 0), "Decimal(38, 0)"),
        (T.StringType(), "String"),
        (T.CharType(3), "String"),
        (T.VarcharType(9), "String"),
        (T.BinaryType(), "String"),
        (T.BooleanType(), "Bool"),
        (T.DateType(), "Date32"),
        (T.TimestampType(), "DateTime64(6, 'UTC')"),
        (T.TimestampNTZType(), "DateTime64(6, 'UTC')"),
        (T.DayTimeIntervalType(), "Int64"),
        (T.TimeType(3), "Time64(3)"),
        (T.ArrayType(T.IntegerType(), False), "Array(Int32)"),
        (T.ArrayType(T.IntegerType(), True), "Array(Nullable(Int32))"),
        (T.ArrayType(T.ArrayType(T.StringType(), False), True), "Array(Array(String))"),
        (T.MapType(T.StringType(), T.LongType(), False), "Map(String, Int64)"),
        (T.MapType(T.StringType(), T.LongType(), True), "Map(String, Nullable(Int64))"),
        (
            T.StructType([T.StructField("a", T.IntegerType(), False), T.StructField("b c", T.StringType())]),
            "Tuple(`a` Int32, `b c` Nullable(String))",
        ),
        (T.GeometryType(4326), "Tuple(srid Int32, wkb String)"),
    ],
)
def test_every_spark_type_maps_to_its_clickhouse_type(spark, ch):
    assert spark_to_clickhouse(spark, False) == ch
    # and the result is a type the parser reads back
    assert parse_clickhouse_type(ch).name == ch.split("(")[0]


@pytest.mark.parametrize(
    "spark,ch",
    [
        (T.IntegerType(), "Nullable(Int32)"),
        (T.StringType(), "Nullable(String)"),
        (T.DecimalType(5, 1), "Nullable(Decimal(5, 1))"),
        (T.TimestampType(), "Nullable(DateTime64(6, 'UTC'))"),
        (T.ArrayType(T.IntegerType(), False), "Array(Int32)"),
        (T.MapType(T.StringType(), T.IntegerType(), False), "Map(String, Int32)"),
        (T.StructType([T.StructField("a", T.IntegerType(), False)]), "Tuple(`a` Int32)"),
    ],
)
def test_nullable_fields_wrap_scalars_but_never_arrays_maps_or_tuples(spark, ch):
    assert spark_to_clickhouse(spark, True) == ch


def test_a_struct_field_name_with_a_backtick_is_escaped_in_the_type():
    st_ = T.StructType([T.StructField("a`b\\c", T.IntegerType(), False)])
    ch = spark_to_clickhouse(st_)
    assert ch == "Tuple(`a\\`b\\\\c` Int32)"
    assert parse_clickhouse_type(ch).names == ("a`b\\c",)


@pytest.mark.parametrize(
    "spark,words",
    [
        (T.NullType(), "Nullable(Nothing)"),
        (T.VariantType(), "to_json"),
        (T.YearMonthIntervalType(), "interval"),
        (T.CalendarIntervalType(), "interval"),
        (T.StructType([]), "empty struct"),
    ],
)
def test_types_without_a_column_type_are_refused_naming_the_column(spark, words):
    with pytest.raises(ConfigurationError) as e:
        spark_to_clickhouse(spark, True, column="payload")
    assert "`payload`" in str(e.value) and words in str(e.value)


class PointUDT(T.UserDefinedType):
    @classmethod
    def sqlType(cls) -> T.DataType:
        return T.ArrayType(T.DoubleType(), False)


def test_a_user_defined_type_maps_through_its_sql_type():
    assert spark_to_clickhouse(PointUDT()) == "Array(Float64)"


@pytest.mark.parametrize(
    "arrow,ch",
    [
        (pa.int8(), "Int8"),
        (pa.uint64(), "UInt64"),
        (pa.float16(), "Float32"),
        (pa.float64(), "Float64"),
        (pa.decimal128(7, 3), "Decimal(7, 3)"),
        (pa.decimal256(60, 10), "Decimal(60, 10)"),
        (pa.large_string(), "String"),
        (pa.large_binary(), "String"),
        (pa.binary(4), "FixedString(4)"),
        (pa.bool_(), "Bool"),
        (pa.date32(), "Date32"),
        (pa.date64(), "Date32"),
        (pa.timestamp("ms", tz="Europe/Paris"), "DateTime64(3, 'UTC')"),
        (pa.timestamp("ns"), "DateTime64(9, 'UTC')"),
        (pa.duration("us"), "Int64"),
        (pa.time64("ns"), "Time64(9)"),
        (pa.dictionary(pa.int32(), pa.string()), "String"),
        (pa.large_list(pa.field("x", pa.int16(), False)), "Array(Int16)"),
        (pa.map_(pa.string(), pa.int32()), "Map(String, Nullable(Int32))"),
        (pa.struct([pa.field("a", pa.int32(), False)]), "Tuple(`a` Int32)"),
    ],
)
def test_arrow_types_map_like_the_spark_types_they_come_from(arrow, ch):
    assert arrow_to_clickhouse(arrow) == ch


def test_an_arrow_null_column_has_no_column_type():
    with pytest.raises(ConfigurationError, match="`n`"):
        arrow_to_clickhouse(pa.null(), True, column="n")


def test_spark_schema_to_arrow_reads_char_as_string_and_names_unconvertible_columns():
    s = spark_schema_to_arrow(T.StructType([T.StructField("c", T.CharType(2))]))
    assert s.field("c").type == pa.string()
    with pytest.raises(ConfigurationError, match="`ym`.*interval year to month"):
        spark_schema_to_arrow(T.StructType([T.StructField("ym", T.YearMonthIntervalType())]))


# ---------------------------------------------------------------- DDL


def test_create_table_sql_quotes_every_identifier_and_defaults_order_by():
    schema = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("we`ird", T.StringType(), True)])
    sql = create_table_sql("d`b", "t\\1", schema)
    assert sql == (
        "CREATE TABLE IF NOT EXISTS `d\\`b`.`t\\\\1`\n(\n"
        "    `id` Int64,\n    `we\\`ird` Nullable(String)\n)\n"
        "ENGINE = MergeTree\nORDER BY tuple()"
    )


def test_create_table_sql_uses_engine_partition_and_order_by():
    schema = T.StructType([T.StructField("id", T.LongType(), False)])
    sql = create_table_sql(
        "db", "t", schema, order_by="id", partition_by="id % 4", engine="ReplacingMergeTree", if_not_exists=False
    )
    assert sql.startswith("CREATE TABLE `db`.`t`")
    assert sql.endswith("ENGINE = ReplacingMergeTree\nPARTITION BY id % 4\nORDER BY id")


def test_create_table_sql_accepts_an_arrow_schema():
    sql = create_table_sql("db", "t", pa.schema([pa.field("x", pa.int32())]))
    assert "`x` Nullable(Int32)" in sql


@pytest.mark.parametrize(
    "schema,words",
    [
        (T.StructType([]), "no columns"),
        (
            T.StructType([T.StructField("a", T.IntegerType()), T.StructField("a", T.LongType())]),
            "duplicate columns ['a']",
        ),
        (T.StructType([T.StructField("v", T.VariantType())]), "`v`"),
    ],
)
def test_create_table_sql_refuses_schemas_it_cannot_express(schema, words):
    with pytest.raises(ConfigurationError) as e:
        create_table_sql("db", "t", schema)
    assert words in str(e.value)


@pytest.mark.parametrize("name", ["", "a\x00b"])
def test_quote_identifier_refuses_empty_and_nul(name):
    with pytest.raises(ConfigurationError):
        quote_identifier(name)


# ---------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Int32", CHType("Int32")),
        ("Nullable(Int32)", CHType("Nullable", (CHType("Int32"),))),
        ("LowCardinality(Nullable(String))", CHType("LowCardinality", (CHType("Nullable", (CHType("String"),)),))),
        ("Array(Array(UInt8))", CHType("Array", (CHType("Array", (CHType("UInt8"),)),))),
        ("Map(String, Array(Int64))", CHType("Map", (CHType("String"), CHType("Array", (CHType("Int64"),))))),
        ("Tuple(\n    a Int32,\n    b String)", CHType("Tuple", (CHType("Int32"), CHType("String")), ("a", "b"))),
        ("Tuple(Int32, String)", CHType("Tuple", (CHType("Int32"), CHType("String")))),
        ("Tuple(`a b` Int32, `c\\`d` String)", CHType("Tuple", (CHType("Int32"), CHType("String")), ("a b", "c`d"))),
        ("Decimal(10, 2)", CHType("Decimal", (10, 2))),
        ("Decimal(5)", CHType("Decimal", (5, 0))),
        ("Decimal32(3)", CHType("Decimal", (9, 3))),
        ("Decimal256(10)", CHType("Decimal", (76, 10))),
        ("DateTime64(6, 'UTC')", CHType("DateTime64", (6, "UTC"))),
        ("DateTime('Europe/Paris')", CHType("DateTime", ("Europe/Paris",))),
        ("Enum8('a' = 1, 'b\\'c' = -2)", CHType("Enum8", (("a", 1), ("b'c", -2)))),
        ("Enum16('x''y' = 300)", CHType("Enum16", (("x'y", 300),))),
        ("FixedString(16)", CHType("FixedString", (16,))),
        ("BIGINT", CHType("Int64")),
        ("boolean", CHType("Bool")),
        ("Variant(Int64, String)", CHType("Variant", (CHType("Int64"), CHType("String")))),
        (
            "JSON(max_dynamic_paths = 10, a.b UInt32, SKIP a.c)",
            CHType("JSON", ("max_dynamic_paths = 10, a.b UInt32, SKIP a.c",)),
        ),
        (
            "AggregateFunction(quantiles(0.5, 0.9), UInt64)",
            CHType("AggregateFunction", ("quantiles(0.5, 0.9), UInt64",)),
        ),
        ("Object('json')", CHType("Object", ("'json'",))),
    ],
)
def test_the_parser_reads_the_types_clickhouse_prints(text, expected):
    assert parse_clickhouse_type(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Int32",
        "Nullable(Int32)",
        "Map(String, Array(Tuple(`a b` Int32, `c\\`d` String)))",
        "Enum8('a' = 1, 'b\\'c' = -2)",
        "DateTime64(6, 'UTC')",
        "Tuple(Int32, String)",
    ],
)
def test_printing_a_parsed_type_and_parsing_it_again_gives_the_same_type(text):
    t = parse_clickhouse_type(text)
    assert parse_clickhouse_type(str(t)) == t
    assert pickle.loads(pickle.dumps(t)) == t


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "(",
        ")",
        "Int32)",
        "Nullable(",
        "Nullable()",
        "Nullable(Int32, Int64)",
        "Nullable",
        "Array",
        "Map(String)",
        "Decimal(0, 0)",
        "Decimal(10, 11)",
        "Decimal(a, b)",
        "Decimal(77, 1)",
        "FixedString(0)",
        "FixedString('a')",
        "DateTime64(10)",
        "DateTime64('UTC')",
        "DateTime(3)",
        "Enum8(a = 1)",
        "Enum8('a' = )",
        "Enum8('a' = 1",
        "Tuple(a Int32, String)",
        "Tuple(`a Int32)",
        "Array(Int32",
        "Int32 Int64",
        "Array(Int32) garbage",
        "Nullable('x')",
        "Tuple(a\\",
        "JSON(a",
        "Map(String, ,)",
        "Enum8('unterminated = 1)",
        "DateTime64(6, 'UTC\\",
    ],
)
def test_the_parser_refuses_malformed_types_with_a_clear_error(text):
    with pytest.raises(ConfigurationError, match="cannot parse ClickHouse type"):
        parse_clickhouse_type(text)


def test_the_parser_refuses_absurd_nesting_and_length_without_crashing():
    with pytest.raises(ConfigurationError, match="nesting deeper"):
        parse_clickhouse_type("Array(" * 1_000 + "Int8" + ")" * 1_000)
    with pytest.raises(ConfigurationError, match="too long"):
        parse_clickhouse_type("Tuple(" + "Int8, " * 20_000 + "Int8)")
    with pytest.raises(ConfigurationError, match="must be a string"):
        parse_clickhouse_type(None)


def test_a_parse_error_quotes_a_long_type_only_in_part():
    with pytest.raises(ConfigurationError) as e:
        parse_clickhouse_type("Tuple(" + "a" * 5000)
    assert len(str(e.value)) < 400


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("()'`\\ ,=-0123456789aTupleNulArrayMp")), max_size=60))
def test_the_parser_either_parses_or_raises_configuration_error_on_any_text(text):
    try:
        parse_clickhouse_type(text)
    except ConfigurationError:
        pass


# ---------------------------------------------------------------- the driver check


def _info(*cols: tuple) -> TableInfo:
    return TableInfo("db", "t", "MergeTree", tuple(Column(*c) for c in cols), "", 0, 0)


def ok(arrow: pa.DataType, ch: str, nullable: bool = False) -> bool:
    schema = pa.schema([pa.field("c", arrow, nullable)])
    try:
        check_schema(_info(("c", ch)), schema)
        return True
    except ConfigurationError:
        return False


@pytest.mark.parametrize(
    "arrow,ch",
    [
        (pa.int8(), "Int8"),
        (pa.int64(), "Int32"),
        (pa.int64(), "UInt64"),
        (pa.int64(), "UInt8"),
        (pa.int64(), "Int128"),
        (pa.uint32(), "Int32"),
        (pa.int32(), "Float32"),
        (pa.int64(), "Decimal(10, 0)"),
        (pa.int8(), "Bool"),
        (pa.bool_(), "UInt8"),
        (pa.float64(), "Float32"),
        (pa.decimal128(10, 2), "Decimal(10, 1)"),
        (pa.decimal128(38, 10), "Decimal(18, 2)"),
        (pa.decimal128(10, 0), "Int64"),
        (pa.string(), "LowCardinality(String)"),
        (pa.string(), "FixedString(8)"),
        (pa.string(), "Enum8('a' = 1)"),
        (pa.int64(), "Enum16('a' = 1)"),
        (pa.string(), "UUID"),
        (pa.string(), "IPv4"),
        (pa.string(), "IPv6"),
        (pa.string(), "JSON"),
        (pa.binary(8), "FixedString(4)"),
        (pa.date32(), "Date"),
        (pa.date32(), "Date32"),
        (pa.timestamp("us", tz="UTC"), "DateTime"),
        (pa.timestamp("us"), "DateTime('Asia/Tokyo')"),
        (pa.timestamp("us"), "DateTime64(3)"),
        (pa.timestamp("s"), "DateTime64(9, 'UTC')"),
        (pa.duration("us"), "Int64"),
        (pa.duration("us"), "IntervalMicrosecond"),
        (pa.time64("ns"), "Time64(6)"),
        (pa.int32(), "Nullable(Int64)"),
        (pa.int64(), "Dynamic"),
        (pa.int64(), "Variant(String, Int32)"),
        (pa.dictionary(pa.int8(), pa.string()), "String"),
        (pa.list_(pa.int64()), "Array(UInt8)"),
        (pa.map_(pa.string(), pa.int64()), "Map(String, UInt64)"),
        (pa.struct([("b", pa.int64()), ("a", pa.string())]), "Tuple(a String, b UInt16)"),
        (pa.struct([("x", pa.int32()), ("y", pa.string())]), "Tuple(Int32, String)"),
        (pa.null(), "String"),
    ],
)
def test_pairs_whose_values_may_fit_pass_the_driver_check(arrow, ch):
    assert ok(arrow, ch, nullable=True) and (pa.types.is_null(arrow) or ok(arrow, ch))


@pytest.mark.parametrize(
    "arrow,ch",
    [
        (pa.float64(), "Int64"),
        (pa.float64(), "Decimal(18, 2)"),
        (pa.decimal128(10, 2), "Float64"),
        (pa.string(), "Int64"),
        (pa.string(), "Date32"),
        (pa.int64(), "String"),
        (pa.binary(), "UUID"),
        (pa.bool_(), "String"),
        (pa.date32(), "DateTime"),
        (pa.date32(), "String"),
        (pa.timestamp("us"), "Date32"),
        (pa.timestamp("us"), "String"),
        (pa.duration("us"), "Decimal(18, 6)"),
        (pa.time64("us"), "Time64(3)"),
        (pa.time64("us"), "String"),
        (pa.float64(), "Variant(String, Int32)"),
        (pa.list_(pa.int32()), "String"),
        (pa.int32(), "Array(Int32)"),
        (pa.list_(pa.string()), "Array(Int32)"),
        (pa.map_(pa.string(), pa.int64()), "Array(Int64)"),
        (pa.map_(pa.int64(), pa.int64()), "Map(String, Int64)"),
        (pa.struct([("a", pa.int32())]), "String"),
        (pa.struct([("a", pa.int32())]), "Tuple(Int32, Int32)"),
        (pa.struct([("a", pa.int32()), ("b", pa.int32())]), "Tuple(a Int32)"),
        (pa.struct([("a", pa.int32())]), "Tuple(a Int32, c String)"),
        (pa.struct([("a", pa.string())]), "Tuple(a Int32)"),
        (pa.int64(), "Point"),
    ],
)
def test_kinds_no_value_of_which_fits_are_refused_on_the_driver(arrow, ch):
    assert not ok(arrow, ch)


def test_a_refusal_names_the_column_the_table_both_types_and_a_hint():
    with pytest.raises(ConfigurationError) as e:
        check_schema(
            _info(("amount", "Int32")),
            pa.schema([("amount", pa.float64())]),
            source_types={"amount": "Spark type double"},
        )
    msg = str(e.value)
    assert "`amount`" in msg and "db.t" in msg and "Spark type double" in msg
    assert "ClickHouse type Int32" in msg and "round or cast in Spark first" in msg


def test_a_data_column_the_table_lacks_is_named_with_close_matches():
    schema = pa.schema([pa.field("usr_id", pa.int64(), False), pa.field("TS", pa.int64(), False)])
    with pytest.raises(ConfigurationError) as e:
        check_schema(_info(("user_id", "Int64"), ("ts", "Int64")), schema)
    msg = str(e.value)
    assert "`usr_id` (int64) is not a column of db.t (did you mean `user_id`?)" in msg
    assert "`TS` (int64) is not a column of db.t (did you mean `ts`?)" in msg


def test_table_columns_missing_from_the_data_need_a_default_or_nullable():
    schema = pa.schema([pa.field("id", pa.int64(), False)])
    check_schema(
        _info(
            ("id", "Int64"),
            ("d", "Int32", "DEFAULT"),
            ("m", "Int32", "MATERIALIZED"),
            ("n", "Nullable(Int32)"),
            ("a", "String", "ALIAS"),
        ),
        schema,
    )
    with pytest.raises(ConfigurationError, match="`x` of db.t .Int32. has no data, no DEFAULT"):
        check_schema(_info(("id", "Int64"), ("x", "Int32")), schema)


def test_data_into_a_materialized_or_alias_column_is_refused():
    with pytest.raises(ConfigurationError, match="MATERIALIZED"):
        check_schema(_info(("m", "Int32", "MATERIALIZED")), pa.schema([("m", pa.int32())]))


def test_excluded_routing_columns_are_not_checked():
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("dest", pa.string(), False)])
    check_schema(_info(("id", "Int64")), schema, exclude=["dest"])


def test_duplicate_data_columns_are_refused():
    schema = pa.schema([pa.field("a", pa.int64(), False), pa.field("a", pa.int64(), False)])
    with pytest.raises(ConfigurationError, match="appears twice"):
        check_schema(_info(("a", "Int64")), schema)


def test_every_problem_is_reported_at_once():
    schema = pa.schema([pa.field("a", pa.float64(), False), pa.field("b", pa.string(), False)])
    with pytest.raises(ConfigurationError) as e:
        check_schema(_info(("a", "Int8"), ("b", "Int64")), schema)
    assert "`a`" in str(e.value) and "`b`" in str(e.value)


def test_a_malformed_table_type_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="cannot parse"):
        check_schema(_info(("a", "Array(")), pa.schema([pa.field("a", pa.int64(), False)]))


def test_the_ddl_output_for_every_spark_type_passes_the_check():
    schema = T.StructType(
        [
            T.StructField("b", T.ByteType()),
            T.StructField("l", T.LongType(), False),
            T.StructField("d", T.DecimalType(20, 5)),
            T.StructField("s", T.StringType()),
            T.StructField("bin", T.BinaryType()),
            T.StructField("flag", T.BooleanType()),
            T.StructField("date", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("iv", T.DayTimeIntervalType()),
            T.StructField("tm", T.TimeType(6)),
            T.StructField("c", T.CharType(4)),
            T.StructField("a", T.ArrayType(T.MapType(T.StringType(), T.DoubleType()))),
            T.StructField(
                "st",
                T.StructType([T.StructField("x y", T.FloatType()), T.StructField("z", T.ArrayType(T.ShortType()))]),
            ),
            T.StructField("g", T.GeographyType(4326)),
        ]
    )
    cols = [(f.name, spark_to_clickhouse(f.dataType, f.nullable, column=f.name)) for f in schema]
    check_schema(_info(*cols), spark_schema_to_arrow(schema))
