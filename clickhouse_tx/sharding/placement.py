"""Which shard a row or a partition goes to (pure; no I/O).

A sharded write prepares one xid per (Spark partition, shard) that holds rows. The
coordinator knows partitions only, so each (partition, shard) pair gets a **slot**
number, ``partition * shards + shard``; the slot is what ``Prepared.partition`` and
the xid carry. Everything the protocol guarantees per partition (one decision, the
replacement of a dead xid only by one with the same rows, the dedup claims check)
then holds per (partition, shard), and the shard is recovered from any xid or
message as ``slot % shards``.

Rows go to shards by one of two rules, both deterministic so a replay of a batch
sends every row where it went the first time:

- **by key** (``sharding_key``): the key value's :func:`stable_hash`, modulo the sum
  of the weights, picks the shard whose weight range holds it;
- **by partition** (no key): the whole Spark partition goes to the shard picked the
  same way from the partition id.

The hash (documented here and in ``docs/deployment.md``): integers (any width, signed
or not), booleans, dates and timestamps are taken as their 64-bit two's-complement
integer (a timestamp in Spark's microseconds, a date in days) and mixed with
SplitMix64's finaliser; strings (UTF-8) and binaries are hashed with 64-bit FNV-1a;
a null hashes to 0. The hash sees the value as Spark sends it, before the writer
converts it to the column's ClickHouse type.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clickhouse_tx.errors import ConfigurationError

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class ShardPlacement:
    """The shards of a write and how rows are spread over them (frozen, picklable).

    Attributes
    ----------
    urls
        Per shard, its replicas' HTTP URLs (the ``shards`` option, in its order).
    weights
        Per shard, its share of the hash range (``shard_weights``; all 1 by default).
    key
        The column whose value picks a row's shard (``sharding_key``); None sends
        each Spark partition whole to one shard.
    """

    urls: tuple[tuple[str, ...], ...]
    weights: tuple[int, ...] = ()
    key: str | None = None

    def __post_init__(self) -> None:
        if not self.urls or any(not r for r in self.urls):
            raise ConfigurationError("a sharded write needs at least one shard, each with at least one URL")
        if not self.weights:
            object.__setattr__(self, "weights", (1,) * len(self.urls))
        if len(self.weights) != len(self.urls) or any(w <= 0 for w in self.weights):
            raise ConfigurationError(
                f"shard_weights {list(self.weights)}: expected {len(self.urls)} positive integers, one per shard"
            )

    @property
    def n(self) -> int:
        """The number of shards."""
        return len(self.urls)

    def shard_of_hash(self, h: int) -> int:
        """The shard whose weight range holds ``h`` modulo the sum of the weights."""
        point = h % sum(self.weights)
        for shard, w in enumerate(self.weights):
            if point < w:
                return shard
            point -= w
        raise AssertionError("unreachable: point < sum(weights)")

    def shard_of_partition(self, partition: int) -> int:
        """Where a whole Spark partition goes when there is no ``sharding_key``."""
        return self.shard_of_hash(partition)

    def slot(self, partition: int, shard: int) -> int:
        """The slot number of (partition, shard): what the coordinator sees as the partition."""
        return partition * self.n + shard

    def shard_of_slot(self, slot: int) -> int:
        return slot % self.n

    def partition_of_slot(self, slot: int) -> int:
        return slot // self.n

    def shards_of_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """:meth:`shard_of_hash` of every hash (uint64 array) at once."""
        bounds = np.cumsum(np.asarray(self.weights, dtype=np.uint64))
        points = hashes % np.uint64(bounds[-1])
        return np.searchsorted(bounds, points, side="right").astype(np.int64)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over a uint64 array (wrapping arithmetic)."""
    z = values.astype(np.uint64, copy=True)
    z += np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a of ``data``."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def is_hashable_type(t: pa.DataType) -> bool:
    """True if :func:`stable_hash` takes a column of Arrow type ``t``."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def stable_hash(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The documented hash (module docstring) of every value of ``column``, as uint64.

    Raises
    ------
    ConfigurationError
        A column type the hash does not take.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if not is_hashable_type(t):
        raise ConfigurationError(
            f"sharding_key column of Arrow type {t}: the shard hash takes integers, booleans, "
            "dates, timestamps, strings and binaries"
        )
    valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        out = np.zeros(len(column), dtype=np.uint64)
        for i, v in enumerate(column.to_pylist()):
            if v is not None:
                out[i] = fnv1a64(v.encode() if isinstance(v, str) else v)
        return out
    if pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_boolean(t):
        column = column.cast(pa.int64()) if not pa.types.is_boolean(t) else pc.cast(column, pa.int8())
    ints = column.fill_null(0).to_numpy(zero_copy_only=False)
    hashed = _splitmix64(ints.astype(np.int64).view(np.uint64) if ints.dtype != np.uint64 else ints)
    hashed[~valid] = 0
    return hashed


def split_by_shard(batch: pa.RecordBatch, placement: ShardPlacement) -> dict[int, pa.RecordBatch]:
    """``batch``'s rows by shard (by ``placement.key``); shards without rows are absent."""
    if placement.key is None:
        raise ValueError("split_by_shard needs a placement with a sharding key")
    shards = placement.shards_of_hashes(stable_hash(batch.column(placement.key)))
    out: dict[int, pa.RecordBatch] = {}
    for shard in np.unique(shards).tolist():
        out[int(shard)] = batch.filter(pa.array(shards == shard))
    return out


def parse_weights(raw: str, shards: int) -> tuple[int, ...]:
    """The ``shard_weights`` option (``1,2``): one positive integer per shard."""
    try:
        weights = tuple(int(w.strip()) for w in raw.split(","))
    except ValueError:
        weights = ()
    if len(weights) != shards or any(w <= 0 for w in weights):
        raise ConfigurationError(
            f"option shard_weights={raw!r}: expected {shards} comma-separated positive integers, one per shard"
        )
    return weights


def parse_shard_urls(raw: str) -> tuple[tuple[str, ...], ...]:
    """The ``shards`` option's structure: ``,`` between shards, ``|`` between replicas.

    Returns the stripped URL texts; the caller checks each as a URL.
    """
    shards = tuple(tuple(u.strip() for u in part.split("|")) for part in raw.split(","))
    if not raw.strip() or any(not u for s in shards for u in s):
        raise ConfigurationError(
            "option shards: expected URLs with ',' between shards and '|' between the "
            "replicas of one shard, e.g. http://a:8123|http://b:8123,http://c:8123"
        )
    flat = [u for s in shards for u in s]
    if len(set(flat)) != len(flat):
        raise ConfigurationError("option shards: a server is listed twice")
    return shards


def placement_of(urls: Sequence[Sequence[str]], weights: Sequence[int] = (), key: str | None = None) -> ShardPlacement:
    """A :class:`ShardPlacement` from plain sequences."""
    return ShardPlacement(tuple(tuple(r) for r in urls), tuple(weights), key)
