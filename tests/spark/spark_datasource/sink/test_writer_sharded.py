"""Writes over 2 ClickHouse shards through ``format("clickhouse_tx")`` on a real local
Spark and the 2-shard embedded stack: exact counts per shard and in total."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.interfaces import Target
from clickhouse_tx.sharding.placement import ShardPlacement, stable_hash
from server_patches.stack_files import StackInfo
from tests.helpers.shards import counts, drop_everywhere, ids_per_shard, sharded_table


@pytest.fixture
def target(sharded_stack: StackInfo) -> Iterator[Target]:
    t = sharded_table(sharded_stack)
    yield t
    drop_everywhere(sharded_stack, t.database)


def _options(stack: StackInfo, target: Target, mode: str, **extra: str) -> dict[str, str]:
    return {"shards": stack.shards_option, "table": f"{target.database}.{target.table}", "mode": mode, **extra}


def _by_key(n: int, weights: tuple[int, ...] = (1, 1)) -> list[int]:
    placement = ShardPlacement((("a",), ("b",)), weights, "id")
    shards = placement.shards_of_hashes(stable_hash(pa.array(range(n), pa.int64())))
    return [int((shards == s).sum()) for s in range(2)]


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup"])
def test_a_batch_job_spreads_rows_by_key_over_two_shards_exactly_once(
    sp, sharded_stack: StackInfo, target: Target, mode: str
) -> None:
    n = 20_000
    df = sp.range(n).selectExpr("id", "concat('v', id) AS s").repartition(4)
    df.write.format("clickhouse_tx").options(**_options(sharded_stack, target, mode, sharding_key="id")).mode(
        "append"
    ).save()
    per = ids_per_shard(sharded_stack, target)
    assert counts(per) == _by_key(n)
    assert sorted(per[0] + per[1]) == list(range(n))


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup"])
def test_without_a_key_each_spark_partition_lands_whole_on_one_shard(
    sp, sharded_stack: StackInfo, target: Target, mode: str
) -> None:
    n = 6000
    # range(n) in 3 slices: partition p holds ids [2000 p, 2000 p + 2000).
    df = sp.range(0, n, 1, 3).selectExpr("id", "concat('v', id) AS s")
    df.write.format("clickhouse_tx").options(**_options(sharded_stack, target, mode, shard_weights="1,2")).mode(
        "append"
    ).save()
    per = ids_per_shard(sharded_stack, target)
    # weights 1,2: partition 0 -> shard 0, partitions 1 and 2 -> shard 1
    assert per == [list(range(0, 2000)), list(range(2000, 6000))]


def test_a_streaming_query_writes_each_micro_batch_once_over_the_shards(
    sp, sharded_stack: StackInfo, target: Target, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    chk = tmp_path / "chk"
    for i in range(3):
        sp.range(i * 1000, (i + 1) * 1000, 1, 2).selectExpr("id", "concat('v', id) AS s").write.parquet(
            str(src / f"part{i}")
        )
    q = (
        sp.readStream.schema("id long, s string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src / "*"))
        .writeStream.format("clickhouse_tx")
        .options(**_options(sharded_stack, target, "transaction", sharding_key="s"))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    per = ids_per_shard(sharded_stack, target)
    assert sorted(per[0] + per[1]) == list(range(3000))
    assert min(counts(per)) > 1000  # a string key spreads rows over both shards


def test_url_and_shards_together_fail_on_the_driver_before_any_task_writes(
    sp, sharded_stack: StackInfo, target: Target
) -> None:
    df = sp.range(10).selectExpr("id", "concat('v', id) AS s")
    opts = {**_options(sharded_stack, target, "transaction"), "url": sharded_stack.clickhouse_url}
    with pytest.raises(Exception, match="url and shards"):
        df.write.format("clickhouse_tx").options(**opts).mode("append").save()
    with pytest.raises(Exception, match="sharding_key='nope'"):
        df.write.format("clickhouse_tx").options(
            **_options(sharded_stack, target, "staging", sharding_key="nope")
        ).mode("append").save()
    assert counts(ids_per_shard(sharded_stack, target)) == [0, 0]
