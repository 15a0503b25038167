"""Pure parts of the ClickHouse I/O: type checks, checksums, re-chunking, mode lookup."""

from __future__ import annotations

import datetime
import pickle

import pyarrow as pa
import pytest

from clickhouse_tx.conversion.checksum import arrow_checksum
from clickhouse_tx.conversion.schema import Column, TableInfo, check_schema
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import CommitModeIO, Mode
from clickhouse_tx.modes import mode_io_for
from clickhouse_tx.modes.dedup.chunks import Rechunker, dedup_token


def _table(n: int = 1000) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.uint64()),
            "s": pa.array([f"v{i}" for i in range(n)]),
            "f": pa.array([i / 3 for i in range(n)]),
            "ts": pa.array([datetime.datetime(2024, 1, 1, 0, 0, i % 60) for i in range(n)], pa.timestamp("us")),
            "l": pa.array([[i, i] for i in range(n)]),
            "n": pa.array([None if i % 7 else i for i in range(n)], pa.int32()),
        }
    )


def test_checksum_does_not_depend_on_how_rows_are_split_into_batches() -> None:
    t = _table()
    assert arrow_checksum(t.to_batches(max_chunksize=7)) == arrow_checksum(t.to_batches(max_chunksize=500))


def test_checksum_changes_when_a_row_is_lost_or_duplicated() -> None:
    t = _table()
    full = arrow_checksum(t.to_batches())
    assert arrow_checksum(t.slice(1).to_batches()) != full
    assert arrow_checksum(t.to_batches() + t.slice(3, 1).to_batches()) != full


def test_checksum_fits_a_signed_64_bit_column() -> None:
    assert 0 <= arrow_checksum(_table().to_batches()) < 2**63


@pytest.mark.parametrize("sizes", [[10], [3, 3, 4], [1] * 10, [7, 0, 3]])
def test_rechunker_cuts_fixed_row_counts_whatever_the_input_batches(sizes: list[int]) -> None:
    t = pa.table({"x": pa.array(range(10))})
    batches, off = [], 0
    for s in sizes:
        batches.append(pa.record_batch([t.column(0).slice(off, s).combine_chunks()], names=["x"]))
        off += s
    cut = Rechunker(iter(batches), 4)
    chunks = []
    while cut.has_more():
        chunks.append([v for b in cut.chunk() for v in b.column(0).to_pylist()])
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_rechunker_of_no_batches_has_no_chunk() -> None:
    assert not Rechunker(iter(()), 5).has_more()


def test_dedup_token_names_txn_batch_partition_and_content_but_not_the_attempt_or_chunk_number() -> None:
    assert dedup_token("q", 3, 2, "ab12", 1) == "q:3:2:ab12:1"


def _info(engine: str = "MergeTree") -> TableInfo:
    return TableInfo(
        "db",
        "events",
        engine,
        (Column("id", "UInt64"), Column("s", "String"), Column("m", "UInt64", "MATERIALIZED")),
        "",
        0,
        0,
    )


def test_check_schema_names_a_column_the_table_lacks() -> None:
    with pytest.raises(ConfigurationError, match=r"`extra`.*db\.events"):
        check_schema(_info(), pa.schema([("id", pa.uint64()), ("extra", pa.string())]))


def test_check_schema_names_column_and_both_types_when_incompatible() -> None:
    with pytest.raises(ConfigurationError, match=r"`id`.*list<item: int64>.*UInt64"):
        check_schema(_info(), pa.schema([("id", pa.list_(pa.int64()))]))


def test_check_schema_refuses_a_materialized_column() -> None:
    with pytest.raises(ConfigurationError, match="MATERIALIZED"):
        check_schema(_info(), pa.schema([("m", pa.uint64())]))


def test_table_info_tells_replicated_and_merge_tree_engines_apart() -> None:
    assert _info("ReplicatedMergeTree").is_replicated and _info("ReplicatedMergeTree").is_merge_tree
    assert not _info("Log").is_merge_tree
    assert _info("ReplacingMergeTree").is_merge_tree and not _info("ReplacingMergeTree").is_replicated


@pytest.mark.parametrize("mode", list(Mode))
def test_every_mode_io_is_a_picklable_commit_mode(mode: Mode) -> None:
    io = mode_io_for(mode)
    assert isinstance(io, CommitModeIO) and io.mode is mode
    assert pickle.loads(pickle.dumps(io)) == io


def test_an_unknown_mode_is_a_configuration_error_listing_the_modes() -> None:
    with pytest.raises(ConfigurationError, match="transaction, staging, dedup, none"):
        mode_io_for("exactly-once-please")


def test_a_map_column_has_a_checksum_that_counts_its_entries() -> None:
    # Reproduced: pyarrow's list_value_length has no kernel for maps, so every
    # partition with a Spark MapType column failed in prepare.
    t = pa.map_(pa.string(), pa.int64())
    whole = pa.table({"m": pa.array([[("a", 1)], None, [("b", 2), ("c", 3)], []], t)})
    assert arrow_checksum(whole.to_batches()) == arrow_checksum(whole.to_batches(max_chunksize=1))
    other = pa.table({"m": pa.array([[("a", 1)], None, [("b", 2)], []], t)})
    assert arrow_checksum(whole.to_batches()) != arrow_checksum(other.to_batches())
