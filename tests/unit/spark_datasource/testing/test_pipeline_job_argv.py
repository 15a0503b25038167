"""The pipeline harness's command line for the streaming job: the options a run passes on."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from spark_datasource.testing.pipeline import _job_argv
from spark_datasource.testing.pipeline_config import PipelineConfig, PipelineRun
from spark_datasource.testing.streaming_job import key_values


def _run(cfg: PipelineConfig) -> PipelineRun:
    return PipelineRun(
        cfg=cfg,
        rng=random.Random(0),
        say=lambda _: None,
        work=Path("/tmp/w"),
        topic="events",
        table="db.events",
        checkpoint=Path("/tmp/w/chk"),
        crashes=[],
        t_start=time.monotonic(),
        url="http://127.0.0.1:8123",
        bootstrap="127.0.0.1:9092",
    )


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_source_and_writer_options_reach_the_job_in_the_order_given() -> None:
    cfg = PipelineConfig(
        events=1000,
        source_options=("maxPartitions=2", "minRecordsPerPartition=1"),
        writer_options=("batch_size=10",),
    )
    argv = _job_argv(_run(cfg))
    assert _values(argv, "--source-option") == ["maxPartitions=2", "minRecordsPerPartition=1"]
    assert _values(argv, "--writer-option") == ["batch_size=10"]


def test_spark_settings_reach_the_jobs_session_as_given() -> None:
    cfg = PipelineConfig(events=1000, spark_conf=("spark.driver.extraJavaOptions=-XX:+UseParallelGC -Da=b",))
    argv = _job_argv(_run(cfg))
    assert _values(argv, "--spark-conf") == ["spark.driver.extraJavaOptions=-XX:+UseParallelGC -Da=b"]
    assert "--spark-conf" not in _job_argv(_run(PipelineConfig(events=1000)))


def test_a_job_option_is_split_at_its_first_equals_sign() -> None:
    assert key_values("--source-option", ["maxPartitions=2", "a=b=c"]) == {"maxPartitions": "2", "a": "b=c"}


@pytest.mark.parametrize("given", ["maxPartitions", "=2"])
def test_a_job_option_without_a_key_or_a_value_names_its_flag(given: str) -> None:
    with pytest.raises(SystemExit, match=f"--source-option '{given}': expected KEY=VALUE"):
        key_values("--source-option", [given])
