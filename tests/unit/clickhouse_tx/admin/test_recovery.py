"""Recovery of in-doubt xids, GC of stale prepares and the status summary, over the fakes."""

from __future__ import annotations

import pytest

from clickhouse_tx.admin.recovery import gc_stale, resolve_in_doubt, status_summary
from clickhouse_tx.interfaces import Prepared, WriteContext
from tests.unit.fakes import TARGET, Crash, FakeDecisionLog, World, arrow_batches


def prepare(w: World, partition: int, attempt: int = 0, batch: int = 0) -> Prepared:
    return w.coordinator().prepare(WriteContext("q1", batch, partition, attempt), arrow_batches(4))


def crash_commit_at(w: World, msgs: list[Prepared], op: str, phase: str, nth: int = 0) -> None:
    w.faults.arm(nth, "crash", lambda o, ph: o == op and ph == phase)
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, msgs)
    w.faults.disarm()


def states(w: World) -> dict[str, str]:
    return {x: e.state for x, e in w.registry.everything.items()}


def test_a_committing_xid_that_did_commit_is_recorded_committed() -> None:
    w = World()
    m = prepare(w, 0)
    crash_commit_at(w, [m], "ch.commit", "after")
    assert states(w)[m.xid] == "committing"
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: w.log)
    assert report.committed == (m.xid,) and states(w)[m.xid] == "committed"
    assert w.keys_of(0) == {("q1", 0, 0): 1}


def test_a_committing_decided_xid_still_pending_is_rolled_forward() -> None:
    w = World()
    m = prepare(w, 0)
    crash_commit_at(w, [m], "ch.commit", "before")
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: w.log)
    assert report.committed == (m.xid,) and w.keys_of(0) == {("q1", 0, 0): 1}


def test_a_committing_xid_whose_session_died_is_aborted_and_the_replay_replaces_it() -> None:
    w = World()
    m = prepare(w, 0)
    crash_commit_at(w, [m], "ch.commit", "before")
    w.ch.kill_sessions()
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: w.log)
    assert report.rolled_back == (m.xid,) and states(w)[m.xid] == "aborted"
    r = w.coordinator().commit_batch(0, [prepare(w, 0, 1)])
    assert r.replaced and w.keys_of(0) == {("q1", 0, 0): 1}


def test_an_aborting_xid_is_finished() -> None:
    w = World()
    a, b = prepare(w, 0), prepare(w, 0, 1)
    crash_commit_at(w, [a, b], "ch.rollback", "before")  # dies rolling back the duplicate
    assert states(w)[b.xid] == "aborting"
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: w.log)
    assert b.xid in report.rolled_back and states(w)[b.xid] == "aborted"
    assert w.ch.tx[b.xid].status == "rolled_back"


def test_an_unreachable_decision_log_leaves_a_pending_xid_alone() -> None:
    w = World()
    m = prepare(w, 0)
    crash_commit_at(w, [m], "ch.commit", "before")
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: None)
    assert report.skipped == (m.xid,) and states(w)[m.xid] == "committing"


def test_gc_rolls_back_old_undecided_prepares_and_spares_decided_and_young_ones() -> None:
    w = World()
    decided = prepare(w, 0)
    crash_commit_at(w, [decided], "log.write", "after")  # decided, never committed
    stale = prepare(w, 1, batch=1)
    w.now[0] += 600
    young = prepare(w, 2, batch=1)
    report = gc_stale(TARGET, w.ch, w.registry, lambda t: w.log, older_than_s=300)
    assert report.rolled_back == (stale.xid,) and report.skipped == (decided.xid,)
    assert states(w) == {decided.xid: "initialized", stale.xid: "aborted", young.xid: "initialized"}
    assert w.ch.tx[stale.xid].status == "rolled_back"


def test_gc_filters_by_txn_id() -> None:
    w = World()
    m = prepare(w, 0)
    w.now[0] += 600
    assert (
        gc_stale(TARGET, w.ch, w.registry, lambda t: w.log, 300, txn_ids={"other"}, overwrite_stages=False).rolled_back
        == ()
    )
    assert gc_stale(
        TARGET, w.ch, w.registry, lambda t: w.log, 300, txn_ids={"q1"}, overwrite_stages=False
    ).rolled_back == (m.xid,)


def test_status_counts_open_xids_and_names_the_in_doubt_ones() -> None:
    w = World()
    assert status_summary(w.registry, clock=lambda: w.now[0]).oldest_open_age_s is None
    a, b = prepare(w, 0), prepare(w, 1)
    crash_commit_at(w, [a, b], "ch.commit", "after", nth=0)
    w.now[0] += 30
    s = status_summary(w.registry, clock=lambda: w.now[0])
    # One bulk CAS moved both decided xids to COMMITTING before the first COMMIT.
    assert s.open_by_state == {"committing": 2}
    assert s.in_doubt == tuple(sorted((a.xid, b.xid))) and s.by_txn == {"q1": 2}
    assert s.oldest_open_age_s == pytest.approx(30)


def test_a_committing_xid_is_never_rolled_back_by_a_decision_log_that_does_not_hold_its_decision() -> None:
    w = World()
    m = prepare(w, 0)
    crash_commit_at(w, [m], "ch.commit", "before")
    w.ch.kill_sessions()  # even when the lookup says it can no longer commit
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: FakeDecisionLog(t))
    assert report.skipped == (m.xid,) and report.rolled_back == () and states(w)[m.xid] == "committing"


def test_recovery_and_gc_act_only_on_the_queries_they_are_given() -> None:
    w = World()
    m = prepare(w, 0)
    crash_commit_at(w, [m], "ch.commit", "before")
    stale = prepare(w, 1, batch=1)
    w.now[0] += 600
    report = resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: w.log, txn_ids={"other"})
    assert (report.committed, report.rolled_back, report.skipped) == ((), (), ())
    assert (
        gc_stale(TARGET, w.ch, w.registry, lambda t: w.log, 300, txn_ids={"other"}, overwrite_stages=False).rolled_back
        == ()
    )
    assert states(w) == {m.xid: "committing", stale.xid: "initialized"}


def test_gc_of_a_mode_without_stage_tables_never_looks_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from clickhouse_tx.admin import recovery

    def leftover_stages(target):  # would ask the server for tables named like stages
        raise AssertionError("listed stage tables for a mode that has none")

    monkeypatch.setattr(recovery, "leftover_stages", leftover_stages)
    w = World()
    m = prepare(w, 0)
    w.now[0] += 600
    report = gc_stale(TARGET, w.ch, w.registry, lambda t: w.log, older_than_s=300, overwrite_stages=False)
    assert report.rolled_back == (m.xid,) and report.dropped == () and report.errors == {}
