"""Keys of the ``foreachBatch`` helper that mean what they say (issue #58), with a real
SparkSession and the embedded stack: two helper functions of one ``app_id`` called in one
micro-batch write both tables once, a replay or a restart after a failure between the two
calls writes none of it twice; mode ``dedup`` keeps rows equal in an array column, and
refuses a replay whose sums of doubles came out otherwise instead of writing it twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import functions as F

from spark_datasource.foreach.helper import clickhouse_tx_batch
from spark_datasource.testing import credentials
from tests.helpers.foreach_files import (
    FILES,
    PER_FILE,
    N,
    failed_stream,
    forget_last_commit,
    json_files,
    lose_last_key_row,
    run_stream,
)
from tests.helpers.spark_writes import actual_totals, create_events_table, expected_totals, read_committed, run_sql


def _helper(url: str, database: str, table: str, **extra: Any) -> Callable[[Any, int], None]:
    options = {"allow_nullable_into_non_nullable": True, **credentials.writer_options(), **extra}
    return clickhouse_tx_batch(url=url, table=f"{database}.{table}", app_id="shared", **options)


def _two_helpers(url: str, database: str, stop_in: int | None = None, **extra: Any) -> Callable[[Any, int], None]:
    """One ``foreachBatch`` function calling two helpers of one ``app_id``: every row into
    ``a`` and into ``b``. ``stop_in``: the batch where the function fails between the calls."""
    into_a, into_b = _helper(url, database, "a", **extra), _helper(url, database, "b", **extra)

    def write(df: Any, batch_id: int) -> None:
        into_a(df, batch_id)
        if batch_id == stop_in:
            raise RuntimeError("the driver stops between the two helpers")
        into_b(df, batch_id)

    return write


def _keys(url: str, database: str) -> list[list[str]]:
    return read_committed(url, f"SELECT batch_id, tables, rows FROM `{database}`.clickhouse_tx_batches ORDER BY ALL")


def test_two_helpers_of_one_app_id_in_one_micro_batch_write_both_tables_once_and_a_replay_writes_nothing_more(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    for t in ("a", "b"):
        create_events_table(clickhouse_url, database, t, "transaction")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    run_stream(sp, src, chk, _two_helpers(clickhouse_url, database))
    expected_keys = [[str(b), f"['{database}.{t}']", str(PER_FILE)] for b in range(FILES) for t in ("a", "b")]
    for t in ("a", "b"):
        assert actual_totals(clickhouse_url, database, t) == expected_totals(N), t
    assert _keys(clickhouse_url, database) == expected_keys
    forget_last_commit(chk)
    run_stream(sp, src, chk, _two_helpers(clickhouse_url, database))
    for t in ("a", "b"):
        assert actual_totals(clickhouse_url, database, t) == expected_totals(N), t
    assert _keys(clickhouse_url, database) == expected_keys


def test_a_stop_between_the_two_helpers_then_a_restart_leaves_each_tables_rows_once(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    for t in ("a", "b"):
        create_events_table(clickhouse_url, database, t, "dedup")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    for mode in ("transaction", "dedup"):
        failed_stream(sp, src, chk, _two_helpers(clickhouse_url, database, stop_in=1, mode=mode))
        assert actual_totals(clickhouse_url, database, "b")[0] == PER_FILE  # batch 0 only
        run_stream(sp, src, chk, _two_helpers(clickhouse_url, database, mode=mode))
        for t in ("a", "b"):
            assert actual_totals(clickhouse_url, database, t) == expected_totals(N), (mode, t)
        assert len(_keys(clickhouse_url, database)) == 2 * FILES
        for t in ("a", "b", "clickhouse_tx_batches"):
            run_sql(clickhouse_url, f"TRUNCATE TABLE `{database}`.`{t}`")
        chk = tmp_path / "chk-dedup"


def test_one_table_written_twice_under_one_key_in_a_micro_batch_is_refused_naming_app_id_and_the_context(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "a", "transaction")
    into_a = _helper(clickhouse_url, database, "a")

    def twice(df: Any, batch_id: int) -> None:
        into_a(df.where("id % 2 = 0"), batch_id)
        into_a(df.where("id % 2 = 1"), batch_id)

    text = failed_stream(sp, json_files(tmp_path), tmp_path / "chk", twice)
    assert "app_id='shared'" in text and "clickhouse_tx_transaction" in text


def test_in_mode_dedup_equal_rows_with_an_array_column_are_written_and_a_reordered_replay_adds_none(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    run_sql(
        clickhouse_url,
        f"CREATE TABLE `{database}`.tags (id UInt64, tags Array(String)) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 1000",
    )
    src, chk = tmp_path / "src", tmp_path / "chk"
    src.mkdir()
    rows = [{"id": 1, "tags": ["a"]}, {"id": 1, "tags": ["a"]}, {"id": 2, "tags": ["b"]}, {"id": 1, "tags": ["c"]}]
    (src / "part-0.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    helper = _helper(clickhouse_url, database, "tags", mode="dedup")
    stream = sp.readStream.schema("id long, tags array<string>").json(str(src))

    def run(fn: Callable[[Any, int], None]) -> None:
        q = (
            stream.writeStream.foreachBatch(fn)
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(600)
        assert q.exception() is None

    run(lambda df, batch_id: helper(df.repartition(1), batch_id))
    select = f"SELECT id, tags FROM `{database}`.tags ORDER BY id, tags"
    once = read_committed(clickhouse_url, select)
    assert once == [["1", "['a']"], ["1", "['a']"], ["1", "['c']"], ["2", "['b']"]]
    # A driver killed before the key row: no key row, Spark's commit log without the batch.
    run_sql(clickhouse_url, f"TRUNCATE TABLE `{database}`.clickhouse_tx_batches")
    for name in ("0", ".0.crc"):
        (chk / "commits" / name).unlink(missing_ok=True)
    run(lambda df, batch_id: helper(df.repartition(3).orderBy("tags", ascending=False), batch_id))
    assert read_committed(clickhouse_url, select) == once


def _sums(df: Any, ascending: bool) -> Any:
    """``groupBy(k).agg(sum(x))`` over doubles, the rows added in ascending or descending order
    of ``x``: what two runs of a shuffle may do. Spark keeps the sort below a double sum (it
    knows the sum depends on the order)."""
    doubles = df.select((F.col("id") % 3).alias("k"), (F.col("id") / 7).alias("x")).repartition(1)
    order = F.col("x").asc() if ascending else F.col("x").desc()
    return doubles.sortWithinPartitions(order).groupBy("k").agg(F.sum("x").alias("total"))


def _python_sums(batch: int, ascending: bool) -> dict[int, float]:
    """What :func:`_sums` gives for ``batch``'s file, added in the same order."""
    out = {}
    for k in range(3):
        xs = sorted(i / 7 for i in range(batch * PER_FILE, (batch + 1) * PER_FILE) if i % 3 == k)
        total = 0.0
        for x in xs if ascending else reversed(xs):
            total += x
        out[k] = total
    return out


def test_in_mode_dedup_a_replay_whose_double_sums_differ_is_refused_naming_the_cause_and_never_written_twice(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    last = FILES - 1
    first, other = _python_sums(last, ascending=True), _python_sums(last, ascending=False)
    assert first != other  # the data makes the addition order show in the last bits
    run_sql(
        clickhouse_url,
        f"CREATE TABLE `{database}`.sums (k Int64, total Float64) ENGINE = MergeTree ORDER BY k "
        "SETTINGS non_replicated_deduplication_window = 1000",
    )
    helper = _helper(clickhouse_url, database, "sums", mode="dedup")
    src, chk = json_files(tmp_path), tmp_path / "chk"
    run_stream(sp, src, chk, lambda df, batch_id: helper(_sums(df, ascending=True), batch_id))
    select = f"SELECT k, total FROM `{database}`.sums ORDER BY total"
    written = read_committed(clickhouse_url, select)
    assert len(written) == 3 * FILES
    assert set(first.values()) <= {float(t) for _, t in written}

    # The driver killed after batch 2's rows went in, before its key row; the replay adds
    # the doubles in the other order.
    lose_last_key_row(clickhouse_url, database, chk)
    text = failed_stream(sp, src, chk, lambda df, batch_id: helper(_sums(df, ascending=False), batch_id))
    for part in (f"{database}.sums", "app_id='shared'", f"batch {last}", "first attempt 3 rows", "this replay 3 rows"):
        assert part in text, part
    assert "sum in the plan" in text and "mode 'transaction'" in text and "new app_id" in text
    assert read_committed(clickhouse_url, select) == written  # the first attempt's rows, once

    # The same rows in another order and partitioning: the replay completes the batch, adding nothing.
    def same_rows(df: Any, batch_id: int) -> None:
        helper(_sums(df, ascending=True).repartition(3).orderBy(F.desc("k")), batch_id)

    run_stream(sp, src, chk, same_rows)
    assert read_committed(clickhouse_url, select) == written
    assert [r[0] for r in _keys(clickhouse_url, database)] == [str(b) for b in range(FILES)]
