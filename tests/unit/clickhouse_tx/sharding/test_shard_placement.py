"""The pure routing of a sharded write: the documented hash, weights, slots, the options."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.sharding.placement import (
    ShardPlacement,
    fnv1a64,
    parse_shard_urls,
    parse_weights,
    split_by_shard,
    stable_hash,
)
from spark_datasource.options.writer_options import WriterOptions

URLS = (("http://a:8123", "http://b:8123"), ("http://c:8123",))


def test_the_hash_is_the_documented_one_and_the_same_for_every_integer_width() -> None:
    # SplitMix64's finaliser of 0 and 1, FNV-1a 64 of "a" (published test vectors).
    assert stable_hash(pa.array([0, 1], pa.int64())).tolist() == [0xE220A8397B1DCDAF, 0x910A2DEC89025CC1]
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    for t in (pa.int8(), pa.uint16(), pa.int32(), pa.uint64()):
        assert stable_hash(pa.array([5, None], t)).tolist() == [stable_hash(pa.array([5], pa.int64()))[0], 0]
    assert stable_hash(pa.array(["a", None])).tolist() == [0xAF63DC4C8601EC8C, 0]


def test_a_column_type_the_hash_does_not_take_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="sharding_key column of Arrow type double"):
        stable_hash(pa.array([1.5]))


def test_weights_split_the_hash_range_and_partitions_follow_them() -> None:
    placement = ShardPlacement(URLS, weights=(1, 2))
    assert [placement.shard_of_partition(p) for p in range(6)] == [0, 1, 1, 0, 1, 1]
    hashes = np.arange(30, dtype=np.uint64)
    assert placement.shards_of_hashes(hashes).tolist() == [placement.shard_of_hash(h) for h in range(30)]


def test_a_slot_names_its_partition_and_shard() -> None:
    placement = ShardPlacement(URLS)
    for p in range(5):
        for s in range(2):
            slot = placement.slot(p, s)
            assert (placement.partition_of_slot(slot), placement.shard_of_slot(slot)) == (p, s)


def test_a_batch_splits_by_key_without_losing_or_moving_a_row() -> None:
    placement = ShardPlacement(URLS, key="id")
    batch = pa.record_batch({"id": pa.array(range(1000), pa.int64())})
    parts = split_by_shard(batch, placement)
    assert sorted(v for b in parts.values() for v in b.column("id").to_pylist()) == list(range(1000))
    again = split_by_shard(batch, placement)
    assert {s: b.column("id").to_pylist() for s, b in parts.items()} == {
        s: b.column("id").to_pylist() for s, b in again.items()
    }
    assert 400 < parts[0].num_rows < 600


def test_the_shards_option_is_shards_then_replicas_and_refuses_garbage() -> None:
    assert parse_shard_urls("http://a:8123|http://b:8123, http://c:8123") == URLS
    for bad in ("", "http://a,,http://b", "http://a|http://a"):
        with pytest.raises(ConfigurationError, match="option shards"):
            parse_shard_urls(bad)
    assert parse_weights("1, 2", 2) == (1, 2)
    with pytest.raises(ConfigurationError, match="shard_weights"):
        parse_weights("1,0", 2)


def test_writer_options_take_shards_and_refuse_them_with_url_or_credentials() -> None:
    base = {"table": "db.t", "mode": "staging"}
    opts = WriterOptions.parse(
        {**base, "shards": "http://a:8123|http://b:8123,http://c:8123", "sharding_key": "id", "shard_weights": "1,3"},
        streaming=False,
    )
    assert opts.url == "http://a:8123" and opts.shards == URLS
    placement = opts.shard_placement()
    assert placement is not None and placement.key == "id" and placement.weights == (1, 3)
    with pytest.raises(ConfigurationError, match="url and shards"):
        WriterOptions.parse({**base, "url": "http://a:8123", "shards": "http://c:8123"}, streaming=False)
    with pytest.raises(ConfigurationError, match="needs the option shards"):
        WriterOptions.parse({**base, "url": "http://a:8123", "sharding_key": "id"}, streaming=False)
    with pytest.raises(ConfigurationError) as e:
        WriterOptions.parse({**base, "shards": "http://u:secret@c:8123"}, streaming=False)
    assert "secret" not in str(e.value)
