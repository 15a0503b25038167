"""The embedded server speaks ClickHouse's HTTP protocol where clients depend on it:
streamed results with in-body exceptions, ``multipart/form-data`` parameters and
external data, result-less statements through ``command()``, and query text that is
not UTF-8. Checked with raw HTTP (what goes over the wire) and with an unmodified
clickhouse-connect (what a client makes of it).
"""

from __future__ import annotations

import re
import uuid

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError, StreamFailureError
from clickhouse_connect.driver.external import ExternalData
from clickhouse_connect.driver.summary import QuerySummary

from server_patches.stack_files import StackInfo
from spark_datasource.testing.credentials import clickhouse_connect_login, http_auth

# 100 one-row blocks arrive (about a second) before row 100 raises.
FAILS_MID_STREAM = "SELECT sleepEachRow(0.01), throwIf(number = 100) FROM numbers(200)"
ONE_ROW_BLOCKS = {"max_block_size": "1"}


def _read_until_cut(response: requests.Response) -> tuple[bytes, bool]:
    """The body as far as it arrived, and whether it ended without HTTP's final chunk."""
    got = bytearray()
    try:
        for part in response.iter_content(chunk_size=None):
            got += part
    except requests.exceptions.ChunkedEncodingError:
        return bytes(got), True
    return bytes(got), False


def test_an_error_after_the_first_rows_is_written_into_the_body_between_tagged_markers(clickhouse_url: str) -> None:
    r = requests.post(
        clickhouse_url,
        params={**ONE_ROW_BLOCKS, "default_format": "TSV"},
        data=FAILS_MID_STREAM,
        stream=True,
        timeout=60,
        auth=http_auth(),
    )

    body, cut = _read_until_cut(r)

    assert r.status_code == 200  # the rows were on their way before the error
    assert r.headers.get("Transfer-Encoding") == "chunked"
    tag = r.headers["X-ClickHouse-Exception-Tag"]
    rows, _, block = body.partition(b"__exception__\r\n")
    assert rows.splitlines() == [b"0\t0"] * 100  # every row before the failing one, none after
    assert block.startswith(tag.encode() + b"\r\nCode: 395. DB::Exception: ")
    assert b"Value passed to 'throwIf' function is non-zero" in block
    assert block.endswith(tag.encode() + b"\r\n__exception__\r\n")
    assert cut, "the reply must end without HTTP's final chunk, so no client takes it as complete"


def test_clickhouse_connect_raises_a_stream_failure_for_an_error_mid_result_and_keeps_working(ch_client) -> None:
    # clickhouse-connect asks for wait_end_of_query=1 by default (the whole result, or an
    # error status); with 0 the server streams, as in clickhouse-connect's own test.
    streaming = {"max_block_size": 1, "wait_end_of_query": 0}
    with pytest.raises(StreamFailureError) as failure:
        _ = ch_client.query(FAILS_MID_STREAM, settings=streaming).result_rows
    with (
        pytest.raises(StreamFailureError) as streamed,
        ch_client.query_rows_stream(FAILS_MID_STREAM, settings=streaming) as stream,
    ):
        for _ in stream:
            pass

    for err in (failure.value, streamed.value):
        assert "Value passed to 'throwIf' function is non-zero" in str(err)
    assert ch_client.command("SELECT 1") == 1


def test_an_error_before_the_first_byte_is_an_error_status_with_the_exception_code(clickhouse_url: str) -> None:
    early = requests.post(
        clickhouse_url,
        params={"default_format": "Native"},
        data="SELECT throwIf(number = 0) FROM numbers(3)",
        timeout=60,
        auth=http_auth(),
    )
    # wait_end_of_query=1: the whole result is held back, so even a late error gets a status.
    late = requests.post(
        clickhouse_url,
        params={**ONE_ROW_BLOCKS, "wait_end_of_query": "1"},
        data=FAILS_MID_STREAM,
        timeout=60,
        auth=http_auth(),
    )

    for r in (early, late):
        assert r.status_code == 500
        assert r.headers["X-ClickHouse-Exception-Code"] == "395"
        assert re.match(r"Code: 395\. DB::Exception: Value passed to 'throwIf'", r.text)


def test_a_large_select_is_streamed_and_arrives_whole_and_in_order(clickhouse_url: str) -> None:
    n = 2_000_000
    r = requests.post(
        clickhouse_url, data=f"SELECT number FROM numbers({n}) FORMAT TSV", stream=True, timeout=120, auth=http_auth()
    )

    body, cut = _read_until_cut(r)

    assert r.status_code == 200 and not cut
    assert r.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in r.headers
    values = body.split()
    assert len(values) == n
    assert values[:3] == [b"0", b"1", b"2"] and values[-1] == str(n - 1).encode()


def test_a_session_is_free_for_its_next_query_as_soon_as_a_streamed_reply_ends(clickhouse_url: str) -> None:
    session = {"session_id": f"stream-{uuid.uuid4()}"}
    with requests.Session() as http:
        http.auth = http_auth()
        for _ in range(3):
            r = http.post(
                clickhouse_url, params=session, data="SELECT number FROM numbers(2000000) FORMAT TSV", timeout=120
            )
            assert r.status_code == 200, r.text
            assert len(r.content.split()) == 2_000_000
            follow = http.post(clickhouse_url, params=session, data="SELECT 1", timeout=60)
            assert (follow.status_code, follow.text) == (200, "1\n")  # never 373 SESSION_IS_LOCKED


def test_query_and_parameters_sent_as_multipart_form_fields_run_as_in_the_url(clickhouse_url: str) -> None:
    fields = {
        "query": (None, "SELECT {a:UInt32} + {b:UInt32}, {s:String}"),
        "param_a": (None, "40"),
        "param_b": (None, "2"),
        "param_s": (None, "it's ok"),
    }

    r = requests.post(clickhouse_url, files=fields, timeout=60, auth=http_auth())

    assert r.status_code == 200, r.text
    assert r.text == "42\tit\\'s ok\n"


def test_settings_sent_as_multipart_form_fields_apply_to_the_query(clickhouse_url: str) -> None:
    fields = {"query": (None, "SELECT getSetting('max_threads')"), "max_threads": (None, "3")}

    r = requests.post(clickhouse_url, files=fields, timeout=60, auth=http_auth())

    assert (r.status_code, r.text) == (200, "3\n")


def test_external_data_files_are_tables_the_query_reads(clickhouse_url: str) -> None:
    files = {
        "query": (None, "SELECT sum(a), groupArray(b) FROM ext"),
        "ext": ("ext.csv", b"1,x\n2,y\n39,z\n", "text/csv"),
    }

    r = requests.post(
        clickhouse_url,
        params={"ext_structure": "a UInt32, b String", "ext_format": "CSV"},
        files=files,
        timeout=60,
        auth=http_auth(),
    )

    assert r.status_code == 200, r.text
    assert r.text == "42\t['x','y','z']\n"


def test_external_data_given_by_types_has_columns_named_by_position(clickhouse_url: str) -> None:
    files = {"query": (None, "SELECT _1 * 2, _2 FROM t"), "t": ("t.tsv", b"21\tq\n", "text/plain")}

    r = requests.post(clickhouse_url, params={"t_types": "UInt8,String"}, files=files, timeout=60, auth=http_auth())

    assert (r.status_code, r.text) == (200, "42\tq\n")


def test_external_data_without_structure_is_refused_naming_the_fields_to_send(clickhouse_url: str) -> None:
    files = {"query": (None, "SELECT * FROM t"), "t": ("t.tsv", b"1\n", "text/plain")}

    r = requests.post(clickhouse_url, files=files, timeout=60, auth=http_auth())

    assert r.status_code == 400
    assert r.headers["X-ClickHouse-Exception-Code"] == "36"
    assert "t_structure or t_types" in r.text


def test_clickhouse_connect_form_encoded_parameters_and_external_data(stack: StackInfo, database: str) -> None:
    client = clickhouse_connect.get_client(
        host="127.0.0.1",
        port=stack.clickhouse_port,
        database=database,
        form_encode_query_params=True,
        **clickhouse_connect_login(),
    )
    try:
        assert client.query("SELECT {x:Array(UInt32)}", parameters={"x": [1, 2]}).result_rows == [([1, 2],)]
        data = ExternalData(
            file_name="people.csv", data=b"ann,31\nbob,11\n", fmt="CSV", structure=["name String", "age UInt8"]
        )
        rows = client.query(
            "SELECT name FROM people WHERE age > {min:UInt8}", parameters={"min": 20}, external_data=data
        ).result_rows
        assert rows == [("ann",)]
        # The temporary table lived for that one query.
        assert client.command("SELECT count() FROM system.tables WHERE name = 'people'") == 0
    finally:
        client.close()


def test_statements_without_a_result_give_clickhouse_connect_a_summary(ch_client) -> None:
    dropped = ch_client.command("DROP TABLE IF EXISTS no_such_table")
    created = ch_client.command("CREATE TABLE t (id UInt8) ENGINE = MergeTree ORDER BY id")
    as_query = ch_client.query("SET max_threads = 2")

    assert isinstance(dropped, QuerySummary) and isinstance(created, QuerySummary)
    assert re.fullmatch(r"[0-9a-f-]{36}", dropped.query_id())
    assert "query_id" in as_query.first_item
    assert ch_client.command("SHOW CREATE TABLE t").startswith("CREATE TABLE ")
    assert ch_client.command("SELECT count() FROM t") == 0  # a result, even an empty one, is not a summary


def test_only_statements_with_a_result_name_their_format(clickhouse_url: str) -> None:
    ddl = requests.post(
        clickhouse_url, data="CREATE TEMPORARY TABLE x (a UInt8) ENGINE = Memory", timeout=60, auth=http_auth()
    )
    select = requests.post(clickhouse_url, data="SELECT 1 WHERE 0", timeout=60, auth=http_auth())

    assert ddl.status_code == select.status_code == 200
    assert "X-ClickHouse-Format" not in ddl.headers
    assert select.headers["X-ClickHouse-Format"] == "TabSeparated"


def test_query_text_that_is_not_utf8_reaches_the_engine_byte_for_byte(clickhouse_url: str, ch_client) -> None:
    r = requests.post(clickhouse_url, data=b"SELECT hex('\x92\xff')", timeout=60, auth=http_auth())
    binary = ch_client.raw_query(
        "SELECT col2, col1 FROM format(CSVWithNames, $xx$)", parameters={"$xx$": b"col1,col2\n\x92,700"}
    )

    assert (r.status_code, r.text) == (200, "92FF\n")
    assert binary == b"700\t\x92\n"


def test_show_create_of_a_system_table_answers_its_columns_engine_and_comment(ch_client) -> None:
    one = ch_client.query("SHOW CREATE TABLE system.one")
    statement = ch_client.command("SHOW CREATE TABLE system.numbers")

    assert one.column_names == ("statement",)
    assert one.result_rows[0][0].startswith(
        "CREATE TABLE system.one\n(\n    `dummy` UInt8\n)\nENGINE = SystemOne\n"
        "COMMENT 'This table contains a single row"
    )
    # command() answers the TabSeparated text, escapes included, as from a server.
    assert statement.startswith(r"CREATE TABLE system.numbers\n(\n    `number` UInt64\n)\nENGINE = SystemNumbers")
    with pytest.raises(DatabaseError) as missing:
        ch_client.command("SHOW CREATE TABLE system.no_such_table")
    assert missing.value.code == 60
