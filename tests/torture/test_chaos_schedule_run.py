"""One chaos schedule end to end on its own stack: a driver SIGKILL at a protocol step and
a ClickHouse SIGKILL, then the restarted job delivers every event once and leaves nothing.

Real parts: the embedded stack behind the chaos proxies, the dev Kafka broker, a Spark
driver child process per run (:func:`spark_datasource.testing.chaos.runner.run_schedule`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_datasource.testing.chaos.inject import ChaosStack
from spark_datasource.testing.chaos.runner import run_schedule
from spark_datasource.testing.chaos.schedule import Schedule, ScheduledFault


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_streaming_job_killed_after_its_decision_and_cut_off_from_clickhouse_restarts_and_delivers_once(
    tmp_path: Path,
) -> None:
    sch = Schedule(
        seed=424242,
        job="stream_trigger",
        mode="transaction",
        events=1500,
        partitions=3,
        faults=(
            ScheduledFault("kill_driver", 0.0, step="after_decision"),
            ScheduledFault("ch_reset", 1.0, seconds=1.0),
        ),
    )
    stack = ChaosStack(tmp_path / "stack")
    try:
        rec = run_schedule(stack, sch, tmp_path / "schedule")
    finally:
        stack.close()
    assert rec["ok"], rec["problems"]
    assert {e["kind"] for e in rec["injected"]} >= {"kill_driver"}
    assert rec["restarts"] >= 1
    assert (rec["rows"], rec["duplicates"], rec["lost"]) == (1500, 0, 0)
    assert rec["stage_tables"] == rec["open_transactions"] == rec["registry_entries"] == 0
    assert rec["verify_exit"] == 0 and rec["gc_exit"] == 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_batch_job_over_two_shards_rides_through_an_executor_jvm_and_a_shard_killed_under_it(
    tmp_path: Path,
) -> None:
    sch = Schedule(
        seed=424243,  # odd: rows go to the shards by event_id
        job="batch",
        mode="staging",
        events=1500,
        partitions=3,
        faults=(ScheduledFault("kill_executor", 0.5), ScheduledFault("kill_shard", 1.0, seconds=2.0)),
    )
    assert (sch.master, sch.shards, sch.sharding_key) == ("local-cluster[2,1,1024]", 2, "event_id")
    stack = ChaosStack(tmp_path / "stack")
    try:
        rec = run_schedule(stack, sch, tmp_path / "schedule")
    finally:
        stack.close()
    assert rec["ok"], rec["problems"]
    assert [e["kind"] for e in rec["injected"]] == ["kill_executor", "kill_shard"]
    assert (rec["rows"], rec["duplicates"], rec["lost"]) == (1500, 0, 0)
    assert rec["stage_tables"] == rec["open_transactions"] == rec["registry_entries"] == 0
    assert rec["verify_exit"] == 0 and rec["gc_exit"] == 0
