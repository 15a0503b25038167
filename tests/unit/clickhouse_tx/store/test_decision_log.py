"""The decision log on a real local filesystem through pyarrow.fs."""

from __future__ import annotations

import collections
import dataclasses
import errno
import os
import pathlib

import pyarrow.fs as pafs
import pytest

from clickhouse_tx.errors import ConfigurationError, DecisionConflictError, TornDecisionError
from clickhouse_tx.interfaces import Decision, Mode
from clickhouse_tx.store.decision_log import FileDecisionLog
from tests.helpers.decision_log import decision, race


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
    for v in range(1, 11):  # numeric, not lexical, ordering; more versions than one probe
        log.write(decision(v, xids=("a", f"d{v}")))
    d = log.read(3)
    assert d.version == 10 and [p.xid for p in d.chosen] == ["a", "d10"] and not d.done
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


def test_of_racing_writers_of_one_version_exactly_one_wins(tmp_path: pathlib.Path) -> None:
    winners = race(lambda: FileDecisionLog(str(tmp_path), "q"))
    assert len(winners) == 1
    assert [p.xid for p in FileDecisionLog(str(tmp_path), "q").read(3).chosen] == winners


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


def test_a_version_is_refused_before_its_predecessor(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q")
    with pytest.raises(ValueError, match="v2 of batch 3 written before v1"):
        log.write(decision(2))


class CountingHandler(pafs.FileSystemHandler):
    """A local filesystem that counts calls and the file infos it hands out."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.calls: collections.Counter = collections.Counter()
        self.infos = 0

    def reset(self) -> None:
        self.calls.clear()
        self.infos = 0

    def get_type_name(self) -> str:
        return "counting"

    def get_file_info(self, paths):  # pyarrow's handler interface
        self.calls["get_file_info"] += 1
        self.infos += len(paths)
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        self.calls["list_directory"] += 1
        out = self.fs.get_file_info(selector)
        self.infos += len(out)
        return out

    def open_input_stream(self, path):
        self.calls["open"] += 1
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        self.calls["open"] += 1
        return self.fs.open_input_file(path)

    def normalize_path(self, path):
        return path

    def equals(self, other):
        return other is self

    def _no(self, *args):
        raise NotImplementedError("read-only in this test")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _no
    delete_file = move = copy_file = open_output_stream = open_append_stream = _no


def _counted_read(tmp_path: pathlib.Path, batch: int) -> tuple[Decision | None, CountingHandler]:
    handler = CountingHandler()
    log = FileDecisionLog("unused", "q", filesystem=(pafs.PyFileSystem(handler), str(tmp_path)))
    handler.reset()
    return log.read(batch), handler


def test_reading_a_batch_decision_costs_the_same_few_filesystem_calls_for_10_or_600_batches(
    tmp_path: pathlib.Path,
) -> None:
    log = FileDecisionLog(str(tmp_path), "q", compact_every=10_000)
    costs = []
    for upto in (10, 600):
        for b in range(len(costs) and 10, upto):
            log.write(decision(batch=b))
            log.mark_done(b)
        d, counted = _counted_read(tmp_path, 5)
        assert d is not None and d.done and d.batch == 5
        new, counted_new = _counted_read(tmp_path, upto)  # the first read of a new batch
        assert new is None
        costs.append((dict(counted.calls), counted.infos, dict(counted_new.calls), counted_new.infos))
    assert costs[0] == costs[1]
    read_calls, read_infos, new_calls, new_infos = costs[1]
    assert "list_directory" not in read_calls and sum(read_calls.values()) <= 2 and read_infos <= 5
    assert sum(new_calls.values()) <= 2 and new_infos <= 6


def test_compaction_keeps_the_newest_done_batches_and_every_batch_not_done(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q", retain_batches=10, compact_every=10_000)
    for b in range(30):
        log.write(decision(batch=b))
        if b not in (3, 25):
            log.mark_done(b)
    deleted = log.compact()
    newest_done = [29, 28, 27, 26, 24, 23, 22, 21, 20, 19]
    assert deleted == [b for b in range(19) if b != 3]
    assert list(log.batches()) == [3] + sorted(newest_done + [25])
    for b in newest_done:
        assert log.read(b) == dataclasses.replace(decision(batch=b), done=True)
    for b in (3, 25):  # not done: kept whole, a replay rolls them forward
        assert log.read(b) == decision(batch=b)
    # a compacted batch reads as done with nothing to commit, and is never decided again
    assert log.read(7) == Decision(txn_id="q", batch=7, chosen=(), version=0, done=True)
    with pytest.raises(DecisionConflictError, match="batch 7 is done and compacted"):
        log.write(decision(batch=7))
    assert log.read(30) is None
    assert log.compact() == []  # nothing more to drop until new batches are done


def test_marking_done_compacts_every_few_batches_keeping_the_retained_ones(tmp_path: pathlib.Path) -> None:
    log = FileDecisionLog(str(tmp_path), "q", retain_batches=3, compact_every=5)
    for b in range(11):
        log.write(decision(batch=b))
        log.mark_done(b)
    assert list(log.batches()) == [8, 9, 10]  # compacted when batch 10 was done
    files = sorted(os.listdir(tmp_path / "clickhouse_tx" / "q"))
    assert files == ["10.done", "10.v1.json", "8.done", "8.v1.json", "9.done", "9.v1.json", "_compacted"]
    assert os.listdir(tmp_path / "clickhouse_tx" / "q" / "_compacted") == ["7"]
    assert log.read(0).done and log.read(0).chosen == ()


def test_a_retention_below_one_batch_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="retain_batches"):
        FileDecisionLog("/tmp/x", "q", retain_batches=0)


def _no_hard_links(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    tried: list[str] = []

    def refuse(src: str, dst: str) -> None:
        tried.append(dst)
        raise PermissionError(errno.EPERM, "Operation not permitted", dst)

    monkeypatch.setattr(os, "link", refuse)
    return tried


def test_where_hard_links_fail_a_publish_still_refuses_a_second_writer(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried = _no_hard_links(monkeypatch)
    log = FileDecisionLog(str(tmp_path), "q")
    log.write(decision(1, xids=("a",)))
    with pytest.raises(DecisionConflictError, match="v1 of batch 3"):
        log.write(decision(1, xids=("z",)))
    log.mark_done(3)
    assert tried  # the link was attempted and failed
    assert [p.xid for p in log.read(3).chosen] == ["a"] and log.read(3).done
    assert sorted(os.listdir(tmp_path / "clickhouse_tx" / "q")) == ["3.done", "3.v1.json"]


def test_where_hard_links_fail_of_racing_writers_exactly_one_wins(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_hard_links(monkeypatch)
    winners = race(lambda: FileDecisionLog(str(tmp_path), "q"))
    assert len(winners) == 1
    assert [p.xid for p in FileDecisionLog(str(tmp_path), "q").read(3).chosen] == winners


def test_a_decision_torn_by_a_killed_writer_is_reported_not_taken_as_absent(tmp_path: pathlib.Path) -> None:
    d = tmp_path / "clickhouse_tx" / "q"
    d.mkdir(parents=True)
    (d / "3.v1.json").write_bytes(decision().to_bytes()[:40])
    with pytest.raises(TornDecisionError, match="3.v1.json is incomplete"):
        FileDecisionLog(str(tmp_path), "q").read(3)


def test_an_object_store_log_without_an_arbiter_refuses_to_write_and_says_why(tmp_path: pathlib.Path) -> None:
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())  # no exclusive create
    log = FileDecisionLog("unused", "q", filesystem=(fs, ""))
    assert log.semantics == "registry-cas"
    with pytest.raises(ConfigurationError, match="needs an arbiter"):
        log.write(decision())
    assert not (tmp_path / "clickhouse_tx" / "q" / "3.v1.json").exists()


def test_a_coordinator_over_a_compacting_log_replays_the_newest_and_a_compacted_batch_as_done(
    tmp_path: pathlib.Path,
) -> None:
    from clickhouse_tx.interfaces import WriteContext
    from tests.unit.fakes import World, arrow_batches

    w = World()
    w.log = FileDecisionLog(str(tmp_path), w.txn_id, retain_batches=2, compact_every=1)

    def run(batch: int, attempt: int):
        co = w.coordinator()
        msgs = [co.prepare(WriteContext(w.txn_id, batch, p, attempt), arrow_batches(5, p)) for p in range(2)]
        return co.commit_batch(batch, msgs)

    for b in range(8):
        assert not run(b, 0).already_done
    assert list(w.log.batches()) == [6, 7]
    newest, compacted = run(7, 1), run(3, 1)  # Spark replays its last batch; a stray replay
    assert newest.already_done and compacted.already_done
    assert len(newest.rolled_back) == len(compacted.rolled_back) == 2
    for b in range(8):  # every (batch, partition) visible exactly once
        assert w.keys_of(b) == {(w.txn_id, b, 0): 1, (w.txn_id, b, 1): 1}
