"""``dedup_chunks.canonical_order``: the same rows in any order come out in one order (pure)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from clickhouse_tx.modes.dedup.chunks import ChunkSizing, canonical_order, chunk_digest, chunk_messages, cut_rows

ROWS = pa.table(
    {
        "id": pa.array([3, 1, 2, 1, None, 2], pa.int64()),
        "f": pa.array([0.0, -0.0, 1.5, float("nan"), None, 1.5], pa.float64()),
        "s": pa.array(["c", "a", None, "a", "e", "b"]).dictionary_encode(),
        "d": pa.array([1, 2, 3, 4, 5, 6], pa.int32()),
    }
)


def _shuffled(table: pa.Table, seed: int, batch_rows: int) -> pa.Table:
    order = list(range(table.num_rows))
    random.Random(seed).shuffle(order)
    return pa.Table.from_batches(table.take(order).to_batches(max_chunksize=batch_rows))


def _bytes(table: pa.Table) -> str:
    """The digest of ``table``'s rows as one chunk (NaN compares unequal to itself; bytes do not)."""
    return chunk_digest(chunk_messages(iter(table.to_batches()), 1000)[1])


def _digests(table: pa.Table, sizing: ChunkSizing) -> list[str]:
    _, cutter = cut_rows(iter(table.to_batches()), sizing)
    out = []
    while cutter.has_more():
        out.append(chunk_digest(chunk_messages(cutter.chunk(), sizing.message_rows)[1]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_same_rows_in_any_order_and_record_batches_come_out_in_one_order(seed: int) -> None:
    once = canonical_order(ROWS, "db.t")
    again = canonical_order(_shuffled(ROWS, seed, batch_rows=1 + seed % 3), "db.t")
    assert _bytes(again) == _bytes(once) and not pa.types.is_dictionary(once.schema.field("s").type)
    assert sorted(once.column("d").to_pylist()) == [1, 2, 3, 4, 5, 6]  # every row kept, once


def test_rows_that_differ_only_in_the_sign_of_zero_are_kept_apart_in_a_fixed_order() -> None:
    t = pa.table({"f": pa.array([0.0, -0.0, 0.0, -0.0])})
    flips = [canonical_order(t.take(order), "db.t") for order in ([0, 1, 2, 3], [1, 0, 3, 2], [1, 3, 0, 2])]
    assert len({_bytes(f) for f in flips}) == 1


def test_the_same_rows_shuffled_cut_into_chunks_with_the_same_digests() -> None:
    big = pa.table({"id": pa.array(range(1000), pa.int64()), "v": pa.array([i % 7 for i in range(1000)], pa.int8())})
    sizing = ChunkSizing.fixed(128, message_rows=50)
    first = _digests(canonical_order(big, "db.t"), sizing)
    assert len(first) == 8
    assert _digests(canonical_order(_shuffled(big, 1, batch_rows=77), "db.t"), sizing) == first
    assert _digests(_shuffled(big, 1, batch_rows=77), sizing) != first  # without the order: other tokens


def test_columns_that_cannot_be_ordered_are_fine_while_the_others_tell_the_rows_apart() -> None:
    t = pa.table({"id": pa.array([2, 1, 3]), "tags": pa.array([["b"], ["a"], []])})
    assert canonical_order(t, "db.t").column("tags").to_pylist() == [["a"], ["b"], []]


NESTED = pa.table(
    {
        "id": pa.array([1, 1, 1, 1, 2], pa.uint64()),
        "tags": pa.array([["a"], ["a"], ["b"], None, []]),
        "m": pa.array([[("k", 1)], [("k", 1)], [("k", 1)], [], [("j", 2)]], pa.map_(pa.string(), pa.int64())),
        "t": pa.array(
            [{"x": 1.5, "y": [0.0]}, {"x": 1.5, "y": [0.0]}, {"x": 1.5, "y": [-0.0]}, None, {"x": 0.0, "y": []}],
            pa.struct([("x", pa.float64()), ("y", pa.list_(pa.float64()))]),
        ),
    }
)


def test_equal_rows_with_arrays_maps_and_nested_tuples_are_kept_and_sort_next_to_each_other() -> None:
    t = pa.table({"id": pa.array([1, 1], pa.uint64()), "tags": pa.array([["a"], ["a"]])})
    assert canonical_order(t, "db.t").to_pylist() == t.to_pylist()
    once = canonical_order(NESTED, "db.t")
    assert once.num_rows == 5 and once.slice(0, 4).column("id").to_pylist() == [1, 1, 1, 1]
    pairs = [(r["tags"], r["m"], r["t"]) for r in once.to_pylist()]
    assert any(pairs[i] == pairs[i + 1] for i in range(4))  # the two equal rows, side by side


@pytest.mark.parametrize("seed", range(6))
def test_rows_that_differ_only_in_columns_that_cannot_be_ordered_come_out_in_one_order_whatever_the_input(
    seed: int,
) -> None:
    once = canonical_order(NESTED, "db.t")
    assert _bytes(canonical_order(_shuffled(NESTED, seed, batch_rows=1 + seed % 3), "db.t")) == _bytes(once)
    lists = pa.table({"tags": pa.array([["b"], ["a"], ["b"], ["a", "b"]])})
    assert canonical_order(_shuffled(lists, seed, 2), "db.t").to_pylist() == canonical_order(lists, "db.t").to_pylist()


def test_the_sign_of_zero_inside_an_array_tells_rows_apart_in_a_fixed_order() -> None:
    t = pa.table({"id": pa.array([1, 1, 1]), "v": pa.array([[0.0], [-0.0], [0.0]])})
    flips = [canonical_order(t.take(order), "db.t") for order in ([0, 1, 2], [1, 0, 2], [2, 0, 1])]
    assert len({_bytes(f) for f in flips}) == 1


def test_an_empty_or_one_row_table_is_returned_as_it_is() -> None:
    t = pa.table({"tags": pa.array([["a"]])})
    assert canonical_order(t, "db.t") is t and canonical_order(t.slice(0, 0), "db.t").num_rows == 0
