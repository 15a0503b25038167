"""The streaming job the SIGKILL torture tests run as a child process, and how they run it.

The job (``kafka_py`` -> ``clickhouse_tx``, trigger ``availableNow``) runs in a child
process started in its own session, so a fault plan (``fault.step`` +
``fault.action=kill``) or the test can SIGKILL its whole process group: driver, JVM and
workers. This module is the child's entry point
(``python -m tests.helpers.torture run <json args>``).

The child sets ``spark.python.use.daemon=false`` unless ``daemon`` is asked for:
PySpark's worker daemon moves its workers into a process group of their own
(``os.setpgid(0, 0)`` in ``pyspark/daemon.py``), so a kill fired in a worker would
otherwise miss the driver and the JVM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
PER_PARTITION = 2000
MAX_OFFSETS = 1500  # several micro-batches, each spanning every partition


def job_args(bootstrap: str, topic: str, url: str | None, database: str, chk: Path, **more: object) -> dict:
    """The arguments of :func:`streaming_job`: the topic, the target, the checkpoint, then ``more``."""
    return {"bootstrap": bootstrap, "topic": topic, "url": url, "database": database, "chk": str(chk), **more}


def kill_at(step: str, tmp_path: Path, batch: int = 1) -> dict[str, str]:
    """The fault options that SIGKILL the job's process group once, at ``step`` of ``batch``.

    The once-file ``tmp_path / "fault.once"`` exists afterwards: the kill fired.
    """
    once = str(tmp_path / "fault.once")
    return {"fault.step": step, "fault.action": "kill", "fault.batch": str(batch), "fault.once_file": once}


def slow_except(values: list[str], fast: str) -> list:
    """``values`` as pytest params, each marked slow but ``fast`` (the one the default run keeps)."""
    return [pytest.param(v, marks=() if v == fast else pytest.mark.slow) for v in values]


def spark_session(args: dict):  # -> pyspark.sql.SparkSession (pyspark is imported in the child only)
    from pyspark.sql import SparkSession

    import spark_datasource
    from clickhouse_tx.testing.faults import KILL_PGID_ENV

    if args.get("daemon"):
        # Workers forked by pyspark's daemon sit in groups of their own: a fault kills
        # this group (driver, JVM) by id first. Forking is quicker than starting a
        # worker, which Spark allows 10 s to connect back (too short on a loaded machine).
        os.environ[KILL_PGID_ENV] = str(os.getpgrp())
    spark = (
        SparkSession.builder.master(args.get("master", "local[2]"))
        .appName("clickhouse-tx-driver-kill")
        .config("spark.python.use.daemon", "true" if args.get("daemon") else "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_datasource.register(spark)
    return spark


def streaming_job(args: dict) -> None:
    """The streaming job (child process): drain the topic with availableNow, then exit 0.

    ``args``: those of :func:`tests.helpers.cluster_job.start_stream`, and optionally
    ``master`` and ``daemon`` (workers forked by pyspark's daemon).
    """
    from tests.helpers.cluster_job import start_stream

    spark = spark_session(args)
    start_stream(spark, {"max_offsets": MAX_OFFSETS, **args}).awaitTermination()
    spark.stop()


def start_child(
    args: dict,
    cwd: Path = ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    module: str = "tests.helpers.torture",
) -> subprocess.Popen:
    """Start ``python -m <module> run <args>`` (by default the streaming job) in a session of
    its own (``cwd``: where a relative checkpoint resolves)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", module, "run", json.dumps(args)],
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdout=stdout,
        stderr=stderr,
    )


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the child's session (it may have ended; a JVM or worker may have outlived it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_child(
    args: dict,
    kill_after_s: float | None = None,
    timeout_s: float = 300,
    cwd: Path = ROOT,
    *,
    during: Callable[[], None] | None = None,
    check: bool = True,
    module: str = "tests.helpers.torture",
    watch: Callable[[subprocess.Popen], None] | None = None,
) -> int:
    """Run the job (``python -m <module> run``) to its end (or SIGKILL it after ``kill_after_s``); its exit code.

    ``during`` runs in a thread while the job does (e.g. a server crash); so does
    ``watch``, given the job's process (e.g. :meth:`tests.helpers.insert_kill.InsertKill.watch`,
    which kills its process group at a moment the server shows). Raises
    AssertionError when the job failed otherwise than by SIGKILL, unless ``check`` is
    False: then the failure's causes are printed and its exit code returned (a restart).
    The job's stderr goes to a file: a pipe read only at the end fills with Spark's logs
    of a failing query (64 KiB) and blocks the job until the timeout.
    """
    with tempfile.TemporaryFile() as log:
        proc = start_child(args, cwd=cwd, stderr=log, module=module)
        side = threading.Thread(target=during, daemon=True) if during else None
        if side:
            side.start()
        watcher = threading.Thread(target=watch, args=(proc,), daemon=True) if watch else None
        if watcher:
            watcher.start()
        try:
            if kill_after_s is not None:
                try:
                    proc.wait(kill_after_s)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)
        finally:
            kill_session(proc)  # whatever of the session survived its leader (a JVM, a worker)
            if side:
                side.join()
            if watcher:
                watcher.join()
        log.seek(0)
        err = log.read().decode(errors="replace")
    if proc.returncode not in (0, -signal.SIGKILL):
        if check:
            raise AssertionError(f"streaming job failed ({proc.returncode}): {err[-3000:]}")
        causes = [line for line in err.splitlines() if "Error" in line or "Caused by" in line]
        print(f"job exit {proc.returncode}: " + "\n".join(causes[:8]))
    return proc.returncode


def run_child_past_worker_start(args: dict, cwd: Path) -> int:
    """One run of the job; again when Spark gave up on a Python worker's start.

    Spark waits 10 s (hard-coded in ``PythonWorkerFactory``) for a new worker to connect
    back; on a loaded machine a worker can take longer to import pyspark and the job
    fails before it reads a record. That is no protocol step, so the run is repeated.
    """
    for attempt in range(3):
        try:
            return run_child(args, cwd=cwd, timeout_s=600)
        except AssertionError as e:
            if "connect back" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        streaming_job(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
