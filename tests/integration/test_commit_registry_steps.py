"""The registry steps of a driver's commit against the local stack, partitions in parallel.

The rollback of a batch's other attempts uses the plan's registry listing, and the
done batch's entries are forgotten by a thread after ``commit_batch`` returns
(``docs/protocol.md``, "Commit of batch b", steps 5 and 6).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from clickhouse_tx.factory import build_coordinator, build_registry
from clickhouse_tx.http_client import ClickHouseHTTP
from clickhouse_tx.interfaces import WriteContext
from tests.helpers.tables import batches, committed_count, make_table, rows

PARTS = 4


def _join_housekeeping_threads() -> None:
    for t in threading.enumerate():
        if t.name == "clickhouse-tx-housekeeping":
            t.join(timeout=30)


def test_a_speculative_attempt_registered_before_the_commit_is_rolled_back_and_every_entry_forgotten(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    txn = f"q-{uuid.uuid4().hex[:8]}"
    coord = build_coordinator(target, "transaction", txn, str(tmp_path))
    assert coord.parallelism > 1  # the path with the forget after the return
    msgs = [coord.prepare(WriteContext(txn, 0, p, 0), batches(rows(100, start=100 * p))) for p in range(PARTS)]
    # a duplicate attempt of partition 0 whose message never reaches the driver
    spec = coord.prepare(WriteContext(txn, 0, 0, 1), batches(rows(100)))

    report = build_coordinator(target, "transaction", txn, str(tmp_path)).commit_batch(0, msgs)
    _join_housekeeping_threads()

    assert set(report.committed) == {m.xid for m in msgs}
    assert report.rolled_back == (spec.xid,)
    assert committed_count(admin, target) == 100 * PARTS
    assert build_registry(target).list_batch(txn, 0) == []
