"""Modes staging and dedup into a ``ReplicatedMergeTree`` target: a driver killed and restarted writes each record once.

The Replicated profile of ``make test-external`` (docs/deployment.md): the embedded
engine cannot write into Replicated tables, so these tests run only against the user's
cluster (``CLICKHOUSE_TX_EXTERNAL_URL`` and ``CLICKHOUSE_TX_EXTERNAL_CLUSTER``); without
it every case is collected and skipped before any fixture starts a server or Spark.

The target ``events (p, o, v)`` is created ``ON CLUSTER`` with the cluster's macros
(:func:`tests.helpers.replicated.replicated_table_ddl`). Each case runs the streaming job
of :mod:`tests.helpers.torture` (3 Kafka partitions of 2,000 records, 1,500 a batch), which
SIGKILLs its process group once at ``step`` of batch 1 (:func:`~tests.helpers.torture.kill_at`),
then restarts it on the same checkpoint until it drains the topic, as
``tests/torture/test_driver_kill.py`` does. The target must then hold each record once,
read without a transaction (none can hold a Replicated table) and with
``select_sequential_consistency = 1``; no registry entry may stay open and no stage
table (whose Keeper path is the writer's own) may be left.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

from tests.helpers import replicated
from tests.helpers.spark_streams import make_topic
from tests.helpers.spark_writes import open_registry_entries, table_names
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_at, run_child

if TYPE_CHECKING:
    from server_patches.stack_files import StackInfo

#: The user's servers with a cluster, read at import so a skip comes before any fixture.
PROFILE = replicated.cluster_profile()
pytestmark = pytest.mark.skipif(PROFILE is None, reason=replicated.SKIP_REASON)

#: Where the job dies in batch 1, and what a restart then finds.
STEPS = {
    "after_prepare": "after the prepare, before the commit (stages full in staging, blocks in in dedup; no decision)",
    "after_decision": "after the decision, before any partition is published (the restart rolls it forward)",
    "after_commit:1": "in the middle of the commit (one partition published, the others not)",
}
COLUMNS = "p Int32, o Int64, v String"


@pytest.fixture
def replicated_database() -> Iterator[str]:
    """A database on every host of the cluster with the Replicated target ``events``;
    dropped ``ON CLUSTER ... SYNC`` after the test, Keeper nodes included."""
    assert PROFILE is not None and PROFILE.cluster is not None  # else the module is skipped
    name = f"{os.environ.get('CLICKHOUSE_TX_RUN_PREFIX', '')}t_repl_{uuid.uuid4().hex[:8]}"
    try:
        for ddl in replicated.replicated_table_ddl(name, "events", COLUMNS, "(p, o)", "p", PROFILE.cluster):
            PROFILE.run(ddl)
        yield name
    finally:
        PROFILE.run(replicated.drop_database_ddl(name, PROFILE.cluster))


def _killed_once_then_drained(args: dict, fault: dict[str, str]) -> list[int]:
    """Run the job with ``fault``, then without it until it drains the topic; the exit codes.

    A first run that failed before the kill (on a loaded machine: a Python worker that did
    not connect back within Spark's 10 s) reached no protocol step: it is run again with
    the fault, and every restart may fail the same way.
    """
    once = Path(fault["fault.once_file"])
    codes = [run_child({**args, "fault": fault}, check=False)]
    if codes[0] != -signal.SIGKILL and not once.exists():
        codes = [run_child({**args, "fault": fault})]
    while codes[-1] != 0 and len(codes) < 5:
        codes.append(run_child(args, check=False))
    assert codes[0] == -signal.SIGKILL and once.exists(), f"not killed at {fault['fault.step']}: {codes}"
    assert codes[-1] == 0, f"the job did not drain the topic after restarts: exit codes {codes}"
    return codes


@pytest.mark.timeout(900)
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("mode", ["staging", "dedup"])
def test_a_driver_killed_at_a_protocol_step_and_restarted_writes_each_record_once_into_a_replicated_target(
    stack: StackInfo,
    kafka_bootstrap: str,
    clickhouse_url: str,
    replicated_database: str,
    tmp_path: Path,
    mode: str,
    step: str,
) -> None:
    assert PROFILE is not None
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    name = f"repl_{uuid.uuid4().hex[:6]}"
    chk = tmp_path / "chk"
    args = job_args(kafka_bootstrap, topic, clickhouse_url, replicated_database, chk, name=name, options={"mode": mode})

    codes = _killed_once_then_drained(args, kill_at(step, tmp_path))
    print(f"mode {mode} killed {STEPS[step]}: exit codes {codes}")

    replicated.assert_each_record_once(PROFILE, replicated_database, expected)
    assert open_registry_entries(clickhouse_url, replicated_database) == 0
    assert not [t for t in table_names(clickhouse_url, replicated_database) if t.startswith("_ctx_")]
