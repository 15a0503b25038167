"""Mode ``dedup`` under a replay that cuts the batch into other partitions (real Spark).

Dedup rows are visible as soon as an executor inserts them, and a chunk's token is
made of its partition and its rows. A replay of the same batch under another
``repartition(n)`` therefore sends other tokens for rows already in the table. Each
test first lets a run insert its partitions and fail before its commit, then runs the
same batch again under another partitioning: that run must be refused before it
inserts anything, and the original partitioning must then finish the batch with every
row once.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    expected_totals,
    resumable_job,
    scalar,
    writer_options,
)

N = 3000


def _job(sp, url: str, database: str, parts: int, txn: str, log_dir: Path, **extra: str) -> None:
    """Ids 0..N-1 in mode dedup, cut into ``parts`` partitions, as a resumable batch job."""
    resumable_job(sp, url, database, "dedup", N, parts, txn, log_dir, **extra)


def _failed_before_its_commit(sp, url: str, database: str, tmp_path: Path, parts: int) -> tuple[str, Path]:
    """A dedup job inserts ``parts`` partitions (visible) and fails before its decision."""
    create_events_table(url, database, "events", "dedup")
    txn, log_dir = f"layout-{uuid.uuid4().hex[:8]}", tmp_path / "decisions"
    with pytest.raises(Exception, match="injected fault at before_decision"):
        _job(
            sp,
            url,
            database,
            parts,
            txn,
            log_dir,
            **{"fault.step": "before_decision", "fault.action": "raise", "fault.once_file": str(tmp_path / "once")},
        )
    assert scalar(url, f"SELECT count() FROM `{database}`.events") == N  # dedup: visible at prepare
    return txn, log_dir


@pytest.mark.parametrize("parts", [2, 5])
def test_a_dedup_rerun_under_another_partitioning_is_refused_before_it_inserts_and_the_original_finishes_once(
    sp, clickhouse_url: str, database: str, tmp_path: Path, parts: int
) -> None:
    txn, log_dir = _failed_before_its_commit(sp, clickhouse_url, database, tmp_path, 3)
    with pytest.raises(Exception) as info:
        _job(sp, clickhouse_url, database, parts, txn, log_dir)
    text = str(info.value)
    assert "DedupLayoutError" in text and "batch 0" in text, text
    assert "3 partitions" in text and "the original partitioning" in text, text
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == N  # nothing more
    _job(sp, clickhouse_url, database, 3, txn, log_dir)  # the way out the error names
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.events") == N


def test_a_dedup_rerun_under_the_same_partitioning_inserts_nothing_twice(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    txn, log_dir = _failed_before_its_commit(sp, clickhouse_url, database, tmp_path, 3)
    _job(sp, clickhouse_url, database, 3, txn, log_dir)
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.events") == N


def _stream(sp, url: str, database: str, src: Path, chk: Path, parts: int, **extra: str):
    """A file-source stream (replays read the same files) into ``events``, cut into ``parts``."""
    return (
        sp.readStream.schema("id long, k int, s string")
        .json(str(src))
        .repartition(parts)
        .writeStream.format("clickhouse_tx")
        .options(**writer_options(url, database, "events", "dedup", **extra))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )


def test_a_streaming_dedup_replay_after_a_failed_commit_under_another_partitioning_is_refused(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "dedup")
    src, chk = tmp_path / "src", tmp_path / "chk"
    src.mkdir()
    for f in range(3):
        (src / f"part-{f}.json").write_text(
            "".join(json.dumps({"id": i, "k": i % 1000, "s": f"r{i}"}) + "\n" for i in range(f * 1000, (f + 1) * 1000))
        )
    q = _stream(
        sp,
        clickhouse_url,
        database,
        src,
        chk,
        3,
        **{"fault.step": "before_decision", "fault.action": "raise", "fault.once_file": str(tmp_path / "once")},
    )
    with pytest.raises(Exception, match="injected fault at before_decision"):
        q.awaitTermination(600)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == N
    q = _stream(sp, clickhouse_url, database, src, chk, 4)  # the replay of batch 0, cut in 4
    with pytest.raises(Exception) as info:
        q.awaitTermination(600)
    assert "DedupLayoutError" in str(info.value), str(info.value)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == N
    q = _stream(sp, clickhouse_url, database, src, chk, 3)
    q.awaitTermination(600)
    assert q.exception() is None
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(N)
    assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.events") == N
