"""A micro-batch past the helper's ``driver_max_bytes``, with a real SparkSession and the embedded stack.

The collect stops keeping rows at the limit (``spark_datasource.foreach.collect``);
the single-table helper in mode ``transaction`` then writes the batch from the executors
as a batch job of the sink under the key (``spark_datasource.foreach.helper.write_from_executors``);
a context of several tables, and mode ``dedup``, refuse it with nothing written.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from clickhouse_tx.foreach.keys import BatchKey
from spark_datasource import clickhouse_tx_transaction
from spark_datasource.foreach.collect import collect_arrow
from spark_datasource.foreach.helper import spill_key
from spark_datasource.testing import credentials
from tests.helpers.foreach_files import (
    FILES,
    LOGGER,
    PER_FILE,
    N,
    failed_stream,
    json_files,
    key_rows,
    lose_last_key_row,
    run_stream,
    single_helper,
)
from tests.helpers.spark_writes import actual_totals, create_events_table, expected_totals, read_committed


def test_a_collect_past_its_limit_keeps_nothing_and_the_session_goes_on(sp) -> None:
    df = sp.range(0, 200_000, numPartitions=4).selectExpr("id", "cast(id as string) s")
    whole = collect_arrow(df)
    assert whole is not None and sum(b.num_rows for b in whole) == 200_000
    size = sum(b.nbytes for b in whole)
    assert collect_arrow(df, size - 1) is None
    under = collect_arrow(df, size)
    assert under is not None and [b.column(0)[0].as_py() for b in under] == [b.column(0)[0].as_py() for b in whole]
    assert sp.range(10).count() == 10


def _jobs(url: str, database: str) -> list[list[str]]:
    return read_committed(url, f"SELECT idempotence_key, rows FROM `{database}`.clickhouse_tx_jobs ORDER BY rows, 1")


def test_micro_batches_past_the_limit_are_written_from_the_executors_under_the_key_and_a_replay_writes_nothing(
    sp, clickhouse_url: str, database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        query_id = run_stream(sp, src, chk, single_helper(clickhouse_url, database, driver_max_bytes=1))
    spilled = [r.getMessage() for r in caplog.records if r.name == LOGGER and "from the executors" in r.getMessage()]
    assert len(spilled) == FILES, spilled
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert key_rows(clickhouse_url, database) == [
        [str(b), query_id, f"['{database}.events']", str(PER_FILE)] for b in range(FILES)
    ]
    keys = sorted(spill_key(BatchKey("events", b, query_id)) for b in range(FILES))
    assert sorted(k for k, _ in _jobs(clickhouse_url, database)) == keys

    # A driver that died after the last batch job published, before its key row and
    # Spark's commit log: the restart's batch job finds its key and writes nothing.
    lose_last_key_row(clickhouse_url, database, chk)
    run_stream(sp, src, chk, single_helper(clickhouse_url, database, driver_max_bytes=1))
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert len(_jobs(clickhouse_url, database)) == FILES
    assert [k[0] for k in key_rows(clickhouse_url, database)] == [str(b) for b in range(FILES)]


def test_a_micro_batch_past_the_limit_in_mode_dedup_is_refused_naming_the_option_and_nothing_is_written(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "dedup")
    src = json_files(tmp_path)
    text = failed_stream(
        sp, src, tmp_path / "chk", single_helper(clickhouse_url, database, mode="dedup", driver_max_bytes=1)
    )
    assert "pass option driver_max_bytes=1 and mode 'dedup' writes from the driver only" in text, text
    assert actual_totals(clickhouse_url, database, "events")[0] == 0


def test_a_context_of_two_tables_past_the_limit_is_refused_naming_the_option_and_nothing_is_written(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    for t in ("a", "b"):
        create_events_table(clickhouse_url, database, t, "transaction")
    src = json_files(tmp_path)
    options = {"allow_nullable_into_non_nullable": True, "driver_max_bytes": 1, **credentials.writer_options()}

    def write(df, batch_id: int) -> None:
        with clickhouse_tx_transaction(
            url=clickhouse_url, app_id="split", batch_id=batch_id, database=database, **options
        ) as tx:
            tx.insert("a", df.where("id % 2 = 0"))
            tx.insert("b", df.where("id % 2 = 1"))

    text = failed_stream(sp, src, tmp_path / "chk", write)
    assert "pass option driver_max_bytes=1 and a clickhouse_tx_transaction context" in text, text
    assert [actual_totals(clickhouse_url, database, t)[0] for t in ("a", "b")] == [0, 0]
