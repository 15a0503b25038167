"""Batch jobs published at once (``visibility=auto``), and their ``idempotence_key``, on a real Spark.

The kill-and-rerun matrix is in ``tests/torture/test_batch_job_rerun.py``; these are the
in-process cases: what a job leaves when it fails before its publishing step, what a
key already recorded does, and the targets that cannot be published at once.
"""

from __future__ import annotations

import uuid

import pytest

from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    events,
    expected_totals,
    read_committed,
    run_sql,
    table_names,
    writer_options,
)

N = 3000


def _write(sp, url: str, database: str, mode: str, **extra: str) -> None:
    opts = writer_options(url, database, "events", mode, **extra)
    events(sp, N, 3).write.format("clickhouse_tx").options(**opts).mode("append").save()


@pytest.mark.parametrize("mode", ["transaction", "dedup"])
def test_a_batch_job_that_fails_just_before_its_publishing_step_leaves_nothing_in_the_target_nor_a_stage(
    sp, clickhouse_url: str, database: str, tmp_path, mode: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    fault = {"fault.step": "before_publish", "fault.action": "raise", "fault.once_file": str(tmp_path / "once")}
    with pytest.raises(Exception, match="injected fault at before_publish"):
        _write(sp, clickhouse_url, database, mode, **fault)
    assert actual_totals(clickhouse_url, database, "events")[0] == 0
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_ow_")]
    _write(sp, clickhouse_url, database, mode)  # the plain re-run
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)


def test_a_batch_job_whose_idempotence_key_is_recorded_writes_nothing_and_another_key_writes_again(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    key = f"run-{uuid.uuid4().hex[:8]}"
    _write(sp, clickhouse_url, database, "transaction", idempotence_key=key)
    _write(sp, clickhouse_url, database, "transaction", idempotence_key=key)
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    jobs = read_committed(
        clickhouse_url, f"SELECT idempotence_key, `table`, rows FROM `{database}`.clickhouse_tx_jobs ORDER BY txn_id"
    )
    assert jobs == [[key, f"{database}.events", str(N)]]
    _write(sp, clickhouse_url, database, "transaction", idempotence_key=key + "-next")
    assert actual_totals(clickhouse_url, database, "events")[0] == 2 * N


def test_a_batch_job_into_a_server_without_transactions_is_published_per_partition_by_default_and_refused_with_batch(
    sp, stack_factory, tmp_path
) -> None:
    url = stack_factory(transactions=False).clickhouse_url
    database = "no_tx"
    run_sql(url, f"CREATE DATABASE {database}")
    create_events_table(url, database, "events", "staging")

    def totals() -> tuple[int, int, int, int]:  # no transaction can be open here: a plain read
        text = run_sql(url, f"SELECT count(), sum(id), sum(k), sum(length(s)) FROM `{database}`.events")
        return tuple(int(x) for x in text.split())  # type: ignore[return-value]

    _write(sp, url, database, "staging")
    assert totals() == expected_totals(N)
    assert not [t for t in table_names(url, database) if t.startswith("_ctx_")]  # no job stage was made
    with pytest.raises(Exception, match="option visibility=batch: the server refused a transaction"):
        _write(sp, url, database, "staging", visibility="batch")
    assert totals() == expected_totals(N)
