"""The exactly-once ``foreachBatch`` helper under SIGKILL of the whole driver, in modes ``transaction`` and ``dedup``.

Each case runs the streaming job of :mod:`tests.helpers.foreach_torture` (``kafka_py`` ->
``foreachBatch`` of the helper, trigger ``availableNow``, 6,000 records in micro-batches of
at most 1,500) in a child process started in its own session. A fault plan SIGKILLs its
process group (driver Python, JVM, workers) once, in micro-batch 1, at one of the helper's
steps; the job is then restarted on the same checkpoint, without the fault, until it
drains the topic. Every record must then be in every table exactly once (read
committed), under one key row per micro-batch; the restart must skip micro-batch 1
(one INFO line) when the kill came after its COMMIT, and write it when it came before.
Plain reads (no ``implicit_transaction``) must see the same right after the restart: the
restart rolled back the transaction the killed attempt left open in the key's session.

In mode ``dedup`` the tables drop a block by its token (a deduplication window), the
rows of a killed attempt are visible at once, and the restarts repartition each
micro-batch into 3 partitions, so the replay's rows reach the helper in another order
than the killed attempt's.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.foreach_torture import APP_ID, DEDUP_STEPS, JOB, SPLIT, STEPS
from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import read_committed, run_sql
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_at, run_child

Rows = set[tuple[int, int, str]]


def _kill_and_restart(
    stack,
    bootstrap: str,
    url: str,
    database: str,
    tmp_path: Path,
    step: str,
    tables: list[str],
    mode: str = "transaction",
    **more: object,
) -> tuple[Rows, list[str]]:
    """Kill the job at ``step`` of micro-batch 1, restart it until it drains the topic.

    The records, and the helper's INFO lines of skipped batches over all runs.
    """
    topic, expected = make_topic(stack, bootstrap, PARTITIONS, PER_PARTITION)
    for table in tables:
        create_target(url, database, table, dedup_window=mode == "dedup")
    log = tmp_path / "foreach_batch.log"
    args = job_args(bootstrap, topic, url, database, tmp_path / "chk", tables=tables, log=str(log), mode=mode, **more)
    codes = [run_child({**args, "fault": kill_at(step, tmp_path)}, timeout_s=600, module=JOB)]
    restart = {**args, "repartition": 3} if mode == "dedup" else args
    for _ in range(4):
        if codes[-1] == 0:
            break
        codes.append(run_child(restart, timeout_s=600, module=JOB))
    print(f"killed at {step} of micro-batch 1 ({len(tables)} tables): exit codes {codes}")
    assert (tmp_path / "fault.once").exists(), f"the kill at {step} never fired: exit codes {codes}"
    assert codes[0] == -signal.SIGKILL and codes[-1] == 0, f"exit codes {codes}"
    skipped = [line for line in log.read_text().splitlines() if "skipped" in line]
    return expected, skipped


def _assert_one_key_row_per_batch(url: str, database: str, records: int) -> None:
    """Key rows of micro-batches 0..n-1, one each, whose row counts add up to ``records``."""
    keys = read_committed(
        url,
        f"SELECT batch_id, count(), sum(rows) FROM `{database}`.clickhouse_tx_batches "
        f"WHERE app_id = '{APP_ID}' GROUP BY batch_id ORDER BY batch_id",
    )
    assert [int(b) for b, _, _ in keys] == list(range(len(keys))) and len(keys) >= 2, keys
    assert all(n == "1" for _, n, _ in keys), f"a micro-batch has several key rows: {keys}"
    assert sum(int(r) for _, _, r in keys) == records, keys


def _assert_plain_reads_count(url: str, database: str, table: str, rows: int) -> None:
    """A plain read of ``table`` counts ``rows``: it sees the rows of open transactions, and
    the restart rolled back the one the killed attempt left open in the key's session
    (else it would stay open for the helper's default ``session_timeout``, an hour)."""
    seen = int(run_sql(url, f"SELECT count() FROM `{database}`.`{table}` FORMAT TSV"))
    assert seen == rows, f"plain reads of {table} see {seen} rows, {rows} committed: a transaction is still open"


def _assert_replay(step: str, skipped: list[str]) -> None:
    """Micro-batch 1 skipped by the restart (one INFO line) if it committed before the kill, else written."""
    if step == "after_commit":
        assert len(skipped) == 1 and "batch_id=1)" in skipped[0], skipped
    else:
        assert skipped == [], skipped


def _one_table_case(stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str) -> None:
    """The job into ``events`` killed at ``step`` and restarted: every record once, one key
    row per micro-batch, micro-batch 1 skipped or written as ``step`` says, plain reads exact."""
    args = (stack, kafka_bootstrap, clickhouse_url, database, tmp_path, step, ["events"])
    expected, skipped = _kill_and_restart(*args)
    assert_exactly(clickhouse_url, database, expected)
    _assert_one_key_row_per_batch(clickhouse_url, database, len(expected))
    _assert_replay(step, skipped)
    _assert_plain_reads_count(clickhouse_url, database, "events", len(expected))


@pytest.mark.timeout(1200)
def test_a_driver_killed_after_the_insert_before_the_commit_restarts_and_writes_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    _one_table_case(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, "in_batch_transaction")


@pytest.mark.timeout(1200)
def test_a_driver_killed_after_the_commit_before_spark_logs_the_batch_restarts_and_skips_its_replay(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    _one_table_case(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, "after_commit")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("step", STEPS)
def test_a_driver_killed_during_a_two_table_micro_batch_restarts_and_each_table_has_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str
) -> None:
    args = (stack, kafka_bootstrap, clickhouse_url, database, tmp_path, step, list(SPLIT))
    expected, skipped = _kill_and_restart(*args)
    for table, parity in SPLIT.items():
        rows = {r for r in expected if r[1] % 2 == parity}
        assert_exactly(clickhouse_url, database, rows, table)
        _assert_plain_reads_count(clickhouse_url, database, table, len(rows))
    _assert_one_key_row_per_batch(clickhouse_url, database, len(expected))
    _assert_replay(step, skipped)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("step", [s for s in DEDUP_STEPS if not s.startswith("after_insert")])
def test_in_mode_dedup_a_driver_killed_around_the_key_row_restarts_in_another_row_order_and_writes_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str
) -> None:
    args = (stack, kafka_bootstrap, clickhouse_url, database, tmp_path, step, ["events"], "dedup")
    expected, skipped = _kill_and_restart(*args)
    assert_exactly(clickhouse_url, database, expected)
    _assert_one_key_row_per_batch(clickhouse_url, database, len(expected))
    _assert_replay(step, skipped)


@pytest.mark.timeout(1200)
def test_in_mode_dedup_a_driver_killed_between_the_two_tables_of_a_micro_batch_restarts_and_each_has_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    args = (stack, kafka_bootstrap, clickhouse_url, database, tmp_path, "after_insert:1", list(SPLIT), "dedup")
    expected, skipped = _kill_and_restart(*args)
    for table, parity in SPLIT.items():
        assert_exactly(clickhouse_url, database, {r for r in expected if r[1] % 2 == parity}, table)
    _assert_one_key_row_per_batch(clickhouse_url, database, len(expected))
    _assert_replay("after_insert:1", skipped)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("step", ["before_key_row", "after_commit"])
def test_micro_batches_past_driver_max_bytes_killed_around_the_key_row_restart_and_write_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str
) -> None:
    # driver_max_bytes=1: every micro-batch goes through the sink's batch job (published at
    # once under the key); killed after it published, before or after the key row.
    args = (stack, kafka_bootstrap, clickhouse_url, database, tmp_path, step, ["events"])
    expected, skipped = _kill_and_restart(*args, driver_max_bytes=1)
    assert_exactly(clickhouse_url, database, expected)
    _assert_one_key_row_per_batch(clickhouse_url, database, len(expected))
    _assert_replay(step, skipped)
    jobs = read_committed(clickhouse_url, f"SELECT count() FROM `{database}`.clickhouse_tx_jobs")
    keys = read_committed(clickhouse_url, f"SELECT count() FROM `{database}`.clickhouse_tx_batches")
    assert jobs == keys, f"one published batch job per key row: {jobs} jobs, {keys} keys"


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["transaction", "dedup"])
def test_a_driver_killed_between_two_helper_calls_under_one_app_id_restarts_and_each_table_has_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    # Two clickhouse_tx_batch calls per micro-batch, one per table, under one app_id: the
    # kill lands after table a's call committed (its key row names a alone), before b's.
    args = (stack, kafka_bootstrap, clickhouse_url, database, tmp_path, "between_helpers", list(SPLIT), mode)
    expected, skipped = _kill_and_restart(*args, two_helpers=True)
    for table, parity in SPLIT.items():
        rows = {r for r in expected if r[1] % 2 == parity}
        assert_exactly(clickhouse_url, database, rows, table)
        _assert_plain_reads_count(clickhouse_url, database, table, len(rows))
    keys = read_committed(
        clickhouse_url,
        f"SELECT batch_id, arrayStringConcat(tables, ','), count() FROM `{database}`.clickhouse_tx_batches "
        f"WHERE app_id = '{APP_ID}' GROUP BY batch_id, tables ORDER BY batch_id, tables",
    )
    batches = sorted({int(b) for b, _, _ in keys})
    assert batches == list(range(len(batches))) and len(batches) >= 2, keys
    # One key row per micro-batch and table: a's of micro-batch 1 from the killed run, b's from the restart.
    assert [(int(b), t.split(".")[-1], n) for b, t, n in keys] == [(b, t, "1") for b in batches for t in SPLIT], keys
    # The restart skipped table a's call of micro-batch 1 (its key row was there) and wrote b's.
    assert len(skipped) == 1 and "batch_id=1)" in skipped[0], skipped
