"""A checksum of Arrow data: a cheap fingerprint of the rows of one partition attempt.

The checksum is deterministic and computed with ``pyarrow.compute`` kernels (no Python
per row); it does not depend on how the rows are split into record batches: per column, the
wrapping 64-bit sum of the values (integers, booleans, dates, timestamps,
decimals' storage), or of the value lengths (strings, binary), or of the list
lengths (lists, maps), plus the null count; floats contribute their null count
and their count of non-null values only (float sums depend on summation order).
Columns are mixed with distinct odd multipliers and the row count is added. It is
meant to catch lost or duplicated chunks when two attempts are compared, not to
be a cryptographic hash.

Each attempt's checksum travels in its commit message (``Prepared.checksum``) and its
marker; a dead xid is replaced only by an attempt with the same rows and checksum.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1


def _column_sum(arr: pa.ChunkedArray | pa.Array) -> int:
    """Order-independent contribution of one column (see the module docstring)."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = (
            arr.cast(t.value_type)
            if isinstance(arr, pa.Array)
            else pa.chunked_array([c.cast(t.value_type) for c in arr.chunks], t.value_type)
        )
        t = arr.type
    nulls: int = arr.null_count
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        vals = pc.cast(arr, pa.int64(), safe=False) if not pa.types.is_int64(t) else arr
        s = pc.sum(vals).as_py() or 0
    elif pa.types.is_temporal(t):
        s = pc.sum(pc.cast(pc.cast(arr, _storage_int(t)), pa.int64(), safe=False)).as_py() or 0
    elif pa.types.is_decimal(t):
        # Each value as a whole number of units of its scale (deterministic per value).
        as_int = pc.cast(pc.multiply(pc.cast(arr, pa.float64()), 10**t.scale), pa.int64(), safe=False)
        s = pc.sum(as_int).as_py() or 0
    elif (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        s = pc.sum(pc.binary_length(arr)).as_py() or 0
    elif pa.types.is_map(t):
        # list_value_length has no kernel for maps: count the entries from the offsets.
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        s = sum(c.offsets[-1].as_py() - c.offsets[0].as_py() for c in chunks if len(c))
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        s = pc.sum(pc.list_value_length(arr)).as_py() or 0
    elif pa.types.is_floating(t):
        s = len(arr) - nulls
    else:
        s = len(arr) - nulls
    return (int(s) * 0x9E3779B97F4A7C15 + nulls * 0xC2B2AE3D27D4EB4F) & _MASK64


def _storage_int(t: pa.DataType) -> pa.DataType:
    return pa.int32() if (pa.types.is_date32(t) or pa.types.is_time32(t)) else pa.int64()


def batch_checksum(batch: pa.RecordBatch) -> int:
    """Checksum contribution of one record batch (add contributions modulo 2**64)."""
    total: int = batch.num_rows
    for i, col in enumerate(batch.columns):
        total += (_column_sum(col) * (2 * i + 3)) & _MASK64
    return total & _MASK64


def combine(a: int, b: int) -> int:
    """Add two checksum contributions (order-independent)."""
    return (a + b) & _MASK64


def finish(total: int) -> int:
    """Fold a 64-bit total into a non-negative value that fits Int64 and UInt64 columns."""
    return (total ^ (total >> 63)) & _MASK63


def arrow_checksum(batches: Iterable[pa.RecordBatch]) -> int:
    """The checksum of all rows of ``batches`` (independent of the batch boundaries)."""
    total = 0
    for b in batches:
        total = combine(total, batch_checksum(b))
    return finish(total)


class CountingBatches:
    """Wrap a batch iterator: count rows and fold the checksum as batches stream by.

    Runs on the executor; sees each batch once, holds none of them.
    """

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._it = iter(batches)
        self.rows = 0
        self._total = 0

    def __iter__(self) -> "CountingBatches":
        return self

    def __next__(self) -> pa.RecordBatch:
        b = next(self._it)
        self.rows += b.num_rows
        self._total = combine(self._total, batch_checksum(b))
        return b

    @property
    def checksum(self) -> int:
        return finish(self._total)


__all__ = ["CountingBatches", "arrow_checksum", "batch_checksum", "combine", "finish"]
