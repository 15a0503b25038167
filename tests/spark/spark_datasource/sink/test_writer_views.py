"""Batch writes through ``df.write.format("clickhouse_tx")`` into a target with a chain of two views."""

from __future__ import annotations

import pytest

from tests.helpers.spark_writes import create_events_table, events, scalar, writer_options
from tests.helpers.views import add_rollup_views, assert_views_count_once


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup"])
def test_a_batch_job_counts_each_row_once_in_both_views_of_a_chain(
    sp, clickhouse_url: str, database: str, mode: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    add_rollup_views(clickhouse_url, database, "k % 3")
    opts = writer_options(clickhouse_url, database, "events", mode)
    events(sp, 3000, 3).write.format("clickhouse_tx").options(**opts).mode("append").save()
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 3000
    per_key = {r: sum(1 for i in range(3000) if i % 1000 % 3 == r) for r in range(3)}  # k = id % 1000
    assert_views_count_once(clickhouse_url, database, per_key)


def test_a_dedup_job_into_views_without_a_window_is_refused_on_the_driver_and_writes_nothing(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "dedup")
    add_rollup_views(clickhouse_url, database, "k % 3", window=False)
    opts = writer_options(clickhouse_url, database, "events", "dedup")
    with pytest.raises(Exception, match="events_by_key_mv") as e:
        events(sp, 3000, 3).write.format("clickhouse_tx").options(**opts).mode("append").save()
    assert "'transaction' and 'staging'" in str(e.value)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 0
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events_by_key") == 0
