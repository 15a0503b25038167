"""The dedup window check counts what ClickHouse's window counts, per engine.

A non-replicated MergeTree numbers its blocks with one counter for the table; a
Replicated (or Shared) MergeTree numbers them per partition, while its window keeps the
newest block hashes of the whole table, and drops them by age too. Part names here are
ClickHouse's: ``<partition_id>_<min_block>_<max_block>_<level>[_<mutation>]``.
"""

from __future__ import annotations

import json
from typing import Iterable

import pytest

from clickhouse_tx.errors import DedupWindowError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.dedup.window import (
    BlockPoint,
    WindowSettings,
    blocks_since,
    check_window,
    count_since,
    earliest,
    earliest_first_points,
    points_from_details,
    points_to_details,
    window_problem,
)

TARGET = Target(url="http://ch:8123", database="db", table="events")
REPLICATED = WindowSettings(replicated=True, blocks=100, seconds=3600)
PLAIN = WindowSettings(replicated=False, blocks=100)


def highest_per_partition(part_names: Iterable[str]) -> dict[str, int]:
    """What the check reads from ``system.parts`` (partition id -> highest max block), from part names."""
    out: dict[str, int] = {}
    for name in part_names:
        pid, _min_block, max_block, *_level = name.split("_")
        out[pid] = max(out.get(pid, -1), int(max_block))
    return out


def replicated(part_names: Iterable[str], at_ms: int = 0) -> BlockPoint:
    parts = highest_per_partition(part_names)
    return BlockPoint(max(parts.values(), default=0), parts, at_ms)


def test_replicated_blocks_are_summed_over_partitions_not_taken_from_the_highest_number() -> None:
    then = ["202401_0_0_0", "202402_0_5_1", "all_3_3_0"]
    # Three inserts into 202401 (blocks 1..3) and one into a new partition (block 0):
    # the table's highest number (5, in 202402) did not move, yet four hashes went in.
    now = then + ["202401_1_1_0", "202401_2_2_0", "202401_3_3_0", "202403_0_0_0"]
    assert blocks_since(highest_per_partition(then), highest_per_partition(now)) == 4
    assert count_since(replicated(then), replicated(now)) == 4
    assert replicated(now).top - replicated(then).top == 0  # what the table-wide reading saw


def test_a_merge_of_replicated_parts_allocates_no_block_and_counts_nothing() -> None:
    then = ["202402_0_5_1", "202402_6_6_0", "202402_7_7_0"]
    now = ["202402_0_7_2"]  # the three merged: same highest block
    assert count_since(replicated(then), replicated(now)) == 0


def test_a_mutated_replicated_part_name_with_its_version_is_read_by_its_max_block() -> None:
    assert highest_per_partition(["202402_0_5_1_9", "all_3_3_0_4"]) == {"202402": 5, "all": 3}
    assert count_since(replicated(["all_3_3_0"]), replicated(["all_3_3_0_4", "all_4_4_0"])) == 1


def test_a_replicated_partition_dropped_since_the_point_counts_nothing_and_never_negative() -> None:
    then = ["202401_0_9_2", "202402_0_5_1"]
    now = ["202402_0_5_1", "202402_6_6_0"]
    assert count_since(replicated(then), replicated(now)) == 1


def test_a_non_replicated_table_is_counted_by_its_single_counter_as_before() -> None:
    # One counter for the table: parts of any partition take the next number.
    then = BlockPoint(highest_per_partition(["1_1_1_0", "2_2_2_0", "3_3_3_0"])["3"])
    now = BlockPoint(7)  # blocks 4..7, wherever they went
    assert count_since(then, now) == 4
    assert window_problem(then, now, PLAIN, TARGET) is None
    assert window_problem(then, BlockPoint(103), PLAIN, TARGET) is not None


def test_a_full_replicated_window_is_refused_naming_the_replicated_setting() -> None:
    then = replicated(["a_0_0_0", "b_0_0_0"])
    now = replicated(["a_0_59_3", "b_0_40_2"])  # 59 + 40 = 99 blocks since: still held
    assert window_problem(then, now, REPLICATED, TARGET) is None
    now = replicated(["a_0_60_3", "b_0_40_2"])
    with pytest.raises(DedupWindowError, match=r"100 parts .* dedup window holds 100") as err:
        check_window(then, now, REPLICATED, TARGET, "x1")
    assert "MODIFY SETTING replicated_deduplication_window = 1000" in str(err.value)
    assert "non_replicated" not in str(err.value)


def test_a_replicated_window_that_may_have_expired_by_age_is_refused_not_claimed_safe() -> None:
    then = replicated(["all_0_0_0"], at_ms=1_000_000)
    young = replicated(["all_0_1_1"], at_ms=1_000_000 + 3_000_000)  # 3000 s of 3600
    assert window_problem(then, young, REPLICATED, TARGET) is None
    old = replicated(["all_0_1_1"], at_ms=1_000_000 + 3_300_000)  # past 90% of the age bound
    problem = window_problem(then, old, REPLICATED, TARGET)
    assert problem is not None and "replicated_deduplication_window_seconds = 3600" in problem
    assert "3300 s passed" in problem


def test_a_non_replicated_window_has_no_age_bound() -> None:
    then, now = BlockPoint(5, None, 0), BlockPoint(6, None, 10**9)
    assert window_problem(then, now, PLAIN, TARGET) is None


def test_a_point_of_an_earlier_version_is_counted_by_the_highest_number_and_not_aged() -> None:
    legacy = BlockPoint.from_details(7)
    assert legacy == BlockPoint(7)
    assert count_since(legacy, replicated(["a_0_9_1", "b_0_2_0"], at_ms=10**12)) == 2
    assert window_problem(legacy, replicated(["a_0_9_1"], at_ms=10**12), REPLICATED, TARGET) is None


def test_points_survive_the_json_of_prepared_details_and_a_non_replicated_one_stays_a_number() -> None:
    views = {"db.mv": replicated(["202401_0_3_1", "all_2_2_0"], at_ms=42), "db.plain": BlockPoint(9)}
    back = points_from_details(json.loads(json.dumps(points_to_details(views))))
    assert back == views
    assert points_to_details({"db.plain": BlockPoint(9)}) == {"db.plain": 9}


def test_the_earliest_of_a_batchs_points_is_no_later_per_partition_and_in_time() -> None:
    a = replicated(["p1_0_4_1", "p2_0_2_1"], at_ms=200)
    b = replicated(["p1_0_6_1", "p2_0_1_0", "p3_0_0_0"], at_ms=100)
    first = earliest([a, b])
    assert first.partitions == {"p1": 4, "p2": 1} and first.at_ms == 100
    now = replicated(["p1_0_7_2", "p2_0_2_1", "p3_0_1_1"])
    assert count_since(first, now) >= max(count_since(a, now), count_since(b, now))
    assert earliest([BlockPoint(5), BlockPoint(3)]) == BlockPoint(3)


def test_a_batch_is_checked_together_from_its_partitions_earliest_points_of_target_and_views() -> None:
    a = {"first_block": replicated(["p_0_4_1"], at_ms=20).to_details(), "first_view_blocks": {"db.mv": 3}}
    b = {"first_block": replicated(["p_0_2_1"], at_ms=30).to_details(), "first_view_blocks": {"db.mv": 1}}
    empty: dict[str, object] = {"first_block": None, "first_view_blocks": {}}  # a partition that inserted nothing
    first, views = earliest_first_points([a, b, empty])
    assert first == BlockPoint(2, {"p": 2}, 20) and views == {"db.mv": BlockPoint(1)}
    assert earliest_first_points([empty]) == (None, {})
