"""Chaos schedules are replayable from their seed and cover every fault kind in 100 schedules."""

from __future__ import annotations

import collections

import pytest

from clickhouse_tx.testing.faults import STREAMING_STEPS
from spark_datasource.testing.chaos.schedule import (
    CLUSTER_MASTER,
    JOBS,
    KINDS,
    LOCAL_MASTER,
    MODES,
    first_fault_index,
    plan,
)


def test_the_same_seed_always_gives_the_same_schedule() -> None:
    assert [plan(s) for s in range(40)] == [plan(s) for s in range(40)]
    assert plan(7) != plan(8)


def test_first_fault_index_is_the_number_of_faults_of_all_earlier_seeds() -> None:
    total = 0
    for seed in range(200):
        assert first_fault_index(seed) == total
        total += len(plan(seed).faults)


@pytest.mark.parametrize("start", [0, 1, 17, 1000, 123_457])
def test_any_100_consecutive_seeds_inject_every_fault_kind_at_least_10_times(start: int) -> None:
    kinds = collections.Counter(f.kind for s in range(start, start + 100) for f in plan(s).faults)
    assert set(kinds) == set(KINDS)
    assert min(kinds.values()) >= 10, kinds


@pytest.mark.parametrize("start", [0, 1, 500])
def test_100_consecutive_seeds_cover_every_job_mode_and_driver_kill_step(start: int) -> None:
    schedules = [plan(s) for s in range(start, start + 100)]
    assert {s.job for s in schedules} == set(JOBS)
    assert {s.mode for s in schedules} == set(MODES)
    steps = {f.step for s in schedules for f in s.faults if f.step}
    assert steps == set(STREAMING_STEPS)


def test_each_schedule_has_one_to_three_faults_in_time_order_with_sane_windows() -> None:
    for seed in range(300):
        sch = plan(seed)
        assert 1 <= len(sch.faults) <= 3
        timed = [f.at_s for f in sch.faults if not f.step]
        assert timed == sorted(timed)
        for f in sch.faults:
            assert f.step is None or f.kind == "kill_driver"
            if f.kind.endswith("_stall"):
                assert f.seconds > 6, "a stall must outlast the writer's 6 s request timeout"
            if f.kind.endswith("_slow"):
                assert f.rate > 0


def test_a_schedule_that_kills_an_executor_runs_on_executors_of_their_own_and_the_rest_in_one_jvm() -> None:
    schedules = [plan(s) for s in range(200)]
    killing = [s for s in schedules if any(f.kind == "kill_executor" for f in s.faults)]
    assert killing, "200 seeds plan executor kills"
    assert {s.master for s in killing} == {CLUSTER_MASTER}
    assert {s.master for s in schedules if s not in killing} == {LOCAL_MASTER}


def test_a_schedule_that_kills_a_shard_writes_to_two_shards_by_key_or_by_partition() -> None:
    schedules = [plan(s) for s in range(300)]
    sharded = [s for s in schedules if any(f.kind == "kill_shard" for f in s.faults)]
    assert sharded and {s.shards for s in sharded} == {2}
    assert {s.shards for s in schedules if s not in sharded} == {1}
    assert {s.sharding_key for s in sharded} == {"event_id", None}
    assert {s.sharding_key for s in schedules if s not in sharded} == {None}
