"""A micro-batch's COMMIT whose reply is lost (``clickhouse_tx.foreach.keys``), on real servers.

A transaction a killed attempt left open, settled by the next attempt; and the embedded
stack's ClickHouse behind the chaos proxy
(:class:`spark_datasource.testing.chaos.proxy.FaultProxy`): the proxy drops the COMMIT's
reply after the server ran it, or stops before the COMMIT is sent. The outcome is settled
by reading the attempt's key row, never by writing again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import NotCommittedError, OutcomeUnknownError
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords, TableRows, key_session, settle_key, write_batch
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.staging.tables import settle_session
from clickhouse_tx.retry import RetryPolicy
from server_patches.stack_files import StackInfo
from spark_datasource.testing.chaos.proxy import FaultProxy
from spark_datasource.testing.credentials import target_fields
from tests.helpers.spark_writes import read_committed, run_sql

ROWS = 100
RIDE = RetryPolicy(max_attempts=40, max_total_s=30.0, base_delay_s=0.1, max_delay_s=0.5)


@pytest.fixture
def proxy(stack: StackInfo) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", stack.clickhouse_port)) as p:
        yield p


def _target(url: str, database: str) -> Target:
    timeouts = {"request_timeout_s": 5, "connect_timeout_s": 2}
    return Target(url=url, database=database, table="t", read_retry=RIDE, **timeouts, **target_fields())


def _ready(url: str, database: str) -> list[TableRows]:
    run_sql(url, f"CREATE TABLE `{database}`.t (id Int64) ENGINE = MergeTree ORDER BY id")
    BatchRecords(_target(url, database)).ensure_table()
    return [TableRows(database, "t", [pa.record_batch({"id": pa.array(range(ROWS), pa.int64())})])]


def _counts(url: str, database: str) -> list[int]:
    """Committed rows of ``t`` and of the key table."""
    tables = ("t", "clickhouse_tx_batches")
    return [int(read_committed(url, f"SELECT count() FROM `{database}`.`{t}`")[0][0]) for t in tables]


def test_a_commit_whose_reply_is_lost_is_settled_by_its_key_row_and_the_rows_are_there_once(
    proxy: FaultProxy, clickhouse_url: str, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = _ready(clickhouse_url, database)
    key = BatchKey("lost-reply", 4, "query-1", tables=(f"{database}.t",))
    via = _target(f"http://127.0.0.1:{proxy.port}", database)
    with caplog.at_level(logging.INFO, logger="clickhouse_tx.spark.foreach_batch"):
        rows = write_batch(via, key, parts, before_commit=lambda: proxy.inject("drop_reply", 1.0))
    assert rows == ROWS and proxy.stats["replies_dropped"] >= 1
    assert _counts(clickhouse_url, database) == [ROWS, 1]
    assert BatchRecords(via).recorded(key) is not None  # a replay of the batch is skipped
    assert any("the COMMIT took effect although it failed" in r.getMessage() for r in caplog.records)


def test_a_commit_whose_outcome_cannot_be_read_raises_outcome_unknown_naming_the_key(
    proxy: FaultProxy, clickhouse_url: str, database: str
) -> None:
    parts = _ready(clickhouse_url, database)
    key = BatchKey("unreachable", 7, "query-1", tables=(f"{database}.t",))
    with pytest.raises(OutcomeUnknownError) as info:
        write_batch(_target(f"http://127.0.0.1:{proxy.port}", database), key, parts, before_commit=proxy.stop)
    assert "(app_id='unreachable', batch_id=7): COMMIT failed" in str(info.value)
    assert "Restarting the query on its checkpoint reads it" in str(info.value)
    assert _counts(clickhouse_url, database) == [0, 0]
    # What the restart does: the transaction settled on the server, the key row read.
    direct = _target(clickhouse_url, database)
    assert info.value.xid.startswith(key_session(key) + "_")  # the attempt, in the key's session
    with ClickHouseHTTP(direct, session_id=key_session(key)) as c:
        assert settle_session(c) is True  # it was still open: rolled back now
    assert BatchRecords(direct).recorded(key) is None
    assert _counts(clickhouse_url, database) == [0, 0]


def test_a_transaction_a_killed_attempt_left_open_is_rolled_back_before_the_key_is_read_and_written_once(
    clickhouse_url: str, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A driver SIGKILLed inside its transaction sends no ROLLBACK: the rows stay in an open
    # transaction, seen by plain reads, until its session expires. The next attempt at the
    # key writes in the same session, and settles it first.
    parts = _ready(clickhouse_url, database)
    key = BatchKey("killed-inside", 2, "query-1", tables=(f"{database}.t",))
    target = _target(clickhouse_url, database)
    dead = ClickHouseHTTP(target, session_id=key_session(key), session_timeout=60)
    dead.command("BEGIN TRANSACTION")
    dead.command(f"INSERT INTO `{database}`.t SELECT number FROM numbers({ROWS})")
    plain = f"SELECT count() FROM `{database}`.t"
    assert int(run_sql(clickhouse_url, plain).strip()) == ROWS  # the open transaction's rows
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.foreach.keys"):
        settle_key(target, key)
    assert "rolled back the transaction an earlier attempt left open" in caplog.text
    assert int(run_sql(clickhouse_url, plain).strip()) == 0
    assert BatchRecords(target).recorded(key) is None
    assert write_batch(target, key, parts) == ROWS
    assert _counts(clickhouse_url, database) == [ROWS, 1]
    assert int(run_sql(clickhouse_url, plain).strip()) == ROWS


def test_a_rollback_raced_into_the_keys_session_before_the_key_row_leaves_no_key_row_without_its_rows(
    clickhouse_url: str, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another attempt at the key (a zombie driver, a settle) sends ROLLBACK in the shared
    # session between this attempt's rows and its key row. Unfenced, the key row's INSERT
    # then ran outside any transaction and committed alone: a restart skipped the batch.
    parts = _ready(clickhouse_url, database)
    key = BatchKey("raced", 5, "query-1", tables=(f"{database}.t",))
    target = _target(clickhouse_url, database)
    real = BatchRecords.insert_sql

    def raced(self: BatchRecords, *args: Any, **kwargs: Any) -> str:
        with ClickHouseHTTP(target, session_id=key_session(key)) as other:
            other.command("ROLLBACK")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BatchRecords, "insert_sql", raced)
    outcome: BaseException | None = None
    try:
        write_batch(target, key, parts)
    except NotCommittedError as exc:
        outcome = exc
    assert _counts(clickhouse_url, database) == [0, 0]  # no key row without its rows
    assert isinstance(outcome, NotCommittedError), "the batch was reported written"
    monkeypatch.undo()
    assert BatchRecords(target).recorded(key) is None  # the restart writes the batch
    assert write_batch(target, key, parts) == ROWS
    assert _counts(clickhouse_url, database) == [ROWS, 1]
