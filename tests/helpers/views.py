"""A chain of two materialized views on a test target, and what their tables hold.

``target -> <target>_by_key_mv -> <target>_by_key -> <target>_total_mv -> <target>_total``:
a SummingMergeTree rollup of the rows per key, and a second view summing the rollup
into one total. Exactly once means both tables count every source row once.
"""

from __future__ import annotations

from tests.helpers.spark_writes import run_sql, scalar


def add_rollup_views(url: str, database: str, key: str, *, table: str = "events", window: bool = True) -> None:
    """The two views (and their tables) on ``database.table``; ``key``: the rollup's key expression.

    ``window``: the views' tables keep a deduplication window (mode ``dedup`` needs it).
    """
    settings = " SETTINGS non_replicated_deduplication_window = 1000" if window else ""
    db = f"`{database}`"
    run_sql(url, f"CREATE TABLE {db}.{table}_by_key (k Int64, n UInt64) ENGINE = SummingMergeTree ORDER BY k{settings}")
    run_sql(
        url,
        f"CREATE MATERIALIZED VIEW {db}.{table}_by_key_mv TO {db}.{table}_by_key AS "
        f"SELECT toInt64({key}) AS k, count() AS n FROM {db}.{table} GROUP BY k",
    )
    run_sql(url, f"CREATE TABLE {db}.{table}_total (n UInt64) ENGINE = SummingMergeTree ORDER BY tuple(){settings}")
    run_sql(
        url,
        f"CREATE MATERIALIZED VIEW {db}.{table}_total_mv TO {db}.{table}_total AS "
        f"SELECT sum(n) AS n FROM {db}.{table}_by_key",
    )


def view_counts(url: str, database: str, table: str = "events") -> dict[int, int]:
    """Rows per key that the rollup view counted (read-committed)."""
    from tests.helpers.spark_writes import read_committed

    rows = read_committed(url, f"SELECT k, sum(n) FROM `{database}`.{table}_by_key GROUP BY k ORDER BY k")
    return {int(k): int(n) for k, n in rows}


def view_total(url: str, database: str, table: str = "events") -> int:
    """The total the second view of the chain counted (read-committed)."""
    return scalar(url, f"SELECT sum(n) FROM `{database}`.{table}_total")


def assert_views_count_once(url: str, database: str, per_key: dict[int, int], table: str = "events") -> None:
    """Both views' tables count each key's rows exactly as ``per_key`` says."""
    counts = view_counts(url, database, table)
    assert counts == per_key, f"the rollup view counted {counts}, the source has {per_key}"
    total = view_total(url, database, table)
    assert total == sum(per_key.values()), f"the chained view counted {total}, the source has {sum(per_key.values())}"
