"""Streaming restarts after the prepared work of a decided batch is gone.

The Spark driver (with its executors: ``local[2]``) is SIGKILLed right after it wrote
the decision of batch 1, before any COMMIT. The prepared transactions then die: by
session expiry (their keep-alive died with the executors) or by a ClickHouse restart.
One restart of the query on the same checkpoint must drain the topic with every
Kafka record in ClickHouse exactly once, also when it cuts batches into another
number of partitions than the killed run (``repartition``). Child processes come
from :mod:`tests.helpers.torture`.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from server_patches import crashes
from spark_datasource.options.writer_specs import MIN_SESSION_TIMEOUT_S
from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import open_registry_entries, run_sql
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_at, run_child


def _killed_after_the_decision(stack, url: str, database: str, tmp_path: Path, **extra) -> tuple[dict, set]:
    topic, expected = make_topic(stack, stack.kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(url, database)
    name = f"expiry_{uuid.uuid4().hex[:6]}"
    args = job_args(stack.kafka_bootstrap, topic, url, database, tmp_path / "chk", name=name, daemon=True, **extra)
    fault = {**kill_at("after_decision", tmp_path), "session_timeout": str(MIN_SESSION_TIMEOUT_S)}
    assert run_child({**args, "fault": fault}) == -signal.SIGKILL
    assert (tmp_path / "fault.once").exists()
    return args, expected


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_driver_killed_after_its_decision_and_restarted_after_the_session_timeout_writes_each_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    args, expected = _killed_after_the_decision(stack, clickhouse_url, database, tmp_path)
    time.sleep(MIN_SESSION_TIMEOUT_S + 3)  # past the session_timeout: every decided transaction has expired
    # one restart drains the topic: the batch is written again once, no restart loop
    assert run_child({**args, "fault": {"session_timeout": str(MIN_SESSION_TIMEOUT_S)}}) == 0
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("parts", [2, 5])
def test_a_query_restarted_after_a_clickhouse_restart_with_another_partitioning_writes_each_record_once(
    stack_factory, tmp_path: Path, parts: int
) -> None:
    own = stack_factory(kafka=True)
    database = f"d_{uuid.uuid4().hex[:8]}"
    run_sql(own.clickhouse_url, f"CREATE DATABASE `{database}`")
    args, expected = _killed_after_the_decision(own, own.clickhouse_url, database, tmp_path, repartition=3)
    own = crashes.restart_clickhouse(own.dir)  # the decided, prepared transactions are lost
    assert run_child({**args, "url": own.clickhouse_url, "repartition": parts}) == 0
    assert_exactly(own.clickhouse_url, database, expected)
    assert open_registry_entries(own.clickhouse_url, database) == 0
