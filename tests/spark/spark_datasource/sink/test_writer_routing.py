"""Multi-table routing (``table_column`` + ``tables``) on a real local Spark and stack.

Each row goes to the table its routing column names; all tables of a partition are
written in the partition's one ClickHouse transaction. Every read of a target is
read-committed (``implicit_transaction = 1``).
"""

from __future__ import annotations

import pytest

from tests.helpers.spark_writes import open_registry_entries, read_committed, run_sql, scalar, writer_options

N = 10_000


@pytest.fixture
def two_tables(clickhouse_url: str, database: str) -> tuple[str, str]:
    for name in ("a", "b"):
        run_sql(
            clickhouse_url,
            f"CREATE TABLE `{database}`.`{name}` (id Int64, k Int32, s String) ENGINE = MergeTree ORDER BY id",
        )
    return "a", "b"


def routed_frame(sp, database: str, n: int, bad_id: int | None = None):
    """ids 0..n-1 in 2 partitions; id % 3 == 0 -> ``a`` (bare name), else ``<db>.b``.

    With ``bad_id``, that one row names table ``c`` (not listed in ``tables``).
    """
    bad = f"WHEN id = {bad_id} THEN 'c' " if bad_id is not None else ""
    return sp.range(0, n, 1, 2).selectExpr(
        "id",
        "cast(id % 1000 as int) as k",
        "concat('r', cast(id as string)) as s",
        f"CASE {bad}WHEN id % 3 = 0 THEN 'a' ELSE '{database}.b' END as dest",
    )


def totals(url: str, database: str, table: str) -> tuple[int, int, int, int]:
    row = read_committed(url, f"SELECT count(), sum(id), sum(k), sum(length(s)) FROM `{database}`.`{table}`")[0]
    return tuple(int(x) for x in row)  # type: ignore[return-value]


def expected(ids: list[int]) -> tuple[int, int, int, int]:
    return (len(ids), sum(ids), sum(i % 1000 for i in ids), sum(1 + len(str(i)) for i in ids))


def test_rows_are_routed_to_the_table_their_column_names_exactly_once_without_the_column(
    sp, clickhouse_url: str, database: str, two_tables: tuple[str, str]
) -> None:
    opts = writer_options(clickhouse_url, database, "a", "transaction", table_column="dest", tables=f"a, {database}.b")
    routed_frame(sp, database, N).write.format("clickhouse_tx").options(**opts).mode("append").save()

    assert totals(clickhouse_url, database, "a") == expected([i for i in range(N) if i % 3 == 0])
    assert totals(clickhouse_url, database, "b") == expected([i for i in range(N) if i % 3 != 0])
    for table in two_tables:
        cols = run_sql(
            clickhouse_url,
            f"SELECT name FROM system.columns WHERE database = '{database}' "
            f"AND table = '{table}' ORDER BY position FORMAT TSV",
        ).split()
        assert cols == ["id", "k", "s"]
    # one marker per partition (one xid spans both tables), counting the rows of both
    assert read_committed(clickhouse_url, f"SELECT count(), sum(rows) FROM `{database}`.clickhouse_tx_commits") == [
        ["2", str(N)]
    ]
    assert open_registry_entries(clickhouse_url, database) == 0


def test_a_row_naming_an_unlisted_table_fails_the_job_and_no_table_gets_any_row(
    sp, clickhouse_url: str, database: str, two_tables: tuple[str, str]
) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.c (id Int64, k Int32, s String) ENGINE = MergeTree ORDER BY id")
    opts = writer_options(clickhouse_url, database, "a", "transaction", table_column="dest", tables=f"a,{database}.b")
    with pytest.raises(Exception) as info:
        routed_frame(sp, database, N, bad_id=N - 7).write.format("clickhouse_tx").options(**opts).mode("append").save()
    assert "names table 'c', which is not in the option tables" in str(info.value)
    for table in ("a", "b", "c"):
        assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.`{table}`") == 0
    assert open_registry_entries(clickhouse_url, database) == 0


def test_routing_in_staging_mode_is_refused_before_any_write(
    sp, clickhouse_url: str, database: str, two_tables: tuple[str, str]
) -> None:
    opts = writer_options(clickhouse_url, database, "a", "staging", table_column="dest", tables=f"a,{database}.b")
    with pytest.raises(Exception) as info:
        routed_frame(sp, database, 100).write.format("clickhouse_tx").options(**opts).mode("append").save()
    assert "mode='staging'" in str(info.value) and "mode 'transaction' only" in str(info.value)
    for table in two_tables:
        assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.`{table}`") == 0
    names = run_sql(clickhouse_url, f"SELECT name FROM system.tables WHERE database = '{database}' FORMAT TSV").split()
    assert "clickhouse_tx_registry" not in names and "clickhouse_tx_commits" not in names
