"""JSON-file streams through the exactly-once ``foreachBatch`` helper (``tests/spark``).

Each stream reads JSON files (a replay reads the same files: the same rows under the same
batch ids), ``maxFilesPerTrigger=1`` so that each file is one micro-batch, and runs
``availableNow`` to its end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from spark_datasource.foreach.helper import clickhouse_tx_batch
from spark_datasource.testing import credentials
from tests.helpers.spark_writes import read_committed, run_sql

FILES, PER_FILE = 3, 100
N = FILES * PER_FILE
SCHEMA = "id long, k int, s string"
LOGGER = "clickhouse_tx.spark.foreach_batch"


def json_files(tmp_path: Path) -> Path:
    """Ids 0..N-1 of :func:`expected_totals`, ``PER_FILE`` per file."""
    src = tmp_path / "src"
    src.mkdir()
    for f in range(FILES):
        rows = ({"id": i, "k": i % 1000, "s": f"r{i}"} for i in range(f * PER_FILE, (f + 1) * PER_FILE))
        (src / f"part-{f}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def start_stream(sp, src: Path, chk: Path, fn: Callable[[Any, int], None]):
    return (
        sp.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )


def run_stream(sp, src: Path, chk: Path, fn: Callable[[Any, int], None]) -> str:
    """Run the stream to its end; the query's id."""
    q = start_stream(sp, src, chk, fn)
    q.awaitTermination(600)
    assert q.exception() is None
    return str(q.id)


def failed_stream(sp, src: Path, chk: Path, fn: Callable[[Any, int], None]) -> str:
    """Run the stream, which must fail; the text of its error."""
    q = start_stream(sp, src, chk, fn)
    with pytest.raises(Exception) as info:
        q.awaitTermination(600)
    return str(info.value)


def forget_last_commit(chk: Path) -> None:
    """Spark forgets that batch 2 (the last) finished: the restart replays it over the same file."""
    for name in (str(FILES - 1), f".{FILES - 1}.crc"):
        (chk / "commits" / name).unlink(missing_ok=True)


def key_rows(url: str, database: str) -> list[list[str]]:
    return read_committed(
        url, f"SELECT batch_id, query_id, tables, rows FROM `{database}`.clickhouse_tx_batches ORDER BY batch_id"
    )


def single_helper(url: str, database: str, **extra: Any) -> Callable[[Any, int], None]:
    return clickhouse_tx_batch(
        url=url,
        table=f"{database}.events",
        app_id="events",
        allow_nullable_into_non_nullable=True,
        **credentials.writer_options(),
        **extra,
    )


def lose_last_key_row(url: str, database: str, chk: Path) -> None:
    """What a driver killed after the last batch's rows went in, before its key row, leaves:
    the key row gone and Spark's commit log without the batch (a restart replays it)."""
    run_sql(
        url,
        f"ALTER TABLE `{database}`.clickhouse_tx_batches DELETE WHERE batch_id = {FILES - 1} "
        "SETTINGS mutations_sync = 2",
    )
    forget_last_commit(chk)
