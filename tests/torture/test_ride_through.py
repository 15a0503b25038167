"""A streaming query rides through short outages of ZooKeeper and ClickHouse (no restart).

A ``kafka_py`` -> ``clickhouse_tx`` (mode ``staging``) query runs in a child process
(``availableNow``, many small batches). Mid-run ZooKeeper is SIGKILLed and started
again 3 s later; once more batches have committed, ClickHouse is SIGKILLed and started
again 3 s later. The query must finish on its own (exit 0, never restarted) with every
Kafka record in ClickHouse exactly once and no registry entry left open.

What rides through what: the driver's and the executors' registry, marker and
decision steps retry transient failures within ``retry.*`` (40 attempts / 60 s here:
enough for a 3 s outage plus a server start); an executor whose stage insert is cut
by the ClickHouse restart fails its task, which Spark retries under a new xid
(``spark.task.maxFailures``: 4 by default on a cluster, ``local[2,4]`` here); the cut
attempt's stage is rolled back.

The child is the streaming job of :mod:`tests.helpers.torture` (its writer
options given as ``fault``).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from server_patches import crashes
from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import open_registry_entries, run_sql, scalar
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_session, start_child

MAX_OFFSETS = 600  # 10 batches: the run outlasts both outages
OUTAGE_S = 3.0


def _committed_rows(url: str, database: str) -> int:
    try:
        return scalar(url, f"SELECT count() FROM `{database}`.events")
    except Exception:  # ClickHouse is restarting: nothing to count yet
        return -1


def _wait_rows(proc: subprocess.Popen, url: str, database: str, at_least: int, timeout_s: float = 600) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = _committed_rows(url, database)
        if n >= at_least:
            return n
        assert proc.poll() is None, f"the query ended ({proc.returncode}) before {at_least} rows were committed"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} rows committed within {timeout_s:.0f} s")


def _start_child(args: dict, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return start_child(args, stdout=out, stderr=subprocess.STDOUT)


def _started(proc: subprocess.Popen, url: str, database: str, log: Path, timeout_s: float = 900) -> bool:
    """True once a first batch is committed; False if the job died on a Python worker's start.

    Spark waits 10 s (hard-coded in ``PythonWorkerFactory``) for a new worker to connect
    back; on a loaded machine the query can fail so before its first batch. That is no
    fault of the test, so such a run is started again (nothing was written yet).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _committed_rows(url, database) > 0:
            return True
        if proc.poll() is not None:
            if "connect back" in log.read_text(errors="replace"):
                return False
            raise AssertionError(f"the query failed before its first batch:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no batch committed within {timeout_s:.0f} s")


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_a_staging_query_rides_through_a_3_s_zookeeper_outage_and_a_3_s_clickhouse_restart_without_a_restart(
    stack_factory, tmp_path: Path
) -> None:
    own = stack_factory(kafka=True)
    url, database = own.clickhouse_url, f"d_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE `{database}`")
    topic, expected = make_topic(own, own.kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(url, database)
    args = job_args(
        own.kafka_bootstrap,
        topic,
        url,
        database,
        tmp_path / "chk",
        name=f"ride_{uuid.uuid4().hex[:6]}",
        daemon=True,
        master="local[2,4]",
        max_offsets=MAX_OFFSETS,
        fault={"mode": "staging", "retry.attempts": "40", "retry.max_seconds": "60"},
    )
    proc = _start_child(args, tmp_path / "child.log")
    try:
        for _ in range(4):  # Spark gave up on a Python worker's start before any batch: start again
            if _started(proc, url, database, tmp_path / "child.log"):
                break
            kill_session(proc)
            proc = _start_child(args, tmp_path / "child.log")
        before_zk = _wait_rows(proc, url, database, MAX_OFFSETS)
        crashes.kill_zookeeper(own.dir)
        time.sleep(OUTAGE_S)
        crashes.start_zookeeper(own.dir)
        before_ch = _wait_rows(proc, url, database, before_zk + MAX_OFFSETS)
        assert proc.poll() is None, "the query finished before ClickHouse could be restarted"
        crashes.kill_clickhouse(own.dir)
        time.sleep(OUTAGE_S)
        crashes.start_clickhouse(own.dir)
        code = proc.wait(1200)
    finally:
        kill_session(proc)
    tail = (tmp_path / "child.log").read_text(errors="replace")[-3000:]
    assert code == 0, f"the query failed ({code}):\n{tail}"
    assert before_ch < len(expected), "ClickHouse was restarted after the last batch"
    assert_exactly(url, database, expected)
    assert open_registry_entries(url, database) == 0
