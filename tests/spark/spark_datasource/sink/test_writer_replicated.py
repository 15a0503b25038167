"""Spark writes into a ``Replicated*MergeTree`` target whose replica is read-only.

The embedded engine never activates a replica, so each is read-only, as a real
server's is while it has lost its Keeper session. A new user's first writes (a batch
append of 3,000 rows in 3 partitions and a stream of the same rows) must fail, naming
``TABLE_IS_READ_ONLY``, within seconds, and claim nothing: no row, no marker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers.spark_writes import events, run_sql, scalar, table_names, writer_options

pytestmark = pytest.mark.embedded_only("needs a read-only replica, as the embedded engine's always are")

N = 3000
#: A minute would mean the server retried the insert (insert_keeper_max_retries) before the error.
FAST_S = 20


def _replicated_events(url: str, database: str) -> None:
    run_sql(
        url,
        f"CREATE TABLE `{database}`.events (id Int64, k Int32, s String) ENGINE = "
        "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') "
        "ORDER BY id SETTINGS replicated_deduplication_window = 1000",
    )


def _nothing_claimed(url: str, database: str) -> None:
    # A plain read: no transaction can hold a Replicated table.
    assert run_sql(url, f"SELECT count() FROM `{database}`.events FORMAT TSV").strip() == "0"
    if "clickhouse_tx_commits" in table_names(url, database):
        assert scalar(url, f"SELECT count() FROM `{database}`.clickhouse_tx_commits") == 0


@pytest.mark.parametrize("mode", ["dedup", "none", "staging"])
def test_a_batch_append_into_a_read_only_replica_fails_naming_table_is_read_only_and_claims_nothing(
    sp, clickhouse_url: str, database: str, mode: str
) -> None:
    _replicated_events(clickhouse_url, database)
    started = time.monotonic()
    with pytest.raises(Exception, match="TABLE_IS_READ_ONLY") as err:
        events(sp, N, 3).write.format("clickhouse_tx").options(
            **writer_options(clickhouse_url, database, "events", mode)
        ).mode("append").save()
    assert time.monotonic() - started < FAST_S
    assert "read-only replica" in str(err.value)
    _nothing_claimed(clickhouse_url, database)


@pytest.mark.parametrize("mode", ["dedup", "none", "staging"])
def test_a_stream_into_a_read_only_replica_fails_naming_table_is_read_only_and_claims_nothing(
    sp, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    _replicated_events(clickhouse_url, database)
    src = tmp_path / "src"
    src.mkdir()
    for f in range(3):
        (src / f"part-{f}.json").write_text(
            "".join(json.dumps({"id": i, "k": i % 1000, "s": f"r{i}"}) + "\n" for i in range(f * 1000, (f + 1) * 1000))
        )
    started = time.monotonic()
    with pytest.raises(Exception, match="TABLE_IS_READ_ONLY"):
        q = (
            sp.readStream.schema("id long, k int, s string")
            .json(str(src))
            .writeStream.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", mode))
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination(120)
        finally:
            q.stop()
    assert time.monotonic() - started < FAST_S
    _nothing_claimed(clickhouse_url, database)
