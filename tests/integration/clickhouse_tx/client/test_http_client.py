"""The requests-based ClickHouse HTTP client against the local stack."""

from __future__ import annotations

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import (
    NotCommittedError,
    OutcomeUnknownError,
    ReplyLostError,
    RequestNotSentError,
    ServerError,
    TransientError,
)
from clickhouse_tx.interfaces import Target
from server_patches.processes import free_port
from spark_datasource.testing.credentials import target_fields

SECRET = "hunter2-Secret-pw"


@pytest.fixture
def client(clickhouse_url: str, database: str) -> ClickHouseHTTP:
    c = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="t", **target_fields()))
    yield c
    c.close()


def test_hostile_database_table_and_column_names_round_trip(client: ClickHouseHTTP, database: str) -> None:
    table, column = "we`ird ta\\ble;DROP", "col`umn 'x'"
    fq = q.qualified(database, table)
    client.command(f"CREATE TABLE {fq} ({q.quote_identifier(column)} UInt64) ENGINE = MergeTree ORDER BY tuple()")
    data = pa.table({column: pa.array([1, 2, 3], pa.uint64())})
    assert client.insert_arrow_stream(fq, data.schema, iter(data.to_batches())) == 3
    names = client.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
    assert {r["name"] for r in names} == {table}
    rows = client.query_json(f"SELECT sum({q.quote_identifier(column)}) AS s FROM {fq}")
    assert rows == [{"s": 6}]


def test_query_parameters_carry_any_string_unchanged(client: ClickHouseHTTP) -> None:
    value = "tab\there\nnew'line\\back`tick\0nul"
    rows = client.query_json(
        "SELECT {v:String} AS v, {a:Array(String)} AS a, {n:UInt64} AS n",
        params={"v": value, "a": ["x'y", "z\\"], "n": 2**60},
    )
    assert rows == [{"v": value, "a": ["x'y", "z\\"], "n": 2**60}]


def test_a_server_exception_becomes_a_server_error_with_code_and_name(client: ClickHouseHTTP) -> None:
    with pytest.raises(ServerError) as ei:
        client.command("SELECT * FROM table_that_does_not_exist_here")
    assert ei.value.code == 60 and ei.value.name == "UNKNOWN_TABLE"


def test_streaming_insert_counts_rows_and_sends_every_batch(client: ClickHouseHTTP, database: str) -> None:
    fq = q.qualified(database, "big")
    client.command(f"CREATE TABLE {fq} (a UInt64, b String) ENGINE = MergeTree ORDER BY a")
    n = 300_000
    data = pa.table({"a": pa.array(range(n), pa.uint64()), "b": pa.array(["v"] * n)})

    def gen():  # a generator, as from a Spark task: consumed while the body is sent
        yield from data.to_batches(max_chunksize=10_000)

    assert client.insert_arrow_stream(fq, data.schema, gen()) == n
    assert client.query_json(f"SELECT count() AS c, sum(a) AS s FROM {fq}") == [{"c": n, "s": n * (n - 1) // 2}]


def test_serialized_record_batches_go_in_as_one_insert_with_their_nulls_and_strings(
    client: ClickHouseHTTP, database: str
) -> None:
    fq = q.qualified(database, "m")
    client.command(f"CREATE TABLE {fq} (a UInt64, s Nullable(String)) ENGINE = MergeTree ORDER BY a")
    batch = pa.record_batch(
        {"a": pa.array(range(1000), pa.uint64()), "s": pa.array([None if i % 7 == 0 else f"r{i}" for i in range(1000)])}
    )
    client.insert_arrow_messages(
        fq, batch.schema, [batch.slice(10, 490).serialize(), batch.slice(500).serialize()], rows=batch.num_rows - 10
    )
    assert client.query_json(
        f"SELECT count() AS c, min(a) AS lo, countIf(s IS NULL) AS n, max(s) AS top FROM {fq}"
    ) == [{"c": 990, "lo": 10, "n": sum(1 for i in range(10, 1000) if i % 7 == 0), "top": "r999"}]


def test_an_error_in_the_source_iterator_aborts_the_insert_and_writes_nothing(
    client: ClickHouseHTTP, database: str
) -> None:
    fq = q.qualified(database, "t")
    client.command(f"CREATE TABLE {fq} (a UInt64) ENGINE = MergeTree ORDER BY a")
    data = pa.table({"a": pa.array(range(100), pa.uint64())})

    def failing():
        yield data.to_batches()[0]
        raise ValueError("the source broke")

    with pytest.raises(ValueError, match="the source broke"):
        client.insert_arrow_stream(fq, data.schema, failing())
    assert client.query_json(f"SELECT count() AS c FROM {fq}") == [{"c": 0}]


def test_a_refused_connection_is_a_retryable_not_sent_error_without_the_password() -> None:
    c = ClickHouseHTTP(
        Target(url=f"http://127.0.0.1:{free_port()}", database="d", table="t", password=SECRET, connect_timeout_s=2)
    )
    with pytest.raises(RequestNotSentError) as ei:
        c.command("SELECT 1")
    assert isinstance(ei.value, TransientError) and isinstance(ei.value, NotCommittedError)
    assert SECRET not in str(ei.value) and SECRET not in repr(c)


def test_a_reply_that_does_not_arrive_in_time_is_an_outcome_unknown_error(clickhouse_url: str) -> None:
    c = ClickHouseHTTP(
        Target(url=clickhouse_url, database="default", table="t", request_timeout_s=0.3, **target_fields())
    )
    with pytest.raises(ReplyLostError) as ei:
        c.command("SELECT sleep(1.5)")
    assert isinstance(ei.value, OutcomeUnknownError)


def test_a_wrong_password_fails_with_the_server_error_and_never_shows_the_password(clickhouse_url: str) -> None:
    c = ClickHouseHTTP(Target(url=clickhouse_url, database="default", table="t", password=SECRET))
    with pytest.raises(ServerError) as ei:
        c.command("SELECT 1")
    assert ei.value.name == "AUTHENTICATION_FAILED"
    assert SECRET not in str(ei.value) and SECRET not in repr(ei.value)


def test_credentials_in_the_url_are_used_but_never_shown(clickhouse_url: str) -> None:
    url = clickhouse_url.replace("http://", f"http://default:{SECRET}@")
    c = ClickHouseHTTP(Target(url=url, database="default", table="t", user=""))
    with pytest.raises(ServerError) as ei:
        c.command("SELECT 1")
    assert ei.value.name == "AUTHENTICATION_FAILED"
    assert SECRET not in str(ei.value) and SECRET not in repr(c) and SECRET not in c.server


def test_a_session_keeps_its_transaction_between_requests(clickhouse_url: str, database: str) -> None:
    fq = q.qualified(database, "t")
    plain = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="t", **target_fields()))
    plain.command(f"CREATE TABLE {fq} (a UInt64) ENGINE = MergeTree ORDER BY a")
    s = ClickHouseHTTP(
        Target(url=clickhouse_url, database=database, table="t", **target_fields()),
        session_id="sess-test-1",
        session_timeout=30,
    )
    s.command("BEGIN TRANSACTION")
    s.command(f"INSERT INTO {fq} VALUES (1)")
    assert s.query_json(f"SELECT count() AS c FROM {fq}") == [{"c": 1}]
    s.command("ROLLBACK")
    assert plain.query_json(f"SELECT count() AS c FROM {fq}") == [{"c": 0}]


def test_session_check_fails_for_a_session_that_does_not_exist(clickhouse_url: str) -> None:
    s = ClickHouseHTTP(
        Target(url=clickhouse_url, database="default", table="t", **target_fields()), session_id="never-created-xyz"
    )
    with pytest.raises(ServerError) as ei:
        s.command("SELECT 1", session_check=True)
    assert ei.value.code == 372
