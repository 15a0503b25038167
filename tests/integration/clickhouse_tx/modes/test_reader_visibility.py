"""What a concurrent read-committed reader sees while a multi-partition batch commits, per mode.

Measures the figures quoted in ``docs/modes.md`` ("What readers see"):

    python -m pytest tests/integration/clickhouse_tx/modes/test_reader_visibility.py -s -q
"""

from __future__ import annotations

import collections
import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext
from spark_datasource.testing.credentials import target_fields

PARTITIONS, ROWS, BATCHES = 8, 2000, 10


def _count(c: ClickHouseHTTP, target: Target) -> int:
    return int(
        c.command(
            f"SELECT count() FROM {q.qualified(target.database, target.table)} SETTINGS implicit_transaction = 1"
        ).strip()
    )


def _rows(batch: int, partition: int) -> pa.Table:
    first = (batch * PARTITIONS + partition) * ROWS
    return pa.table({"id": pa.array(range(first, first + ROWS), pa.uint64())})


def _classify(seen: collections.Counter) -> dict[str, int]:
    """Reads by what they saw: whole batches, whole partitions of a batch, part of a partition."""
    out = {"reads": sum(seen.values()), "whole_batches": 0, "part_of_a_batch": 0, "part_of_a_partition": 0}
    for c, n in seen.items():
        key = (
            "whole_batches"
            if c % (PARTITIONS * ROWS) == 0
            else "part_of_a_batch"
            if c % ROWS == 0
            else "part_of_a_partition"
        )
        out[key] += n
    return out


@pytest.mark.parametrize(
    ("mode", "visibility"),
    [("transaction", "partition"), ("staging", "partition"), ("dedup", "partition"), ("staging", "batch")],
)
def test_a_reader_during_a_multi_partition_commit_never_sees_part_of_a_partition(
    clickhouse_url: str, database: str, tmp_path: Path, mode: str, visibility: str
) -> None:
    target = Target(url=clickhouse_url, database=database, table="events", **target_fields())
    admin = ClickHouseHTTP(target)
    admin.command(
        f"CREATE TABLE {q.qualified(database, 'events')} (id UInt64) ENGINE = MergeTree "
        "ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
    )
    coord = build_coordinator(target, mode, f"vis-{mode}", str(tmp_path), visibility=visibility)
    seen: collections.Counter[int] = collections.Counter()
    before_commit = []
    stop = threading.Event()

    def reader() -> None:
        r = ClickHouseHTTP(target)
        while not stop.is_set():
            seen[_count(r, target)] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for b in range(BATCHES):
            msgs = [
                coord.prepare(WriteContext(coord.txn_id, b, p, 0), iter(_rows(b, p).to_batches()))
                for p in range(PARTITIONS)
            ]
            before_commit.append(_count(admin, target) - b * PARTITIONS * ROWS)
            coord.commit_batch(b, msgs)
    finally:
        stop.set()
        thread.join()
    result = {
        "mode": mode,
        "visibility": visibility,
        "batches": BATCHES,
        "partitions": PARTITIONS,
        "rows_per_partition": ROWS,
        **_classify(seen),
        "rows_visible_before_commit_per_batch": sorted(set(before_commit)),
    }
    print("reader visibility:", json.dumps(result))
    assert _count(admin, target) == BATCHES * PARTITIONS * ROWS
    assert result["reads"] > 0 and result["part_of_a_partition"] == 0, result
    if visibility == "batch":  # the whole batch appears in one step, or nothing of it
        assert result["part_of_a_batch"] == 0, result
    # Prepared rows: invisible until the commit, except in dedup mode (inserted straight in).
    assert set(before_commit) == ({PARTITIONS * ROWS} if mode == "dedup" else {0})
