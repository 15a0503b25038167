"""The client retries what repeating cannot change, and nothing else (``Target.read_retry``).

Found by the chaos run (``benchmarks/results/chaos-2026-11-24-lanes1.json``): of 49 job
restarts, a third followed one lost reply of a read or of idempotent DDL inside a
partition's prepare (the dedup layout records, staging's ``system.parts`` read, the
registry's ``CREATE TABLE IF NOT EXISTS``) or of the driver's ``SELECT 1`` probe; local
Spark does not retry a task, so each failed the whole job.

Real parts: the embedded stack's ClickHouse behind the chaos proxy
(:class:`spark_datasource.testing.chaos.proxy.FaultProxy`) dropping replies after the server ran
the request, and a ZooKeeper stopped under a KeeperMap read.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ReplyLostError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.retry import NO_RETRY, RetryPolicy
from server_patches import crashes
from server_patches.stack_files import StackInfo
from spark_datasource.testing.chaos.proxy import FaultProxy
from spark_datasource.testing.credentials import target_fields

RIDE = RetryPolicy(max_attempts=40, max_total_s=30.0, base_delay_s=0.1, max_delay_s=0.5)


@pytest.fixture
def proxy(stack: StackInfo) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", stack.clickhouse_port)) as p:
        yield p


def _via(proxy: FaultProxy, database: str, retry: RetryPolicy = RIDE, **kw: object) -> ClickHouseHTTP:
    target = Target(
        url=f"http://127.0.0.1:{proxy.port}",
        database=database,
        table="t",
        request_timeout_s=5,
        connect_timeout_s=2,
        read_retry=retry,
    )
    return ClickHouseHTTP(target, **kw)  # type: ignore[arg-type]


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]


def test_a_read_whose_replies_are_dropped_for_a_second_is_retried_and_returns_its_rows(
    proxy: FaultProxy, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    c = _via(proxy, database)
    proxy.inject("drop_reply", 1.0)
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.retry"):
        rows = c.query_json("SELECT 42 AS x")
    assert rows == [{"x": 42}]
    logged = _retries(caplog)
    assert logged and "ReplyLostError" in logged[0] and "SELECT 42 AS" in logged[0]


def test_without_a_read_retry_policy_the_same_read_fails_as_a_lost_reply(proxy: FaultProxy, database: str) -> None:
    c = _via(proxy, database, retry=NO_RETRY)
    proxy.inject("drop_reply", 1.0)
    with pytest.raises(ReplyLostError):
        c.query_json("SELECT 42 AS x")


def test_idempotent_ddl_is_retried_and_the_table_exists_once(
    proxy: FaultProxy, clickhouse_url: str, database: str
) -> None:
    c = _via(proxy, database)
    proxy.inject("drop_reply", 1.0)
    c.command("CREATE TABLE IF NOT EXISTS r (x UInt8) ENGINE = MergeTree ORDER BY x", idempotent=True)
    direct = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="r", **target_fields()))
    tables = direct.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
    assert tables == [{"name": "r"}]


def test_an_insert_whose_reply_is_lost_is_not_repeated_by_the_read_retry(
    proxy: FaultProxy, clickhouse_url: str, database: str
) -> None:
    direct = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="r", **target_fields()))
    direct.command("CREATE TABLE r (x UInt8) ENGINE = MergeTree ORDER BY x")
    c = _via(proxy, database)
    c.server_traits()  # the once-per-process read an INSERT makes first, before the fault
    proxy.inject("drop_reply", 1.0)
    with pytest.raises(ReplyLostError):
        c.command("INSERT INTO r VALUES (1)")
    proxy.clear()
    assert direct.command("SELECT count() FROM r").strip() == "1"  # ran once, on the server


def test_a_read_inside_a_session_is_not_retried(proxy: FaultProxy, database: str) -> None:
    # The server may still be running the lost request in the session: a retry would
    # meet SESSION_IS_LOCKED, and a transaction's caller decides what a loss means.
    c = _via(proxy, database, session_id=f"s_{uuid.uuid4().hex}")
    proxy.inject("drop_reply", 1.0)
    with pytest.raises(ReplyLostError):
        c.query_json("SELECT 42 AS x")


def _after(seconds: float, fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
    t.start()
    return t


def test_a_keepermap_read_rides_through_a_2_s_zookeeper_outage(stack_factory: Callable[..., StackInfo]) -> None:
    own = stack_factory(kafka=False)
    c = ClickHouseHTTP(Target(url=own.clickhouse_url, database="default", table="k", read_retry=RIDE))
    c.command("CREATE TABLE k (key UInt64, v String) ENGINE = KeeperMap('/read_retry_k') PRIMARY KEY key")
    c.command("INSERT INTO k VALUES (1, 'a')")
    crashes.kill_zookeeper(own.dir)
    starter = _after(2.0, lambda: crashes.start_zookeeper(own.dir))
    started = time.monotonic()
    rows = c.query_json("SELECT key, v FROM k ORDER BY key")
    starter.join()
    assert rows == [{"key": 1, "v": "a"}]
    assert time.monotonic() - started >= 2.0  # it did wait out the outage


def test_under_a_callers_retry_loop_the_client_does_not_retry_the_read_again(proxy: FaultProxy, database: str) -> None:
    # One loop per call: the caller's (here one attempt, as a coordinator step that
    # gave up) decides; the client's read_retry stands aside under it.
    from clickhouse_tx.retry import retry_call

    c = _via(proxy, database)
    proxy.inject("drop_reply", 1.0)
    with pytest.raises(ReplyLostError):
        retry_call(lambda: c.query_json("SELECT 42 AS x"), NO_RETRY)


def test_the_drivers_transaction_probe_rides_through_lost_replies_and_leaves_no_open_transaction(
    proxy: FaultProxy, clickhouse_url: str, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Reproduced by chaos seed 37: the probe's BEGIN TRANSACTION, sent in a session
    # during a stall, failed the job and left a RUNNING transaction behind.
    from clickhouse_tx.factory import build_mode_io
    from clickhouse_tx.interfaces import Mode

    target = _via(proxy, database).target
    proxy.inject("drop_reply", 1.0)
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.retry"):
        build_mode_io(Mode.TRANSACTION).require_transactions(target, "mode transaction")
    assert _retries(caplog)  # the probe did lose a reply
    direct = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="t", **target_fields()))
    running = direct.query_json("SELECT count() AS n FROM system.transactions WHERE state = 'RUNNING'")
    assert running == [{"n": 0}]
