"""``python -m clickhouse_tx status|gc|recover`` against the real local server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator, build_mode_io
from clickhouse_tx.interfaces import Decision, Target, WriteContext
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.store.decision_log import FileDecisionLog
from clickhouse_tx.store.registry import KeeperMapRegistry
from spark_datasource.testing.credentials import target_fields
from tests.helpers.cli import id_batch, id_table, run_cli, visible_ids

TXN = "cli"


def test_status_counts_open_prepares_and_gc_rolls_back_the_ones_no_decision_names(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    target, admin = id_table(clickhouse_url, database)
    coord = build_coordinator(target, "transaction", TXN, str(tmp_path))
    coord.commit_batch(0, [coord.prepare(WriteContext(TXN, 0, 0, 0), iter(id_batch(1000)))])
    stale = [coord.prepare(WriteContext(TXN, 3, p, 0), iter(id_batch(100 * p))) for p in range(2)]
    common = ["--url", clickhouse_url, "--table", f"{database}.events"]

    status = run_cli("status", *common, "--json")
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["open_by_state"] == {TxState.INITIALIZED.value: 2}

    gc = run_cli("gc", *common, "--mode", "transaction", "--checkpoint", str(tmp_path), "--older-than", "0", "--json")
    assert gc.returncode == 0, gc.stderr
    assert sorted(json.loads(gc.stdout)["rolled_back"]) == sorted(p.xid for p in stale)

    registry = KeeperMapRegistry(target)
    assert [registry.get(p.xid) for p in stale] == [None, None]  # rolled back, then forgotten
    assert visible_ids(admin, target) == 100  # batch 0 only
    after = json.loads(run_cli("status", *common, "--json").stdout)
    assert after["open_by_state"] == {}


def test_recover_rolls_forward_a_decided_xid_a_dead_driver_left_committing(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    target, admin = id_table(clickhouse_url, database)
    coord = build_coordinator(target, "transaction", TXN, str(tmp_path))
    p = coord.prepare(WriteContext(TXN, 5, 0, 0), iter(id_batch(0)))
    # The driver wrote the decision and moved the xid to COMMITTING, then died before COMMIT.
    FileDecisionLog(str(tmp_path), TXN).write(Decision(txn_id=TXN, batch=5, chosen=(p,)))
    registry = KeeperMapRegistry(target)
    assert registry.transition(p.xid, [TxState.INITIALIZED.value], TxState.COMMITTING.value)
    assert visible_ids(admin, target) == 0

    recover = ["recover", "--url", clickhouse_url, "--table", f"{database}.events", "--mode", "transaction"]
    rec = run_cli(*recover, "--checkpoint", str(tmp_path), "--json")
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["committed"] == [p.xid]
    assert registry.get(p.xid).state == TxState.COMMITTED.value
    assert visible_ids(admin, target) == 100
    # A second pass finds nothing in doubt and changes nothing.
    again = json.loads(run_cli(*recover, "--checkpoint", str(tmp_path), "--json").stdout)
    assert again["committed"] == [] and visible_ids(admin, target) == 100
    assert build_mode_io("transaction").lookup(target, p).value == "committed"


def _commit_until_first_commit(target: Target, chk: Path, txn: str, partitions: int, rows: int) -> list:
    """A job that decided a batch and COMMITTED one partition, then died (as after_commit:1)."""
    coord = build_coordinator(target, "transaction", txn, str(chk))
    msgs = [coord.prepare(WriteContext(txn, 0, p, 0), iter(id_batch(p * rows, rows))) for p in range(partitions)]
    FileDecisionLog(str(chk), txn).write(Decision(txn_id=txn, batch=0, chosen=tuple(msgs)))
    registry = KeeperMapRegistry(target)
    for m in msgs:
        assert registry.transition(m.xid, [TxState.INITIALIZED.value], TxState.COMMITTING.value)
    build_mode_io("transaction").commit(target, msgs[0])
    return msgs


def test_recover_with_another_querys_checkpoint_never_rolls_back_the_decided_xids_of_a_query_it_was_not_given(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    target, admin = id_table(clickhouse_url, database)
    chk_a, chk_b = tmp_path / "a", tmp_path / "b"
    msgs_a = _commit_until_first_commit(target, chk_a, "query-a", 3, 1000)
    # Query B shares the registry: it has a decision log of its own and an open prepare.
    coord_b = build_coordinator(target, "transaction", "query-b", str(chk_b))
    coord_b.commit_batch(0, [coord_b.prepare(WriteContext("query-b", 0, 0, 0), iter(id_batch(10_000, 10)))])
    b_open = coord_b.prepare(WriteContext("query-b", 1, 0, 0), iter(id_batch(20_000, 10)))
    assert visible_ids(admin, target) == 1010

    common = ["--url", clickhouse_url, "--table", f"{database}.events", "--mode", "transaction", "--json"]
    rec = run_cli("recover", *common, "--checkpoint", str(chk_b))
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["rolled_back"] == []
    gc = run_cli("gc", *common, "--checkpoint", str(chk_b), "--older-than", "0")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["rolled_back"] == [b_open.xid]  # B's own stale prepare only

    registry = KeeperMapRegistry(target)
    assert registry.transition(msgs_a[0].xid, [TxState.COMMITTING.value], TxState.COMMITTED.value)
    # gc given A's own checkpoint leaves a decided batch that is not done alone, finished entries too.
    own = run_cli("gc", *common, "--checkpoint", str(chk_a), "--older-than", "0")
    assert own.returncode == 0 and json.loads(own.stdout)["forgotten"] == [], own.stdout + own.stderr
    assert [registry.get(m.xid).state for m in msgs_a] == [TxState.COMMITTED.value] + [TxState.COMMITTING.value] * 2
    # A's replay (its own decision's roll-forward) finishes the batch: all 3,000 rows of A.
    build_coordinator(target, "transaction", "query-a", str(chk_a)).commit_batch(0, msgs_a)
    assert visible_ids(admin, target) == 3010


def test_recover_and_gc_without_a_txn_id_or_a_checkpoint_refuse_to_act_on_every_query(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    target, admin = id_table(clickhouse_url, database)
    msgs = _commit_until_first_commit(target, tmp_path / "a", "query-a", 2, 10)
    common = ["--url", clickhouse_url, "--table", f"{database}.events", "--mode", "transaction"]
    out = run_cli("recover", *common)
    assert out.returncode == 2 and "--txn-id" in out.stderr and "--checkpoint" in out.stderr, out.stderr
    # gc without them runs its retention pass of the bookkeeping records only: no xid is touched
    out = run_cli("gc", *common, "--older-than", "0", "--retention", "0s")
    assert out.returncode == 0 and "prepares: not touched" in out.stdout and "--txn-id" in out.stdout, out.stderr
    wrong = run_cli("recover", *common, "--txn-id", "query-a", "--checkpoint", str(tmp_path / "elsewhere"))
    assert wrong.returncode == 2 and "query-a" in wrong.stderr, wrong.stderr
    registry = KeeperMapRegistry(target)
    assert registry.get(msgs[1].xid).state == TxState.COMMITTING.value
    assert visible_ids(admin, target) == 10
    build_mode_io("transaction").rollback(target, msgs[1])  # an open transaction blocks DROP DATABASE


# A writer process: commits batch 0, leaves two attempts of batch 1 prepared (a zombie
# and a retried task), then is SIGKILLed in the middle of a third attempt's INSERT.
_CRASHING_WRITER = r"""
import os, signal, sys
import pyarrow as pa
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext

url, db, table, mode, txn, chk = sys.argv[1:7]
target = Target(url=url, database=db, table=table)

def rows(first, n=500):
    return iter(pa.table({"id": pa.array(range(first, first + n), pa.uint64())}).to_batches(max_chunksize=100))

def dying(first):
    yield from rows(first)
    os.kill(os.getpid(), signal.SIGKILL)

coord = build_coordinator(target, mode, txn, chk)
coord.commit_batch(0, [coord.prepare(WriteContext(txn, 0, p, 0), rows(1000 * p)) for p in range(2)])
for attempt in range(2):
    coord.prepare(WriteContext(txn, 1, 0, attempt), rows(5000))
coord.prepare(WriteContext(txn, 1, 1, 0), dying(6000))
"""


def _leftovers(admin: ClickHouseHTTP, target: Target, txn: str) -> dict[str, int]:
    """Every kind of leftover a crashed writer can leave, counted."""
    stages = admin.query_json(
        "SELECT count() AS n FROM system.tables WHERE database = {d:String} AND startsWith(name, '_ctx_stage_')",
        params={"d": target.database},
    )
    open_tx = admin.query_json("SELECT count() AS n FROM system.transactions WHERE state = 'RUNNING'")
    return {
        "registry entries": len(KeeperMapRegistry(target).list_txn(txn)),
        "stage tables": int(stages[0]["n"]),
        "open transactions": int(open_tx[0]["n"]),
    }


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_gc_after_a_writer_is_sigkilled_leaves_zero_leftovers_of_every_kind(
    mode: str, stack_factory, tmp_path: Path
) -> None:
    url = stack_factory().clickhouse_url  # a private server: it counts every open transaction
    database = "gc_after_crash"
    admin = ClickHouseHTTP(Target(url=url, database="default", table="x"))
    admin.command(f"CREATE DATABASE {q.quote_identifier(database)}")
    target, admin = id_table(url, database)
    txn, chk = f"crash-{mode}", str(tmp_path / "chk")
    run = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, url, database, "events", mode, txn, chk],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    if mode == "staging":
        # A failed prepare whose DROP of the stage failed: ABORTED, stage still there.
        p = build_coordinator(target, mode, txn, chk).prepare(WriteContext(txn, 1, 2, 0), iter(id_batch(9000)))
        registry = KeeperMapRegistry(target)
        for state in (TxState.ABORTING, TxState.ABORTED):
            assert registry.transition(p.xid, [TxState.INITIALIZED.value, TxState.ABORTING.value], state.value)
    before = _leftovers(admin, target, txn)
    assert before["registry entries"] >= 3 and visible_ids(admin, target) == 1000
    assert before["stage tables" if mode == "staging" else "open transactions"] >= 2, before

    gc = run_cli(
        "gc",
        "--url",
        url,
        "--table",
        f"{database}.events",
        "--mode",
        mode,
        "--checkpoint",
        chk,
        "--older-than",
        "0",
        "--json",
    )
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert _leftovers(admin, target, txn) == {"registry entries": 0, "stage tables": 0, "open transactions": 0}
    assert visible_ids(admin, target) == 1000  # batch 0, untouched


def test_gc_drops_the_stage_a_dead_overwrite_job_left_and_no_other_jobs_stage(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    from clickhouse_tx.modes.staging.tables import overwrite_stage_name

    target, admin = id_table(clickhouse_url, database)
    stages = {job: overwrite_stage_name(job) for job in ("ow-job", "other-job")}
    for stage in stages.values():
        admin.command(f"CREATE TABLE {q.qualified(database, stage)} AS {q.qualified(database, 'events')}")
    # The overwrite job committed into its stage, then its driver died before the swap.
    staged = Target(url=clickhouse_url, database=database, table=stages["ow-job"], **target_fields())
    coord = build_coordinator(staged, "transaction", "ow-job", str(tmp_path))
    coord.commit_batch(0, [coord.prepare(WriteContext("ow-job", 0, 0, 0), iter(id_batch(0)))])

    gc = run_cli(
        "gc",
        "--url",
        clickhouse_url,
        "--table",
        f"{database}.events",
        "--mode",
        "transaction",
        "--checkpoint",
        str(tmp_path),
        "--older-than",
        "0",
        "--json",
    )
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert json.loads(gc.stdout)["dropped_stages"] == [stages["ow-job"]]
    left = admin.query_json(
        "SELECT name FROM system.tables WHERE database = {d:String} AND startsWith(name, '_ctx_ow_')",
        params={"d": database},
    )
    assert [r["name"] for r in left] == [stages["other-job"]]
