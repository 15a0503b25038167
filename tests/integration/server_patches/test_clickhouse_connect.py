"""clickhouse-connect, unmodified and with its default settings (lz4 compression on),
against the embedded ClickHouse HTTP interface: what the protocol relies on works.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
import uuid
from urllib.parse import urlsplit

import clickhouse_connect
import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from server_patches.stack_files import StackInfo
from spark_datasource.testing.credentials import clickhouse_connect_login
from tests.conftest import quote_ident


def _client(stack: StackInfo, database: str, **kwargs: object):  # -> clickhouse_connect Client
    host = urlsplit(stack.clickhouse_url).hostname or "127.0.0.1"
    login = clickhouse_connect_login()  # the run's user and password (make test-external), if any
    return clickhouse_connect.get_client(host=host, port=stack.clickhouse_port, database=database, **login, **kwargs)


def _count(client, table: str, where: str = "1", *, committed_only: bool = False) -> int:
    settings = {"implicit_transaction": 1} if committed_only else None
    return int(client.command(f"SELECT count() FROM {quote_ident(table)} WHERE {where}", settings=settings))


def test_create_insert_and_query_round_trip_with_default_client_settings(ch_client) -> None:
    ch_client.command("CREATE TABLE t (id UInt64, name String, score Float64) ENGINE = MergeTree ORDER BY id")
    rows = [[i, f"name-{i}", i / 2] for i in range(1000)]
    ch_client.insert("t", rows, column_names=["id", "name", "score"])  # lz4 Native body

    result = ch_client.query("SELECT id, name, score FROM t ORDER BY id")

    assert result.result_rows == [tuple(r) for r in rows]
    assert result.column_names == ("id", "name", "score")
    assert ch_client.command("SELECT sum(id) FROM t") == sum(range(1000))


def test_insert_arrow_of_a_million_rows_arrives_complete(ch_client) -> None:
    n = 1_000_000
    ch_client.command("CREATE TABLE big (id UInt64, v Float64) ENGINE = MergeTree ORDER BY id")
    table = pa.table({"id": pa.array(range(n), pa.uint64()), "v": pa.array([i * 0.5 for i in range(n)], pa.float64())})

    ch_client.insert_arrow("big", table)

    assert ch_client.command("SELECT count() FROM big") == n
    assert ch_client.command("SELECT sum(id) FROM big") == n * (n - 1) // 2
    back = ch_client.query_arrow("SELECT id, v FROM big ORDER BY id")
    assert back.num_rows == n
    assert back.column("id").to_pylist()[-3:] == [n - 3, n - 2, n - 1]
    assert back.column("v").to_pylist()[:2] == [0.0, 0.5]


def test_two_sessions_with_concurrent_transactions_stay_isolated_and_only_the_commit_lands(
    stack: StackInfo, database: str, ch_client
) -> None:
    ch_client.command("CREATE TABLE t (id UInt64, who String) ENGINE = MergeTree ORDER BY id")
    a = _client(stack, database, session_id=f"a-{uuid.uuid4()}")
    b = _client(stack, database, session_id=f"b-{uuid.uuid4()}")
    try:

        def write(client, who: str, first: int) -> None:
            client.command("BEGIN TRANSACTION")
            # With the types given, insert() skips its DESCRIBE TABLE, which ClickHouse
            # refuses inside a transaction (code 48, NOT_IMPLEMENTED).
            client.insert(
                "t",
                [[first + i, who] for i in range(1000)],
                column_names=["id", "who"],
                column_type_names=["UInt64", "String"],
                # A server refuses a queued (async) INSERT inside a transaction, and
                # async_insert is on by default since 26.2.
                settings={"async_insert": 0},
            )

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda args: write(*args), [(a, "a", 0), (b, "b", 1000)]))

        # Each open transaction sees its own rows and none of the other's.
        assert _count(a, "t", "who = 'a'") == 1000
        assert _count(a, "t", "who = 'b'") == 0
        assert _count(b, "t", "who = 'b'") == 1000
        assert _count(b, "t", "who = 'a'") == 0
        # A committed-only reader sees neither before the decision.
        assert _count(ch_client, "t", committed_only=True) == 0

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda c: c[0].command(c[1]), [(a, "COMMIT"), (b, "ROLLBACK")]))

        assert _count(ch_client, "t", "who = 'a'", committed_only=True) == 1000
        assert _count(ch_client, "t", "who = 'b'", committed_only=True) == 0
        assert _count(ch_client, "t") == 1000  # the rolled-back rows are gone for plain reads too
    finally:
        a.close()
        b.close()


def test_an_expired_session_rolls_back_its_open_transaction(stack: StackInfo, database: str, ch_client) -> None:
    ch_client.command("CREATE TABLE t (id UInt64) ENGINE = MergeTree ORDER BY id")
    session_id = f"short-{uuid.uuid4()}"
    short = _client(stack, database, session_id=session_id, settings={"session_timeout": 1})
    try:
        short.command("BEGIN TRANSACTION")
        short.command("INSERT INTO t VALUES (1), (2), (3)", settings={"async_insert": 0})
        # Outside a transaction ClickHouse shows the open insert (docs/design.md §4 caveat):
        # this proves the transaction is open before it expires.
        assert _count(ch_client, "t") == 3

        deadline = time.monotonic() + 60  # the session times out after 1 s idle
        while _count(ch_client, "t") != 0 and time.monotonic() < deadline:
            time.sleep(0.2)

        assert _count(ch_client, "t") == 0
        # Same session id again: a new session, with no transaction left to commit.
        with pytest.raises(DatabaseError):
            short.command("COMMIT")
        assert _count(ch_client, "t", committed_only=True) == 0
    finally:
        short.close()


def test_keeper_map_table_stores_rows_and_strict_mode_refuses_an_existing_key(ch_client, database: str) -> None:
    ch_client.command(
        f"CREATE TABLE km (k String, state String, n UInt64) ENGINE = KeeperMap('/{database}/km') PRIMARY KEY k"
    )
    ch_client.insert("km", [["x1", "INITIALIZED", 1], ["x2", "INITIALIZED", 2]], column_names=["k", "state", "n"])
    ch_client.command("INSERT INTO km VALUES ('x1', 'COMMITTING', 1)")  # default: overwrite

    with pytest.raises(DatabaseError):
        ch_client.command("INSERT INTO km VALUES ('x2', 'ABORTING', 2)", settings={"keeper_map_strict_mode": 1})
    ch_client.command("DELETE FROM km WHERE k = 'x2'")
    ch_client.command("INSERT INTO km VALUES ('x3', 'INITIALIZED', 3)")

    rows = ch_client.query("SELECT k, state, n FROM km ORDER BY k").result_rows
    assert rows == [("x1", "COMMITTING", 1), ("x3", "INITIALIZED", 3)]


def test_server_errors_arrive_as_database_errors_carrying_the_clickhouse_code(ch_client) -> None:
    with pytest.raises(DatabaseError) as unknown_table:
        ch_client.query("SELECT * FROM no_such_table")
    with pytest.raises(DatabaseError) as syntax:
        ch_client.command("SELEKT 1")

    # clickhouse-connect takes the code from X-ClickHouse-Exception-Code and the name
    # from the body; the body itself is ClickHouse's "Code: N. DB::Exception: ..." text.
    assert (unknown_table.value.code, unknown_table.value.name) == (60, "UNKNOWN_TABLE")
    assert re.search(r"Code: 60\. DB::Exception: ", str(unknown_table.value))
    assert (syntax.value.code, syntax.value.name) == (62, "SYNTAX_ERROR")
    assert re.search(r"Code: 62\. DB::Exception: ", str(syntax.value))
    assert ch_client.command("SELECT 1") == 1  # the client's session still works


def test_a_session_refuses_a_second_query_while_one_runs(stack: StackInfo, database: str) -> None:
    session_id = f"busy-{uuid.uuid4()}"
    first = _client(stack, database, session_id=session_id)
    second = _client(stack, database, session_id=session_id)
    refused: list[DatabaseError] = []

    def slow() -> None:
        try:
            first.command("SELECT sleepEachRow(0.5) FROM numbers(6) FORMAT Null", settings={"max_block_size": 1})
        except DatabaseError as e:  # it lost the race for the session lock
            refused.append(e)

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(slow)
            # Whichever of the two holds the session, the other one must be refused.
            while not running.done() and not refused:
                try:
                    second.command("SELECT 1")
                except DatabaseError as e:
                    refused.append(e)
            running.result()
        assert refused, "two queries overlapped in one session and neither was refused"
        assert all((e.code, e.name) == (373, "SESSION_IS_LOCKED") for e in refused), refused
        assert second.command("SELECT 1") == 1  # the session is usable once free
    finally:
        first.close()
        second.close()
