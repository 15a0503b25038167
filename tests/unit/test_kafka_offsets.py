"""Offset planning of the ``kafka_py`` source, with scripted offsets (no broker, no Spark).

:mod:`spark_datasource.kafka.offsets` is pure; what it decides is checked here with
plain dicts. The same planning read through the dev broker and a SparkSession is in
``tests/spark/test_kafka_reader.py`` and ``tests/spark/test_kafka_spark_options.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.errors import KafkaDataLossError
from spark_datasource.kafka.offsets import (
    KafkaOffsetRange,
    KafkaRangeGroup,
    group_ranges,
    limit_offsets,
    partition_count,
    place_timestamps,
    plan_end_offsets,
    plan_partitions,
    plan_ranges,
    resolve_bound,
    resolve_offsets,
    to_json_offsets,
)
from spark_datasource.kafka.options import KafkaOptions, parse_kafka_options

BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def _opts(**options: str) -> KafkaOptions:
    return parse_kafka_options({**BASE, **options})


def test_the_planning_and_the_executor_read_import_no_pyspark() -> None:
    code = (
        "import sys\n"
        "import spark_datasource.kafka.offsets, spark_datasource.kafka.fetch\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'pandas')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------ micro-batch ends


def test_offsets_serialise_in_a_fixed_order_whatever_the_insertion_order() -> None:
    a = to_json_offsets({("b", 10): 1, ("a", 2): 5, ("b", 2): 3})
    b = to_json_offsets({("b", 2): 3, ("a", 2): 5, ("b", 10): 1})
    assert json.dumps(a) == json.dumps(b) == '{"a": {"2": 5}, "b": {"2": 3, "10": 1}}'


def test_the_trigger_limit_caps_the_total_and_shares_it_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 7}
    end = limit_offsets(start, latest, 100)
    advance = {tp: end[tp] - start[tp] for tp in start}
    assert sum(advance.values()) == 100
    assert advance == {("t", 0): 90, ("t", 1): 10, ("t", 2): 0}
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)
    assert limit_offsets(start, latest, 10_000) == latest


def test_a_tiny_limit_still_makes_progress_and_never_overshoots() -> None:
    start = {("t", p): 0 for p in range(5)}
    latest = {("t", p): 3 for p in range(5)}
    end = limit_offsets(start, latest, 1)
    assert sum(end.values()) == 1


def test_a_new_partition_enters_at_its_earliest_offset_with_an_empty_first_range() -> None:
    start = {("t", 0): 5}
    latest = {("t", 0): 9, ("t", 1): 4}
    end = plan_end_offsets(start, latest, {("t", 1): 0}, None, True)
    assert end == {("t", 0): 9, ("t", 1): 0}
    assert plan_ranges(start, end, None, True) == [KafkaOffsetRange("t", 0, 5, 9)]
    # Next trigger: the new partition is read from its earliest offset.
    end2 = plan_end_offsets(end, latest, {}, None, True)
    assert plan_ranges(end, end2, None, True) == [KafkaOffsetRange("t", 1, 0, 4)]


def test_an_added_partition_whose_first_records_were_deleted_is_data_loss_like_spark() -> None:
    start = {("t", 0): 5}
    latest = {("t", 0): 9, ("t", 1): 40}
    with pytest.raises(KafkaDataLossError, match=r"t\[1\] starts at 12.*failOnDataLoss"):
        plan_end_offsets(start, latest, {("t", 1): 12}, None, True)
    assert plan_end_offsets(start, latest, {("t", 1): 12}, None, False) == {("t", 0): 9, ("t", 1): 12}


def test_a_vanished_partition_is_data_loss_unless_failondataloss_is_false() -> None:
    start = {("t", 0): 5, ("gone", 0): 3}
    latest = {("t", 0): 6}
    with pytest.raises(KafkaDataLossError, match=r"gone\[0\].*failOnDataLoss"):
        plan_end_offsets(start, latest, {}, None, True)
    assert plan_end_offsets(start, latest, {}, None, False) == {("t", 0): 6}


def test_an_end_below_the_start_is_data_loss_unless_failondataloss_is_false() -> None:
    with pytest.raises(KafkaDataLossError, match="below the checkpointed offset"):
        plan_ranges({("t", 0): 10}, {("t", 0): 4}, None, True)
    assert plan_ranges({("t", 0): 10}, {("t", 0): 4}, None, False) == []


def test_min_partitions_splits_ranges_into_contiguous_pieces_covering_them_exactly() -> None:
    start = {("t", 0): 0, ("t", 1): 10}
    end = {("t", 0): 300, ("t", 1): 110}
    ranges = plan_ranges(start, end, 8, True)
    assert len(ranges) >= 8
    for tp in start:
        pieces = [r for r in ranges if (r.topic, r.partition) == tp]
        assert pieces[0].start == start[tp] and pieces[-1].end == end[tp]
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    assert plan_ranges(start, end, 8, True) == ranges  # deterministic
    assert len(plan_ranges(start, end, 2, True)) == 2  # enough partitions already


def test_an_empty_batch_plans_no_partitions() -> None:
    assert plan_ranges({("t", 0): 4}, {("t", 0): 4}, None, True) == []


# ------------------------------------------------------------------ where a read starts


def test_explicit_starting_offsets_must_cover_exactly_the_partitions_read() -> None:
    tps = [("a", 0), ("a", 1)]
    earliest, latest = {("a", 0): 2, ("a", 1): 0}, {("a", 0): 9, ("a", 1): 5}
    assert resolve_offsets(((("a", 0), -2), (("a", 1), -1)), tps, earliest, latest, "startingOffsets") == {
        ("a", 0): 2,
        ("a", 1): 5,
    }
    with pytest.raises(ConfigurationError, match=r"'startingOffsets' leaves out a\[1\]"):
        resolve_offsets(((("a", 0), 3),), tps, earliest, latest, "startingOffsets")
    with pytest.raises(ConfigurationError, match=r"'endingOffsets' names b\[0\]"):
        resolve_offsets(((("a", 0), 3), (("a", 1), 3), (("b", 0), 1)), tps, earliest, latest, "endingOffsets")


def test_a_starting_timestamp_with_no_match_fails_or_starts_at_latest_and_an_ending_one_ends_at_latest() -> None:
    found = {("t", 0): 4, ("t", 1): None}
    latest = {("t", 0): 9, ("t", 1): 12}
    strict = parse_kafka_options({**BASE, "startingTimestamp": "100"})
    with pytest.raises(ConfigurationError, match=r"'startingTimestamp': no record of t\[1\].*Strategy=latest"):
        place_timestamps(found, latest, strict, starting=True)
    lenient = parse_kafka_options({**BASE, "startingTimestamp": "100", "startingOffsetsByTimestampStrategy": "LATEST"})
    assert place_timestamps(found, latest, lenient, starting=True) == {("t", 0): 4, ("t", 1): 12}
    assert place_timestamps(found, latest, strict, starting=False) == {("t", 0): 4, ("t", 1): 12}


def test_a_timestamp_bound_is_looked_up_for_the_partitions_read_and_an_offset_bound_is_never_looked_up() -> None:
    tps = [("t", 0), ("t", 1)]
    earliest, latest = {("t", 0): 0, ("t", 1): 3}, {("t", 0): 9, ("t", 1): 12}
    asked: list[dict] = []

    def lookup(stamps):  # type: ignore[no-untyped-def]
        asked.append(dict(stamps))
        return {tp: 5 if tp == ("t", 0) else None for tp in stamps}

    by_offset = _opts(startingOffsets="earliest")
    assert resolve_bound(by_offset, tps, earliest, latest, lookup, starting=True) == earliest
    assert asked == []
    by_time = _opts(startingTimestamp="1700000000000", startingOffsetsByTimestampStrategy="latest")
    assert resolve_bound(by_time, tps, earliest, latest, lookup, starting=True) == {("t", 0): 5, ("t", 1): 12}
    assert asked == [{("t", 0): 1_700_000_000_000, ("t", 1): 1_700_000_000_000}]
    one = _opts(startingOffsetsByTimestamp='{"t": {"0": 7}}')
    with pytest.raises(ConfigurationError, match=r"'startingOffsetsByTimestamp' leaves out t\[1\]"):
        resolve_bound(one, tps, earliest, latest, lookup, starting=True)


# ------------------------------------------------------------------ Spark partitions


def test_max_partitions_packs_whole_ranges_into_that_many_partitions_the_same_way_every_time() -> None:
    start = {("t", p): 0 for p in range(8)}
    end = {("t", p): 100 + 10 * p for p in range(8)}
    ranges = plan_ranges(start, end, None, True)
    groups = group_ranges(ranges, 3)
    assert len(groups) == 3 and all(isinstance(g, KafkaRangeGroup) for g in groups)
    packed = [r for g in groups for r in g.ranges]
    assert sorted(packed, key=lambda r: r.partition) == ranges  # each range once, never split
    loads = [sum(r.size for r in g.ranges) for g in groups]
    assert max(loads) - min(loads) <= max(r.size for r in ranges)
    assert group_ranges(list(reversed(ranges)), 3) == groups  # a pure function of the ranges
    assert group_ranges(ranges, 8) == ranges and group_ranges(ranges, None) == ranges


def test_max_records_per_partition_cuts_ranges_into_pieces_of_at_most_that_many_records() -> None:
    start, end = {("t", 0): 0, ("t", 1): 100}, {("t", 0): 25, ("t", 1): 107}
    ranges = plan_ranges(start, end, None, True, max_records=10)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 8),
        (0, 8, 16),
        (0, 16, 25),
        (1, 100, 107),
    ]
    # With minPartitions, Spark's rule: split by maxRecordsPerPartition, then more if still too few.
    assert len(plan_ranges(start, end, 8, True, max_records=10)) >= 8
    opts = _opts(maxRecordsPerPartition="10")
    assert plan_partitions(start, end, opts) == ranges  # not packed by minRecordsPerPartition
    assert all(isinstance(r, KafkaOffsetRange) and r.size <= 10 for r in plan_partitions(start, end, opts))


def test_a_small_batch_is_packed_into_fewer_spark_partitions_of_about_min_records_each() -> None:
    start = {("t", p): 0 for p in range(8)}
    small = {("t", p): 4 for p in range(8)}  # 32 records
    assert partition_count(plan_ranges(start, small, None, True), _opts()) == 1
    assert len(plan_partitions(start, small, _opts())) == 1
    medium = {("t", p): 700 for p in range(8)}  # 5,600 records, 3 ranges (2,100) per partition
    assert len(plan_partitions(start, medium, _opts(minRecordsPerPartition="2000"))) == 3
    batch = {("t", p): 6_250 for p in range(8)}  # 50,000 records: 4 ranges per partition
    assert len(plan_partitions(start, batch, _opts())) == 2
    large = {("t", p): 20_000 for p in range(8)}  # one partition per range
    assert plan_partitions(start, large, _opts()) == plan_ranges(start, large, None, True)


def test_equal_ranges_are_packed_into_partitions_of_equal_size_not_into_a_count_that_leaves_some_double() -> None:
    start = {("t", p): 0 for p in range(8)}
    end = {("t", p): 18_750 for p in range(8)}  # 150,000 records; 150,000 / 25,000 would be 6 groups
    groups = plan_partitions(start, end, _opts(minRecordsPerPartition="25000"))
    sizes = [sum(r.size for r in g.ranges) for g in groups if isinstance(g, KafkaRangeGroup)]
    assert len(groups) == 4 and sizes == [37_500] * 4


def test_with_min_records_per_partition_of_one_max_partitions_alone_sets_how_a_batch_is_packed() -> None:
    for sizes in ([700] * 8, [6_250] * 8, [18_750] * 8, [40_000, 30, 20, 10], [1] * 3, [2_500, 900, 1_700]):
        start = {("t", p): 0 for p in range(len(sizes))}
        end = {("t", p): n for p, n in enumerate(sizes)}
        ranges = plan_ranges(start, end, None, True)
        count = min(len(ranges), max(1, -(-sum(sizes) // 2_000)))  # one partition per 2,000 records
        packed = group_ranges(ranges, count)
        assert plan_partitions(start, end, _opts(maxPartitions=str(count), minRecordsPerPartition="1")) == packed


def test_packing_is_a_function_of_the_offsets_and_options_so_a_replay_is_cut_the_same_way() -> None:
    start = {("t", p): 10 * p for p in range(5)}
    end = {("t", p): 10 * p + 3 + p for p in range(5)}
    opts = _opts(minRecordsPerPartition="8")
    first = plan_partitions(start, end, opts)
    assert first == plan_partitions(dict(reversed(start.items())), dict(reversed(end.items())), opts)
    # 25 records in 5 ranges: 2 ranges (10 records) per partition on average, so 3 partitions
    assert len(first) == 3 and all(isinstance(g, KafkaRangeGroup) for g in first)
    # every range once, whole, in one group
    ranges = sorted((r.partition, r.start, r.end) for g in first for r in g.ranges)  # type: ignore[attr-defined]
    assert ranges == [(p, 10 * p, 10 * p + 3 + p) for p in range(5)]


def test_min_records_per_partition_of_one_or_min_partitions_keeps_one_spark_partition_per_range_or_more() -> None:
    start = {("t", p): 0 for p in range(4)}
    end = {("t", p): 5 for p in range(4)}
    assert plan_partitions(start, end, _opts(minRecordsPerPartition="1")) == plan_ranges(start, end, None, True)
    assert len(plan_partitions(start, end, _opts(minPartitions="8"))) == 8
    assert len(plan_partitions(start, end, _opts(maxPartitions="2", minRecordsPerPartition="1"))) == 2
