"""The exactly-once ``foreachBatch`` helper with a real SparkSession and the embedded stack.

Each stream reads JSON files (a replay reads the same files: the same rows under the same
batch ids), ``maxFilesPerTrigger=1`` so that each file is one micro-batch, and runs
``availableNow`` to its end.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

import pytest

from clickhouse_tx.errors import ValueDoesNotFitError
from clickhouse_tx.foreach.keys import BatchRecords
from spark_datasource import clickhouse_tx_batch, clickhouse_tx_transaction
from spark_datasource.testing import credentials
from tests.helpers.foreach_files import (
    FILES,
    LOGGER,
    PER_FILE,
    SCHEMA,
    N,
    failed_stream,
    forget_last_commit,
    json_files,
    key_rows,
    lose_last_key_row,
    run_stream,
    single_helper,
)
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    expected_totals,
    read_committed,
    run_sql,
    scalar,
)


def test_a_file_stream_writes_every_row_once_and_a_replayed_batch_writes_nothing_with_one_info_line(
    sp, clickhouse_url: str, database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    query_id = run_stream(sp, src, chk, single_helper(clickhouse_url, database))
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert key_rows(clickhouse_url, database) == [
        [str(b), query_id, f"['{database}.events']", str(PER_FILE)] for b in range(FILES)
    ]
    forget_last_commit(chk)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert run_stream(sp, src, chk, single_helper(clickhouse_url, database)) == query_id
    skipped = [r.getMessage() for r in caplog.records if r.name == LOGGER and "skipped" in r.getMessage()]
    assert len(skipped) == 1 and "batch_id=2" in skipped[0], skipped
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert len(key_rows(clickhouse_url, database)) == FILES


def test_called_outside_the_query_with_its_checkpoint_a_written_batch_writes_nothing(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    run_stream(sp, src, chk, single_helper(clickhouse_url, database))
    again = single_helper(clickhouse_url, database, checkpoint_location=str(chk))
    again(sp.read.schema(SCHEMA).json(str(src / "part-0.json")), 0)
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    with pytest.raises(Exception, match="option checkpoint_location=.* is the checkpoint of query"):
        run_stream(sp, src, tmp_path / "other", again)  # another query, given this query's checkpoint


def test_a_restart_with_the_same_app_id_on_a_new_checkpoint_is_refused_naming_app_id(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    src = json_files(tmp_path)
    run_stream(sp, src, tmp_path / "chk", single_helper(clickhouse_url, database))
    text = failed_stream(sp, src, tmp_path / "new_chk", single_helper(clickhouse_url, database))
    assert "option app_id='events' is already used by another streaming query" in text, text
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert len(key_rows(clickhouse_url, database)) == FILES


def test_in_mode_dedup_a_batch_replayed_under_another_partitioning_without_its_key_row_adds_every_row_once(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    # The state a driver killed between the last chunk and the key row leaves: rows in,
    # no key row, Spark's commit log without the batch. The restart shuffles the rows
    # into another order (repartition(3) instead of 1): the chunks' order is their values'.
    create_events_table(clickhouse_url, database, "events", "dedup")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    helper = single_helper(clickhouse_url, database, mode="dedup")
    run_stream(sp, src, chk, lambda df, batch_id: helper(df.repartition(1), batch_id))
    lose_last_key_row(clickhouse_url, database, chk)
    run_stream(sp, src, chk, lambda df, batch_id: helper(df.repartition(3), batch_id))
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert [k[0] for k in key_rows(clickhouse_url, database)] == [str(b) for b in range(FILES)]


def _two_tables(url: str, database: str, fail: bool = False) -> Callable[[Any, int], None]:
    """Even ids into ``a``, odd ones into ``b``, in one transaction; ``fail``: raise inside the context."""

    def write(df: Any, batch_id: int) -> None:
        options = {"allow_nullable_into_non_nullable": True, **credentials.writer_options()}
        with clickhouse_tx_transaction(url=url, app_id="split", batch_id=batch_id, database=database, **options) as tx:
            tx.insert("a", df.where("id % 2 = 0"))
            tx.insert(f"{database}.b", df.where("id % 2 = 1"))
            if fail:
                raise RuntimeError("the user's function fails after its inserts")

    return write


def _visible(url: str, database: str, table: str) -> int:
    """Rows of ``table`` as a plain read sees them (open transactions' rows included)."""
    return int(run_sql(url, f"SELECT count() FROM `{database}`.`{table}` FORMAT TSV"))


def test_a_user_function_raising_inside_the_context_leaves_nothing_of_the_batch_visible(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    for t in ("a", "b"):
        create_events_table(clickhouse_url, database, t, "transaction")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    text = failed_stream(sp, src, chk, _two_tables(clickhouse_url, database, fail=True))
    assert "the user's function fails after its inserts" in text, text
    assert [_visible(clickhouse_url, database, t) for t in ("a", "b")] == [0, 0]
    # The context's key names its tables, known when the block ends: a block that raised
    # did not reach the key table at all.
    assert run_sql(clickhouse_url, f"EXISTS TABLE `{database}`.clickhouse_tx_batches").strip() == "0"
    run_stream(sp, src, chk, _two_tables(clickhouse_url, database))  # the restart replays batch 0
    a, b = (actual_totals(clickhouse_url, database, t) for t in ("a", "b"))
    assert (a[0], b[0], a[1] + b[1]) == (N // 2, N // 2, expected_totals(N)[1])


def test_two_tables_of_one_micro_batch_land_together_under_one_key_row(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    for t in ("a", "b"):
        create_events_table(clickhouse_url, database, t, "transaction")
    src = json_files(tmp_path)
    query_id = run_stream(sp, src, tmp_path / "chk", _two_tables(clickhouse_url, database))
    assert key_rows(clickhouse_url, database) == [
        [str(b), query_id, f"['{database}.a','{database}.b']", str(PER_FILE)] for b in range(FILES)
    ]
    for t, parity in (("a", 0), ("b", 1)):
        assert scalar(clickhouse_url, f"SELECT countIf(id % 2 = {parity}) FROM `{database}`.{t}") == N // 2
        assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.{t}") == N // 2


def test_a_value_that_does_not_fit_the_second_table_rolls_back_the_rows_sent_to_the_first(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "a", "transaction")
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.b (id Int64, k UInt8, s String) ENGINE = MergeTree ORDER BY id")
    batch = sp.read.schema(SCHEMA).json(str(json_files(tmp_path) / "part-1.json"))  # k 100..199: fits UInt8
    (tmp_path / "chk").mkdir()
    (tmp_path / "chk" / "metadata").write_text(json.dumps({"id": "a-query-of-this-test"}) + "\n")
    login = credentials.writer_options()
    with (
        pytest.raises(ValueDoesNotFitError, match="k"),
        clickhouse_tx_transaction(
            url=clickhouse_url,
            app_id="split",
            batch_id=0,
            database=database,
            checkpoint_location=str(tmp_path / "chk"),
            allow_nullable_into_non_nullable=True,
            **login,
        ) as tx,
    ):
        tx.insert("a", batch)
        tx.insert("b", batch.selectExpr("id", "k * 2 AS k", "s"))  # 200..398: not all fit UInt8
    assert [_visible(clickhouse_url, database, t) for t in ("a", "b", "clickhouse_tx_batches")] == [0, 0, 0]


def test_values_go_into_the_table_s_own_types_as_the_sink_converts_them(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    run_sql(
        clickhouse_url,
        f"CREATE TABLE `{database}`.typed (id UInt64, ts DateTime, amount Float32, name LowCardinality(String)) "
        "ENGINE = MergeTree ORDER BY id",
    )
    (tmp_path / "metadata").write_text(json.dumps({"id": "a-query-of-this-test"}) + "\n")
    batch = sp.sql(
        "SELECT id, timestamp_micros(1700000000000000 + id * 1000001) AS ts, id / 4 AS amount, "
        "concat('n', id) AS name FROM range(1000)"
    )
    fn = clickhouse_tx_batch(
        url=clickhouse_url,
        table="typed",
        database=database,
        app_id="typed",
        checkpoint_location=str(tmp_path),
        allow_nullable_into_non_nullable=True,
        batch_size=128,
        **credentials.writer_options(),
    )
    fn(batch, 0)
    row = read_committed(
        clickhouse_url,
        f"SELECT count(), sum(id), min(ts), max(ts), sum(amount), uniqExact(name) FROM `{database}`.typed",
    )[0]
    assert row == ["1000", "499500", "2023-11-14 22:13:20", "2023-11-14 22:29:59", "124875", "1000"]


def test_a_run_reads_the_key_table_for_its_first_batch_only_and_a_restart_of_the_same_function_reads_it_again(
    sp, clickhouse_url: str, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark replays at most a run's first batch; the later ones are new (foreach_query).
    create_events_table(clickhouse_url, database, "events", "transaction")
    reads: list[int] = []
    real = BatchRecords.recorded
    monkeypatch.setattr(BatchRecords, "recorded", lambda self, key: reads.append(key.batch_id) or real(self, key))
    src, chk, fn = json_files(tmp_path), tmp_path / "chk", single_helper(clickhouse_url, database)
    run_stream(sp, src, chk, fn)
    assert reads == [0]
    forget_last_commit(chk)
    run_stream(sp, src, chk, fn)  # another run of the same function object: batch 2 is read, and skipped
    assert reads == [0, 2]
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert len(key_rows(clickhouse_url, database)) == FILES


def test_a_table_altered_between_two_runs_of_one_function_is_checked_again_at_the_restart(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    src, chk, fn = json_files(tmp_path), tmp_path / "chk", single_helper(clickhouse_url, database)
    run_stream(sp, src, chk, fn)
    run_sql(clickhouse_url, f"ALTER TABLE `{database}`.events MODIFY COLUMN k Int8")
    rows = ({"id": i, "k": i % 1000, "s": f"r{i}"} for i in range(N, N + PER_FILE))
    (src / f"part-{FILES}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = failed_stream(sp, src, chk, fn)  # k up to 399 does not fit Int8: named, nothing written
    assert "of column `k`" in text and "does not fit ClickHouse type Int8" in text, text
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == N
