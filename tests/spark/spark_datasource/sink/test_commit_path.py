"""Batch jobs through real Spark whose commit meets lost, expired or refused work.

Each job writes the ids 0..n-1 once (``events``), so the target must end with
exactly those rows: no duplicate, no loss, whatever happened in between. The
re-runs that replay a batch use the same ``transactional_id`` and ``decision_log``,
as the errors advise (a streaming query replays the same way from its checkpoint).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from clickhouse_tx.store.decision_log import FileDecisionLog
from server_patches import crashes
from spark_datasource.options.writer_specs import MIN_SESSION_TIMEOUT_S
from spark_datasource.testing.credentials import cli_args, target_fields
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    events,
    expected_totals,
    open_registry_entries,
    resumable_job,
    run_sql,
    scalar,
    table_names,
    writer_options,
)

N = 3000


def _job(sp, url: str, database: str, parts: int, txn: str, log_dir: Path, **extra: str) -> None:
    """Ids 0..N-1 in mode transaction, cut into ``parts`` partitions, as a resumable batch job."""
    resumable_job(sp, url, database, "transaction", N, parts, txn, log_dir, **extra)


def _once(url: str, database: str, n: int = N) -> None:
    assert actual_totals(url, database, "events") == expected_totals(n)
    assert scalar(url, f"SELECT uniqExact(id) FROM `{database}`.events") == n


def _decided_then_clickhouse_restarted(sp, own, tmp_path: Path, commit_first: bool):
    """A job decides 3 partitions and dies before its COMMITs; ClickHouse then restarts.

    With ``commit_first`` the COMMIT of partition 0 landed before the driver died.
    Returns (url, database, txn, decision log dir) on the restarted server.
    """
    url, database = own.clickhouse_url, f"d_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE `{database}`")
    create_events_table(url, database, "events", "transaction")
    txn, log_dir = f"rerun-{uuid.uuid4().hex[:8]}", tmp_path / "decisions"
    with pytest.raises(Exception, match="injected fault at after_decision"):
        _job(
            sp,
            url,
            database,
            3,
            txn,
            log_dir,
            **{"fault.step": "after_decision", "fault.action": "raise", "fault.once_file": str(tmp_path / "once")},
        )
    decision = FileDecisionLog(str(log_dir), txn).read(0)
    assert decision is not None and len(decision.chosen) == 3 and not decision.done
    if commit_first:
        p0 = next(p for p in decision.chosen if p.partition == 0)
        ClickHouseHTTP(
            Target(url=url, database=database, table="events"), session_id=p0.xid, session_timeout=3600
        ).command("COMMIT", session_check=True)
    info = crashes.restart_clickhouse(own.dir)  # every other prepared transaction is lost
    return info.clickhouse_url, database, txn, log_dir


@pytest.mark.parametrize("parts", [2, 5])
def test_a_rerun_after_clickhouse_lost_the_prepared_work_under_another_partitioning_writes_each_row_once(
    sp, stack_factory, tmp_path: Path, parts: int
) -> None:
    own = stack_factory(kafka=False)
    url, database, txn, log_dir = _decided_then_clickhouse_restarted(sp, own, tmp_path, commit_first=False)
    _job(sp, url, database, parts, txn, log_dir)  # nothing was visible: decided again over `parts`
    _once(url, database)
    decision = FileDecisionLog(str(log_dir), txn).read(0)
    assert decision.done and len(decision.chosen) == parts and decision.version == 2
    assert open_registry_entries(url, database) == 0


def test_a_rerun_under_another_partitioning_after_a_partial_commit_is_refused_until_the_original_one(
    sp, stack_factory, tmp_path: Path
) -> None:
    own = stack_factory(kafka=False)
    url, database, txn, log_dir = _decided_then_clickhouse_restarted(sp, own, tmp_path, commit_first=True)
    for parts in (5, 2):  # refused each time, naming what is visible; nothing else lands
        with pytest.raises(Exception) as info:
            _job(sp, url, database, parts, txn, log_dir)
        text = str(info.value)
        assert "LostTransactionError" in text and "partitions [1, 2]" in text
        assert "Partitions [0] are committed and visible (1000 rows)" in text
        assert f"transactional_id '{txn}'" in text and "original partitioning (3 partitions" in text
        assert scalar(url, f"SELECT count() FROM `{database}`.events") == 1000
        assert run_sql(url, f"SELECT count() FROM `{database}`.events").strip() == "1000"
    _job(sp, url, database, 3, txn, log_dir)  # the advised way out
    _once(url, database)
    assert open_registry_entries(url, database) == 0


def test_a_server_error_after_a_commit_took_effect_is_looked_up_and_the_job_succeeds_writing_each_row_once(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    # The first COMMIT of the batch lands, then its request raises a server error: the
    # driver looks the xid up (its marker is visible), so the job succeeds and is done.
    create_events_table(clickhouse_url, database, "events", "transaction")
    txn, log_dir = f"late-{uuid.uuid4().hex[:8]}", tmp_path / "decisions"
    once = tmp_path / "once"
    _job(
        sp,
        clickhouse_url,
        database,
        4,
        txn,
        log_dir,
        **{"fault.step": "after_commit:1", "fault.action": "error", "fault.once_file": str(once)},
    )
    assert once.exists()  # the error was raised after a COMMIT that took effect
    _once(clickhouse_url, database)
    assert FileDecisionLog(str(log_dir), txn).read(0).done
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.clickhouse_tx_commits") == 4
    assert open_registry_entries(clickhouse_url, database) == 0


def test_a_job_dying_after_its_first_commit_is_finished_by_recover_and_a_rerun_writes_nothing_twice(
    sp, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    txn, log_dir = f"late-{uuid.uuid4().hex[:8]}", tmp_path / "decisions"
    with pytest.raises(Exception, match="injected fault at after_commit:1"):
        _job(
            sp,
            clickhouse_url,
            database,
            4,
            txn,
            log_dir,
            **{"fault.step": "after_commit:1", "fault.action": "raise", "fault.once_file": str(tmp_path / "once")},
        )
    visible = scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events")
    assert visible >= N // 4  # the first COMMIT at least, and nothing twice
    assert scalar(clickhouse_url, f"SELECT uniqExact(id) FROM `{database}`.events") == visible
    assert not FileDecisionLog(str(log_dir), txn).read(0).done
    argv = [
        *("-m", "clickhouse_tx", "recover", "--url", clickhouse_url, "--table", f"{database}.events"),
        *("--mode", "transaction", "--txn-id", txn, "--checkpoint", str(log_dir)),
        *cli_args(),
    ]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "committed" in done.stdout and open_registry_entries(clickhouse_url, database) == 0
    _once(clickhouse_url, database)  # the decision was rolled forward: every partition committed
    _job(sp, clickhouse_url, database, 4, txn, log_dir)  # a re-run with the same id: no duplicate
    _once(clickhouse_url, database)
    assert FileDecisionLog(str(log_dir), txn).read(0).done


def _slow(seconds: float):
    def slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time as t

        yield from batches
        t.sleep(seconds)

    return slow


def _late_last(seconds: float):
    """Partition 2 starts writing ``seconds`` late: the others' sessions wait that long."""

    def late(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time as t

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 2:
            t.sleep(seconds)
        yield from batches

    return late


def test_a_short_session_timeout_is_refused_before_any_task_writes_and_the_floor_holds_a_late_commit(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    df = events(sp, N, 3).mapInArrow(_late_last(MIN_SESSION_TIMEOUT_S + 5.0), "id long, k int, s string")

    def write(timeout: str) -> None:
        (
            df.write.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", "transaction", session_timeout=timeout))
            .mode("append")
            .save()
        )

    with pytest.raises(Exception, match=rf"option session_timeout='3': expected at least {MIN_SESSION_TIMEOUT_S} sec"):
        write("3")
    # refused on the driver: no task ran, no commit table or registry was made
    assert table_names(clickhouse_url, database) == ["events"]
    # at the floor, partitions 0 and 1 wait longer than their timeout for the commit:
    # the keep-alive holds them, and the job commits each row once
    write(str(MIN_SESSION_TIMEOUT_S))
    _once(clickhouse_url, database)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.clickhouse_tx_commits") == 3


@pytest.mark.slow  # 50 s of tasks outlasting sessions; the keep-alive itself: tests/integration/.../test_commit_path.py
def test_a_job_with_16_tasks_on_2_slots_each_slower_than_the_session_timeout_commits_every_partition(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    n = 16 * 500
    df = events(sp, n, 16).mapInArrow(_slow(6.0), "id long, k int, s string")
    started = time.monotonic()
    (
        df.write.format("clickhouse_tx")
        .options(
            **writer_options(
                clickhouse_url, database, "events", "transaction", session_timeout=str(MIN_SESSION_TIMEOUT_S)
            )
        )
        .mode("append")
        .save()
    )
    # 8 waves of 6 s: the first sessions waited ~40 s for the COMMIT, 4 timeouts
    assert time.monotonic() - started > 40
    _once(clickhouse_url, database, n)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.clickhouse_tx_commits") == 16


def test_a_job_whose_early_session_is_gone_at_commit_commits_nothing_and_a_rerun_writes_it_once(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    target = Target(url=clickhouse_url, database=database, table="events", **target_fields())
    killed: list[str] = []

    def kill_first_prepared() -> None:
        # A plain read shows the markers of open transactions: the first prepared xid.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            try:
                out = run_sql(
                    clickhouse_url,
                    f"SELECT xid FROM `{database}`.clickhouse_tx_commits ORDER BY `partition` LIMIT 1 FORMAT TSV",
                ).split()
            except RuntimeError:
                out = []
            if out:
                # what an expired session does: the transaction is rolled back and gone
                ClickHouseHTTP(target, session_id=out[0], session_timeout=3600).command("ROLLBACK", session_check=True)
                killed.append(out[0])
            time.sleep(0.2)

    killer = threading.Thread(target=kill_first_prepared, daemon=True)
    killer.start()
    df = events(sp, 4000, 4).mapInArrow(_slow(4.0), "id long, k int, s string")
    with pytest.raises(Exception, match=r"Nothing of the batch was committed"):
        (
            df.write.format("clickhouse_tx")
            .options(**writer_options(clickhouse_url, database, "events", "transaction"))
            .mode("append")
            .save()
        )
    killer.join()
    assert killed
    assert run_sql(clickhouse_url, f"SELECT count() FROM `{database}`.events").strip() == "0"
    assert open_registry_entries(clickhouse_url, database) == 0
    (
        events(sp, 4000, 4)
        .write.format("clickhouse_tx")
        .options(**writer_options(clickhouse_url, database, "events", "transaction"))
        .mode("append")
        .save()
    )
    _once(clickhouse_url, database, 4000)
