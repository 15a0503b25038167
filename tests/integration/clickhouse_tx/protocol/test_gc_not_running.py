"""``python -m clickhouse_tx gc --not-running``: the leftovers of a query that never decided a batch.

Such a query has no decision log, only ``<checkpoint>/clickhouse_tx/query.json`` (a
streaming query stores it at start). Without ``--not-running`` gc refuses (checkpoint)
or skips (txn id) its prepares; with it, and old enough, it rolls back every attempt
of a batch none of whose xids started committing, and leaves the others alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clickhouse_tx.factory import build_coordinator, build_mode_io
from clickhouse_tx.ids import StoredQueryId
from clickhouse_tx.interfaces import CommitOutcome, Prepared, Target, WriteContext
from clickhouse_tx.protocol.commit_plan import prepared_from_entry
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.store.registry import KeeperMapRegistry
from tests.helpers.cli import id_batch, id_table, run_cli, visible_ids


def _never_decided(target: Target, mode: str, chk: Path, txn: str, batch: int = 0) -> list[Prepared]:
    """A query stored its id in ``chk``, prepared 2 partitions of ``batch`` and died before deciding."""
    (chk / "clickhouse_tx").mkdir(parents=True, exist_ok=True)
    (chk / "clickhouse_tx" / "query.json").write_bytes(StoredQueryId(txn, "spark-query-id").to_json())
    coord = build_coordinator(target, mode, txn, str(chk))
    return [coord.prepare(WriteContext(txn, batch, p, 0), iter(id_batch(100 * p))) for p in range(2)]


def _gc(target: Target, mode: str, *args: str):
    return run_cli(
        "gc", "--url", target.url, "--table", f"{target.database}.{target.table}", "--mode", mode, *args, "--json"
    )


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_gc_not_running_rolls_back_every_prepare_of_a_query_that_never_decided_and_refuses_without_the_flag(
    clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    target, admin = id_table(clickhouse_url, database)
    chk, txn = tmp_path / "chk", f"never-{mode}"
    prepared = _never_decided(target, mode, chk, txn)
    io = build_mode_io(mode)
    assert [io.lookup(target, p) for p in prepared] == [CommitOutcome.PENDING] * 2

    refused = _gc(target, mode, "--checkpoint", str(chk), "--older-than", "0")
    assert refused.returncode == 2 and "--not-running" in refused.stderr, refused.stderr
    by_id = _gc(target, mode, "--txn-id", txn, "--older-than", "0")
    assert by_id.returncode == 0 and json.loads(by_id.stdout)["skipped"] == sorted(p.xid for p in prepared)
    young = _gc(target, mode, "--checkpoint", str(chk), "--not-running", "--older-than", "3600")
    assert young.returncode == 0 and json.loads(young.stdout)["rolled_back"] == []  # too young: a live batch?

    gc = _gc(target, mode, "--checkpoint", str(chk), "--not-running", "--older-than", "0")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert sorted(json.loads(gc.stdout)["rolled_back"]) == sorted(p.xid for p in prepared)
    assert KeeperMapRegistry(target).list_txn(txn) == []  # rolled back, then forgotten
    assert [io.lookup(target, p) for p in prepared] == [CommitOutcome.NOT_COMMITTED] * 2
    stages = admin.query_json(
        "SELECT count() AS n FROM system.tables WHERE database = {d:String} AND startsWith(name, '_ctx_stage_')",
        params={"d": database},
    )
    assert int(stages[0]["n"]) == 0 and visible_ids(admin, target) == 0


def test_gc_not_running_leaves_a_batch_whose_xid_started_committing_and_forgets_an_aborted_one(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    target, admin = id_table(clickhouse_url, database)
    txn = "never-mixed"
    started = _never_decided(target, "transaction", tmp_path / "a", txn, batch=1)
    registry = KeeperMapRegistry(target)
    assert registry.transition(started[0].xid, [TxState.INITIALIZED.value], TxState.COMMITTING.value)
    aborted = _never_decided(target, "transaction", tmp_path / "a", txn, batch=2)
    build_coordinator(target, "transaction", txn, str(tmp_path / "a")).abort_batch(2, aborted)  # Spark's abort

    gc = _gc(target, "transaction", "--txn-id", txn, "--not-running", "--older-than", "0")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    doc = json.loads(gc.stdout)
    assert doc["skipped"] == [started[1].xid] and doc["rolled_back"] == []
    assert sorted(doc["forgotten"]) == sorted(p.xid for p in aborted)
    left = {e.xid: e.state for e in registry.list_txn(txn)}
    assert left == {started[0].xid: TxState.COMMITTING.value, started[1].xid: TxState.INITIALIZED.value}
    io = build_mode_io("transaction")
    assert io.lookup(target, prepared_from_entry(registry.get(started[1].xid))) is CommitOutcome.PENDING
    for p in started:  # end the open transactions: DROP DATABASE waits for them otherwise
        io.rollback(target, p)
