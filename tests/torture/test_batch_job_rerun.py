"""A batch job stopped anywhere and run again as it is: every row once.

A user's or a scheduler's retry (Airflow, cron) runs a failed job again with the same
code and options, as a new job. The job of :mod:`tests.helpers.batch_torture` (3,000
rows in 3 partitions) is SIGKILLed (driver, JVM and workers) at a step of its commit,
or fails by an error after its first COMMIT, then run again with the same arguments:
the target must hold each row exactly once. Nothing of a job is visible before its
publishing COMMIT (:mod:`clickhouse_tx.jobs.publish`), so every stop before it leaves
nothing behind; a stop after it is the one window a plain re-run cannot tell from a
new job, closed by the ``idempotence_key``.

Before the job stage, a job stopped after its first COMMIT (and one that failed after
it) was written twice by the re-run in modes transaction and staging, and any stop of
a dedup job was.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.batch_torture import run_batch_child
from tests.helpers.cli import run_cli
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    expected_totals,
    open_registry_entries,
    run_sql,
    table_names,
)
from tests.helpers.torture import kill_at, slow_except
from tests.helpers.views import add_rollup_views, assert_views_count_once

N, PARTITIONS = 3000, 3


def _matrix(steps: list[str], fast: tuple[str, str]) -> list:
    """(step, mode) pytest params, every one slow but ``fast`` (what the default run keeps)."""
    return [
        pytest.param(step, mode, marks=() if (step, mode) == fast else pytest.mark.slow, id=f"{step}-{mode}")
        for mode in MODES
        for step in steps
    ]


MODES = ["transaction", "staging", "dedup"]
STEPS = ["after_prepare", "after_decision", "after_commit:1", "before_mark_done", "before_publish", "in_publish"]


def _job(clickhouse_url: str, database: str, mode: str, **options: str) -> dict:
    return {
        "url": clickhouse_url,
        "database": database,
        "mode": mode,
        "n": N,
        "partitions": PARTITIONS,
        "options": options,
    }


def _clean_up_after_the_killed_job(url: str, database: str, mode: str) -> None:
    """What an operator runs after a killed batch job: ``gc`` for its transactional id.

    The killed job left its stage, and maybe prepared xids whose open transactions hold
    the stage until their sessions expire; afterwards nothing of it is left.
    """
    stages = [f"{database}.{t}" for t in table_names(url, database) if t.startswith("_ctx_ow_")]
    # The job's id, as its driver logged it: from the registry (open xids) or, once its
    # stage committed and its entries were forgotten, from the stage's markers.
    listed = ", ".join(repr(s) for s in stages) or repr("")
    txns = run_sql(
        url,
        f"SELECT DISTINCT txn_id FROM (SELECT txn_id, `table` FROM `{database}`.clickhouse_tx_registry "
        f"UNION ALL SELECT txn_id, `table` FROM `{database}`.clickhouse_tx_commits) "
        f"WHERE `table` IN ({listed}) FORMAT TSV",
    ).split()
    assert txns or not stages, f"no transactional id found for the stages {stages}"
    for txn in txns:  # the documented clean-up (docs/modes.md, "Batch jobs: all or nothing")
        done = run_cli(
            "gc", "--url", url, "--table", f"{database}.events", "--mode", mode, "--txn-id", txn, "--not-running",
            "--older-than", "0",
        )  # fmt: skip
        assert done.returncode == 0, f"gc: {done.stdout}{done.stderr}"
    assert open_registry_entries(url, database) == 0
    assert not [t for t in table_names(url, database) if t.startswith("_ctx_ow_")]


def _stopped_then_rerun(job: dict, stop: dict[str, str], tmp_path: Path) -> tuple[int, int]:
    """The exit codes of the stopped run and of the plain re-run (which must succeed)."""
    first, err = run_batch_child({**job, "options": {**job["options"], **stop}})
    assert (tmp_path / "fault.once").exists(), f"the fault never fired: exit {first}: {err[-2000:]}"
    second, err = run_batch_child(job)
    assert second == 0, f"the re-run failed ({second}): {err[-3000:]}"
    return first, second


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("step", "mode"), _matrix(STEPS, ("after_commit:1", "transaction")))
def test_a_batch_job_killed_at_a_commit_step_and_run_again_as_it_is_writes_each_row_once(
    stack, clickhouse_url: str, database: str, tmp_path: Path, mode: str, step: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    job = _job(clickhouse_url, database, mode)
    first, _ = _stopped_then_rerun(job, kill_at(step, tmp_path, batch=0), tmp_path)
    assert first == -signal.SIGKILL
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    _clean_up_after_the_killed_job(clickhouse_url, database, mode)
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", slow_except(MODES, "transaction"))
def test_a_batch_job_that_failed_by_an_error_after_its_first_commit_and_ran_again_writes_each_row_once(
    stack, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    job = _job(clickhouse_url, database, mode)
    fault = {**kill_at("after_commit:1", tmp_path, batch=0), "fault.action": "raise"}
    first, _ = _stopped_then_rerun(job, fault, tmp_path)
    assert first not in (0, -signal.SIGKILL)
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    # the failed job dropped its stage: nothing of it is left in the database
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_ow_")]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", slow_except(MODES, "dedup"))
def test_a_batch_job_whose_first_commit_answers_a_server_error_after_taking_effect_succeeds_with_each_row_once(
    stack, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    fault = {**kill_at("after_commit:1", tmp_path, batch=0), "fault.action": "error"}
    code, err = run_batch_child({**_job(clickhouse_url, database, mode), "options": fault})
    assert (tmp_path / "fault.once").exists(), f"the fault never fired: exit {code}: {err[-2000:]}"
    assert code == 0, f"the job failed ({code}) although its COMMIT took effect: {err[-3000:]}"
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", slow_except(MODES, "staging"))
def test_a_batch_job_killed_after_its_publishing_commit_and_run_again_with_its_idempotence_key_writes_nothing_more(
    stack, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    job = _job(clickhouse_url, database, mode, idempotence_key="airflow-run-1")
    first, _ = _stopped_then_rerun(job, kill_at("after_publish", tmp_path, batch=0), tmp_path)
    assert first == -signal.SIGKILL
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    _clean_up_after_the_killed_job(clickhouse_url, database, mode)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("step", "mode"), _matrix(["after_commit:1", "in_publish"], ("in_publish", "staging")))
def test_a_batch_job_into_a_chain_of_two_views_killed_and_run_again_counts_each_row_once_in_every_view(
    stack, clickhouse_url: str, database: str, tmp_path: Path, mode: str, step: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    add_rollup_views(clickhouse_url, database, "k % 3")
    job = _job(clickhouse_url, database, mode)
    first, _ = _stopped_then_rerun(job, kill_at(step, tmp_path, batch=0), tmp_path)
    assert first == -signal.SIGKILL
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    _clean_up_after_the_killed_job(clickhouse_url, database, mode)
    per_key = {r: sum(1 for i in range(N) if i % 1000 % 3 == r) for r in range(3)}  # k = id % 1000
    assert_views_count_once(clickhouse_url, database, per_key)
