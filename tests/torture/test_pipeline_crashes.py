"""The end-to-end pipeline survives SIGKILLs of the whole Spark job at every protocol step.

Each test runs :func:`spark_datasource.testing.pipeline.run_pipeline` against the shared stack: a
real Kafka-protocol broker, a real local Spark job in its own process group, ClickHouse
on chdb with ZooKeeper. The job is killed (SIGKILL of its process group: driver JVM,
Python workers) either by the writer's fault injection at a named step of the
two-phase commit, or from outside after a random delay, and restarted on the same
checkpoint. The pipeline then compares Kafka's offsets with what a read-committed
reader sees in ClickHouse.

The one non-slow test is a smoke test of the whole path; the matrix is ``slow``.
"""

from __future__ import annotations

import os

import pytest

from clickhouse_tx.testing.faults import STREAMING_STEPS
from server_patches.stack_files import StackInfo
from spark_datasource.testing.pipeline import run_pipeline
from spark_datasource.testing.pipeline_config import PipelineConfig
from spark_datasource.testing.pipeline_report import summary_table

EXACTLY_ONCE_MODES = ("transaction", "staging", "dedup")


def _run(
    stack: StackInfo,
    tmp_path,
    *,
    mode: str,
    crash_points: str,
    crashes: int = 1,
    events: int = 4000,
    partitions: int = 4,
    seed: int = 7,
    per_batch: int | None = None,
) -> dict:
    assert stack.kafka_bootstrap, "these tests need the dev Kafka broker"
    cfg = PipelineConfig(
        events=events,
        partitions=partitions,
        mode=mode,
        trigger=0.5,
        crashes=crashes,
        crash_points=crash_points,
        max_offsets_per_trigger=per_batch or max(400, events // 5),
        seed=seed,
        url=stack.clickhouse_url,
        bootstrap=stack.kafka_bootstrap,
        kafka_control=stack.kafka_control,
        work_dir=str(tmp_path),
        quiet=True,
        job_timeout_s=400,
    )
    result = run_pipeline(cfg)
    print(summary_table(result))
    return result


def _assert_no_stray_job_processes(tmp_path) -> None:
    # every job process would have the work dir on its command line (checkpoint path)
    mine = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "spark_datasource.testing.streaming_job" in cmd and str(tmp_path) in cmd:
            mine.append((pid, cmd[:200]))
    assert mine == []


def test_a_job_killed_after_its_first_commit_restarts_and_delivers_every_event_once(stack: StackInfo, tmp_path) -> None:
    r = _run(stack, tmp_path, mode="transaction", crash_points="after_commit:1")
    assert r["crashes"] == 1 and r["restarts"] == 1, r["crash_log"]
    assert r["duplicates"] == 0 and r["lost"] == 0 and r["lost_event_ids"] == 0, r["anomalies"]
    assert r["rows_in_clickhouse"] == r["events"] == 4000
    _assert_no_stray_job_processes(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", EXACTLY_ONCE_MODES)
@pytest.mark.parametrize("step", STREAMING_STEPS)
def test_a_kill_at_each_protocol_step_leaves_no_duplicates_and_no_losses(
    stack: StackInfo, tmp_path, mode: str, step: str
) -> None:
    r = _run(stack, tmp_path, mode=mode, crash_points=step)
    assert r["crashes"] == 1, f"the fault at {step} never fired: {r['crash_log']}"
    assert r["duplicates"] == 0 and r["lost"] == 0 and r["lost_event_ids"] == 0, r["anomalies"]
    assert r["rows_in_clickhouse"] == r["events"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", EXACTLY_ONCE_MODES)
def test_repeated_random_kills_leave_no_duplicates_and_no_losses(stack: StackInfo, tmp_path, mode: str) -> None:
    # 20 micro-batches, so three kills at random times land before the source is drained.
    r = _run(stack, tmp_path, mode=mode, crash_points="random", crashes=3, events=8000, seed=11, per_batch=400)
    assert r["crashes"] >= 2, r["crash_log"]
    assert r["crash_log"][0]["committed_before"] < r["events"], r["crash_log"]  # a kill mid-stream
    assert r["duplicates"] == 0 and r["lost"] == 0 and r["lost_event_ids"] == 0, r["anomalies"]
    assert r["rows_in_clickhouse"] == r["events"]


@pytest.mark.slow
@pytest.mark.parametrize("crash_points", ["random", "after_commit:1"])
def test_at_least_once_mode_loses_nothing_through_kills(stack: StackInfo, tmp_path, crash_points: str) -> None:
    # 20 batches of 400: with 5 batches of 800 the random kills (0.2-2.5 s after the first
    # batch) came after the last commit, or never when the job exited first
    r = _run(
        stack,
        tmp_path,
        mode="none",
        crash_points=crash_points,
        crashes=2 if crash_points == "random" else 1,
        events=8000,
        per_batch=400,
    )
    assert r["crashes"] >= 1, r["crash_log"]
    assert r["crash_log"][0]["committed_before"] < r["events"], r["crash_log"]  # a kill mid-stream
    assert r["lost"] == 0 and r["lost_event_ids"] == 0, r["anomalies"]
    assert r["distinct_offsets"] == r["events"]
