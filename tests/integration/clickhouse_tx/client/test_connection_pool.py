"""Every client of a server in one process shares one connection pool (``client/_transport/pool.py``).

Counted from outside the process: a recording proxy in front of the stack counts the
TCP connections it accepts while the driver commits a micro-batch of 8 partitions.
"""

from __future__ import annotations

import dataclasses
import socket
import urllib.parse
from pathlib import Path

import pytest

from clickhouse_tx.client._transport import pool
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import RequestNotSentError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Prepared, WriteContext
from tests.helpers.request_log import RecordingProxy
from tests.helpers.tables import TXN, batches, committed_count, make_table, rows

PARTITIONS = 8


def _prepare(co, batch: int) -> list[Prepared]:  # type: ignore[no-untyped-def]
    return [
        co.prepare(WriteContext(TXN, batch, p, 0), batches(rows(50, start=1_000 * batch + 50 * p)))
        for p in range(PARTITIONS)
    ]


def test_a_commit_of_8_partitions_opens_at_most_one_connection_once_the_pool_is_warm(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    pool.close_all()
    with RecordingProxy(target.url) as proxy:
        via_proxy = dataclasses.replace(target, url=proxy.url)
        build_coordinator(via_proxy, "transaction", TXN, str(tmp_path)).commit_batch(
            0, _prepare(build_coordinator(via_proxy, "transaction", TXN, str(tmp_path)), 0)
        )
        for batch in (1, 2):
            msgs = _prepare(build_coordinator(via_proxy, "transaction", TXN, str(tmp_path)), batch)
            before = (proxy.connections, len(proxy.requests))
            # Spark builds a fresh writer, hence a fresh coordinator, for every commit.
            build_coordinator(via_proxy, "transaction", TXN, str(tmp_path)).commit_batch(batch, msgs)
            opened, sent = proxy.connections - before[0], len(proxy.requests) - before[1]
            assert sent >= 2 * PARTITIONS  # a session check and a COMMIT per partition, at least
            assert opened <= 1, f"batch {batch}: {opened} connections opened for {sent} requests"
    assert committed_count(admin, target) == 3 * PARTITIONS * 50


def test_clients_of_one_server_share_a_pool_and_a_forked_process_gets_its_own(
    admin: ClickHouseHTTP, database: str
) -> None:
    import os

    target = make_table(admin, database)
    a, b = ClickHouseHTTP(target), ClickHouseHTTP(target, session_id="x", session_timeout=5)
    assert a._http is b._http
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = ClickHouseHTTP(target)._http is not a._http and ClickHouseHTTP(target).command("SELECT 1").strip() == "1"
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"


def _refusing_url() -> str:
    """An ``http://`` URL on 127.0.0.1 where nothing listens (a proxy that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_environment_s_proxy_applies_to_the_next_client_and_no_proxy_exempts_the_server(
    admin: ClickHouseHTTP, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_table(admin, database)
    for name in pool.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert ClickHouseHTTP(target).command("SELECT 1").strip() == "1"  # a pool without a proxy exists now
    monkeypatch.setenv("HTTP_PROXY", _refusing_url())
    with pytest.raises(RequestNotSentError, match="connect"):
        ClickHouseHTTP(target).command("SELECT 1")  # through the proxy that is down
    monkeypatch.setenv("NO_PROXY", urllib.parse.urlsplit(target.url).hostname or "")
    assert ClickHouseHTTP(target).command("SELECT 1").strip() == "1"
