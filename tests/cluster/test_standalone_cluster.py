"""Kafka -> ClickHouse on a standalone Spark cluster whose executor JVMs are SIGKILLed mid-run.

The driver is a child process (``tests/helpers/cluster_job.py``) of an application on
the session's cluster (two Workers of one core each, so two executors). While the
query drains the topic, the test SIGKILLs an executor JVM twice, each time once the
target has grown since the last kill. Spark re-runs the lost tasks on the other
executor and the Workers start replacements; the target must hold every record once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server_patches.processes import free_port
from tests.helpers import spark_cluster
from tests.helpers.spark_streams import assert_exactly_once_by_offsets, create_target, make_topic
from tests.helpers.spark_writes import scalar

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 2
PER_PARTITION = 2000


def _rows(url: str, database: str) -> int:
    return scalar(url, f"SELECT count() FROM `{database}`.events")


def _wait_for_growth(proc: subprocess.Popen, url: str, database: str, above: int, timeout_s: float = 420) -> int:
    """The target's committed row count once it exceeds ``above`` (the driver must still run)."""
    deadline = time.monotonic() + timeout_s
    while (n := _rows(url, database)) <= above:
        assert proc.poll() is None, f"the driver ended ({proc.returncode}) before the kill"
        assert time.monotonic() < deadline, f"no commit beyond {above} rows in {timeout_s:.0f} s"
        time.sleep(0.3)
    return n


def _kill_a_busy_executor(cluster: spark_cluster.StandaloneCluster, ui_url: str, timeout_s: float = 300) -> int:
    """SIGKILL an executor JVM while it runs a task; its pid."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if (pid := spark_cluster.busy_executor_pid(cluster, ui_url)) is not None:
                break
        except OSError:
            pass  # the driver's UI is slow to answer on a loaded machine: ask again
        assert time.monotonic() < deadline, f"no executor ran a task within {timeout_s:.0f} s"
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return pid


def _executor_dirs(cluster: spark_cluster.StandaloneCluster) -> list[Path]:
    """``work-<i>/<app id>/<executor id>``: one per executor a Worker ever launched."""
    return [d for d in cluster.log_dir.glob("work-*/app-*/*") if d.is_dir()]


@pytest.mark.timeout(900)
def test_a_stream_on_a_standalone_cluster_survives_two_executor_sigkills_with_every_record_once(
    standalone_cluster: spark_cluster.StandaloneCluster,
    stack,
    kafka_bootstrap: str,
    clickhouse_url: str,
    database: str,
    tmp_path: Path,
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database)
    before = set(_executor_dirs(standalone_cluster))
    ui = free_port()  # the driver's REST API tells which executor runs a task
    args = {
        "bootstrap": kafka_bootstrap,
        "topic": topic,
        "url": clickhouse_url,
        "database": database,
        "chk": str(tmp_path / "chk"),
        "max_offsets": 400,  # 10 batches of 2 tasks
        "delay_s": 3.0,  # per task: most of a batch is spent in its tasks
        "conf": spark_cluster.app_conf(standalone_cluster, **{"spark.ui.enabled": "true", "spark.ui.port": str(ui)}),
    }
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.cluster_job", json.dumps(args)],
            env=spark_cluster.spark_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    killed = []
    try:
        seen = _wait_for_growth(proc, clickhouse_url, database, 0)
        for _ in range(2):
            killed.append(_kill_a_busy_executor(standalone_cluster, f"http://127.0.0.1:{ui}"))
            seen = _wait_for_growth(proc, clickhouse_url, database, seen)
        assert proc.wait(600) == 0, f"the driver failed: {log.read_text()[-3000:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    driver_log = log.read_text()
    # each kill failed a running task (ExecutorLostFailure), which Spark ran again elsewhere
    assert driver_log.count("Lost executor") >= 2, driver_log[-3000:]
    assert driver_log.count("ExecutorLostFailure") >= 2, driver_log[-3000:]
    assert len(set(_executor_dirs(standalone_cluster)) - before) >= 4  # 2 first executors, 2 replacements
    assert_exactly_once_by_offsets(clickhouse_url, database, expected)
