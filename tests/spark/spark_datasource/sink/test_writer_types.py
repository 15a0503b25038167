"""The README's first write: Spark's types into an ordinary ClickHouse table.

``id long, name string, amount double, ts timestamp`` (every derived column nullable,
microsecond timestamps) into ``(id UInt64, name String, amount Float64, ts DateTime)``.
Before values were checked one by one, the driver refused this table outright
(``int64 into UInt64``, ``nullable data into non-Nullable String``, ``timestamp into
DateTime``). Now the values that fit land exactly and one that does not fails the
job, naming the column and the value, with nothing written.
"""

from __future__ import annotations

import pytest

from spark_datasource.testing.credentials import writer_options
from tests.helpers.spark_writes import open_registry_entries, read_committed, run_sql

README_TABLE = "(id UInt64, name String, amount Float64, ts DateTime) ENGINE = MergeTree ORDER BY id"


@pytest.fixture(scope="module")
def sp(spark):
    import spark_datasource

    spark_datasource.register(spark)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def _frame(sp, first_id: int = 0):
    # Derived columns as a real job has them (from a join, a CASE, a parsed file):
    # declared nullable though none is null, ts with microseconds.
    return sp.range(first_id, first_id + 1000, 1, 2).selectExpr(
        "id",
        "if(id > -1000, concat('n', cast(id as string)), null) as name",
        "if(id > -1000, id / 4, null) as amount",
        "if(id > -1000, timestamp_micros(1700000000000000 + id * 1000001), null) as ts",
    )


def test_the_readme_table_with_uint64_and_datetime_takes_a_spark_frame_exactly(
    sp, clickhouse_url: str, database: str
) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.events {README_TABLE}")
    df = _frame(sp)
    assert [f.nullable for f in df.schema.fields] == [False, True, True, True]
    (
        df.write.format("clickhouse_tx")
        .option("url", clickhouse_url)
        .options(**writer_options())
        .option("database", database)
        .option("table", "events")
        .mode("append")
        .save()
    )

    got = read_committed(
        clickhouse_url, f"SELECT id, name, amount, toUnixTimestamp(ts) FROM `{database}`.events ORDER BY id"
    )
    assert len(got) == 1000
    for i, (id_, name, amount, ts) in enumerate(got):
        micros = 1700000000000000 + i * 1000001
        assert (int(id_), name, float(amount)) == (i, f"n{i}", i / 4)
        assert int(ts) == micros // 1_000_000  # sub-second digits truncated toward the past


def test_a_value_that_does_not_fit_fails_the_job_naming_it_and_nothing_is_written(
    sp, clickhouse_url: str, database: str
) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.events {README_TABLE}")
    df = _frame(sp, first_id=-3)  # ids -3..996: three negatives into UInt64
    with pytest.raises(Exception) as info:
        (
            df.write.format("clickhouse_tx")
            .option("url", clickhouse_url)
            .options(**writer_options())
            .option("database", database)
            .option("table", "events")
            .mode("append")
            .save()
        )
    msg = str(info.value)
    assert f"{database}.events: value -3 of column `id` at row 0 of this partition" in msg
    assert "does not fit ClickHouse type UInt64" in msg and "ValueDoesNotFitError" in msg
    assert read_committed(clickhouse_url, f"SELECT count() FROM `{database}`.events") == [["0"]]
    assert open_registry_entries(clickhouse_url, database) == 0


def test_strict_precision_refuses_sub_second_digits_a_datetime_cannot_hold(
    sp, clickhouse_url: str, database: str
) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.events {README_TABLE}")
    with pytest.raises(Exception) as info:
        (
            _frame(sp)
            .write.format("clickhouse_tx")
            .option("url", clickhouse_url)
            .options(**writer_options())
            .option("database", database)
            .option("table", "events")
            .option("strict_precision", "true")
            .mode("append")
            .save()
        )
    assert "column `ts`" in str(info.value) and "strict_precision=true" in str(info.value)
    assert read_committed(clickhouse_url, f"SELECT count() FROM `{database}`.events") == [["0"]]


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup"])
def test_bad_rows_dead_letter_writes_the_rows_that_do_not_fit_aside_and_counts_them(
    sp, clickhouse_url: str, database: str, tmp_path, mode: str
) -> None:
    from spark_datasource.sink.metrics import read_metrics

    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.events {README_TABLE}")
    if mode == "dedup":
        run_sql(
            clickhouse_url, f"ALTER TABLE `{database}`.events MODIFY SETTING non_replicated_deduplication_window = 1000"
        )
    (
        _frame(sp, first_id=-3)
        .write.format("clickhouse_tx")
        .option("url", clickhouse_url)
        .options(**writer_options())
        .option("mode", mode)
        .option("database", database)
        .option("table", "events")
        .option("bad_rows", "dead_letter")
        .option("dead_letter_table", "events_dlq")
        .option("decision_log", str(tmp_path / "log"))
        .mode("append")
        .save()
    )
    assert read_committed(clickhouse_url, f"SELECT count(), min(id) FROM `{database}`.events") == [["997", "0"]]
    letters = read_committed(
        clickhouse_url, f"SELECT `row`, `column`, row_json FROM `{database}`.events_dlq ORDER BY `row`"
    )
    assert [(r, c) for r, c, _ in letters] == [("0", "id"), ("1", "id"), ("2", "id")]
    assert letters[0][2].startswith('{"amount": -0.75, "id": -3, "name": "n-3", "ts": "2023-11-14 22:13:16')
    assert [m["dead_letters"] for m in read_metrics(str(tmp_path / "log"))] == [3]
