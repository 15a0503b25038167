"""The embedded server answers as a ClickHouse server does where the engine allows it:
system logs, server identity on Keeper, the native port. What the engine cannot do is listed in
docs/server.md ("What still differs from a real server").
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

from server_patches import chdb_config, crashes
from server_patches.kafka_broker import create_topic
from server_patches.stack_files import StackInfo
from spark_datasource.testing.credentials import http_auth


def _q(url: str, sql: str, **params: str) -> str:
    r = requests.post(url, params=params, data=sql.encode(), timeout=60, auth=http_auth())
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
    _q(clickhouse_url, f"INSERT INTO {table} VALUES (1)", session_id=sid)
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
    _q(url, "INSERT INTO default.t VALUES (1)", session_id=sid)

    # A second engine process registers its own Keeper session on the first's ZooKeeper.
    second = stack_factory(kafka=False, zookeeper_address_for_clickhouse=first.zookeeper)
    other = uuid.uuid4().hex
    _q(second.clickhouse_url, "CREATE TABLE default.t (a Int64) ENGINE = MergeTree ORDER BY a")
    _q(second.clickhouse_url, "BEGIN TRANSACTION", session_id=other)
    _q(second.clickhouse_url, "INSERT INTO default.t VALUES (2)", session_id=other)
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
