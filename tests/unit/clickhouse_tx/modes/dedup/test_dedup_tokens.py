"""Dedup tokens come from a chunk's rows, not from how they arrived or where they sit."""

from __future__ import annotations

import pyarrow as pa

from clickhouse_tx.modes.dedup.chunks import Rechunker, chunk_digest, chunk_messages


def table(n: int, start: int = 0, nulls: bool = False) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.uint64()),
            "s": pa.array([None if nulls and i % 3 == 0 else f"v{i}" for i in range(start, start + n)]),
        }
    )


def digests(t: pa.Table, batch_rows: int, chunk_rows: int, message_rows: int = 65_536) -> list[str]:
    cut = Rechunker(iter(t.to_batches(max_chunksize=batch_rows)), chunk_rows)
    out = []
    while cut.has_more():
        out.append(chunk_digest(chunk_messages(cut.chunk(), message_rows)[1]))
    return out


def test_equal_rows_arriving_in_other_record_batch_sizes_give_equal_chunk_digests() -> None:
    for nulls in (False, True):
        t = table(1000, nulls=nulls)
        for message_rows in (300, 64):  # one message a chunk, or several
            first = digests(t, 70, 300, message_rows)
            assert len(first) == 4 and len(set(first)) == 4
            assert digests(t, 999, 300, message_rows) == digests(t, 1, 300, message_rows) == first


def test_a_chunks_messages_hold_its_rows_in_order_in_pieces_of_the_message_size() -> None:
    t = table(1000, nulls=True)
    rows, messages = chunk_messages(iter(t.to_batches(max_chunksize=77)), 300)
    back = pa.Table.from_batches([pa.ipc.read_record_batch(m, t.schema) for m in messages])
    assert rows == 1000 and [b.num_rows for b in back.to_batches()] == [300, 300, 300, 100]
    assert back.equals(t)


def test_other_rows_give_another_digest() -> None:
    assert digests(table(300), 300, 300) != digests(table(300, start=1), 300, 300)
    changed = table(300).set_column(1, "s", pa.array(["x"] * 300))
    assert digests(changed, 300, 300) != digests(table(300), 300, 300)
