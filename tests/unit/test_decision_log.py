"""The decision log on a real local filesystem through pyarrow.fs."""

from __future__ import annotations

import os
import pathlib
import threading

import pytest

from clickhouse_tx.decision_log import FileDecisionLog
from clickhouse_tx.errors import DecisionConflictError
from clickhouse_tx.interfaces import Decision, Mode, Prepared


def prepared(xid: str, partition: int = 0, batch: int = 3) -> Prepared:
    return Prepared(xid=xid, txn_id="q", batch=batch, partition=partition, attempt=0,
                    mode=Mode.STAGING, server="http://h:8123", table="db.t", rows=10, checksum=7,
                    details={"stage": f"stage_{xid}", "partition_ids": ["all"]})


def decision(version: int = 1, batch: int = 3, xids: tuple[str, ...] = ("a", "b")) -> Decision:
    return Decision(txn_id="q", batch=batch, version=version,
                    chosen=tuple(prepared(x, i, batch) for i, x in enumerate(xids)))


def test_a_written_decision_reads_back_equal_and_not_done(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    assert log.read(3) is None
    log.write(decision())
    assert log.read(3) == decision()
    assert (tmp_path / "clickhouse_tx" / "q" / "3.v1.json").is_file()


def test_a_version_is_written_once(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    log.write(decision(xids=("a",)))
    with pytest.raises(DecisionConflictError, match="v1 of batch 3"):
        log.write(decision(xids=("z",)))
    assert [p.xid for p in log.read(3).chosen] == ["a"]


def test_read_returns_the_highest_version_with_the_done_flag(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(f"file://{tmp_path}", "q")
    log.write(decision(1, xids=("a", "b")))
    log.write(decision(2, xids=("a", "c")))
    log.write(decision(10, xids=("a", "d")))  # numeric, not lexical, ordering
    d = log.read(3)
    assert d.version == 10 and [p.xid for p in d.chosen] == ["a", "d"] and not d.done
    log.mark_done(3)
    log.mark_done(3)  # idempotent
    assert log.read(3).done
    assert log.read(4) is None


def test_batches_lists_decided_batches_in_order(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    for b in (10, 2, 7):
        log.write(decision(batch=b))
    assert list(log.batches()) == [2, 7, 10]
    assert list(FileDecisionLog(str(tmp_path), "other").batches()) == []


def test_a_crash_mid_write_leaves_only_a_temp_file_that_readers_ignore(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    log.write(decision(1))
    d = tmp_path / "clickhouse_tx" / "q"
    (d / "3.v2.json.tmp-deadbeef").write_bytes(b'{"half": ')  # what a killed writer leaves
    assert log.read(3).version == 1
    log.write(decision(2))
    assert log.read(3).version == 2


def test_no_temp_files_remain_after_writes(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    log.write(decision(1))
    with pytest.raises(DecisionConflictError):
        log.write(decision(1))
    log.mark_done(3)
    assert sorted(os.listdir(tmp_path / "clickhouse_tx" / "q")) == ["3.done", "3.v1.json"]


def test_of_two_racing_writers_of_one_version_exactly_one_wins(tmp_path: pathlib.Path) -> None:
    results: list[str] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        log = FileDecisionLog(str(tmp_path), "q")
        barrier.wait()
        try:
            log.write(decision(1, xids=(f"x{i}",)))
            results.append(f"x{i}")
        except DecisionConflictError:
            pass

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 1
    assert [p.xid for p in FileDecisionLog(str(tmp_path), "q").read(3).chosen] == results


def test_a_log_for_another_txn_or_a_foreign_file_is_refused(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    with pytest.raises(ValueError, match="txn_id 'other'"):
        log.write(Decision(txn_id="other", batch=1, chosen=()))
    with pytest.raises(ValueError, match="safe directory"):
        FileDecisionLog(str(tmp_path), "../escape")
    d = tmp_path / "clickhouse_tx" / "q"
    d.mkdir(parents=True, exist_ok=True)
    (d / "5.v1.json").write_bytes(decision(batch=6).to_bytes())
    with pytest.raises(ValueError, match="batch=6"):
        log.read(5)


def test_prepared_details_survive_the_round_trip(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    log.write(decision())
    p = log.read(3).chosen[0]
    assert p.mode is Mode.STAGING and p.details == {"stage": "stage_a", "partition_ids": ["all"]}


def test_a_filesystem_without_hard_links_publishes_by_checked_move(tmp_path: pathlib.Path) -> None:
    import pyarrow.fs as pafs

    log = FileDecisionLog(str(tmp_path), "q")
    # a non-local pyarrow filesystem (as HDFS would be) takes the generic temp + move path
    log._fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    log.directory = "clickhouse_tx/q"
    log.write(decision(1))
    with pytest.raises(DecisionConflictError):
        log.write(decision(1))
    log.mark_done(3)
    assert log.read(3).done and log.read(3).version == 1
    assert sorted(os.listdir(tmp_path / "clickhouse_tx" / "q")) == ["3.done", "3.v1.json"]
