"""The pipeline harness's crash plan: which kills a run asks of the job, by its sink."""

from __future__ import annotations

import random

import pytest

from clickhouse_tx.testing.faults import STREAMING_STEPS
from spark_datasource.testing.foreach_sinks import FOREACH_FAULT_STEP
from spark_datasource.testing.pipeline_config import PipelineConfig, plan_crashes


def test_a_writer_run_crashes_at_the_writers_steps_and_a_foreach_run_after_its_insert() -> None:
    writer = plan_crashes(PipelineConfig(crashes=5, crash_points="steps"), random.Random(1))
    foreach = plan_crashes(PipelineConfig(crashes=2, crash_points="mixed", sink="foreach_connect"), random.Random(1))
    assert sorted(writer) == sorted(STREAMING_STEPS)
    assert foreach == [FOREACH_FAULT_STEP, "random"]


def test_given_crash_points_are_taken_in_turn() -> None:
    cfg = PipelineConfig(crashes=3, crash_points=f"{FOREACH_FAULT_STEP},random", sink="foreach_connect")
    assert plan_crashes(cfg, random.Random(0)) == [FOREACH_FAULT_STEP, "random", FOREACH_FAULT_STEP]


@pytest.mark.parametrize(
    ("sink", "point"),
    [("clickhouse_tx", FOREACH_FAULT_STEP), ("foreach_connect", "before_mark_done")],
)
def test_a_crash_point_the_sink_does_not_fire_is_refused_before_the_run(sink: str, point: str) -> None:
    with pytest.raises(ValueError, match=f"not a step of --sink {sink}"):
        plan_crashes(PipelineConfig(crashes=1, crash_points=point, sink=sink), random.Random(0))
