"""Mistakes are refused on the driver, before any task writes, with a message that names them.

Each case runs a real ``df.write`` on the local Spark session against the stack
(or a closed port for "server down") and checks two things: the message names the
option, table or column, and nothing reached the server (no rows in the target,
no transaction ever registered: every executor registers before it writes).
"""

from __future__ import annotations

import socket

import pytest

from spark_datasource.testing.credentials import writer_options
from tests.helpers.spark_writes import open_registry_entries, run_sql, table_names

SECRET = "s3cr3t-never-shown"


def _frame(sp):
    return sp.range(0, 100, 1, 2).selectExpr("id", "cast(id as string) as s")


def _write(df, **options: str) -> str:
    """Run the write, as the run's user if any; return the error text (the test fails if it succeeds)."""
    with pytest.raises(Exception) as info:
        df.write.format("clickhouse_tx").options(**{**writer_options(), **options}).mode("append").save()
    return str(info.value)


def _assert_nothing_written(url: str, database: str) -> None:
    names = table_names(url, database)
    if "events" in names:
        assert run_sql(url, f"SELECT count() FROM `{database}`.events FORMAT TSV").strip() == "0"
    if "clickhouse_tx_registry" in names:
        assert run_sql(url, f"SELECT count() FROM `{database}`.clickhouse_tx_registry FORMAT TSV").strip() == "0"
    assert open_registry_entries(url, database) == 0


@pytest.fixture
def events_table(clickhouse_url: str, database: str) -> str:
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.events (id Int64, s String) ENGINE = MergeTree ORDER BY id")
    return "events"


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("tabel", "x", "tabel (did you mean table"),
        ("mode", "exactly_once", "option mode='exactly_once'"),
        ("batch_size", "-3", "option batch_size='-3'"),
        ("session_timeout", "soon", "option session_timeout='soon'"),
        ("table_column", "dest", "table_column='dest' needs the option tables"),
    ],
)
def test_a_bad_option_is_named_and_nothing_is_written(
    sp, clickhouse_url: str, database: str, events_table: str, option: str, value: str, named: str
) -> None:
    msg = _write(_frame(sp), url=clickhouse_url, database=database, table=events_table, **{option: value})
    assert named in msg
    _assert_nothing_written(clickhouse_url, database)


def test_an_unknown_table_is_named_with_the_create_table_hint(sp, clickhouse_url: str, database: str) -> None:
    msg = _write(_frame(sp), url=clickhouse_url, database=database, table="no_such_table")
    assert f"table {database}.no_such_table does not exist" in msg and "create_table" in msg
    assert "no_such_table" not in table_names(clickhouse_url, database)
    _assert_nothing_written(clickhouse_url, database)


def test_a_schema_mismatch_names_the_column_and_both_types(
    sp, clickhouse_url: str, database: str, events_table: str
) -> None:
    df = sp.range(0, 10, 1, 2).selectExpr("id", "array(id) as s")
    msg = _write(df, url=clickhouse_url, database=database, table=events_table)
    assert "column `s`" in msg and "array<bigint>" in msg and "String" in msg
    _assert_nothing_written(clickhouse_url, database)


def test_a_missing_column_is_named(sp, clickhouse_url: str, database: str, events_table: str) -> None:
    df = sp.range(0, 10, 1, 2).selectExpr("id", "cast(id as string) as s", "id as extra")
    msg = _write(df, url=clickhouse_url, database=database, table=events_table)
    assert "extra" in msg
    _assert_nothing_written(clickhouse_url, database)


def test_an_unsupported_spark_type_is_named_with_its_column(sp, clickhouse_url: str, database: str) -> None:
    df = sp.range(0, 10, 1, 2).selectExpr("id", "parse_json('{\"a\": 1}') as s")
    msg = _write(df, url=clickhouse_url, database=database, table="created", create_table="true", order_by="id")
    assert "column `s`" in msg and "variant" in msg.lower()
    assert "created" not in table_names(clickhouse_url, database)
    _assert_nothing_written(clickhouse_url, database)


def test_a_server_that_is_down_is_reported_with_the_url_option(sp) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    msg = _write(
        _frame(sp), url=f"http://127.0.0.1:{port}", table="db.events", **{"retry.attempts": "1", "connect_timeout": "2"}
    )
    assert "cannot reach ClickHouse at" in msg and f"127.0.0.1:{port}" in msg and "option url" in msg


def test_a_wrong_password_is_reported_without_showing_it(
    sp, clickhouse_url: str, database: str, events_table: str
) -> None:
    msg = _write(_frame(sp), url=clickhouse_url, database=database, table=events_table, user="default", password=SECRET)
    assert "authentication failed" in msg and "user and password" in msg
    assert SECRET not in msg
    _assert_nothing_written(clickhouse_url, database)


def test_a_streaming_write_without_a_checkpoint_location_is_refused(
    sp, clickhouse_url: str, database: str, events_table: str
) -> None:
    stream = (
        sp.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .load()
        .selectExpr("value as id", "cast(value as string) as s")
    )
    with pytest.raises(Exception, match="checkpointLocation"):
        q = (
            stream.writeStream.format("clickhouse_tx")
            .option("url", clickhouse_url)
            .options(**writer_options())
            .option("database", database)
            .option("table", events_table)
            .start()
        )
        try:
            q.awaitTermination(60)
            q.processAllAvailable()
        finally:
            q.stop()
    _assert_nothing_written(clickhouse_url, database)
