"""The chaos proxy in its two places: between a client and ClickHouse, between ClickHouse and ZooKeeper.

Real parts: the embedded stack's ClickHouse (chdb behind the HTTP server) and ZooKeeper,
the transport's own client, and :class:`spark_datasource.testing.chaos.proxy.FaultProxy` in front.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ReplyLostError
from clickhouse_tx.interfaces import Target
from server_patches import crashes
from server_patches.stack_files import StackInfo
from spark_datasource.testing.chaos.proxy import FaultProxy
from spark_datasource.testing.credentials import target_fields


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client(url: str, database: str = "default") -> ClickHouseHTTP:
    return ClickHouseHTTP(
        Target(url=url, database=database, table="t", request_timeout_s=5, connect_timeout_s=2, **target_fields())
    )


def test_a_reply_dropped_between_client_and_clickhouse_is_a_lost_reply_of_a_statement_that_ran(
    stack: StackInfo,
) -> None:
    db = f"d_{uuid.uuid4().hex[:8]}"
    direct = _client(stack.clickhouse_url)
    with FaultProxy(("127.0.0.1", stack.clickhouse_port)) as proxy:
        via = _client(f"http://127.0.0.1:{proxy.port}")
        assert via.command("SELECT 1").strip() == "1"
        proxy.inject("drop_reply", 2.0)
        with pytest.raises(ReplyLostError):
            via.command(f"CREATE DATABASE `{db}`")
        proxy.clear()
        # the server ran it: the client only lost the answer
        assert direct.command(f"EXISTS DATABASE `{db}`").strip() == "1"
        assert via.command("SELECT 2").strip() == "2"
        via.close()
    direct.command(f"DROP DATABASE `{db}`")
    direct.close()


def _keeper_insert(c: ClickHouseHTTP, table: str, key: int) -> None:
    c.command(f"INSERT INTO {table} VALUES ({key}, 'v')")


def test_clickhouse_reaches_zookeeper_through_the_proxy_and_keeps_it_across_a_restart(stack_factory) -> None:
    zk_port = _free_port()
    with FaultProxy(("127.0.0.1", zk_port)) as zk_proxy:
        via = f"127.0.0.1:{zk_proxy.port}"
        own = stack_factory(kafka=False, zk_port=zk_port, zookeeper_address_for_clickhouse=via)
        c = _client(own.clickhouse_url)
        table = f"default.km_{uuid.uuid4().hex[:8]}"
        c.command(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = KeeperMap('/{table}') PRIMARY KEY k")
        _keeper_insert(c, table, 1)
        assert zk_proxy.stats["connections"] >= 1, "ClickHouse did not use the proxy as its Keeper"
        before = zk_proxy.stats["connections"]
        c.close()
        crashes.kill_clickhouse(Path(own.dir))
        crashes.start_clickhouse(Path(own.dir), zookeeper_address_for_clickhouse=via)
        c = _client(own.clickhouse_url)
        deadline = time.monotonic() + 60
        while True:  # the restarted server connects to its Keeper in the background
            try:
                _keeper_insert(c, table, 2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert zk_proxy.stats["connections"] > before, "the restarted ClickHouse bypassed the proxy"
        assert c.command(f"SELECT count() FROM {table}").strip() == "2"
        c.close()


def test_a_reset_window_on_the_keeper_link_holds_keeper_writes_until_clickhouse_reconnects(stack_factory) -> None:
    zk_port = _free_port()
    with FaultProxy(("127.0.0.1", zk_port)) as zk_proxy:
        own = stack_factory(kafka=False, zk_port=zk_port, zookeeper_address_for_clickhouse=f"127.0.0.1:{zk_proxy.port}")
        c = _client(own.clickhouse_url)
        table = f"default.km_{uuid.uuid4().hex[:8]}"
        c.command(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = KeeperMap('/{table}') PRIMARY KEY k")
        _keeper_insert(c, table, 1)
        zk_proxy.inject("reset", 8.0)  # longer than the client's 5 s
        time.sleep(0.5)
        # ClickHouse fails the write or keeps retrying its Keeper past the client's 5 s
        with pytest.raises(Exception, match="(?i)keeper|session|connection|zookeeper|no reply"):
            _keeper_insert(c, table, 2)
        assert zk_proxy.stats["resets"] >= 1
        time.sleep(3.0)
        deadline = time.monotonic() + 60
        while True:
            try:
                _keeper_insert(c, table, 3)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        keys = c.command(f"SELECT groupArray(k) FROM (SELECT k FROM {table} ORDER BY k)").strip()
        assert keys in ("[1,3]", "[1,2,3]")  # 2 may have landed after its client gave up
        c.close()
