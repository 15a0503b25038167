"""Exhaustive exploration of the commit protocol over the fakes (``tests/model``).

The model (:mod:`tests.model.protocol_model`) runs one batch of one query: tasks that
prepare in any order, a fault (crash, refused call, lost reply, ClickHouse restart) or
the zombie attempt's prepare at any step of any fake call, restarts under another
partitioning (1-3 partitions) and another spelling of the checkpoint, and Spark
replaying a done batch. Every state is checked; the counts are printed at the end of
the pytest run (``tests/model/conftest.py``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from clickhouse_tx.interfaces import Decision
from clickhouse_tx.protocol import batch_commit, commit_plan
from clickhouse_tx.protocol.batch_commit import BatchCommitter
from clickhouse_tx.protocol.batch_ops import BatchOps
from tests.model.explorer import REPORTS, Stats, Violation, explore, replay
from tests.model.protocol_model import Bounds, ProtocolModel, checkpoint_identity

#: the default run: 2 partitions, restarts under 1, 2 or 3, one fault or zombie per schedule
DEFAULT = Bounds(first_partitions=(2,), replay_partitions=(1, 2, 3), max_runs=2, max_events=1)
#: the slow run: 2 or 3 partitions, up to two restarts
WIDE = Bounds(first_partitions=(2, 3), replay_partitions=(1, 2, 3), max_runs=3, max_events=1)
#: the slow run with two events per schedule (two faults, or a fault and the zombie)
TWO_EVENTS = Bounds(first_partitions=(2,), replay_partitions=(2,), max_runs=2, max_events=2, operator=False)
#: the planted bugs' run: small, each bug is found within it
SMALL = Bounds(first_partitions=(2,), replay_partitions=(2, 3), max_runs=2, max_events=1)


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    # the coordinator logs every refusal and cleanup; millions of lines cost minutes
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _explore(name: str, bounds: Bounds, root: Path) -> tuple[Stats, ProtocolModel]:
    model = ProtocolModel(bounds, checkpoint_identity(root))
    stats = explore(model)
    ends = ", ".join(f"{k} {v:,}" for k, v in sorted(model.outcomes.items()))
    REPORTS.append(f"{name}: {stats.line()}; commit calls: {ends}")
    return stats, model


def test_every_schedule_of_one_fault_or_zombie_and_a_restart_keeps_every_row_exactly_once(tmp_path: Path) -> None:
    stats, model = _explore("model checker", DEFAULT, tmp_path)
    if stats.counterexample is not None:
        pytest.fail(str(stats.counterexample))
    assert stats.violations == 0
    assert stats.schedules >= 10_000, stats.line()
    assert stats.boundary_states >= 400 and stats.states >= 10_000, stats.line()
    # the interesting endings were all reached: a commit, a replay that had to finish the
    # batch after the query stopped, the zombie finishing after the batch was done
    assert {"committed", "committed, zombie late", "done by the final replay"} <= set(stats.endings)
    # and the driver's commit ended every documented way, replays under another
    # partitioning included (refused with LostTransactionError, or decided again)
    # (one fault is retried away, so no xid stays in doubt: no OutcomeUnknownError here)
    assert {"committed", "committed under another partitioning", "LostTransactionError", "NotCommittedError"} <= set(
        model.outcomes
    ), model.outcomes


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 10 min on the shared machine
def test_every_schedule_with_three_partitions_and_two_restarts_keeps_every_row_exactly_once(tmp_path: Path) -> None:
    stats, _ = _explore("model checker (wide)", WIDE, tmp_path)
    if stats.counterexample is not None:
        pytest.fail(str(stats.counterexample))
    assert stats.schedules >= 1_000_000, stats.line()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 10 min on the shared machine
def test_every_schedule_with_two_faults_or_a_fault_and_the_zombie_keeps_every_row_exactly_once(tmp_path: Path) -> None:
    stats, _ = _explore("model checker (two events)", TWO_EVENTS, tmp_path)
    if stats.counterexample is not None:
        pytest.fail(str(stats.counterexample))
    # 996,148 schedules: a floor that a model cut short (an early end, a lost branch) falls under
    assert stats.schedules >= 900_000, stats.line()


def _found(stats: Stats, capsys: pytest.CaptureFixture[str], model: ProtocolModel) -> Violation:
    """The counterexample, printed, and replayed alone from its printed choice list."""
    v = stats.counterexample
    assert v is not None, f"the planted bug went unnoticed: {stats.line()}"
    with capsys.disabled():
        print(f"\ncounterexample found after {stats.segment_runs} segment runs:\n{v}")
    with pytest.raises(Violation) as again:
        replay(model, v.schedule)
    assert again.value.args[0] == v.args[0]
    return v


def test_a_coordinator_that_skips_the_checksum_on_replacement_is_caught_with_a_replayable_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commit_plan, "same_rows", lambda a, b: True)
    model = ProtocolModel(SMALL, checkpoint_identity(tmp_path))
    v = _found(explore(model), capsys, model)
    assert "restart 1: n=3" in "\n".join(v.labels)  # another partitioning took a dead xid's place


def test_a_coordinator_that_commits_before_writing_its_decision_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write, commit_all = BatchOps.write, BatchCommitter._commit_all

    def late_write(self: BatchOps, decision: Decision) -> None:
        if decision.version > 1:
            write(self, decision)

    def commit_then_write(self: BatchCommitter, run: batch_commit._Run) -> dict[int, bool]:
        out = commit_all(self, run)
        if run.decision.version == 1:
            write(self.batch_ops, run.decision)
        return out

    monkeypatch.setattr(BatchOps, "write", late_write)
    monkeypatch.setattr(BatchCommitter, "_commit_all", commit_then_write)
    model = ProtocolModel(SMALL, checkpoint_identity(tmp_path))
    v = _found(explore(model), capsys, model)
    assert "no decision" in v.args[0]


def _hashed_as_spelled(raw: str, cwd: str) -> str:
    """The planted bug: the first build's default id, a hash of the location as spelled."""
    return "chk-" + hashlib.sha256(raw.encode()).hexdigest()[:16]


def test_a_transactional_id_taken_from_the_checkpoint_as_spelled_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = checkpoint_identity(tmp_path, resolve=_hashed_as_spelled)
    assert len({txn for _, txn in ids}) > 1
    model = ProtocolModel(SMALL, ids)
    v = _found(explore(model), capsys, model)
    assert "more than once" in v.args[0] or "done but rows" in v.args[0]


def test_every_spelling_of_the_checkpoint_resolves_to_one_transactional_id(tmp_path: Path) -> None:
    ids = checkpoint_identity(tmp_path)
    assert len(ids) == 5 and len({txn for _, txn in ids}) == 1, ids
