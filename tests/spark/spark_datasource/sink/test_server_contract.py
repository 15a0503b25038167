"""Every INSERT the writer sends carries the server contract's settings, seen on the wire.

A recording proxy (tests/helpers/request_log.py) stands between Spark (driver and
Python workers) and the stack; each test writes a batch job, a stream and, where the
mode has one, a foreachBatch helper batch through it, then checks every recorded
INSERT against :mod:`clickhouse_tx.client.contract`: ``async_insert = 0`` (a stock
26.3+ server refuses a queued INSERT inside a transaction), deduplication stated by
``insert_deduplicate`` and ``deduplicate_insert`` (26.2+: the latter supersedes the
former), and a token.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clickhouse_tx.errors import ConfigurationError
from spark_datasource import clickhouse_tx_batch
from spark_datasource.testing import credentials
from tests.helpers.foreach_files import SCHEMA, N, json_files, run_stream
from tests.helpers.request_log import RecordingProxy, unpinned_inserts
from tests.helpers.spark_writes import create_events_table, events, scalar, writer_options


def _batch_job(sp, url: str, database: str, mode: str) -> None:
    create_events_table(url, database, "job", mode)
    opts = writer_options(url, database, "job", mode)
    events(sp, 500, 2).write.format("clickhouse_tx").options(**opts).mode("append").save()


def _stream(sp, url: str, database: str, mode: str, tmp_path: Path) -> None:
    create_events_table(url, database, "stream", mode)
    query = (
        sp.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(json_files(tmp_path / "stream")))
        .writeStream.format("clickhouse_tx")
        .options(**writer_options(url, database, "stream", mode))
        .option("checkpointLocation", str(tmp_path / "stream_chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None


def _helper_batches(sp, url: str, database: str, mode: str, tmp_path: Path) -> None:
    create_events_table(url, database, "helper", mode)
    fn = clickhouse_tx_batch(
        url=url,
        table=f"{database}.helper",
        app_id=f"contract_{mode}",
        mode=mode,
        allow_nullable_into_non_nullable=True,
        **credentials.writer_options(),
    )
    run_stream(sp, json_files(tmp_path / "helper"), tmp_path / "helper_chk", fn)


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup", "none"])
def test_every_insert_of_a_batch_job_a_stream_and_a_helper_batch_carries_the_pinned_settings(
    sp, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    (tmp_path / "stream").mkdir()
    (tmp_path / "helper").mkdir()
    with RecordingProxy(clickhouse_url) as proxy:
        _batch_job(sp, proxy.url, database, mode)
        _stream(sp, proxy.url, database, mode, tmp_path)
        tables = ["job", "stream"]
        if mode in ("transaction", "dedup"):  # the helper's modes
            _helper_batches(sp, proxy.url, database, mode, tmp_path)
            tables.append("helper")
    expected = {"job": 500, "stream": N, "helper": N}
    for table in tables:
        assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.`{table}`") == expected[table]
    inserts = proxy.inserts()
    # Not vacuous: the rows of every write went through the proxy as INSERTs it saw.
    assert len([r for r in inserts if "FORMAT ArrowStream" in r.statement]) >= len(tables)
    assert unpinned_inserts(inserts, has_deduplicate_insert=True) == []


def test_a_user_setting_the_contract_pins_is_refused_on_the_driver_naming_it(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    opts = writer_options(clickhouse_url, database, "events", "transaction", **{"setting.async_insert": "1"})
    with pytest.raises(Exception, match="setting async_insert is set by clickhouse-tx"):
        events(sp, 10, 1).write.format("clickhouse_tx").options(**opts).mode("append").save()
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 0
    with pytest.raises(ConfigurationError, match="setting insert_deduplicate is set by clickhouse-tx"):
        clickhouse_tx_batch(
            url=clickhouse_url, table=f"{database}.events", app_id="a", **{"setting.insert_deduplicate": "0"}
        )


@pytest.mark.parametrize("mode", ["transaction", "staging", "none"])
def test_a_partition_holding_the_same_block_three_times_lands_whole_in_a_table_with_a_deduplication_window(
    sp, clickhouse_url: str, database: str, mode: str
) -> None:
    # The window the server would deduplicate by (a stage is made AS the target, so it
    # has it too), and blocks cut at 1,000 rows: three equal blocks in one INSERT.
    create_events_table(clickhouse_url, database, "events", "dedup")
    block = sp.range(0, 1000, 1, 1).selectExpr("id", "cast(id % 1000 as int) as k", "'same' as s")
    df = block.union(block).union(block).coalesce(1)
    opts = writer_options(clickhouse_url, database, "events", mode, **{"setting.max_insert_block_size": "1000"})
    df.write.format("clickhouse_tx").options(**opts).mode("append").save()
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 3000
