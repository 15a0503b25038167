"""Mode dedup sizes a partition's chunks from its first rows, the same way on every replay."""

from __future__ import annotations

import pyarrow as pa
import pytest

from clickhouse_tx.modes.dedup.chunks import ChunkSizing, chunk_digest, chunk_messages, cut_rows

SIZING = ChunkSizing(target_bytes=32_768, sample_rows=50, min_rows=50, max_rows=1_000, message_rows=64)


def table(n: int, width: int, nulls: bool = False) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.uint64()),
            "s": pa.array([None if nulls and i % 3 == 0 else f"{i:0{width}d}" for i in range(n)]),
        }
    )


def cut(t: pa.Table, batch_rows: int, sizing: ChunkSizing = SIZING) -> tuple[int, list[tuple[int, str]]]:
    """(rows per chunk, [(rows, digest) of each chunk]) of ``t`` arriving in ``batch_rows``-row batches."""
    rows, cutter = cut_rows(iter(t.to_batches(max_chunksize=batch_rows)), sizing)
    chunks = []
    while cutter.has_more():
        n, messages = chunk_messages(cutter.chunk(), sizing.message_rows)
        chunks.append((n, chunk_digest(messages)))
    return rows, chunks


def test_narrow_rows_make_chunks_of_max_rows_and_wide_rows_chunks_of_about_the_target_bytes() -> None:
    narrow, _ = cut(table(3000, 2), 100)
    wide, chunks = cut(table(3000, 400), 100)
    assert narrow == SIZING.max_rows
    assert SIZING.min_rows < wide < 100  # ~410 bytes a row: 32 KiB hold about 80
    assert all(n == wide for n, _ in chunks[:-1]) and sum(n for n, _ in chunks) == 3000


def test_the_chunks_depend_on_the_partitions_rows_not_on_the_record_batches_they_arrived_in() -> None:
    for nulls in (False, True):
        t = table(2500, 300, nulls=nulls)
        first = cut(t, 7)
        assert len(first[1]) > 2
        for size in (1, 49, 50, 51, 333, 2500):
            assert cut(t, size) == first, size


def test_a_partition_shorter_than_the_sample_is_one_chunk() -> None:
    rows, chunks = cut(table(30, 2000), 4)
    assert rows == SIZING.min_rows and [n for n, _ in chunks] == [30]


def test_a_partition_without_rows_has_no_chunk() -> None:
    rows, chunks = cut(table(0, 2), 10)
    assert chunks == [] and rows == SIZING.min_rows


def test_fixed_sizing_cuts_the_same_rows_whatever_their_width() -> None:
    assert cut(table(1000, 2), 70, ChunkSizing.fixed(300))[0] == 300
    assert [n for n, _ in cut(table(1000, 900), 70, ChunkSizing.fixed(300))[1]] == [300, 300, 300, 100]


def test_rows_for_stays_within_its_bounds() -> None:
    assert SIZING.rows_for(50, 1) == SIZING.max_rows
    assert SIZING.rows_for(50, 10**9) == SIZING.min_rows
    assert SIZING.rows_for(50, 50 * 100) == 32_768 // 100
    assert SIZING.rows_for(0, 0) == SIZING.min_rows


@pytest.mark.parametrize(
    "bad", [dict(sample_rows=0), dict(sample_rows=60, min_rows=50), dict(min_rows=2000), dict(message_rows=0)]
)
def test_a_sizing_whose_bounds_are_out_of_order_or_whose_messages_are_empty_is_refused(
    bad: dict[str, int],
) -> None:
    with pytest.raises(ValueError, match="sample_rows <= min_rows <= max_rows and message_rows > 0"):
        ChunkSizing(**{**SIZING.__dict__, **bad})
