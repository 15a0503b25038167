"""Option ``visibility=batch`` (mode ``staging``): a batch's stages published in one transaction.

What a concurrent reader sees is measured in ``test_reader_visibility.py``; here, what a
driver that dies inside the one transaction leaves, and what the replay and an
operator's per-xid commit do with it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ConfigurationError, ServerBusyError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Hook, Prepared, Target, WriteContext
from clickhouse_tx.modes import mode_io_for
from clickhouse_tx.modes.staging.mode import StagingMode
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX, batch_session
from clickhouse_tx.retry import RetryPolicy, retry_call
from spark_datasource.testing.credentials import target_fields
from tests.helpers.tables import TXN, batches, committed_count, distinct_ids, make_table, rows, tables


class DriverDied(BaseException):
    """The driver dies here (a BaseException: no retry or cleanup path catches it)."""


class DiesInsideTheBatchTransaction(StagingMode):
    """Staging with ``visibility=batch`` whose driver dies just before the batch's COMMIT."""

    def __init__(self) -> None:
        super().__init__(whole_batch=True)

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        def die() -> None:
            raise DriverDied

        super().commit_together(target, ps, before_commit=die)


#: A rolled-back MOVE leaves an outdated part in its stage until the cleanup thread removes it
#: (every ``cleanup_delay_period``, 30 s by default), and the replay waits for that: a stage made
#: ``AS`` this target cleans up each second instead.
QUICK_CLEANUP = (
    "non_replicated_deduplication_window = 1000, old_parts_lifetime = 1, "
    "cleanup_delay_period = 1, cleanup_delay_period_random_add = 0"
)


def _prepared_batch(target: Target, tmp_path: Path, n: int = 2000, parts: int = 4) -> list[Prepared]:
    co = build_coordinator(target, "staging", TXN, str(tmp_path), visibility="batch")
    data = rows(n)
    co.validate(data.schema)
    per = n // parts
    return [co.prepare(WriteContext(TXN, 0, p, 0), batches(data.slice(p * per, per))) for p in range(parts)]


def _die_inside_the_batch_transaction(target: Target, tmp_path: Path, msgs: list[Prepared]) -> None:
    co = build_coordinator(target, "staging", TXN, str(tmp_path), visibility="batch")
    co.context = dataclasses.replace(co.context, mode_io=DiesInsideTheBatchTransaction())
    with pytest.raises(DriverDied):
        co.commit_batch(0, msgs)


def _open_transactions(admin: ClickHouseHTTP) -> int:
    return int(admin.query_json("SELECT count() AS c FROM system.transactions")[0]["c"])


def _assert_published_once(admin: ClickHouseHTTP, database: str, target: Target) -> None:
    """The batch's 2,000 rows visible once, no stage left, no transaction open."""
    assert committed_count(admin, target) == 2000 and distinct_ids(admin, target) == 2000
    assert not [t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)]
    assert _open_transactions(admin) == 0


def test_a_driver_dead_inside_the_batch_transaction_leaves_nothing_visible_and_the_replay_publishes_once(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database, settings=QUICK_CLEANUP)
    msgs = _prepared_batch(target, tmp_path)

    _die_inside_the_batch_transaction(target, tmp_path, msgs)

    # Every stage was moved inside the open transaction: a read-committed reader sees none of it.
    assert committed_count(admin, target) == 0
    assert _open_transactions(admin) >= 1
    report = build_coordinator(target, "staging", TXN, str(tmp_path), visibility="batch").commit_batch(0, msgs)
    assert report.replay
    _assert_published_once(admin, database, target)  # the dead attempt's transaction rolled back


def test_recover_after_a_driver_died_inside_the_batch_transaction_rolls_it_back_and_publishes_each_xid_once(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database, settings=QUICK_CLEANUP)
    msgs = _prepared_batch(target, tmp_path)
    _die_inside_the_batch_transaction(target, tmp_path, msgs)

    # What `recover` runs for each COMMITTING xid (per-xid, without visibility=batch):
    # the open batch transaction hides the stages' partitions from a plain read, so a
    # MOVE now would move nothing and the marker would claim rows a rollback takes back.
    # With recover's retry of what the server refused before running (its TxOps): the
    # rolled-back MOVE leaves its parts in the target in state Deleting for a moment, and
    # a MOVE of a part of the same name meanwhile is refused as PART_IS_TEMPORARILY_LOCKED.
    for p in msgs:
        retry_call(lambda p=p: StagingMode().commit(target, p), RetryPolicy(max_attempts=10, max_total_s=60.0))

    _assert_published_once(admin, database, target)


def test_the_batch_session_is_named_by_query_and_batch() -> None:
    assert batch_session("q/1", 7) != batch_session("q/1", 8) != batch_session("q/2", 8)
    assert batch_session("q/1", 7) == batch_session("q/1", 7)
    assert "/" not in batch_session("q/1", 7)


@pytest.mark.parametrize("mode", ["transaction", "dedup", "none"])
def test_visibility_batch_is_refused_outside_mode_staging_before_anything_is_written(mode: str) -> None:
    with pytest.raises(ConfigurationError, match="only mode 'staging'"):
        mode_io_for(mode, visibility="batch")


def test_visibility_batch_refuses_a_replicated_table_and_names_visibility_partition(
    admin: ClickHouseHTTP, database: str
) -> None:
    fq = q.qualified(database, "replicated")
    admin.command(
        f"CREATE TABLE {fq} (id UInt64, s String) ENGINE = "
        f"ReplicatedMergeTree('/clickhouse/tables/{database}/replicated', 'r1') ORDER BY id"
    )
    target = Target(url=admin.target.url, database=database, table="replicated", **target_fields())
    with pytest.raises(ConfigurationError, match="visibility=partition"):
        mode_io_for("staging", visibility="batch").validate(target, rows(1).schema)
    # Per-partition staging takes the engine: what it refuses is the embedded engine's
    # read-only replica, and only after every check of what could never work.
    with pytest.raises(ServerBusyError, match="read-only replica"):
        mode_io_for("staging").validate(target, rows(1).schema)
