"""The whole Spark driver (Python, JVM, workers) SIGKILLed during a streaming run, then restarted.

Each case runs the streaming job (``kafka_py`` -> ``clickhouse_tx``, trigger
``availableNow``) in a child process started in its own session. With a fault plan
(``fault.step`` + ``fault.action=kill`` + a once-file) the job SIGKILLs its own process
group at that protocol step; the random case is killed from outside after a random
delay. The job is then restarted on the same checkpoint without the fault until it
drains the topic. Every source record must be in ClickHouse exactly once (read with
``implicit_transaction=1``). The S3 variant runs every step with ``decision_log`` on
a moto S3 server process (the session fixture ``s3_endpoint``), arbitrated through
the registry, and checks that the decisions are in the bucket.

The child sets ``spark.python.use.daemon=false``: PySpark's worker daemon moves its
workers into a process group of their own (``os.setpgid(0, 0)`` in
``pyspark/daemon.py``), so a kill fired in a worker would otherwise miss the driver and
the JVM. This module is also the child's entry point
(``python -m tests.torture.test_driver_kill run ...``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from tests.helpers import s3
from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import open_registry_entries

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
PER_PARTITION = 2000
MAX_OFFSETS = 1500  # several micro-batches, each spanning every partition


def _child(args: dict) -> None:
    """The streaming job (child process): drain the topic with availableNow, then exit 0."""
    from pyspark.sql import SparkSession

    import spark_datasource
    from clickhouse_tx.faults import KILL_PGID_ENV

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
    df = (
        spark.readStream.format("kafka_py")
        .option("bootstrap.servers", args["bootstrap"])
        .option("subscribe", args["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.get("max_offsets", MAX_OFFSETS)))
        .load()
        .selectExpr("partition as p", "offset as o", "cast(value as string) as v")
    )
    if args.get("repartition"):  # another partitioning than the Kafka partitions
        df = df.repartition(int(args["repartition"]))
    writer = (
        df.writeStream.format("clickhouse_tx")
        .option("url", args["url"])
        .option("database", args["database"])
        .option("table", "events")
        .option("allow_nullable_into_non_nullable", "true")
        .option("checkpointLocation", args["chk"])
        .trigger(availableNow=True)
    )
    if args.get("name"):
        writer = writer.queryName(args["name"])
    for k, v in {**args.get("options", {}), **(args.get("fault") or {})}.items():
        writer = writer.option(k, v)
    q = writer.start()
    q.awaitTermination()
    spark.stop()


def _run_child(args: dict, kill_after_s: float | None = None, timeout_s: float = 300, cwd: Path = ROOT) -> int:
    """Run the job in its own session (``cwd``: where a relative checkpoint resolves)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.torture.test_driver_kill", "run", json.dumps(args)],
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if kill_after_s is not None:
            try:
                proc.wait(kill_after_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            try:  # whatever of the session survived its leader (a JVM, a worker)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"streaming job failed ({proc.returncode}): {proc.stderr.read().decode()[-3000:]}")
    proc.stderr.close()
    return proc.returncode


def _kill_and_recover(
    stack,
    kafka_bootstrap: str,
    clickhouse_url: str,
    database: str,
    tmp_path: Path,
    fault: dict | None,
    kill_after_s: float | None = None,
    options: dict[str, str] | None = None,
    daemon: bool = False,
) -> list[int]:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database)
    args = {
        "bootstrap": kafka_bootstrap,
        "topic": topic,
        "url": clickhouse_url,
        "database": database,
        "chk": str(tmp_path / "chk"),
        "name": f"kill_{uuid.uuid4().hex[:6]}",
        "options": options or {},
        "daemon": daemon,
    }
    codes = [_run_child({**args, "fault": fault}, kill_after_s=kill_after_s)]
    for _ in range(4):
        if codes[-1] == 0:
            break
        codes.append(_run_child(args))
    assert codes[0] == -signal.SIGKILL, f"the first run was not killed: exit codes {codes}"
    assert codes[-1] == 0, f"the job did not drain the topic after restarts: exit codes {codes}"
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0
    return codes


STEPS = ["after_prepare", "before_decision", "after_decision", "after_commit:1", "before_mark_done"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "step", [pytest.param(s, marks=() if s == "after_commit:1" else pytest.mark.slow) for s in STEPS]
)
def test_a_driver_killed_at_a_protocol_step_and_restarted_loses_and_duplicates_nothing(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str
) -> None:
    fault = {
        "fault.step": step,
        "fault.action": "kill",
        "fault.batch": "1",
        "fault.once_file": str(tmp_path / "fault.once"),
    }
    _kill_and_recover(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, fault)
    assert (tmp_path / "fault.once").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_driver_killed_at_a_random_time_and_restarted_loses_and_duplicates_nothing(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("CTX_KILL_SEED", time.time_ns() % 10_000))
    delay = random.Random(seed).uniform(12.0, 30.0)  # JVM start takes ~10 s; then batches run
    print(f"random kill after {delay:.1f}s (CTX_KILL_SEED={seed})")
    _kill_and_recover(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, None, kill_after_s=delay)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("step", STEPS)
def test_a_driver_killed_at_a_protocol_step_with_the_decision_log_on_s3_loses_and_duplicates_nothing(
    stack,
    kafka_bootstrap: str,
    clickhouse_url: str,
    database: str,
    tmp_path: Path,
    step: str,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k, v in s3.s3_env().items():
        monkeypatch.setenv(k, v)  # the child drivers and their Python workers inherit them
    prefix = f"kill-{database}"
    fault = {
        "fault.step": step,
        "fault.action": "kill",
        "fault.batch": "1",
        "fault.once_file": str(tmp_path / "fault.once"),
    }
    options = {"decision_log": s3.uri(s3_endpoint, prefix)}
    # Forked workers (daemon): a started one must connect back within 10 s, which the
    # shared 2-core machine missed once in this test.
    _kill_and_recover(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, fault, options=options, daemon=True)
    assert (tmp_path / "fault.once").exists()
    selector = pafs.FileSelector(f"{s3.BUCKET}/{prefix}", recursive=True)
    decisions = [f.path for f in s3.filesystem(s3_endpoint).get_file_info(selector) if f.path.endswith(".json")]
    assert len(decisions) >= 2, f"the decisions are not on S3: {decisions}"
    # beside Spark's checkpoint only the query's identity, no decision
    assert [p.name for p in (tmp_path / "chk" / "clickhouse_tx").rglob("*")] == ["query.json"]


if __name__ == "__main__":
    if sys.argv[1] == "run":
        _child(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
