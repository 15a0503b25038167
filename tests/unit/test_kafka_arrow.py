"""Arrow building of the ``kafka_py`` source: kafka-python records to one record batch.

:func:`spark_datasource.kafka.arrow.records_to_batch` with records built here (no
broker, no Spark). The same batches read from the dev broker through Spark are in
``tests/spark/test_kafka_reader.py``; ``value.format=json`` batches in
``tests/unit/test_kafka_json.py``.
"""

from __future__ import annotations

from collections import namedtuple

from spark_datasource.kafka.arrow import arrow_schema, messages_to_batch, records_to_batch

Rec = namedtuple("Rec", "key value offset timestamp timestamp_type headers")


def test_fetched_records_become_one_arrow_batch_with_the_spark_schema() -> None:
    recs = [
        Rec(None, b"a", 5, 1_700_000_000_123, 0, []),
        Rec(b"k", None, 7, 1_700_000_000_124, 1, [("x", b"1"), ("y", None)]),
        Rec(b"", b"", 8, 0, 0, None),
    ]
    batch = records_to_batch(recs, "t", 3, arrow_schema())
    assert batch.schema.equals(arrow_schema())
    d = batch.to_pydict()
    assert d["key"] == [None, b"k", b""] and d["value"] == [b"a", None, b""]
    assert d["topic"] == ["t"] * 3 and d["partition"] == [3] * 3 and d["offset"] == [5, 7, 8]
    assert [ts.timestamp() for ts in d["timestamp"]] == [1_700_000_000.123, 1_700_000_000.124, 0]
    assert d["timestampType"] == [0, 1, 0]
    assert d["headers"] == [[], [{"key": "x", "value": b"1"}, {"key": "y", "value": None}], []]


def test_a_fetch_without_headers_in_the_schema_leaves_the_headers_column_out() -> None:
    schema = arrow_schema(None, include_headers=False)
    batch = records_to_batch([Rec(b"k", b"v", 0, 1_700_000_000_000, 0, [("x", b"1")])], "t", 0, schema)
    assert batch.schema.equals(schema) and "headers" not in batch.schema.names
    assert batch.to_pydict()["value"] == [b"v"]


def test_librdkafka_messages_become_the_same_batch_as_the_same_kafka_python_records() -> None:
    from confluent_kafka import Message

    recs = [
        Rec(None, b"a", 5, 1_700_000_000_123, 0, []),
        Rec(b"k", None, 7, 1_700_000_000_124, 1, [("x", b"1"), ("y", None)]),
        Rec(b"", b"", 8, 0, 0, None),
    ]
    # librdkafka's timestamp types: 1 create time, 2 log-append time (Spark's 0 and 1)
    msgs = [
        Message(
            topic="t",
            partition=3,
            offset=r.offset,
            key=r.key,
            value=r.value,
            headers=r.headers or None,
            timestamp=(r.timestamp_type + 1, r.timestamp),
        )
        for r in recs
    ]
    for schema in (arrow_schema(), arrow_schema(None, include_headers=False)):
        assert messages_to_batch(msgs, "t", 3, schema).equals(records_to_batch(recs, "t", 3, schema))
    empty = messages_to_batch([], "t", 3, arrow_schema())
    assert empty.num_rows == 0 and empty.schema.equals(arrow_schema())
