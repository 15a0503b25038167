"""Mode dedup: the driver SIGKILLed after its executors inserted a batch, restarted under another partitioning.

Dedup rows are visible as soon as an executor inserts them. The first run (Kafka ->
``repartition(3)`` -> ``clickhouse_tx`` in mode dedup) is SIGKILLed with its whole
process group at a protocol step of batch 1: after the first partition of the batch
was prepared (others may be half inserted or not started: the batch has no seal yet),
or in the driver's commit, after every partition was inserted (before the decision,
just before the one INSERT of the batch's markers, or after it). The restart cuts the
replayed batch 1 into 5 partitions: its tasks must be refused before they insert (the
query fails naming the layouts), leaving the table as the kill left it. The next
restart, with the original ``repartition(3)``, must drain the topic with every Kafka
record in ClickHouse exactly once.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.spark_streams import assert_exactly, make_topic, target_rows
from tests.helpers.spark_writes import open_registry_entries, run_sql
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_at, run_child_past_worker_start

DEDUP = {"mode": "dedup"}  # writer options the child passes through (with the fault plan's)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("step", ["after_prepare", "before_decision", "in_batch_transaction", "after_commit:1"])
def test_a_dedup_driver_killed_after_its_inserts_and_restarted_under_another_partitioning_is_refused_then_writes_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    run_sql(
        clickhouse_url,
        f"CREATE TABLE `{database}`.events (p Int32, o Int64, v String) ENGINE = MergeTree "
        "ORDER BY (p, o) SETTINGS non_replicated_deduplication_window = 1000",
    )
    base = job_args(kafka_bootstrap, topic, clickhouse_url, database, tmp_path / "chk", name=None, daemon=True)
    fault = {**DEDUP, **kill_at(step, tmp_path)}
    codes = [run_child_past_worker_start({**base, "repartition": 3, "fault": fault}, tmp_path)]
    assert codes[0] == -signal.SIGKILL and (tmp_path / "fault.once").exists()
    assert not (tmp_path / "chk" / "commits" / "1").exists(), "Spark logged batch 1: the kill came too late"
    after_kill = target_rows(clickhouse_url, database)
    assert len(after_kill) == len(set(after_kill)) and len(after_kill) > 0

    with pytest.raises(AssertionError) as refused:
        run_child_past_worker_start({**base, "repartition": 5, "fault": DEDUP}, tmp_path)
    assert "DedupLayoutError" in str(refused.value) and "original partitioning" in str(refused.value)
    assert sorted(target_rows(clickhouse_url, database)) == sorted(after_kill)  # nothing inserted

    for _ in range(3):
        codes.append(run_child_past_worker_start({**base, "repartition": 3, "fault": DEDUP}, tmp_path))
        if codes[-1] == 0:
            break
    assert codes[-1] == 0, f"the restarted job did not drain the topic: exit codes {codes}"
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0
    print(
        f"dedup repartition kill at {step}: {len(after_kill)} rows after the kill, refused under 5 "
        f"partitions, {len(expected)} records exactly once after the restart under 3"
    )
