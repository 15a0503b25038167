"""Batch writes through ``df.write.format("clickhouse_tx")`` on a real local Spark and stack.

Every read of the target uses ``implicit_transaction=1`` in the query text
(read-committed: a plain read on ClickHouse 26.9 also counts rows of transactions
that are still open), except where a test checks what a plain reader sees.

The retry/speculation case needs ``local[2,4]`` (local mode retries a task only when
the master says so), so it runs its Spark job in a child process: this module is
also its entry point (``python -m tests.spark.spark_datasource.sink.test_writer_batch retry-job ...``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest
import requests

from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import http_auth, target_fields
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    events,
    expected_totals,
    open_registry_entries,
    read_committed,
    run_sql,
    scalar,
    table_names,
    writer_options,
)

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


# ------------------------------------------------------------------ appends


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup", "none"])
def test_a_million_rows_arrive_exactly_once_with_matching_checksums_in_every_mode(
    sp, clickhouse_url: str, database: str, mode: str
) -> None:
    n = 1_000_000
    create_events_table(clickhouse_url, database, "events", mode)
    txn = f"t1m-{mode}-{uuid.uuid4().hex[:6]}"
    (
        events(sp, n, 4)
        .write.format("clickhouse_tx")
        .options(**writer_options(clickhouse_url, database, "events", mode, transactional_id=txn))
        .mode("append")
        .save()
    )
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(n)
    assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.events") == n
    if mode != "none":
        # one committed marker per partition, carrying the partition's row count
        markers = read_committed(
            clickhouse_url,
            f"SELECT count(), sum(rows) FROM `{database}`.clickhouse_tx_commits WHERE startsWith(txn_id, '{txn}.job-')",
        )[0]
        assert [int(x) for x in markers] == [4, n]
    assert open_registry_entries(clickhouse_url, database) == 0
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_")]


def test_a_staging_job_with_visibility_batch_arrives_exactly_once_and_leaves_no_stage(
    sp, clickhouse_url: str, database: str
) -> None:
    n = 200_000
    create_events_table(clickhouse_url, database, "events", "staging")
    txn = f"vis-{uuid.uuid4().hex[:6]}"
    opts = writer_options(clickhouse_url, database, "events", "staging", transactional_id=txn)
    events(sp, n, 4).write.format("clickhouse_tx").options(**opts, visibility="batch").mode("append").save()
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(n)
    markers = read_committed(
        clickhouse_url,
        f"SELECT count(), sum(rows) FROM `{database}`.clickhouse_tx_commits WHERE startsWith(txn_id, '{txn}.job-')",
    )[0]
    assert [int(x) for x in markers] == [4, n]
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_")]


def _fail_in_partition(target_partition: int, delay_s: float):
    def fail(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time

        from pyspark import TaskContext

        tc = TaskContext.get()
        for b in batches:
            yield b
            if tc.partitionId() == target_partition:
                time.sleep(delay_s)  # let the other partitions finish preparing first
                raise RuntimeError(f"injected failure in partition {target_partition}")

    return fail


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_a_failed_job_leaves_nothing_visible_no_stage_tables_and_no_open_registry_entries(
    sp, clickhouse_url: str, database: str, mode: str
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    df = events(sp, 20_000, 2).mapInArrow(_fail_in_partition(1, 3.0), "id long, k int, s string")
    with pytest.raises(Exception, match="injected failure in partition 1"):
        (
            df.write.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", mode))
            .mode("append")
            .save()
        )
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 0
    # not even a plain (non-transactional) reader sees rows: everything was rolled back
    assert run_sql(clickhouse_url, f"SELECT count() FROM `{database}`.events").strip() == "0"
    assert open_registry_entries(clickhouse_url, database) == 0
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_")]


def test_batch_metrics_are_appended_per_job_and_readable_from_python(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    from spark_datasource.sink.metrics import read_metrics

    create_events_table(clickhouse_url, database, "events", "transaction")
    log_dir = tmp_path / "decisions"
    for _ in range(2):
        (
            events(sp, 30_000, 3)
            .write.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", "transaction", decision_log=str(log_dir)))
            .mode("append")
            .save()
        )
    lines = read_metrics(str(log_dir))
    assert len(lines) == 2 and len({m["txn_id"] for m in lines}) == 2
    for m in lines:
        assert (m["status"], m["rows"], m["partitions"], m["committed_partitions"]) == ("committed", 30_000, 3, 3)
        assert m["bytes"] >= 30_000 * 12  # at least the two numeric columns
        assert m["prepare_seconds_max"] >= m["prepare_seconds_p50"] > 0
        assert m["commit_seconds"] > 0 and m["table"] == f"{database}.events"
        assert (m["retried_attempts"], m["rolled_back"]) == (0, 0)


# ------------------------------------------------------------------ overwrite


def test_overwrite_swaps_in_the_new_rows_and_a_concurrent_reader_sees_old_or_new_never_empty_or_half(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    run_sql(clickhouse_url, f"INSERT INTO `{database}`.events SELECT number, 7, 'old' FROM numbers(50000)")
    old = (50_000, 50_000 * 49_999 // 2)
    new = (200_000, 200_000 * 199_999 // 2)
    seen: set[tuple[int, int]] = set()
    stop = threading.Event()

    def reader() -> None:
        q = f"SELECT count(), sum(id) FROM `{database}`.events"
        while not stop.is_set():
            for text in (q + " SETTINGS implicit_transaction = 1 FORMAT TSV", q + " FORMAT TSV"):
                seen.add(tuple(int(x) for x in run_sql(clickhouse_url, text).split()))  # type: ignore[arg-type]

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        (
            events(sp, 200_000, 4)
            .write.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", "transaction"))
            .mode("overwrite")
            .save()
        )
    finally:
        stop.set()
        t.join()
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(200_000)
    assert old in seen
    assert seen <= {old, new}, f"a reader saw a state that is neither old nor new: {seen - {old, new}}"
    assert not [x for x in table_names(clickhouse_url, database) if x.startswith("_ctx_")]


def test_a_failed_overwrite_keeps_the_old_contents_and_drops_its_stage_table(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    run_sql(clickhouse_url, f"INSERT INTO `{database}`.events SELECT number, 7, 'old' FROM numbers(1000)")
    df = events(sp, 20_000, 2).mapInArrow(_fail_in_partition(1, 3.0), "id long, k int, s string")
    with pytest.raises(Exception, match="injected failure"):
        (
            df.write.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", "transaction"))
            .mode("overwrite")
            .save()
        )
    assert read_committed(clickhouse_url, f"SELECT count(), sum(id), min(s) FROM `{database}`.events") == [
        ["1000", str(1000 * 999 // 2), "old"]
    ]
    assert not [x for x in table_names(clickhouse_url, database) if x.startswith("_ctx_")]
    assert open_registry_entries(clickhouse_url, database) == 0


def test_overwrite_by_partition_replaces_new_partitions_and_drops_the_ones_absent_from_the_data(
    clickhouse_url: str, database: str
) -> None:
    # The fallback for databases that cannot EXCHANGE; forced here on an Atomic database.
    from spark_datasource.sink.overwrite import swap_in, swap_method

    ddl = "(p UInt8, v UInt32) ENGINE = MergeTree PARTITION BY p ORDER BY v"
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.t {ddl}")
    run_sql(clickhouse_url, f"CREATE TABLE `{database}`.st {ddl}")
    run_sql(clickhouse_url, f"INSERT INTO `{database}`.t VALUES (1, 1), (2, 2), (3, 3)")
    run_sql(clickhouse_url, f"INSERT INTO `{database}`.st VALUES (2, 20), (2, 21), (4, 40)")
    target = Target(url=clickhouse_url, database=database, table="t", **target_fields())
    assert swap_method(target) == "exchange"  # chdb 26.9's default database engine is Atomic
    assert swap_in(target, "st", method="replace_partition") == "replace_partition"
    assert read_committed(clickhouse_url, f"SELECT p, v FROM `{database}`.t ORDER BY p, v") == [
        ["2", "20"],
        ["2", "21"],
        ["4", "40"],
    ]


def test_overwrite_of_a_missing_table_with_create_table_creates_and_fills_it(
    sp, clickhouse_url: str, database: str
) -> None:
    (
        events(sp, 1000, 2)
        .write.format("clickhouse_tx")
        .options(**writer_options(clickhouse_url, database, "fresh", "transaction", create_table="true", order_by="id"))
        .mode("overwrite")
        .save()
    )
    assert actual_totals(clickhouse_url, database, "fresh") == expected_totals(1000)


# ------------------------------------------------------------------ retries and speculation

RETRY_N = 200_000
RETRY_MODES = ("transaction", "staging", "dedup")


def _retry_job(url: str, database: str) -> None:
    """Child process: local[2,4] with speculation; partition 1 fails once, partition 2 is slow once."""
    from pyspark.sql import SparkSession

    import spark_datasource

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("clickhouse-tx-retry")
        .config("spark.task.maxFailures", "4")
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.multiplier", "1.2")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.minTaskRuntime", "200ms")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_datasource.register(spark)

    def flaky(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time

        from pyspark import TaskContext

        tc = TaskContext.get()
        for i, b in enumerate(batches):
            yield b
            if tc.attemptNumber() == 0 and tc.partitionId() == 1 and i == 0:
                raise RuntimeError("first attempt of partition 1 fails after its first batch")
            if tc.attemptNumber() == 0 and tc.partitionId() == 2:
                time.sleep(0.5)  # a straggler: invites a speculative copy

    try:
        for mode in RETRY_MODES:
            df = events(spark, RETRY_N, 4).mapInArrow(flaky, "id long, k int, s string")
            (
                df.write.format("clickhouse_tx")
                .options(
                    **writer_options(
                        url,
                        database,
                        mode,
                        mode,
                        transactional_id=f"retry-{mode}",
                        decision_log=os.path.join(os.environ["CTX_RETRY_LOG"], mode),
                        batch_size="8192",
                    )
                )
                .mode("append")
                .save()
            )
    finally:
        spark.stop()


@pytest.mark.timeout(600)
def test_a_task_that_fails_once_and_a_speculative_straggler_leave_no_duplicates(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    from spark_datasource.sink.metrics import read_metrics

    for mode in RETRY_MODES:
        create_events_table(clickhouse_url, database, mode, mode)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "CTX_RETRY_LOG": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            __name__,
            "retry-job",
            clickhouse_url,
            database,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for mode in RETRY_MODES:
        assert actual_totals(clickhouse_url, database, mode) == expected_totals(RETRY_N), mode
        assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.`{mode}`") == RETRY_N
        (m,) = read_metrics(str(tmp_path / mode))
        assert m["retried_attempts"] >= 1, m
        assert m["committed_partitions"] == 4 and m["rows"] == RETRY_N
        # the failed first attempt of partition 1 ended ABORTED, and once the job's batch
        # was done its finished entries were dropped: the registry keeps xids in flight only
        states = run_sql(
            clickhouse_url,
            f"SELECT lower(state) FROM `{database}`.clickhouse_tx_registry WHERE txn_id = 'retry-{mode}' FORMAT TSV",
        ).split()
        assert states == [], (mode, states)
    assert open_registry_entries(clickhouse_url, database) == 0


if __name__ == "__main__":
    if sys.argv[1] == "retry-job":
        _retry_job(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")


def _partitioned(url: str, fq: str, value: int, partitions: int = 40) -> None:
    run_sql(url, f"CREATE TABLE {fq} (p UInt8, v UInt32) ENGINE = MergeTree PARTITION BY p ORDER BY v")
    run_sql(url, f"INSERT INTO {fq} SELECT number % {partitions}, {value} FROM numbers({partitions * 10})")


def test_the_partition_by_partition_swap_runs_in_one_transaction_so_readers_never_see_old_and_new_mixed(
    clickhouse_url: str, database: str
) -> None:
    from spark_datasource.sink.overwrite import swap_in

    for name, value in (("t", 0), ("st1", 1), ("st2", 2)):
        _partitioned(clickhouse_url, f"`{database}`.{name}", value)
    target = Target(url=clickhouse_url, database=database, table="t", **target_fields())
    seen: list[list[str]] = []
    stop = threading.Event()

    def reader() -> None:
        with requests.Session() as s:
            s.auth = http_auth()
            while not stop.is_set():
                r = s.post(
                    clickhouse_url,
                    data=f"SELECT groupUniqArray(v), count() FROM `{database}`.t SETTINGS implicit_transaction = 1",
                    timeout=30,
                )
                seen.append(r.text.split())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_ in range(6):
            assert swap_in(target, f"st{1 + round_ % 2}", method="replace_partition") == "replace_partition"
    finally:
        stop.set()
        thread.join()
    mixed = [s for s in seen if s[0].count(",") > 0 or s[1] != "400"]
    print(f"partition-by-partition swap: {len(seen)} reads, {len(mixed)} saw old and new mixed")
    assert len(seen) > 20 and mixed == []
    assert read_committed(clickhouse_url, f"SELECT groupUniqArray(v), count() FROM `{database}`.t") == [["[2]", "400"]]


def test_an_overwrite_that_cannot_be_atomic_warns_naming_what_readers_can_see(
    clickhouse_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from clickhouse_tx.client.http import ClickHouseHTTP
    from spark_datasource.sink.overwrite import swap_in, swap_method

    db = f"ord_{uuid.uuid4().hex[:8]}"
    admin = ClickHouseHTTP(Target(url=clickhouse_url, database="default", table="x", **target_fields()))
    admin.command(f"CREATE DATABASE `{db}` ENGINE = Ordinary", settings={"allow_deprecated_database_ordinary": 1})
    try:
        _partitioned(clickhouse_url, f"`{db}`.t", 0)
        _partitioned(clickhouse_url, f"`{db}`.st", 1, partitions=3)
        target = Target(url=clickhouse_url, database=db, table="t", **target_fields())
        with caplog.at_level("WARNING", logger="clickhouse_tx.spark"):
            assert swap_method(target) == "replace_partition_each"
            # Asked for the transactional swap anyway: refused, it falls back and says so again.
            assert swap_in(target, "st", method="replace_partition") == "replace_partition_each"
        warnings = [r.getMessage() for r in caplog.records if "NOT atomic" in r.getMessage()]
        assert len(warnings) == 2 and all(
            f"{db}.t" in w and "some partitions new and others old" in w for w in warnings
        ), warnings
        assert read_committed(clickhouse_url, f"SELECT groupUniqArray(v), count() FROM `{db}`.t") == [["[1]", "30"]]
    finally:
        admin.command(f"DROP DATABASE IF EXISTS `{db}` SYNC")
