"""``visibility=batch`` under SIGKILL: the driver dies inside the batch's one transaction, and around it.

The streaming job of :mod:`tests.helpers.torture` in mode ``staging`` with
``visibility=batch`` is SIGKILLed (driver, JVM and workers) at a protocol step, then
restarted on the same checkpoint until it drains the topic. ``in_batch_transaction``
fires inside the transaction that moves every stage of the batch, just before its
COMMIT: the restart must settle the open transaction (its session outlives the driver),
wait out the parts its rolled-back MOVEs locked, and publish the batch once. With
``visibility=partition`` the same step fires inside the batched publish, after its first
MOVE and before any marker: the restart rolls the half-moved batch forward.
Every record must then be in ClickHouse exactly once, with no registry entry or stage left.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import open_registry_entries, table_names
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_at, run_child

CASES = [
    *(("batch", step) for step in ("after_decision", "in_batch_transaction", "after_commit:1")),
    ("partition", "in_batch_transaction"),
]


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("visibility", "step"), CASES)
def test_a_driver_killed_around_the_batch_transaction_and_restarted_loses_and_duplicates_nothing(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, visibility: str, step: str
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database)
    args = job_args(
        kafka_bootstrap,
        topic,
        clickhouse_url,
        database,
        tmp_path / "chk",
        name=f"vis_{uuid.uuid4().hex[:6]}",
        options={"mode": "staging", "visibility": visibility},
    )
    codes = [run_child({**args, "fault": kill_at(step, tmp_path)}, timeout_s=600)]
    for _ in range(4):
        if codes[-1] == 0:
            break
        codes.append(run_child(args, timeout_s=600))  # a replay may wait out locked parts
    assert (tmp_path / "fault.once").exists(), f"the kill at {step} never fired: exit codes {codes}"
    assert codes[0] == -signal.SIGKILL and codes[-1] == 0, f"exit codes {codes}"
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_stage_")]
