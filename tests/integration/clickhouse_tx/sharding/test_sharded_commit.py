"""A write over 2 shards, driven through the real coordinators: prepare per (partition,
shard), one decision per batch, each xid committed on the server that prepared it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.errors import NotCommittedError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.ids import run_fence_key
from clickhouse_tx.interfaces import Prepared, Target, WriteContext
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.protocol.tx_ops import TxOps
from clickhouse_tx.sharding.io import build_sharded_coordinator, prepare_sharded
from clickhouse_tx.sharding.placement import ShardPlacement, stable_hash
from server_patches import crashes
from server_patches.stack_files import StackInfo
from tests.helpers.shards import counts, drop_everywhere, ids_per_shard, sharded_table
from tests.helpers.tables import TXN, batches, rows

MODES = ["transaction", "staging", "dedup"]


@pytest.fixture
def target(sharded_stack: StackInfo) -> Iterator[Target]:
    t = sharded_table(sharded_stack)
    yield t
    drop_everywhere(sharded_stack, t.database)


def _one(mode: str, log: Path):
    def build(t: Target) -> Coordinator:
        return build_coordinator(t, mode, TXN, str(log))

    return build


def _prepare(
    placement: ShardPlacement, target: Target, mode: str, log: Path, data: pa.Table, parts: int, run: str = ""
) -> list[Prepared]:
    """One Spark-like task per slice of ``data``: slice i is partition i."""
    per = data.num_rows // parts
    build = _one(mode, log)
    out: list[Prepared] = []
    for p in range(parts):
        ctx = WriteContext(TXN, 0, p, 0, run)
        out += prepare_sharded(
            placement,
            lambda shard, url: build(dataclasses.replace(target, url=url)),
            target,
            ctx,
            batches(data.slice(p * per, per)),
        )
    return out


def _expected_by_key(placement: ShardPlacement, ids: list[int]) -> list[int]:
    shards = placement.shards_of_hashes(stable_hash(pa.array(ids, pa.uint64())))
    return [int((shards == s).sum()) for s in range(placement.n)]


@pytest.mark.parametrize("mode", MODES)
def test_rows_spread_by_key_commit_once_on_their_shard_and_a_replay_changes_nothing(
    sharded_stack: StackInfo, target: Target, tmp_path: Path, mode: str
) -> None:
    placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), key="id")
    msgs = _prepare(placement, target, mode, tmp_path, rows(2000), parts=4)
    assert sorted({placement.shard_of_slot(m.partition) for m in msgs}) == [0, 1]
    assert len(msgs) == 8  # 4 partitions x 2 shards, every one with rows
    co = build_sharded_coordinator(target, placement, _one(mode, tmp_path))
    report = co.commit_batch(0, msgs)
    assert set(report.committed) == {m.xid for m in msgs} and report.rows == 2000
    per = ids_per_shard(sharded_stack, target)
    assert counts(per) == _expected_by_key(placement, list(range(2000)))
    assert sorted(per[0] + per[1]) == list(range(2000))
    replay = build_sharded_coordinator(target, placement, _one(mode, tmp_path)).commit_batch(0, msgs)
    assert replay.already_done and ids_per_shard(sharded_stack, target) == per


@pytest.mark.parametrize("mode", MODES)
def test_without_a_key_each_partition_goes_whole_to_one_shard_by_weight(
    sharded_stack: StackInfo, target: Target, tmp_path: Path, mode: str
) -> None:
    placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), weights=(1, 2))
    msgs = _prepare(placement, target, mode, tmp_path, rows(1200), parts=6)
    assert [placement.shard_of_slot(m.partition) for m in msgs] == [0, 1, 1, 0, 1, 1]
    build_sharded_coordinator(target, placement, _one(mode, tmp_path)).commit_batch(0, msgs)
    per = ids_per_shard(sharded_stack, target)
    assert counts(per) == [400, 800]
    assert per[0] == list(range(0, 200)) + list(range(600, 800))


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_an_aborted_sharded_batch_leaves_no_row_on_any_shard(
    sharded_stack: StackInfo, target: Target, tmp_path: Path, mode: str
) -> None:
    placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), key="id")
    msgs = _prepare(placement, target, mode, tmp_path, rows(400), parts=2)
    report = build_sharded_coordinator(target, placement, _one(mode, tmp_path)).abort_batch(0, msgs)
    assert sorted(report.rolled_back) == sorted(m.xid for m in msgs)
    assert counts(ids_per_shard(sharded_stack, target)) == [0, 0]


def test_an_attempt_on_any_shard_that_registers_after_its_runs_abort_rolls_itself_back(
    sharded_stack: StackInfo, target: Target, tmp_path: Path
) -> None:
    placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), key="id")
    co = build_sharded_coordinator(target, placement, _one("transaction", tmp_path))
    assert co.abort_batch(0, [], run="run-1").rolled_back == ()
    fence = run_fence_key(TXN, 0, "run-1")  # each shard's attempts read it in their own shard's registry
    assert [fence in r.get_many([fence]) for r in co.registry.registries] == [True, True]
    with pytest.raises(NotCommittedError, match="Spark aborted this batch of the run"):
        _prepare(placement, target, "transaction", tmp_path, rows(400), parts=1, run="run-1")
    msgs = _prepare(placement, target, "transaction", tmp_path, rows(400), parts=2, run="run-2")
    co.commit_batch(0, msgs)
    assert counts(ids_per_shard(sharded_stack, target)) == _expected_by_key(placement, list(range(400)))


def test_a_decision_logged_before_the_driver_died_is_rolled_forward_on_every_shard(
    sharded_stack: StackInfo, target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), key="id")
    msgs = _prepare(placement, target, "transaction", tmp_path, rows(1000), parts=2)
    co = build_sharded_coordinator(target, placement, _one("transaction", tmp_path))
    committed_one: list[str] = []
    real_commit = TxOps.commit_committing

    class DriverDied(BaseException):
        pass

    def commit_then_die(self: TxOps, p: Prepared) -> bool:
        if committed_one:
            raise DriverDied()
        committed_one.append(p.xid)
        return real_commit(self, p)

    co.context = dataclasses.replace(co.context, parallelism=1)
    with monkeypatch.context() as patched, pytest.raises(DriverDied):
        patched.setattr(TxOps, "commit_committing", commit_then_die)
        co.commit_batch(0, msgs)
    assert 0 < sum(counts(ids_per_shard(sharded_stack, target))) < 1000
    # The replay (a new driver, a later task attempt's messages included) finishes the decision.
    again = _prepare(placement, target, "transaction", tmp_path, rows(1000), parts=2)
    report = build_sharded_coordinator(target, placement, _one("transaction", tmp_path)).commit_batch(0, again + msgs)
    assert report.replay
    per = ids_per_shard(sharded_stack, target)
    assert sorted(per[0] + per[1]) == list(range(1000))


@pytest.mark.parametrize("mode", ["staging", "dedup"])
def test_a_dead_replica_is_skipped_and_the_xid_commits_on_the_replica_that_prepared_it(
    stack_factory, tmp_path: Path, mode: str
) -> None:

    info: StackInfo = stack_factory(shards=1, replicas=2)
    target = sharded_table(info)
    ((r0, r1),) = info.clickhouse_urls
    crashes.kill_clickhouse(info.dir, shard=0, replica=0)
    placement = ShardPlacement(((r0, r1),))
    msgs = _prepare(placement, target, mode, tmp_path, rows(600), parts=3)
    assert {m.server for m in msgs} == {r1}
    report = build_sharded_coordinator(target, placement, _one(mode, tmp_path)).commit_batch(0, msgs)
    assert report.rows == 600
    crashes.start_clickhouse(info.dir, shard=0, replica=0)
    from clickhouse_tx.client.http import ClickHouseHTTP

    def count(url: str) -> int:
        with ClickHouseHTTP(dataclasses.replace(target, url=url)) as c:
            fq = f"`{target.database}`.`{target.table}`"
            return int(c.query_json(f"SELECT count() AS n FROM {fq} SETTINGS implicit_transaction = 1")[0]["n"])

    # No replication on the embedded engine (docs/deployment.md): the rows are where they were prepared.
    assert (count(r0), count(r1)) == (0, 600)


def test_transaction_mode_refuses_a_replicated_target_on_any_shard_naming_staging_and_dedup(
    sharded_stack: StackInfo, tmp_path: Path
) -> None:
    from clickhouse_tx.errors import ConfigurationError, ServerBusyError
    from tests.helpers.shards import create_everywhere

    target = sharded_table(sharded_stack, table="plain")
    try:
        create_everywhere(
            sharded_stack,
            f"CREATE TABLE `{target.database}`.repl (id UInt64, s String) "
            f"ENGINE = ReplicatedMergeTree('/t/{target.database}/{{shard}}/repl', '{{replica}}') ORDER BY id",
        )
        placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), key="id")
        repl = dataclasses.replace(target, table="repl")
        co = build_sharded_coordinator(repl, placement, _one("transaction", tmp_path))
        with pytest.raises(ConfigurationError, match="staging") as e:
            co.validate(rows(1).schema)
        assert "dedup" in str(e.value)
        for mode in ("staging", "dedup"):  # they take the engine; the embedded replicas are read-only
            with pytest.raises(ServerBusyError, match="read-only replica"):
                build_sharded_coordinator(repl, placement, _one(mode, tmp_path)).validate(rows(1).schema)
    finally:
        drop_everywhere(sharded_stack, target.database)
