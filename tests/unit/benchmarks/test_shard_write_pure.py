"""The writer options and the ratio spread of ``benchmarks.shard_write``."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.shard_write import _options, _spread, _urls

INFO = SimpleNamespace(
    clickhouse_urls=[["http://a", "http://a2"], ["http://b"]], shards_option="http://a|http://a2,http://b"
)


def test_one_shard_writes_to_the_first_server_and_two_shards_use_the_shards_option_with_or_without_a_key() -> None:
    one = _options(INFO, "one_shard", "transaction", "db", "t")
    assert one["url"] == "http://a" and "shards" not in one
    by_key = _options(INFO, "two_shards_by_key", "staging", "db", "t")
    assert by_key["shards"] == INFO.shards_option and by_key["sharding_key"] == "id" and "url" not in by_key
    by_partition = _options(INFO, "two_shards_by_partition", "dedup", "db", "t")
    assert "sharding_key" not in by_partition and by_partition["mode"] == "dedup"
    assert _urls(INFO, "one_shard") == ["http://a"] and _urls(INFO, "two_shards_by_key") == ["http://a", "http://b"]


def test_the_spread_compares_each_configuration_with_the_base_within_the_same_round() -> None:
    runs = {"one_shard": [1.0, 2.0, 1.0], "two": [2.0, 2.0, 4.0]}
    assert _spread(runs, "two", "one_shard") == {"min": 0.25, "median": 0.5, "max": 1.0}
