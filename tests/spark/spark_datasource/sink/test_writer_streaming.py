"""Streaming writes from a replayable source (``kafka_py`` on the dev broker) into ClickHouse.

The source records are known exactly (``"<partition>:<i>"`` at offset ``i``), so the
target must hold each (partition, offset) once with the right value: no loss, no
duplicate, whatever happened to the query in between.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.spark_streams import (
    assert_exactly,
    extend_topic,
    new_stream,
    start_query,
    target_rows,
)
from tests.helpers.spark_writes import open_registry_entries


def test_a_query_stopped_mid_batch_and_restarted_on_its_checkpoint_several_times_writes_each_record_once(
    sp, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    expected, common = new_stream(stack, kafka_bootstrap, clickhouse_url, database, tmp_path / "chk", "stops", 3000)
    for round_no in range(3):
        q = start_query(sp, max_offsets=150, **common)
        try:
            # let some batches commit, then stop while a trigger is running
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (
                q.lastProgress is None or q.lastProgress["batchId"] < 2 * round_no + 1
            ):
                time.sleep(0.1)
            while time.monotonic() < deadline and not q.status["isTriggerActive"]:
                time.sleep(0.01)
            time.sleep(0.05 * round_no)
        finally:
            q.stop()
        assert q.exception() is None
    partial = len(target_rows(clickhouse_url, database))
    assert 0 < partial < len(expected), "the stops did not interrupt the query before the end"
    q = start_query(sp, available_now=True, max_offsets=2000, **common)
    q.awaitTermination(600)
    assert q.exception() is None
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0


def test_a_commit_interrupted_between_two_commits_is_rolled_forward_on_restart(
    sp, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    from spark_datasource.sink.metrics import read_metrics

    chk = tmp_path / "chk"
    once = tmp_path / "fault.once"
    expected, common = new_stream(stack, kafka_bootstrap, clickhouse_url, database, chk, "fault", 500)
    q = start_query(
        sp,
        available_now=True,
        **common,
        **{"fault.step": "after_commit:1", "fault.action": "raise", "fault.once_file": str(once)},
    )
    with pytest.raises(Exception, match="injected fault at after_commit:1"):
        q.awaitTermination(600)
    assert once.exists()
    # The batch is decided but not done. The coordinator COMMITs decided partitions
    # in parallel, so the other partition's COMMIT may have landed before the fault
    # surfaced: at least the first partition is visible, and nothing twice.
    from clickhouse_tx.store.decision_log import FileDecisionLog
    from spark_datasource.options.writer_options import WriterOptions

    opts = WriterOptions.parse(
        {"url": clickhouse_url, "table": "x.y", "checkpointLocation": str(chk), "queryName": common["name"]},
        streaming=True,
    ).with_query_identity()
    decision = FileDecisionLog(opts.decision_log_uri(), opts.txn_id()).read(0)
    assert decision is not None and not decision.done and len(decision.chosen) == 2
    rows = target_rows(clickhouse_url, database)
    assert len(rows) in (500, 1000) and len(rows) == len(set(rows))

    q = start_query(sp, available_now=True, **common)
    q.awaitTermination(600)
    assert q.exception() is None
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0
    committed = [m for m in read_metrics(str(chk)) if m["status"] == "committed"]
    assert [(m["batch"], m["replay"], m["rows"]) for m in committed] == [(0, True, 1000)]


def test_a_checkpoint_resumes_each_record_once_whichever_way_spark_stores_it_locally(
    sp, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    # docs/performance.md measures two faster ways to store a local checkpoint; a user
    # who tries one restarts a checkpoint Spark's defaults wrote, and may go back. The
    # rounds pass from each way to each other one (every ordered pair once).
    from benchmarks.checkpoint_fs import use_variant

    chk = tmp_path / "chk"
    expected, common = new_stream(stack, kafka_bootstrap, clickhouse_url, database, chk, "fs", 300)
    ways = ["default", "raw_local_fs", "filesystem_manager", "default", "filesystem_manager", "raw_local_fs", "default"]
    checksummed, bare = set(), set()
    try:
        for round_no, variant in enumerate(ways):
            use_variant(sp, variant)
            if round_no:
                expected |= extend_topic(kafka_bootstrap, common["topic"], 2, 300 * round_no, 300)
            q = start_query(sp, available_now=True, max_offsets=200, **common)
            q.awaitTermination(600)
            assert q.exception() is None
            assert_exactly(clickhouse_url, database, expected)
            batches = {p["batchId"] for p in q.recentProgress if p["numInputRows"]}
            (bare if variant == "raw_local_fs" else checksummed).update(batches)
    finally:
        use_variant(sp, "default")
    assert open_registry_entries(clickhouse_url, database) == 0
    # each round's offset log was written the way the round said: Hadoop's checksum
    # files beside it, but for the raw local file system's
    assert bare and checksummed
    assert {int(f.name[1:].removesuffix(".crc")) for f in (chk / "offsets").glob(".*.crc")} == checksummed
