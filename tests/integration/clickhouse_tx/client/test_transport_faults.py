"""Riding through transient faults of the real parts: the error mapping against the
embedded server, and the coordinator's registry and marker reads (``TxOps``, the one
retry loop of each call) across a ClickHouse restart, a ZooKeeper outage and a server
refusing queries (``TOO_MANY_SIMULTANEOUS_QUERIES``).

The pure mapping table: ``tests/unit/clickhouse_tx/client/test_transport_errors.py``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import RequestNotSentError, ServerBusyError
from clickhouse_tx.factory import build_mode_io
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, RegistryEntry, Target
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.protocol.tx_ops import TxOps
from clickhouse_tx.retry import RetryPolicy, is_transient
from clickhouse_tx.store.markers import CommitMarkers
from clickhouse_tx.store.registry import KeeperMapRegistry
from server_patches import crashes
from server_patches.stack_files import StackInfo
from spark_datasource.testing.credentials import target_fields

#: Enough for a 3 s outage plus a server start (the retry.* options of a real query).
RIDE = RetryPolicy(max_attempts=60, max_total_s=60.0, base_delay_s=0.2, max_delay_s=1.0)
SECRET = "Ride-Through-pw-9"


def _entry(xid: str) -> RegistryEntry:
    return RegistryEntry(
        xid=xid,
        txn_id="q",
        batch=0,
        partition=0,
        attempt=0,
        mode=Mode.STAGING,
        server="http://h",
        table="db.events",
        state="initialized",
        created_ms=1,
        updated_ms=1,
    )


def _ops(target: Target) -> TxOps:
    """The coordinator's per-xid steps over the real registry and staging mode."""
    registry = KeeperMapRegistry(target, retry=RIDE)
    return TxOps(target, build_mode_io(Mode.STAGING, registry), registry, retry=RIDE)


def _after(seconds: float, fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
    t.start()
    return t


def test_a_server_refusing_a_query_for_too_many_simultaneous_queries_is_a_transient_server_busy_error(
    clickhouse_url: str, database: str
) -> None:
    busy = ClickHouseHTTP(
        Target(
            url=clickhouse_url,
            database=database,
            table="t",
            settings={"max_concurrent_queries_for_user": "1"},
            **target_fields(),
        )
    )
    sleeper = threading.Thread(
        target=lambda: ClickHouseHTTP(
            Target(url=clickhouse_url, database=database, table="t", **target_fields())
        ).command("SELECT sleep(2)")
    )
    sleeper.start()
    time.sleep(0.5)
    with pytest.raises(ServerBusyError) as ei:
        busy.command("SELECT 1")
    sleeper.join()
    assert ei.value.code == 202 and ei.value.name == "TOO_MANY_SIMULTANEOUS_QUERIES"
    assert is_transient(ei.value)


def test_a_registry_read_refused_as_too_many_simultaneous_queries_is_retried_and_logged(
    clickhouse_url: str, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target(url=clickhouse_url, database=database, table="t", **target_fields())
    KeeperMapRegistry(target).register(_entry("x-busy"))
    ops = _ops(
        Target(
            url=clickhouse_url,
            database=database,
            table="t",
            settings={"max_concurrent_queries_for_user": "1"},
            **target_fields(),
        )
    )
    sleeper = threading.Thread(target=lambda: ClickHouseHTTP(target).command("SELECT sleep(2)"))
    sleeper.start()
    time.sleep(0.5)
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.retry"):
        state = ops.state("x-busy")
    sleeper.join()
    assert state is TxState.INITIALIZED
    retries = [r.getMessage() for r in caplog.records if "TxOps.state failed" in r.getMessage()]
    assert retries and "attempt 1 of 60" in retries[0] and "ServerBusyError" in retries[0]


@pytest.fixture
def own(stack_factory: Callable[..., StackInfo], monkeypatch: pytest.MonkeyPatch) -> StackInfo:
    monkeypatch.setenv("CHTX_RIDE_PASSWORD", SECRET)
    return stack_factory(user="rider", password_env="CHTX_RIDE_PASSWORD")


def test_registry_and_marker_reads_ride_through_a_3_s_clickhouse_restart_and_log_no_password(
    own: StackInfo, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target(url=own.clickhouse_url, database="default", table="t", user="rider", password=SECRET)
    ops = _ops(target)
    ops.registry.register(_entry("x-restart"))
    p = Prepared(
        xid="x-restart",
        txn_id="q",
        batch=0,
        partition=0,
        attempt=0,
        mode=Mode.STAGING,
        server="http://h",
        table="default.t",
        rows=1,
        checksum=1,
    )
    markers = CommitMarkers(target)
    markers.ensure_table()
    markers.insert(p)
    crashes.kill_clickhouse(own.dir)
    with pytest.raises(RequestNotSentError):  # nothing listens: a refused connection is "not sent"
        ClickHouseHTTP(target).command("SELECT 1")
    starter = _after(3.0, lambda: crashes.start_clickhouse(own.dir))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.retry"):
        state = ops.state("x-restart")
        outcome = ops.lookup(p)
    starter.join()
    assert time.monotonic() - started >= 3.0  # it did wait for the restart
    assert state is TxState.INITIALIZED and outcome is CommitOutcome.COMMITTED
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "TxOps.state failed" in logged and "RequestNotSentError" in logged
    assert SECRET not in logged and "rider:" not in logged


def test_registry_reads_and_a_compare_and_set_ride_through_a_3_s_zookeeper_outage(own: StackInfo) -> None:
    target = Target(url=own.clickhouse_url, database="default", table="t", user="rider", password=SECRET)
    ops = _ops(target)
    xid = f"x-zk-{uuid.uuid4().hex[:6]}"
    ops.registry.register(_entry(xid))
    crashes.kill_zookeeper(own.dir)
    starter = _after(3.0, lambda: crashes.start_zookeeper(own.dir))
    started = time.monotonic()
    assert ops.state(xid) is TxState.INITIALIZED
    ops.move(xid, TxState.COMMITTING)
    starter.join()
    assert time.monotonic() - started >= 3.0
    assert ops.state(xid) is TxState.COMMITTING
