"""``value.format=json``: the schema option and the strict decoding of record values.

Pure: bytes in, Arrow out. The same path through a real broker and a SparkSession is
in ``tests/spark/test_kafka_reader.py`` (``..._json_values_...``).
"""

from __future__ import annotations

import json
from collections import namedtuple

import pyarrow as pa
import pytest

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.arrow import arrow_schema, records_to_batch
from spark_datasource.kafka.errors import KafkaValueFormatError
from spark_datasource.kafka.json_values import arrow_value_type, decode_values, parse_value_schema
from spark_datasource.kafka.options import parse_kafka_options
from spark_datasource.kafka.reader import SCHEMA, source_schema, spark_value_type

FIELDS = parse_value_schema("event_id BIGINT, user_id LONG, amount DOUBLE, label STRING, ok BOOLEAN")
VT = arrow_value_type(FIELDS)


def _decode(values: list[bytes | None], first_offset: int = 100) -> list[dict | None]:
    return decode_values(values, VT, "events", 3, range(first_offset, first_offset + len(values))).to_pylist()


def test_each_value_becomes_one_struct_with_missing_fields_null_and_unknown_fields_ignored() -> None:
    got = _decode(
        [
            b'{"event_id": 1, "user_id": 7, "amount": 2.5, "label": "a\\u00e9", "ok": true}',
            b'{"event_id": 2, "extra": {"nested": [1, 2]}}',
            b'{"event_id": null, "amount": 3}',
        ]
    )
    assert got == [
        {"event_id": 1, "user_id": 7, "amount": 2.5, "label": "aé", "ok": True},
        {"event_id": 2, "user_id": None, "amount": None, "label": None, "ok": None},
        {"event_id": None, "user_id": None, "amount": 3.0, "label": None, "ok": None},
    ]


def test_a_record_without_a_value_has_a_null_struct_in_its_own_place() -> None:
    got = _decode([None, b'{"event_id": 1}', None, b'{"event_id": 2}'])
    assert got[0] is None and got[2] is None
    assert [g["event_id"] for g in got if g is not None] == [1, 2]


def test_a_value_printed_over_several_lines_is_still_one_record() -> None:
    pretty = json.dumps({"event_id": 5, "label": "x"}, indent=2).encode()
    assert b"\n" in pretty
    got = _decode([pretty, b'{"event_id": 6}'])
    assert [g["event_id"] for g in got] == [5, 6]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b'{"event_id": 1.5}', "int64"),
        (b'{"event_id": "5"}', "changed from number to string"),
        (b'{"label": 5}', "changed from string to number"),
        (b'{"ok": 1}', "changed from boolean to number"),
        (b'{"event_id": 9223372036854775808}', "int64"),
        (b"", "Empty JSON"),
        (b'{"event_id": 1}{"event_id": 2}', "not one JSON object"),
        (b"[1, 2]", "array"),
        (b'{"event_id": 1', "parse error"),
    ],
)
def test_a_value_that_does_not_fit_fails_naming_its_topic_partition_offset_and_reason(bad: bytes, reason: str) -> None:
    values = [b'{"event_id": %d}' % i for i in range(37)]
    values[29] = bad
    with pytest.raises(KafkaValueFormatError) as e:
        _decode(values)
    text = str(e.value)
    assert "events[3] offset 129 " in text
    assert reason in text
    assert "value.format" in text


def test_a_long_malformed_value_is_shown_only_in_part() -> None:
    bad = b'{"label": "' + b"x" * 5000 + b'", "event_id": "no"}'
    with pytest.raises(KafkaValueFormatError) as e:
        _decode([bad])
    assert f"({len(bad)} bytes)" in str(e.value)
    assert len(str(e.value)) < 1000


def test_a_narrow_integer_out_of_range_is_refused_not_wrapped() -> None:
    vt = arrow_value_type(parse_value_schema("b TINYINT"))
    with pytest.raises(KafkaValueFormatError, match="int8"):
        decode_values([b'{"b": 300}'], vt, "t", 0, [0])
    assert decode_values([b'{"b": -128}'], vt, "t", 0, [0]).to_pylist() == [{"b": -128}]


def test_the_schema_takes_flat_ddl_with_sparks_type_names_and_quoted_names() -> None:
    fields = parse_value_schema(" a TINYINT, b: smallint, `we``ird name` Int, d real, e STRING ")
    assert fields == (("a", "byte"), ("b", "short"), ("we`ird name", "integer"), ("d", "float"), ("e", "string"))


@pytest.mark.parametrize(
    ("ddl", "says"),
    [
        ("", "is empty"),
        ("a ARRAY<INT>", "nested"),
        ("a DECIMAL(10, 2)", "nested and parameterised"),
        ("a TIMESTAMP", "has type 'TIMESTAMP'"),
        ("a INT, A BIGINT", "given twice"),
        ("a INT b", "cannot read"),
        ("a INT,", "cannot read"),
    ],
)
def test_a_schema_the_source_cannot_decode_is_refused_naming_the_option(ddl: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match="value.schema") as e:
        parse_value_schema(ddl)
    assert says in str(e.value)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"value.format": "json"}, "value.schema"),
        ({"value.schema": "a INT"}, "only read with value.format=json"),
        ({"value.format": "avro", "value.schema": "a INT"}, "expected binary"),
    ],
)
def test_value_format_options_that_do_not_go_together_fail_on_the_driver(options: dict, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_kafka_options({"bootstrap.servers": "h:1", "subscribe": "t", **options})


def test_value_format_json_makes_value_a_struct_in_both_the_spark_and_the_arrow_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    opts = parse_kafka_options(
        {"bootstrap.servers": "h:1", "subscribe": "t", "Value.Format": "JSON", "value.schema": "a INT, b STRING"}
    )
    schema = source_schema(opts.value_fields)
    assert schema["value"].dataType == spark_value_type(opts.value_fields)
    assert [f.name for f in schema.fields] == [f.name for f in SCHEMA.fields]
    assert arrow_schema(opts.value_fields).equals(to_arrow_schema(schema, timezone="UTC"), check_metadata=True)
    assert source_schema(None) is SCHEMA


def test_every_type_the_source_decodes_is_spelled_in_arrow_as_pyspark_converts_it() -> None:
    from pyspark.sql.pandas.types import to_arrow_type

    fields = parse_value_schema("a BOOLEAN, b BYTE, c SHORT, d INT, e LONG, f FLOAT, g DOUBLE, h STRING")
    for spark_field, arrow_field in zip(spark_value_type(fields).fields, arrow_value_type(fields)):
        assert to_arrow_type(spark_field.dataType) == arrow_field.type


def test_a_fetch_with_value_format_json_becomes_one_batch_with_the_decoded_value() -> None:
    Rec = namedtuple("Rec", "key value offset timestamp timestamp_type headers")
    recs = [Rec(None, b'{"event_id": %d}' % i, 40 + i, 1_700_000_000_000, 0, []) for i in range(3)]
    batch = records_to_batch(recs, "events", 1, arrow_schema(FIELDS))
    assert batch.schema.equals(arrow_schema(FIELDS))
    assert [v["event_id"] for v in batch.column("value").to_pylist()] == [0, 1, 2]
    assert batch.column("offset").to_pylist() == [40, 41, 42]


def test_an_empty_fetch_decodes_to_an_empty_struct_column() -> None:
    assert decode_values([], VT, "t", 0, []).type == VT
    assert isinstance(decode_values([None], VT, "t", 0, [0]), pa.Array)
