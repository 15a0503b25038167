"""A user's DDL on the target never waits behind what the driver fenced.

ClickHouse makes ``DROP TABLE ... SYNC`` wait for every running transaction that
wrote to the table (measured on the embedded server: behind one open prepared
transaction it waited until the session expired), while a transaction that failed
(the driver's fence, ``transaction.FENCE``) holds nothing. So the driver's fence
must leave no running transaction behind, including one an attempt opened after
the fence; in mode ``staging`` no stage table either (GC would drop it only later).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import NotCommittedError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.store.markers import MARKERS_TABLE
from tests.helpers.tables import TXN, batches, committed_count, make_table, markers, rows, tables


def _ddl_finishes(admin: ClickHouseHTTP, target: Target) -> None:
    """ALTERs, a mutation, a merge, then DROP TABLE ... SYNC of the target and the markers."""
    fq = q.qualified(target.database, target.table)
    admin.command(f"ALTER TABLE {fq} ADD COLUMN extra UInt8 DEFAULT 0")
    admin.command(f"ALTER TABLE {fq} DELETE WHERE id = 1 SETTINGS mutations_sync = 2")
    admin.command(f"OPTIMIZE TABLE {fq} FINAL")
    admin.command(f"DROP TABLE {fq} SYNC")
    admin.command(f"DROP TABLE {q.qualified(target.database, MARKERS_TABLE)} SYNC")


def _validated(admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str) -> tuple[Target, Coordinator]:
    """A fresh target and a coordinator of ``mode`` that checked it."""
    target = make_table(admin, database)
    co = build_coordinator(target, mode, TXN, str(tmp_path))
    co.validate(rows(1).schema)
    return target, co


def _nothing_left(admin: ClickHouseHTTP, database: str, target: Target) -> None:
    """No row of the target committed, no marker, no stage table."""
    assert committed_count(admin, target) == 0 and markers(admin, database) == []
    assert not [t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_ddl_on_the_target_finishes_behind_a_prepared_xid_the_driver_fenced_and_its_rows_never_show(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    # A session keeps its default timeout (an hour): only the fence can free the table.
    target, co = _validated(admin, database, tmp_path, mode)
    p = co.prepare(WriteContext(TXN, 0, 0, 0), batches(rows(100)))
    report = co.abort_batch(0, [p])  # the driver's rollback (transaction: FENCE in the session)
    assert report.rolled_back == (p.xid,) and report.left == ()
    assert co.mode_io.lookup(target, p) is CommitOutcome.NOT_COMMITTED
    assert committed_count(admin, target) == 0
    with pytest.raises(NotCommittedError):
        co.mode_io.commit(target, p)
    _nothing_left(admin, database, target)
    _ddl_finishes(admin, target)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_an_attempt_fenced_before_its_work_existed_rolls_its_own_work_back_and_ddl_does_not_wait(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    # The driver aborts the batch while an attempt is registered but has not begun its
    # transaction: the fence finds no session (a no-op) and the entry is ABORTED. The
    # attempt then opens its session and writes. It used to leave that transaction
    # running, watched by the keep-alive, and the teardown's DROP DATABASE ... SYNC
    # timed out behind it. In mode staging the fence is the DROP of a stage not yet made.
    target, co = _validated(admin, database, tmp_path, mode)
    aborted: list[tuple[str, ...]] = []

    def aborted_first() -> Iterator[pa.RecordBatch]:
        aborted.append(co.abort_batch(0, []).rolled_back)  # pulled before BEGIN (the schema peek)
        yield from batches(rows(100))

    with pytest.raises(NotCommittedError, match="fenced while writing"):
        co.prepare(WriteContext(TXN, 0, 0, 0), aborted_first())
    xid = aborted[0][0]
    p = Prepared.for_attempt(WriteContext(TXN, 0, 0, 0), xid, Mode(mode), "", "")
    assert co.mode_io.lookup(target, p) is CommitOutcome.NOT_COMMITTED  # no running transaction, no stage
    _nothing_left(admin, database, target)
    _ddl_finishes(admin, target)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_an_attempt_that_registers_after_spark_aborted_its_runs_batch_rolls_back_and_ddl_does_not_wait(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    # Spark fails a job on one task's error and calls abort while another task has not
    # registered yet: the abort's listing misses it. That task then wrote, returned its
    # message to a driver that no longer listened, and its transaction stayed open in a
    # reused Python worker's keep-alive; a CI run's DROP DATABASE ... SYNC timed out.
    target, co = _validated(admin, database, tmp_path, mode)
    assert co.abort_batch(0, [], run="run-1").rolled_back == ()
    with pytest.raises(NotCommittedError, match="Spark aborted this batch of the run"):
        co.prepare(WriteContext(TXN, 0, 0, 0, run="run-1"), batches(rows(100)))
    assert co.registry.list_batch(TXN, 0)[0].state == "aborted"
    _nothing_left(admin, database, target)
    # A restarted query's attempt of the same batch is not fenced (then rolled back by its abort).
    replay = co.prepare(WriteContext(TXN, 0, 0, 0, run="run-2"), batches(rows(100)))
    assert co.abort_batch(0, [replay], run="run-2").rolled_back == (replay.xid,)
    _ddl_finishes(admin, target)
