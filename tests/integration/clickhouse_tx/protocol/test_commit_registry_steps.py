"""The registry steps of a driver's commit against the local stack, partitions in parallel.

The rollback of a batch's other attempts uses the plan's registry listing, and the
done batch's entries are dropped, its committed ones straight from COMMITTING
(``docs/protocol.md``, "Commit of batch b", steps 5 and 6).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator, build_registry
from clickhouse_tx.interfaces import Prepared, Target, WriteContext
from clickhouse_tx.protocol.coordinator import Coordinator
from tests.helpers.tables import batches, committed_count, make_table, rows

PARTS = 4


def _prepared_batch(admin: ClickHouseHTTP, database: str, tmp_path: Path) -> tuple[Target, Coordinator, list[Prepared]]:
    """(target, the query's coordinator, one prepared attempt of each of ``PARTS``
    partitions of batch 0)."""
    target = make_table(admin, database)
    txn = f"q-{uuid.uuid4().hex[:8]}"
    coord = build_coordinator(target, "transaction", txn, str(tmp_path))
    msgs = [coord.prepare(WriteContext(txn, 0, p, 0), batches(rows(100, start=100 * p))) for p in range(PARTS)]
    return target, coord, msgs


def test_a_speculative_attempt_registered_before_the_commit_is_rolled_back_and_every_entry_forgotten(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target, coord, msgs = _prepared_batch(admin, database, tmp_path)
    txn = coord.txn_id
    assert coord.parallelism > 1  # the path with the bulk CAS to COMMITTING
    # a duplicate attempt of partition 0 whose message never reaches the driver
    spec = coord.prepare(WriteContext(txn, 0, 0, 1), batches(rows(100)))

    report = build_coordinator(target, "transaction", txn, str(tmp_path)).commit_batch(0, msgs)

    assert set(report.committed) == {m.xid for m in msgs}
    assert report.rolled_back == (spec.xid,)
    assert committed_count(admin, target) == 100 * PARTS
    assert build_registry(target).list_batch(txn, 0) == []


def test_a_replay_of_a_done_batch_drops_the_entries_a_crash_left_committing(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target, coord, msgs = _prepared_batch(admin, database, tmp_path)
    txn = coord.txn_id
    crashed = build_coordinator(target, "transaction", txn, str(tmp_path))
    crashed.registry.forget = lambda xids, committed=(): None  # killed before it dropped them
    crashed.commit_batch(0, msgs)
    left = build_registry(target).list_batch(txn, 0)
    assert {e.state for e in left} == {"committing"} and len(left) == PARTS

    report = build_coordinator(target, "transaction", txn, str(tmp_path)).commit_batch(0, msgs)

    assert report.already_done and set(report.committed) == {m.xid for m in msgs}
    assert committed_count(admin, target) == 100 * PARTS
    assert build_registry(target).list_batch(txn, 0) == []
