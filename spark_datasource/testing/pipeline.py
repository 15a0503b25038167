"""One end-to-end pipeline run: Kafka -> Spark -> ClickHouse, SIGKILLs, restarts, verification.

The harness shared by the demo (:mod:`benchmarks.pipeline`, what ``make demo`` runs),
the torture tests (``tests/torture/test_pipeline_crashes.py``) and the checkpoint
sweep (:mod:`benchmarks.checkpoint_sweep`). :func:`run_pipeline`:

1. uses the given servers or starts the embedded stack (ZooKeeper, ClickHouse on
   chdb, the dev Kafka broker) in the work directory;
2. creates a topic of ``partitions`` partitions and the target MergeTree table;
3. produces ``events`` small JSON events (or, with ``rate``, produces them at that
   rate while the job runs);
4. runs :mod:`spark_datasource.testing.streaming_job` as a child process in its own session and,
   ``crashes`` times, SIGKILLs its whole process group (driver JVM, Python workers)
   either at a protocol step (the writer's test-only ``fault.step``, fired once
   through a once-file; the job runs with ``CLICKHOUSE_TX_TEST_FAULTS=1`` for it) or
   after a random delay, restarting it on the same checkpoint;
5. verifies exactly-once: the (topic, partition, offset) set in ClickHouse, read
   committed (``implicit_transaction=1``), against Kafka's offsets 0..end of every
   partition, and the event ids against what was produced, and returns the figures.

Everything it starts (stack, jobs) is stopped on return, errors included. All of
this runs in the calling process; Spark runs only in the child job.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from spark_datasource.testing.job_launcher import JobLauncher, JobRun
from spark_datasource.testing.pipeline_config import MODES, PipelineConfig, PipelineRun, plan_crashes
from spark_datasource.testing.pipeline_report import figures
from spark_datasource.testing.source_and_target import create_target, create_topic, produce
from spark_datasource.testing.visibility import VisibilityPoller


@contextlib.contextmanager
def _servers(cfg: PipelineConfig, work: Path, say: Callable[[str], None]) -> Iterator[tuple[str, str, str | None]]:
    """(clickhouse url, kafka bootstrap, kafka control): given ones, else a fresh stack."""
    if cfg.url and cfg.bootstrap:
        yield cfg.url, cfg.bootstrap, cfg.kafka_control
        return
    from server_patches import stack as stack_mod

    d = work / "stack"
    say(f"starting the embedded stack in {d} ...")
    try:
        info = stack_mod.start_stack(d, kafka=True)
        say(f"  ClickHouse {info.clickhouse_url}, ZooKeeper {info.zookeeper}, Kafka {info.kafka_bootstrap}")
        yield info.clickhouse_url, str(info.kafka_bootstrap), info.kafka_control
    finally:
        stack_mod.stop_stack(d)


def run_pipeline(cfg: PipelineConfig) -> dict:
    """Run the whole pipeline once and return its figures (what the demo's ``--json`` writes).

    Calling process, once per demo, torture test or sweep point; blocks until the job
    drained the topic through every planned crash, or raises (the job failed or timed
    out), stopping whatever it started either way.
    """
    r = _new_run(cfg)
    try:
        with _servers(cfg, r.work, r.say) as (url, bootstrap, control):
            r.url, r.bootstrap = url, bootstrap
            _prepare_topic_and_table(r, control)
            r.launcher = JobLauncher(_job_argv(r), r.work, _progress_printer(r))
            poller = VisibilityPoller(url, r.table, cfg.latency_poll_s) if cfg.measure_latency else None
            with poller if poller else contextlib.nullcontext():
                _run_through_crashes(r, r.launcher)
                r.stop_producing.set()
                if r.producer is not None:
                    r.producer.join(60)
            return figures(r, r.launcher, poller)
    finally:
        if r.launcher is not None:
            r.launcher.stop_all()
        if cfg.work_dir is None and not cfg.keep:
            shutil.rmtree(r.work, ignore_errors=True)


def _new_run(cfg: PipelineConfig) -> PipelineRun:
    """Names (topic, table, checkpoint) and the crash plan of a fresh run."""
    if cfg.mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)} (got {cfg.mode!r})")
    rng = random.Random(cfg.seed)
    say: Callable[[str], None] = (lambda s: None) if cfg.quiet else (lambda s: print(s, flush=True))
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="chtx-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    suffix = f"{int(time.time())}_{rng.randrange(1 << 30):x}"
    return PipelineRun(
        cfg=cfg,
        rng=rng,
        say=say,
        work=work,
        topic=f"events_{suffix}",
        table=cfg.table or f"pipeline.events_{cfg.mode}_{suffix}",
        checkpoint=work / f"checkpoint_{suffix}",
        crashes=plan_crashes(cfg, rng),
        t_start=time.monotonic(),
    )


def _prepare_topic_and_table(r: PipelineRun, control: str | None) -> None:
    """Create the topic and the target; produce every event now unless producing at a rate."""
    cfg = r.cfg
    create_topic(r.bootstrap, control, r.topic, cfg.partitions)
    create_target(r.url, r.table, cfg.mode)
    r.say(
        f"topic {r.topic} ({cfg.partitions} partitions) -> {r.table} [{cfg.mode}], "
        f"trigger {cfg.trigger:g} s, {len(r.crashes)} crashes planned: {', '.join(r.crashes) or '-'}"
    )
    if cfg.rate is None:
        t_prod = time.monotonic()
        r.produced = produce(r.bootstrap, r.topic, cfg.events, cfg.partitions)
        r.say(f"produced {r.produced} events in {time.monotonic() - t_prod:.1f} s")


def _job_argv(r: PipelineRun) -> list[str]:
    """The streaming job's command line (the same for every restart)."""
    cfg = r.cfg
    ends = {r.topic: {str(p): (cfg.events - p + cfg.partitions - 1) // cfg.partitions for p in range(cfg.partitions)}}
    mopt = cfg.max_offsets_per_trigger
    if mopt is None and cfg.rate is None:
        # several batches, so that crashes land mid-stream
        mopt = max(1000, cfg.events // 10)
    argv = [
        "--bootstrap",
        r.bootstrap,
        "--topic",
        r.topic,
        "--url",
        r.url,
        "--table",
        r.table,
        "--mode",
        cfg.mode,
        "--checkpoint",
        str(r.checkpoint),
        "--trigger",
        str(cfg.trigger),
        "--end-offsets",
        json.dumps(ends),
        "--timeout",
        str(cfg.job_timeout_s),
    ]
    if mopt:
        argv += ["--max-offsets-per-trigger", str(mopt)]
    for kv in cfg.writer_options:
        argv += ["--writer-option", kv]
    for kv in cfg.source_options:
        argv += ["--source-option", kv]
    for kv in cfg.spark_conf:
        argv += ["--spark-conf", kv]
    if cfg.sink != "clickhouse_tx":
        argv += ["--sink", cfg.sink]
    return argv + ["--decode", cfg.decode]


def _progress_printer(r: PipelineRun) -> Callable[[JobRun, str, dict], None]:
    """The launcher's line callback: track committed events, print one line per batch."""
    total = r.cfg.events

    def on_line(run: JobRun, kind: str, doc: dict) -> None:
        if kind != "PROGRESS":
            return
        end = (doc.get("end_offset") or {}).get(r.topic, {})
        r.committed = sum(int(v) for v in end.values())
        rps = doc.get("processed_rps") or 0
        r.say(
            f"  [run {run.index}] batch {doc.get('batch')}: {doc.get('rows') or 0:>7} rows, "
            f"{rps:>9,.0f} rows/s, write+commit {doc.get('add_batch_ms') or 0:>6} ms | "
            f"committed {r.committed:>8}/{total} ({100 * r.committed / max(1, total):.0f}%)"
        )

    return on_line


def _run_through_crashes(r: PipelineRun, launcher: JobLauncher) -> None:
    """Start the job, crash it as planned, restart it on the checkpoint, until it drains.

    A run that fails by itself is restarted too, up to ``cfg.restart_failed`` times.
    """
    pending = list(r.crashes)
    while True:
        point = pending[0] if pending else None
        run, fault, kill_at = _start_job(r, launcher, point)
        rc = _wait_job(r, launcher, run, kill_at)
        fired = fault is not None and (r.work / f"fault-{run.index}.once").exists()
        if run.killed_by_us or fired:
            r.crashes_done.append(
                {
                    "run": run.index,
                    "point": fault or "random",
                    "after_s": round((run.ended or time.monotonic()) - run.started, 2),
                    "committed_before": r.committed,
                }
            )
            r.say(
                f"  ** crash {len(r.crashes_done)}: SIGKILL {f'at {fault}' if fired else 'from outside'}"
                f" after {r.crashes_done[-1]['after_s']} s (exit {rc}); restarting on the same checkpoint"
            )
            pending.pop(0)
            continue
        if rc == 0 and run.done is not None:
            if pending:
                # finished before the planned fault could fire (e.g. no more batches)
                r.say(f"  job finished before crash point {pending[0]} fired; {len(pending)} crash(es) not done")
            return
        if len(r.failures) < r.cfg.restart_failed:
            r.failures.append({"run": run.index, "exit": rc, "committed_before": r.committed})
            r.say(f"  ** the job failed by itself (exit {rc}, run {run.index}); restarting on the same checkpoint")
            continue
        raise RuntimeError(
            f"the streaming job exited with {rc} (run {run.index}); stderr tail:\n{launcher.stderr_tail(run)}"
        )


def _start_job(r: PipelineRun, launcher: JobLauncher, point: str | None) -> tuple[JobRun, str | None, float | None]:
    """One start of the job, armed for crash ``point``: (run, fault step, time of a kill from outside)."""
    extra: list[str] = []
    fault = None
    if point and point != "random":
        fault = point
        extra = [
            "--fault-step",
            point,
            "--fault-action",
            "kill",
            "--fault-once-file",
            str(r.work / f"fault-{len(launcher.runs)}.once"),
        ]
    run = launcher.start(extra, fault)
    if r.cfg.rate is not None and r.producer is None:
        # start the steady stream once the first job is up, so start-up time does not
        # count as latency
        wait_first_progress(run, 180)
        r.latency_since = time.time() + max(r.cfg.trigger, 1.0, r.cfg.warmup_s)
        r.producer = threading.Thread(target=_produce_at_rate, args=(r,), daemon=True)
        r.producer.start()
    kill_at = None
    if point == "random":
        # somewhere in the stream: after the first committed batch, before the end
        wait_first_progress(run, 180)
        kill_at = time.monotonic() + r.rng.uniform(0.2, 2.5 * max(r.cfg.trigger, 1.0))
    return run, fault, kill_at


def _produce_at_rate(r: PipelineRun) -> None:
    r.produced = produce(r.bootstrap, r.topic, r.cfg.events, r.cfg.partitions, rate=r.cfg.rate, stop=r.stop_producing)


def _wait_job(r: PipelineRun, launcher: JobLauncher, run: JobRun, kill_at: float | None) -> int | None:
    """The job's exit code once it ended or was killed at ``kill_at``; raises on timeout."""
    rc = None
    deadline = time.monotonic() + r.cfg.job_timeout_s + 60
    while rc is None and time.monotonic() < deadline:
        if kill_at is not None and time.monotonic() >= kill_at and run.done is None:
            launcher.kill(run)
            break
        rc = launcher.wait(run, 0.2)
    if rc is None and run.proc.poll() is None:
        launcher.kill(run)
        raise RuntimeError(
            f"the job did not finish within {r.cfg.job_timeout_s:.0f} s; stderr:\n{launcher.stderr_tail(run)}"
        )
    return run.proc.returncode


def wait_first_progress(run: JobRun, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not run.ready and run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
