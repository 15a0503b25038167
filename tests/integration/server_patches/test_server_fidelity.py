"""The embedded server answers as a ClickHouse server does where the engine allows it:
system logs, server identity on Keeper, the native port, the INSERTs a server would queue
(``async_insert``), per-request settings in a failed transaction, the ``compatibility``
profile. What the engine cannot do is listed in docs/server.md ("What still differs from a
real server").
"""

from __future__ import annotations

import json
import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Callable

import clickhouse_connect
import clickhouse_connect.driver.exceptions
import pytest
import requests
from kafka import KafkaProducer

from server_patches import chdb_config, crashes, stack
from server_patches.kafka_broker import create_topic
from server_patches.stack_files import StackInfo
from spark_datasource.testing.credentials import http_auth


def _post(url: str, sql: str, body: bytes | None = None, **params: str) -> requests.Response:
    """POST ``sql``: in the URL when a ``body`` (INSERT data) is given, else as the body."""
    if body is not None:
        return requests.post(url, params={"query": sql, **params}, data=body, timeout=60, auth=http_auth())
    return requests.post(url, params=params, data=sql.encode(), timeout=60, auth=http_auth())


def _q(url: str, sql: str, **params: str) -> str:
    r = _post(url, sql, **params)
    assert r.status_code == 200, r.text
    return r.text.strip()


def test_system_flush_logs_fills_the_query_log_the_part_log_and_the_transactions_info_log(
    clickhouse_url: str, database: str
) -> None:
    table = f"`{database}`.t"
    marker = f"fidelity_{uuid.uuid4().hex}"
    _q(clickhouse_url, f"CREATE TABLE {table} (a Int64) ENGINE = MergeTree ORDER BY a")
    sid = uuid.uuid4().hex
    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)
    _q(clickhouse_url, f"INSERT INTO {table} VALUES (1)", session_id=sid, async_insert="0")
    tid = _q(clickhouse_url, "SELECT transactionID().2", session_id=sid)
    _q(clickhouse_url, "COMMIT", session_id=sid)
    _q(clickhouse_url, f"SELECT '{marker}'")

    _q(clickhouse_url, "SYSTEM FLUSH LOGS")

    finished = _q(
        clickhouse_url,
        "SELECT count() FROM system.query_log WHERE type = 'QueryFinish' AND query LIKE {m:String}",
        param_m=f"%{marker}%",
    )
    assert int(finished) >= 1
    new_parts = _q(
        clickhouse_url,
        "SELECT count() FROM system.part_log WHERE event_type = 'NewPart' AND database = {d:String} AND table = 't'",
        param_d=database,
    )
    assert int(new_parts) == 1
    events = _q(
        clickhouse_url,
        "SELECT arraySort(groupArray(toString(type))) FROM system.transactions_info_log WHERE tid.2 = {t:UInt64}",
        param_t=tid,
    )
    assert "'Begin'" in events and "'Commit'" in events, events


def test_two_engine_processes_on_one_zookeeper_keep_their_keeper_sessions_and_both_commit(
    stack_factory: Callable[..., StackInfo],
) -> None:
    first = stack_factory(kafka=False)
    url = first.clickhouse_url
    _q(url, "CREATE TABLE default.t (a Int64) ENGINE = MergeTree ORDER BY a")
    sid = uuid.uuid4().hex
    _q(url, "BEGIN TRANSACTION", session_id=sid)
    _q(url, "INSERT INTO default.t VALUES (1)", session_id=sid, async_insert="0")

    # A second engine process registers its own Keeper session on the first's ZooKeeper.
    second = stack_factory(kafka=False, zookeeper_address_for_clickhouse=first.zookeeper)
    other = uuid.uuid4().hex
    _q(second.clickhouse_url, "CREATE TABLE default.t (a Int64) ENGINE = MergeTree ORDER BY a")
    _q(second.clickhouse_url, "BEGIN TRANSACTION", session_id=other)
    _q(second.clickhouse_url, "INSERT INTO default.t VALUES (2)", session_id=other, async_insert="0")
    _q(second.clickhouse_url, "COMMIT", session_id=other)

    _q(url, "COMMIT", session_id=sid)
    assert _q(url, "SELECT count() FROM default.t") == "1"
    assert _q(second.clickhouse_url, "SELECT count() FROM default.t") == "1"


def test_a_server_keeps_its_identity_across_restarts_and_another_data_directory_has_another(tmp_path: Path) -> None:
    first = chdb_config.server_uuid(tmp_path / "a")
    assert chdb_config.server_uuid(tmp_path / "a") == first
    assert chdb_config.server_uuid(tmp_path / "b") != first
    assert (tmp_path / "a" / "uuid").read_text() == first


def test_the_default_user_manages_access_as_on_a_stock_server_but_the_engine_keeps_no_sql_defined_entities(
    clickhouse_url: str,
) -> None:
    assert _q(clickhouse_url, "SHOW ROW POLICIES") == ""
    grants = _q(clickhouse_url, "SHOW GRANTS")
    assert "CREATE ROLE" in grants and "CREATE ROW POLICY" in grants and "WITH GRANT OPTION" in grants
    profiles = _q(clickhouse_url, "SELECT arraySort(groupArray(name)) FROM system.settings_profiles")
    assert profiles == "['default','readonly']"
    # chdb reads users.xml only: no local_directory storage for CREATE ROLE/USER/... (docs/server.md).
    assert _q(clickhouse_url, "SELECT groupArray(type) FROM system.user_directories") == "['users_xml']"
    r = requests.post(clickhouse_url, data=b"CREATE ROLE fidelity_role", timeout=60, auth=http_auth())
    assert r.headers.get("X-ClickHouse-Exception-Code") == "514", r.text


def test_a_kafka_table_is_created_with_a_success_reply_and_after_a_crash_the_server_restarts_and_consumes(
    stack_factory: Callable[..., StackInfo],
) -> None:
    info = stack_factory(kafka=True)
    assert info.kafka_control and info.kafka_bootstrap
    topic = f"fidelity_{uuid.uuid4().hex[:8]}"
    create_topic(info.kafka_control, topic, 1)
    url = info.clickhouse_url
    create = (
        "CREATE TABLE default.queue (k String, v Int64) ENGINE = Kafka SETTINGS "
        f"kafka_broker_list = '{info.kafka_bootstrap}', kafka_topic_list = '{topic}', "
        "kafka_group_name = 'fidelity', kafka_format = 'JSONEachRow'"
    )
    r = requests.post(url, data=create.encode(), timeout=60, auth=http_auth())
    assert r.status_code == 200, r.text
    _q(url, "CREATE TABLE default.rows (k String, v Int64) ENGINE = MergeTree ORDER BY k")
    _q(url, "CREATE MATERIALIZED VIEW default.consume TO default.rows AS SELECT k, v FROM default.queue")

    crashes.restart_clickhouse(info.dir)  # SIGKILL, then start on the same data

    tables = _q(url, "SELECT arraySort(groupArray(name)) FROM system.tables WHERE database = 'default'")
    assert tables == "['consume','queue','rows']"
    producer = KafkaProducer(bootstrap_servers=info.kafka_bootstrap)
    for i in range(3):
        producer.send(topic, json.dumps({"k": f"k{i}", "v": i}).encode())
    producer.flush()
    producer.close()
    deadline = time.monotonic() + 60
    while _q(url, "SELECT count() FROM default.rows") != "3" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _q(url, "SELECT groupArray(v) FROM (SELECT v FROM default.rows ORDER BY v)") == "[0,1,2]"


def _exchange(port: int, request: bytes) -> bytes:
    """What the server sends back on a fresh connection to ``port`` after ``request``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_an_http_request_on_the_native_port_gets_clickhouses_wrong_port_reply_which_clickhouse_connect_shows(
    stack: StackInfo,
) -> None:
    tcp, http = stack.ports["clickhouse_tcp"], stack.ports["clickhouse"]

    reply = _exchange(tcp, b"GET /?query=SELECT+1 HTTP/1.1\r\nHost: localhost\r\n\r\n")

    # formatHTTPErrorResponseWhenUserIsConnectedToWrongPort in ClickHouse's TCPHandler
    assert (
        reply
        == (
            f"HTTP/1.0 400 Bad Request\r\n\r\nPort {tcp} is for clickhouse-client program\r\n"
            f"You must use port {http} for HTTP.\r\n"
        ).encode()
    )
    with pytest.raises(clickhouse_connect.driver.exceptions.DatabaseError) as err:
        clickhouse_connect.get_client(host="127.0.0.1", port=tcp)
    assert f"Port {tcp} is for clickhouse-client program" in str(err.value)


def test_a_native_hello_on_the_native_port_gets_an_exception_packet_saying_the_protocol_is_not_served(
    stack: StackInfo,
) -> None:
    # Protocol::Client::Hello (0), client name, version 24.8, protocol revision 54470, database, user, password
    name = b"ClickHouse client"
    hello = (
        b"\x00" + bytes([len(name)]) + name + b"\x18\x08" + b"\xc6\xa9\x03" + b"\x07default" + b"\x07default" + b"\x00"
    )

    reply = _exchange(stack.ports["clickhouse_tcp"], hello)

    assert reply[0] == 2  # Protocol::Server::Exception
    assert struct.unpack("<i", reply[1:5])[0] == 48  # NOT_IMPLEMENTED
    assert b"DB::Exception" in reply and b"native protocol is not served" in reply


# ---------------------------------------------------------------- async inserts (26.2+)

IN_TXN = "Async inserts inside transactions are not supported"
WITH_IMPLICIT = "Async inserts with 'implicit_transaction' are not supported"


def _refused(r: requests.Response, message: str, status: int) -> None:
    """``r`` is ClickHouse's refusal of an async insert: code 48 with ``message``."""
    assert r.headers.get("X-ClickHouse-Exception-Code") == "48", r.text
    assert r.text.strip() == f"Code: 48. DB::Exception: {message}. (NOT_IMPLEMENTED)"
    assert r.status_code == status


def _status_of_48(url: str, table: str) -> int:
    """The front's HTTP status for code 48 from the engine itself (DESCRIBE inside a transaction)."""
    sid = uuid.uuid4().hex
    _q(url, "BEGIN TRANSACTION", session_id=sid)
    r = _post(url, f"DESCRIBE TABLE {table}", session_id=sid)
    assert r.headers.get("X-ClickHouse-Exception-Code") == "48", r.text
    _q(url, "ROLLBACK", session_id=sid)
    return r.status_code


@pytest.fixture
def table(clickhouse_url: str, database: str) -> str:
    name = f"`{database}`.t"
    _q(clickhouse_url, f"CREATE TABLE {name} (a Int64) ENGINE = MergeTree ORDER BY a")
    return name


def test_an_insert_with_its_data_inside_a_transaction_is_refused_as_a_server_refuses_an_async_insert(
    clickhouse_url: str, table: str, clickhouse_compatibility: str | None
) -> None:
    if clickhouse_compatibility is not None:
        pytest.skip("async_insert is 1 by default from 26.2 on; this run's compatibility profile may say 0")
    status = _status_of_48(clickhouse_url, table)
    sid = uuid.uuid4().hex
    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)

    r = _post(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", b"1\n2\n", session_id=sid)
    _refused(r, IN_TXN, status)
    # INSERT ... VALUES in the text is inline data as well; a failed transaction answers 649 first.
    r = _post(clickhouse_url, f"INSERT INTO {table} VALUES (3)", session_id=sid)
    assert r.headers.get("X-ClickHouse-Exception-Code") == "649", r.text

    # As on a server, the refusal failed the transaction: only ROLLBACK runs.
    assert _post(clickhouse_url, "COMMIT", session_id=sid).headers.get("X-ClickHouse-Exception-Code") == "649"
    _q(clickhouse_url, "ROLLBACK", session_id=sid)
    assert _q(clickhouse_url, f"SELECT count() FROM {table}") == "0"


def test_an_insert_inside_a_transaction_runs_with_async_insert_0_from_the_url_the_session_or_its_own_settings(
    clickhouse_url: str, table: str
) -> None:
    sid = uuid.uuid4().hex
    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)
    _q(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", session_id=sid, async_insert="0")  # no body: no rows
    assert _post(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", b"1\n", session_id=sid, async_insert="0").ok
    assert _post(clickhouse_url, f"INSERT INTO {table} SETTINGS async_insert = 0 VALUES (2)", session_id=sid).ok
    _q(clickhouse_url, "SET async_insert = 0", session_id=sid)
    assert _post(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", b"3\n", session_id=sid).ok
    # INSERT ... SELECT is never queued.
    _q(clickhouse_url, f"INSERT INTO {table} SELECT 4", session_id=sid, async_insert="1")
    _q(clickhouse_url, "COMMIT", session_id=sid)
    assert _q(clickhouse_url, f"SELECT groupArray(a) FROM (SELECT a FROM {table} ORDER BY a)") == "[1,2,3,4]"


def test_an_async_insert_with_implicit_transaction_is_refused_and_one_outside_a_transaction_runs(
    clickhouse_url: str, table: str
) -> None:
    status = _status_of_48(clickhouse_url, table)
    r = _post(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", b"1\n", implicit_transaction="1", async_insert="1")
    _refused(r, WITH_IMPLICIT, status)
    r = _post(clickhouse_url, f"INSERT INTO {table} VALUES (1)", implicit_transaction="1", async_insert="1")
    _refused(r, WITH_IMPLICIT, status)
    sid = uuid.uuid4().hex  # in a session without a transaction: the same refusal
    implicit = {"implicit_transaction": "1", "async_insert": "1"}
    r = _post(clickhouse_url, f"INSERT INTO {table} VALUES (1)", session_id=sid, **implicit)
    _refused(r, WITH_IMPLICIT, status)
    # throw_on_unsupported_query_inside_transaction = 0 lets it through.
    _q(
        clickhouse_url,
        f"INSERT INTO {table} VALUES (1)",
        implicit_transaction="1",
        async_insert="1",
        throw_on_unsupported_query_inside_transaction="0",
    )
    # Outside a transaction an async insert runs (synchronously: chdb has no queue), with the
    # profile's defaults, as async_insert=1 explicitly, in a session as well.
    assert _post(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", b"2\n").ok
    assert _post(clickhouse_url, f"INSERT INTO {table} VALUES (3)", async_insert="1").ok
    assert _post(clickhouse_url, f"INSERT INTO {table} FORMAT TSV", b"4\n", session_id=sid, async_insert="1").ok
    assert _q(clickhouse_url, f"SELECT groupArray(a) FROM (SELECT a FROM {table} ORDER BY a)") == "[1,2,3,4]"


# ---------------------------------------------------------------- a failed transaction's ROLLBACK


def test_a_plain_rollback_after_a_failed_statement_with_url_settings_runs_and_the_session_works_again(
    clickhouse_url: str, table: str
) -> None:
    sid = uuid.uuid4().hex
    settings = {"session_id": sid, "async_insert": "0", "max_insert_block_size": "1000"}
    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)
    _q(clickhouse_url, f"INSERT INTO {table} VALUES (1)", **settings, insert_deduplication_token="x")
    missing = _post(clickhouse_url, f"INSERT INTO {table}_missing VALUES (1)", **settings)
    assert missing.headers.get("X-ClickHouse-Exception-Code") == "60", missing.text

    _q(clickhouse_url, "ROLLBACK", session_id=sid)  # no settings: none reset inside the failed transaction

    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)
    _q(clickhouse_url, f"INSERT INTO {table} VALUES (2)", session_id=sid, async_insert="0")
    _q(clickhouse_url, "COMMIT", session_id=sid)
    assert _q(clickhouse_url, f"SELECT groupArray(a) FROM {table}") == "[2]"
    # The earlier request's settings are gone from the session once an ordinary statement ran.
    read = "SELECT value FROM system.settings WHERE name = 'max_insert_block_size'"
    assert _q(clickhouse_url, read, session_id=sid) == _q(clickhouse_url, read)


def test_a_rollback_without_settings_after_a_request_with_settings_runs_and_the_next_query_drops_them(
    clickhouse_url: str, table: str
) -> None:
    sid = uuid.uuid4().hex
    read = "SELECT value FROM system.settings WHERE name = 'max_insert_block_size'"
    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid, max_insert_block_size="7")
    settings = {"session_id": sid, "async_insert": "0", "max_insert_block_size": "1000"}
    _q(clickhouse_url, f"INSERT INTO {table} VALUES (1)", **settings)

    _q(clickhouse_url, "ROLLBACK", session_id=sid)

    assert _q(clickhouse_url, f"SELECT count() FROM {table}") == "0"
    assert _q(clickhouse_url, read, session_id=sid) == _q(clickhouse_url, read)
    # A failed transaction takes a ROLLBACK that carries settings as well: they are not applied.
    _q(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)
    failed = _post(clickhouse_url, f"INSERT INTO {table}_missing VALUES (1)", session_id=sid, async_insert="0")
    assert failed.headers.get("X-ClickHouse-Exception-Code") == "60", failed.text
    _q(clickhouse_url, "ROLLBACK", session_id=sid, max_insert_block_size="7")


# ---------------------------------------------------------------- compatibility (version matrix)

COMPAT_READ = "SELECT value FROM system.settings WHERE name = {n:String}"


def _setting(url: str, name: str, **params: str) -> str:
    return _q(url, COMPAT_READ, param_n=name, **params)


def test_a_stack_started_with_compatibility_25_8_has_that_versions_insert_defaults_and_keeps_them_on_restart(
    stack_factory: Callable[..., StackInfo],
) -> None:
    info = stack_factory(kafka=False, compatibility="25.8")
    url, sid = info.clickhouse_url, uuid.uuid4().hex
    assert info.compatibility == "25.8"
    assert stack.stack_status(info.dir)["compatibility"] == "25.8"
    for params in ({}, {"session_id": sid}):  # a pooled and a session connection
        assert _setting(url, "async_insert", **params) == "0"
        assert _setting(url, "deduplicate_insert", **params) == "backward_compatible_choice"
    # A URL setting lasts one query: the session gets the profile's value back, not the built-in one.
    assert _setting(url, "async_insert", session_id=sid, async_insert="1") == "1"
    assert _setting(url, "async_insert", session_id=sid) == "0"
    # async_insert 0 by the profile: an INSERT in a transaction runs, as on a 25.8 server.
    _q(url, "CREATE TABLE default.t (a Int64) ENGINE = MergeTree ORDER BY a")
    _q(url, "BEGIN TRANSACTION", session_id=sid)
    _q(url, "INSERT INTO default.t VALUES (1)", session_id=sid)
    _q(url, "COMMIT", session_id=sid)

    crashes.restart_clickhouse(info.dir)

    assert _setting(url, "async_insert") == "0"
    assert stack.stack_status(info.dir)["compatibility"] == "25.8"


def test_without_compatibility_the_engine_has_the_26_9_insert_defaults(
    clickhouse_url: str, clickhouse_compatibility: str | None
) -> None:
    if clickhouse_compatibility is not None:
        pytest.skip(f"this run's stacks start with compatibility {clickhouse_compatibility}")
    sid = uuid.uuid4().hex
    for params in ({}, {"session_id": sid}):
        assert _setting(clickhouse_url, "async_insert", **params) == "1"
        assert _setting(clickhouse_url, "deduplicate_insert", **params) == "enable"
