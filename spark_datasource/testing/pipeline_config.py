"""What one pipeline run is asked to do (:class:`PipelineConfig`), its crash plan, its state."""

from __future__ import annotations

import dataclasses
import random
import threading
from pathlib import Path
from typing import Callable

from clickhouse_tx.interfaces import Mode
from clickhouse_tx.testing.faults import STREAMING_STEPS
from spark_datasource.testing.foreach_sinks import FOREACH_FAULT_STEP
from spark_datasource.testing.job_launcher import JobLauncher
from spark_datasource.testing.streaming_job import DEFAULT_DECODE

MODES = tuple(m.value for m in Mode)


@dataclasses.dataclass
class PipelineConfig:
    """Everything one pipeline run needs (see the command-line options)."""

    events: int = 200_000
    partitions: int = 8
    mode: str = "transaction"
    trigger: float = 2.0
    crashes: int = 2
    crash_points: str = "mixed"  # random | steps | mixed | comma-separated fault steps
    max_offsets_per_trigger: int | None = None
    rate: float | None = None  # produce at this rate while the job runs (else all up front)
    seed: int | None = None
    url: str | None = None
    bootstrap: str | None = None
    kafka_control: str | None = None
    table: str | None = None
    work_dir: str | None = None
    keep: bool = False
    measure_latency: bool = False
    latency_poll_s: float = 0.1
    #: Seconds after the producer starts that latency and the steady batch figures leave
    #: out: the first micro-batches with data start the Python workers and their clients.
    warmup_s: float = 0.0
    job_timeout_s: float = 900.0
    quiet: bool = False
    writer_options: tuple[str, ...] = ()
    source_options: tuple[str, ...] = ()  # KEY=VALUE options of the job's kafka_py source
    spark_conf: tuple[str, ...] = ()  # KEY=VALUE Spark settings of the job's session
    sink: str = "clickhouse_tx"  # or a foreachBatch sink without the writer (foreach_sinks.SINKS)
    #: Start the job again on its checkpoint when it fails by itself (a query that stopped on
    #: an error, e.g. ClickHouse killed under it), at most this many times, as a supervisor
    #: would; 0: a failure ends the run with an error.
    restart_failed: int = 0
    decode: str = DEFAULT_DECODE  # where the job decodes the events' JSON (streaming_job.DECODE_OPTIONS)


def fault_steps(sink: str) -> tuple[str, ...]:
    """The fault steps the job's ``sink`` fires: the writer's, or a foreachBatch sink's one."""
    return STREAMING_STEPS if sink == "clickhouse_tx" else (FOREACH_FAULT_STEP,)


def plan_crashes(cfg: PipelineConfig, rng: random.Random) -> list[str]:
    """One entry per crash: a fault step, or ``random`` (a SIGKILL from outside)."""
    if cfg.crashes <= 0:
        return []
    if cfg.crash_points == "random":
        return ["random"] * cfg.crashes
    if cfg.crash_points in ("steps", "mixed"):
        steps = list(fault_steps(cfg.sink))
        rng.shuffle(steps)
        out = []
        for i in range(cfg.crashes):
            if cfg.crash_points == "mixed" and i % 2 == 1:
                out.append("random")
            else:
                out.append(steps[i % len(steps)])
        return out
    given = [s.strip() for s in cfg.crash_points.split(",") if s.strip()]
    for s in given:
        if s != "random" and s.split(":")[0] not in {f.split(":")[0] for f in fault_steps(cfg.sink)}:
            known = ", ".join(fault_steps(cfg.sink))
            raise ValueError(f"--crash-points: {s!r} is not a step of --sink {cfg.sink} (one of {known}, random)")
    return [given[i % len(given)] for i in range(cfg.crashes)]


@dataclasses.dataclass
class PipelineRun:
    """The state of one :func:`run_pipeline` call, shared by its steps (calling process)."""

    cfg: PipelineConfig
    rng: random.Random
    say: Callable[[str], None]
    work: Path
    topic: str
    table: str
    checkpoint: Path
    crashes: list[str]
    t_start: float
    url: str = ""
    bootstrap: str = ""
    launcher: JobLauncher | None = None
    committed: int = 0  # events the job has committed, from its last PROGRESS line
    produced: int = 0
    producer: threading.Thread | None = None
    stop_producing: threading.Event = dataclasses.field(default_factory=threading.Event)
    crashes_done: list[dict] = dataclasses.field(default_factory=list)
    failures: list[dict] = dataclasses.field(default_factory=list)  # job runs that failed by themselves
    latency_since: float | None = None
