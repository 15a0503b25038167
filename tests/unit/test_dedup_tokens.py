"""Dedup tokens come from a chunk's rows, not from how they arrived or where they sit."""

from __future__ import annotations

import pyarrow as pa

from clickhouse_tx.modes.dedup import Rechunker, chunk_digest


def table(n: int, start: int = 0, nulls: bool = False) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.uint64()),
            "s": pa.array([None if nulls and i % 3 == 0 else f"v{i}" for i in range(start, start + n)]),
        }
    )


def digests(t: pa.Table, batch_rows: int, chunk_rows: int) -> list[str]:
    cut = Rechunker(iter(t.to_batches(max_chunksize=batch_rows)), chunk_rows)
    out = []
    while cut.has_more():
        out.append(chunk_digest(pa.concat_batches(list(cut.chunk()))))
    return out


def test_equal_rows_arriving_in_other_record_batch_sizes_give_equal_chunk_digests() -> None:
    for nulls in (False, True):
        t = table(1000, nulls=nulls)
        first = digests(t, 70, 300)
        assert len(first) == 4 and len(set(first)) == 4
        assert digests(t, 999, 300) == digests(t, 1, 300) == first


def test_other_rows_give_another_digest() -> None:
    assert digests(table(300), 300, 300) != digests(table(300, start=1), 300, 300)
    changed = table(300).set_column(1, "s", pa.array(["x"] * 300))
    assert digests(changed, 300, 300) != digests(table(300), 300, 300)
