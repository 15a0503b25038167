"""The coordinator over in-memory fakes: plans, flows, and a fault at every step."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from clickhouse_tx.admin.recovery import gc_stale, resolve_in_doubt
from clickhouse_tx.errors import (
    ClickHouseTxError,
    ConfigurationError,
    LostTransactionError,
    NotCommittedError,
    OutcomeUnknownError,
    ServerError,
)
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import (
    CommitModeIO,
    CommitOutcome,
    Decision,
    DecisionLogIO,
    Mode,
    Prepared,
    RegistryEntry,
    RegistryIO,
    WriteContext,
)
from clickhouse_tx.modes import mode_io_for
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.protocol.commit_plan import plan_commit, plan_rollback
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.retry import RetryPolicy
from clickhouse_tx.store.decision_log import FileDecisionLog
from clickhouse_tx.store.registry import KeeperMapRegistry
from tests.unit.fakes import TARGET, Crash, FakeCallFaults, World, arrow_batches

ROWS = 5
PARTS = 3


def msg(xid: str, partition: int, attempt: int = 0, batch: int = 0) -> Prepared:
    return Prepared(
        xid=xid,
        txn_id="q1",
        batch=batch,
        partition=partition,
        attempt=attempt,
        mode=Mode.TRANSACTION,
        server="s",
        table="db.t",
        rows=1,
        checksum=0,
    )


def entry(p: Prepared, state: TxState) -> RegistryEntry:
    return RegistryEntry.of_attempt(p, state.value, 0)


def prepare(c: Coordinator, partition: int, attempt: int, batch: int = 0, run: str = "") -> Prepared:
    return c.prepare(WriteContext(c.txn_id, batch, partition, attempt, run), arrow_batches(ROWS, partition))


def assert_exactly_once(w: World, batch: int = 0, parts: int = PARTS) -> None:
    assert w.keys_of(batch) == {(w.txn_id, batch, p): 1 for p in range(parts)}


# ----------------------------------------------------------------------------------------
# pure plans
# ----------------------------------------------------------------------------------------


def test_a_new_plan_chooses_the_lowest_attempt_per_partition_and_must_be_written_first() -> None:
    ms = [msg("b", 0, 1), msg("a", 0, 1), msg("c", 0, 0), msg("d", 1, 2)]
    plan = plan_commit(None, ms, [entry(m, TxState.INITIALIZED) for m in ms], txn_id="q1", batch=0)
    assert plan.write_decision and not plan.replay and plan.decision.version == 1
    assert [p.xid for p in plan.decision.chosen] == ["c", "d"]
    assert [p.xid for p in plan.spares[0]] == ["a", "b"]


def test_a_new_plan_skips_messages_that_are_no_longer_initialized() -> None:
    ms = [msg("a", 0, 0), msg("b", 0, 1)]
    plan = plan_commit(
        None, ms, [entry(ms[0], TxState.ABORTED), entry(ms[1], TxState.INITIALIZED)], txn_id="q1", batch=0
    )
    assert [p.xid for p in plan.decision.chosen] == ["b"]


def test_a_partition_without_a_committable_message_refuses_the_batch_before_any_write() -> None:
    ms = [msg("a", 0), msg("b", 1)]
    with pytest.raises(NotCommittedError, match=r"partitions \[1\]"):
        plan_commit(None, ms, [entry(ms[0], TxState.INITIALIZED), entry(ms[1], TxState.ABORTED)], txn_id="q1", batch=0)


def test_a_replay_plan_keeps_the_logged_decision_and_offers_same_partition_spares() -> None:
    old = Decision("q1", 0, (msg("a", 0), msg("b", 1)), version=2)
    new = [msg("c", 0, 5), msg("d", 1, 5), msg("e", 2, 5)]  # replay with an extra partition
    plan = plan_commit(old, new, [entry(m, TxState.INITIALIZED) for m in new], txn_id="q1", batch=0)
    assert plan.replay and plan.decision is old
    assert {k: [p.xid for p in v] for k, v in plan.spares.items()} == {0: ["c"], 1: ["d"]}
    # the extra partition is not decided, so it is rolled back
    assert [p.xid for p in plan_rollback({"a", "b"}, new, [])] == ["c", "d", "e"]


def test_a_done_batch_plans_no_commit() -> None:
    old = Decision("q1", 0, (msg("a", 0),), done=True)
    plan = plan_commit(old, [msg("z", 0)], [], txn_id="q1", batch=0)
    assert plan.already_done and not plan.write_decision


def test_the_rollback_plan_covers_zombies_and_spares_but_never_kept_or_finished_xids() -> None:
    ms = [msg("keep", 0), msg("dup", 0, 1)]
    zombie, gone, done = msg("zombie", 1, 3), msg("gone", 1, 2), msg("done", 2)
    entries = [
        entry(ms[0], TxState.COMMITTING),
        entry(ms[1], TxState.INITIALIZED),
        entry(zombie, TxState.INITIALIZED),
        entry(gone, TxState.ABORTED),
        entry(done, TxState.COMMITTED),
    ]
    assert [p.xid for p in plan_rollback({"keep"}, ms, entries)] == ["dup", "zombie"]


# ----------------------------------------------------------------------------------------
# flows without faults
# ----------------------------------------------------------------------------------------


def test_commit_makes_each_partition_visible_once_and_rolls_back_duplicates_and_zombies() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)] + [prepare(c, 1, 1)]
    zombie = prepare(c, 2, 9)  # a task attempt whose message never reaches the driver
    report = w.coordinator().commit_batch(0, ms + [None])
    assert_exactly_once(w)
    assert report.rows == PARTS * ROWS and len(report.committed) == PARTS
    assert set(report.rolled_back) == {ms[-1].xid, zombie.xid}
    assert {e.state for e in w.registry.everything.values()} == {"committed", "aborted"}
    assert w.log.read(0).done


def test_the_decision_is_written_before_the_first_commit() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.trace.clear()
    c.commit_batch(0, ms)
    ops = [op for _, op, phase in w.faults.trace if phase == "before"]
    assert ops.index("log.write") < ops.index("ch.commit")
    assert max(i for i, op in enumerate(ops) if op == "ch.commit") < ops.index("log.mark_done")


def test_a_whole_batch_commit_publishes_every_partition_in_one_step_before_the_per_xid_commits() -> None:
    w = World(whole_batch=True)
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.trace.clear()
    w.coordinator().commit_batch(0, ms)
    assert w.ch.together_calls == [tuple(m.xid for m in ms)]
    ops = [op for _, op, phase in w.faults.trace if phase == "before"]
    assert ops.index("log.write") < ops.index("ch.commit_together") < ops.index("ch.commit")
    assert_exactly_once(w)


def test_a_refused_whole_batch_commit_falls_back_to_per_partition_commits_exactly_once() -> None:
    w = World(whole_batch=True)
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]

    def refused(*args: object, **kwargs: object) -> None:
        raise NotCommittedError("the one transaction was refused: nothing of it is visible")

    w.ch.commit_together = refused  # type: ignore[method-assign]
    report = w.coordinator().commit_batch(0, ms)
    assert len(report.committed) == PARTS and w.ch.together_calls == []
    assert_exactly_once(w)


def test_a_replay_of_a_done_batch_rolls_back_its_messages_and_commits_nothing() -> None:
    w = World()
    c = w.coordinator()
    w.coordinator().commit_batch(0, [prepare(c, p, 0) for p in range(PARTS)])
    replay = [prepare(c, p, 1) for p in range(PARTS)]
    report = w.coordinator().commit_batch(0, replay)
    assert report.already_done and set(report.rolled_back) == {m.xid for m in replay}
    assert_exactly_once(w)


def test_a_replay_rolls_the_logged_xids_forward_and_its_own_messages_back() -> None:
    w = World()
    c = w.coordinator()
    first = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "crash", lambda op, ph: op == "ch.commit" and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)  # dies after the first COMMIT
    w.faults.disarm()
    replay = [prepare(c, p, 1) for p in range(PARTS)]
    report = w.coordinator().commit_batch(0, replay)
    assert report.replay and set(report.committed) == {m.xid for m in first}
    assert set(report.rolled_back) == {m.xid for m in replay}
    assert_exactly_once(w)


def test_a_decided_xid_whose_session_died_is_replaced_by_the_replay_of_its_partition() -> None:
    w = World()
    c = w.coordinator()
    first = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "crash", lambda op, ph: op == "ch.commit" and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)  # partition 0 committed, then the driver died
    w.faults.disarm()
    w.ch.kill_sessions()  # ClickHouse restarted: the other prepared transactions are gone
    replay = [prepare(c, p, 1) for p in range(PARTS)]
    report = w.coordinator().commit_batch(0, replay)
    assert {a for a, _ in report.replaced} == {m.xid for m in first[1:]}
    assert set(report.committed) == {first[0].xid} | {m.xid for m in replay[1:]}
    d = w.log.read(0)
    assert d.version == 1 + PARTS - 1 and d.done and {p.xid for p in d.chosen} == set(report.committed)
    assert_exactly_once(w)


def test_a_replay_after_every_decided_xid_died_decides_again_under_its_own_partitioning() -> None:
    w = World()
    c = w.coordinator()
    first = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "crash", lambda op, ph: op == "log.write" and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)  # the decision is logged, nothing committed
    w.faults.disarm()
    w.ch.kill_sessions()  # ClickHouse restarted: nothing of the batch is visible
    # the restarted query slices the same batch into 5 partitions
    replay = [c.prepare(WriteContext("q1", 0, p, 1), arrow_batches(3, 10 + p)) for p in range(5)]
    report = w.coordinator().commit_batch(0, replay)
    d = w.log.read(0)
    assert d.version == 2 and d.done and [p.xid for p in d.chosen] == [m.xid for m in replay]
    assert set(report.committed) == {m.xid for m in replay}
    assert w.keys_of(0) == {("q1", 0, p): 1 for p in range(5)} and w.ch.visible_rows() == 15
    assert {w.registry.everything[m.xid].state for m in first} == {"aborted"}


def test_a_dead_decided_xid_without_a_replacement_fails_naming_it_and_a_later_replay_heals() -> None:
    w = World()
    c = w.coordinator()
    first = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "crash", lambda op, ph: op == "log.write" and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)
    w.faults.disarm()
    w.ch.tx[first[1].xid].status = "dead"
    partial = [prepare(c, 0, 1), prepare(c, 2, 1)]  # the replay lacks partition 1
    with pytest.raises(LostTransactionError) as info:
        w.coordinator().commit_batch(0, partial)
    assert info.value.xid == first[1].xid and first[1].xid in str(info.value)
    assert w.keys_of(0) == {("q1", 0, 0): 1, ("q1", 0, 2): 1} and not w.log.read(0).done
    w.coordinator().commit_batch(0, [prepare(c, p, 2) for p in range(PARTS)])
    assert_exactly_once(w)


def test_a_lost_commit_reply_is_resolved_by_lookup_and_not_committed_twice() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "error", lambda op, ph: op == "ch.commit" and ph == "after")
    report = w.coordinator().commit_batch(0, ms)
    assert w.faults.fired and report.replaced == ()
    assert w.ch.commit_calls.count(ms[0].xid) == 1  # no blind second COMMIT
    assert_exactly_once(w)


@pytest.mark.parametrize("parts", [1, PARTS], ids=["one-partition", "bulk-moved"])
def test_a_server_error_after_a_commit_that_took_effect_is_looked_up_and_the_batch_succeeds(parts: int) -> None:
    # One partition takes the xid-by-xid path (ensure_committed), several the bulk CAS
    # (commit_committing): both settle the error by the marker, never by a second COMMIT.
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(parts)]
    w.faults.arm(0, "server_error", lambda op, ph: op == "ch.commit" and ph == "after")
    report = w.coordinator().commit_batch(0, ms)
    assert w.faults.fired and report.replaced == () and set(report.committed) == {m.xid for m in ms}
    assert w.ch.commit_calls.count(ms[0].xid) == 1
    assert_exactly_once(w, parts=parts)
    assert w.log.read(0).done
    assert {w.registry.everything[m.xid].state for m in ms} == {"committed"}


def test_a_server_error_before_a_commit_ran_commits_the_pending_xid_once() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "server_error", lambda op, ph: op == "ch.commit" and ph == "before")
    w.coordinator().commit_batch(0, ms)
    assert w.faults.fired and w.log.read(0).done
    assert_exactly_once(w)


def test_a_registry_failing_after_every_commit_took_effect_still_ends_the_batch_done() -> None:
    # The rows are visible: dropping the done batch's entries is bookkeeping, and failing
    # the job here invited a rerun under a new id. The entries are recorded COMMITTED
    # instead (nothing is left COMMITTING), and a replay of the batch drops them.
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "server_error", lambda op, ph: op == "registry.forget" and ph == "before")
    report = w.coordinator().commit_batch(0, ms)
    assert w.faults.fired and set(report.committed) == {m.xid for m in ms}
    assert_exactly_once(w)
    assert w.log.read(0).done
    assert {w.registry.entries[m.xid].state for m in ms} == {"committed"}

    again = w.coordinator().commit_batch(0, ms)
    assert again.already_done and w.registry.entries == {}
    assert {w.registry.everything[m.xid].state for m in ms} == {"committed"}


def test_a_server_error_whose_lookup_fails_too_leaves_the_batch_in_doubt_and_undone() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]

    def lookup(target, p):
        raise ServerError("markers table unreadable", code=1002, name="UNKNOWN_EXCEPTION", xid=p.xid)

    w.faults.arm(0, "server_error", lambda op, ph: op == "ch.commit" and ph == "after")
    w.ch.lookup = lookup  # type: ignore[method-assign]
    with pytest.raises(OutcomeUnknownError) as info:
        w.coordinator().commit_batch(0, ms)
    assert "partitions [0] are in doubt" in str(info.value) and "partitions [1, 2] are committed" in str(info.value)
    assert not w.log.read(0).done


def test_a_pending_xid_is_committed_again_after_a_transient_refusal() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "error", lambda op, ph: op == "ch.commit" and ph == "before")
    w.coordinator().commit_batch(0, ms)
    assert w.faults.fired
    assert_exactly_once(w)


def test_an_xid_pending_forever_leaves_the_batch_undone_with_outcome_unknown() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, 0, 0)]
    w.ch.commit = lambda target, p: (_ for _ in ()).throw(OutcomeUnknownError("timeout", xid=p.xid))  # type: ignore[method-assign]
    with pytest.raises(OutcomeUnknownError, match="still pending"):
        w.coordinator().commit_batch(0, ms)
    assert not w.log.read(0).done and w.keys_of(0) == {}


def test_abort_before_a_decision_rolls_back_every_message_and_zombie() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    zombie = prepare(c, 0, 4)
    report = w.coordinator().abort_batch(0, ms + [None])
    assert set(report.rolled_back) == {m.xid for m in ms} | {zombie.xid} and report.kept == ()
    assert w.keys_of(0) == {} and {e.state for e in w.registry.everything.values()} == {"aborted"}
    w.coordinator().commit_batch(0, [prepare(c, p, 1) for p in range(PARTS)])
    assert_exactly_once(w)


def test_abort_after_a_decision_leaves_decided_xids_for_the_replay() -> None:
    w = World()
    c = w.coordinator()
    first = [prepare(c, p, 0) for p in range(PARTS)]
    w.faults.arm(0, "crash", lambda op, ph: op == "log.write" and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)
    w.faults.disarm()
    extra = prepare(c, 0, 1)
    report = w.coordinator().abort_batch(0, [extra])
    assert report.rolled_back == (extra.xid,) and set(report.kept) == {m.xid for m in first}
    w.coordinator().commit_batch(0, [prepare(c, p, 2) for p in range(PARTS)])
    assert [p.xid for p in w.log.read(0).chosen] == [m.xid for m in first]
    assert_exactly_once(w)


def test_prepare_registers_before_writing() -> None:
    w = World()
    c = w.coordinator()
    prepare(c, 0, 0)
    ops = [op for _, op, ph in w.faults.trace if ph == "before"]
    assert ops.index("registry.register") < ops.index("ch.prepare")


def test_a_failed_prepare_rolls_back_marks_aborted_and_raises_not_committed() -> None:
    w = World()
    c = w.coordinator()

    def bad_batches():
        yield pa.RecordBatch.from_pydict({"id": [1]})
        raise RuntimeError("upstream failed")

    with pytest.raises(NotCommittedError, match="upstream failed") as info:
        c.prepare(WriteContext("q1", 0, 0, 0), bad_batches())
    assert isinstance(info.value.__cause__, RuntimeError)
    assert w.registry.everything[info.value.xid].state == "aborted"


def test_an_attempt_fenced_while_writing_rolls_itself_back() -> None:
    w = World()
    c = w.coordinator()
    real_prepare = w.ch.prepare

    def prepare_then_fenced(target, ctx, xid, batches):
        p = real_prepare(target, ctx, xid, batches)
        w.coordinator().abort_batch(ctx.batch, [])  # the driver gave up on the batch meanwhile
        return p

    w.ch.prepare = prepare_then_fenced  # type: ignore[method-assign]
    with pytest.raises(NotCommittedError, match="fenced"):
        prepare(c, 0, 0)
    assert all(t.status == "rolled_back" for t in w.ch.tx.values())


def test_an_attempt_that_registers_after_spark_aborted_its_runs_batch_rolls_itself_back() -> None:
    # Spark fails a job and calls abort while a slow task has not registered yet: the
    # abort's listing misses it, the task finishes, and its transaction stayed open.
    w = World()
    w.coordinator().abort_batch(0, [], run="run-1")
    with pytest.raises(NotCommittedError, match="Spark aborted this batch of the run") as info:
        prepare(w.coordinator(), 0, 0, run="run-1")
    assert w.registry.everything[info.value.xid].state == "aborted"
    assert all(t.status == "rolled_back" for t in w.ch.tx.values())


def test_the_abort_of_one_run_does_not_fence_the_next_runs_replay_of_the_batch() -> None:
    w = World()
    w.coordinator().abort_batch(0, [], run="run-1")
    w.coordinator().abort_batch(0, [], run="run-1")  # an abort repeated records nothing twice
    c = w.coordinator()
    ms = [prepare(c, p, 0, run="run-2") for p in range(PARTS)]
    c.commit_batch(0, ms)
    assert_exactly_once(w)


def test_a_failed_registration_writes_nothing() -> None:
    w = World()
    w.faults.arm(0, "error", lambda op, ph: op == "registry.register" and ph == "after")
    with pytest.raises(NotCommittedError, match="register") as info:
        prepare(w.coordinator(), 0, 0)
    assert w.ch.tx == {} and w.registry.everything[info.value.xid].state == "aborted"


def test_messages_of_another_batch_or_query_are_refused() -> None:
    w = World()
    with pytest.raises(ValueError, match="batch=1"):
        w.coordinator().commit_batch(0, [msg("x", 0, batch=1)])
    with pytest.raises(TypeError, match="Prepared"):
        w.coordinator().commit_batch(0, ["x"])  # type: ignore[list-item]


def test_validate_delegates_to_the_mode_and_the_password_stays_out_of_reprs() -> None:
    w = World()
    c = w.coordinator()
    c.validate(pa.schema([("id", pa.int64())]))
    with pytest.raises(ConfigurationError, match="db.events"):
        c.validate(pa.schema([]))
    assert "s3cret" not in repr(c) and "s3cret" not in repr(TARGET)


# ----------------------------------------------------------------------------------------
# a fault at every step, then a restart and a replay
# ----------------------------------------------------------------------------------------


def _task(c: Coordinator, partition: int, attempt: int) -> Prepared:
    """A Spark task with retries: a failed or killed attempt is run again as a new attempt."""
    for a in range(attempt, attempt + 5):
        try:
            return prepare(c, partition, a)
        except (NotCommittedError, Crash):
            continue
    raise AssertionError("task kept failing")


def _first_run(w: World) -> str:
    """Prepare 3 partitions (one speculative duplicate, one zombie) and commit batch 0."""
    c = w.coordinator()
    try:
        ms = [_task(c, 0, 0), _task(c, 1, 0), _task(c, 1, 10), _task(c, 2, 0)]
        _task(c, 2, 20)  # zombie: registered and written, never reported
        w.coordinator().commit_batch(0, ms)
        return "ok"
    except Crash:
        return "crash"
    except ClickHouseTxError as exc:
        return type(exc).__name__


def _check_invariants(w: World) -> None:
    assert all(n == 1 for n in w.ch.visible().values()), w.ch.visible()
    if w.log.read(0) is None:
        assert w.keys_of(0) == {}, "rows visible without a decision"
    assert w.ch.rollbacks_of_committed == []


def _restart_and_replay(w: World, recover: bool) -> None:
    w.faults.disarm()
    if recover:
        w.now[0] += 3600
        resolve_in_doubt(TARGET, w.ch, w.registry, lambda t: w.log)
        gc_stale(TARGET, w.ch, w.registry, lambda t: w.log, older_than_s=60)
        _check_invariants(w)
    c = w.coordinator()
    report = w.coordinator().commit_batch(0, [prepare(c, p, 100) for p in range(PARTS)])
    assert_exactly_once(w)
    assert w.ch.visible_rows() == PARTS * ROWS
    states = {}
    for e in w.registry.history("q1", 0):
        states.setdefault(e.partition, []).append(e.state)
    assert all(set(s) <= {"committed", "aborted"} and s.count("committed") == 1 for s in states.values()), states
    assert set(report.committed) == {e.xid for e in w.registry.everything.values() if e.state == "committed"}
    again = w.coordinator().commit_batch(0, [prepare(c, p, 200) for p in range(PARTS)])
    assert again.already_done
    assert_exactly_once(w)
    _check_invariants(w)


def _count_steps(whole_batch: bool = False) -> int:
    w = World(whole_batch=whole_batch)
    assert _first_run(w) == "ok"
    return w.faults.step


@pytest.mark.parametrize("whole_batch", [False, True], ids=["per-partition", "whole-batch"])
@pytest.mark.parametrize("recover", [False, True], ids=["replay", "recover-then-replay"])
@pytest.mark.parametrize("kind", ["crash", "error", "server_error", "kill"])
def test_a_fault_at_every_step_then_a_replay_leaves_every_partition_visible_exactly_once(
    kind: str, recover: bool, whole_batch: bool
) -> None:
    steps = _count_steps(whole_batch)
    assert steps > 50  # registry, ClickHouse and log calls of prepares and the commit
    outcomes: dict[str, int] = {}
    for at in range(steps):
        w = World(faults=FakeCallFaults(at=at, kind=kind), whole_batch=whole_batch)
        outcome = _first_run(w)
        assert w.faults.fired, f"step {at} was never reached"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        try:
            _check_invariants(w)
            if outcome == "ok":
                assert_exactly_once(w)
            elif kind == "server_error" and w.faults.trace[at][1] != "log.mark_done":
                # an error alone never fails a job whose rows are all visible once
                assert w.keys_of(0) != {(w.txn_id, 0, p): 1 for p in range(PARTS)}, "failed, but every row is visible"
            _restart_and_replay(w, recover)
        except AssertionError as exc:
            raise AssertionError(f"{kind} at step {at} ({w.faults.trace[at]}), first run {outcome}: {exc}") from exc
    assert sum(outcomes.values()) == steps
    if kind == "crash":
        assert outcomes.get("crash", 0) > steps // 2  # crashes in the commit, not only in tasks


# ----------------------------------------------------------------------------------------
# replays under another partitioning (a decided xid is dead, the slices differ)
# ----------------------------------------------------------------------------------------


def _sliced(c: Coordinator, parts: int, attempt: int, total: int = 12) -> list[Prepared]:
    """The same batch of ``total`` ids cut into ``parts`` partitions (id % parts)."""
    out = []
    for p in range(parts):
        ids = [i for i in range(total) if i % parts == p]
        data = iter([pa.RecordBatch.from_pydict({"id": ids, "tag": [0] * len(ids)})])
        out.append(c.prepare(WriteContext(c.txn_id, 0, p, attempt), data))
    return out


def _crashed_then_restarted(w: World, crash_after: str) -> list[Prepared]:
    """Batch 0 over 3 partitions; the driver dies after the first ``crash_after`` call,
    then ClickHouse restarts and every prepared transaction is lost."""
    c = w.coordinator()
    first = _sliced(c, 3, 0)
    w.faults.arm(0, "crash", lambda op, ph: op == crash_after and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)
    w.faults.disarm()
    w.ch.kill_sessions()
    return first


def _partly_committed_then_restarted(w: World) -> list[Prepared]:
    """Batch 0 decided over 3 partitions, partition 0 committed, the rest lost with ClickHouse."""
    return _crashed_then_restarted(w, "ch.commit")


def test_a_replay_plan_offers_only_spares_with_the_decided_rows_and_checksum() -> None:
    decided = [
        dataclasses.replace(msg("a", 0), rows=4, checksum=7),
        dataclasses.replace(msg("b", 1), rows=4, checksum=8),
    ]
    old = Decision("q1", 0, tuple(decided))
    new = [
        dataclasses.replace(msg("c", 0, 5), rows=4, checksum=7),  # the same slice
        dataclasses.replace(msg("d", 1, 5), rows=3, checksum=8),  # another slice, same number
        dataclasses.replace(msg("e", 1, 6), rows=4, checksum=9),
    ]
    plan = plan_commit(old, new, [entry(m, TxState.INITIALIZED) for m in new], txn_id="q1", batch=0)
    assert {k: [p.xid for p in v] for k, v in plan.spares.items()} == {0: ["c"], 1: []}


@pytest.mark.parametrize("parts", [2, 5])
def test_a_replay_under_another_partitioning_after_a_partial_commit_is_refused_and_heals_with_the_original(
    parts: int,
) -> None:
    w = World()
    first = _partly_committed_then_restarted(w)
    c = w.coordinator()
    for attempt in (1, 2):  # refused every time, and nothing of the wrong slices lands
        with pytest.raises(LostTransactionError) as info:
            w.coordinator().commit_batch(0, _sliced(c, parts, attempt))
        text = str(info.value)
        assert "partitions [1, 2]" in text and "Partitions [0] are committed and visible (4 rows)" in text
        assert f"this run has {parts} partitions, the decision 3" in text
        assert "transactional_id 'q1'" in text and "write them twice" in text
        assert w.keys_of(0) == {("q1", 0, 0): 1} and w.ch.visible_rows() == 4
        assert not w.log.read(0).done
    report = w.coordinator().commit_batch(0, _sliced(c, 3, 3))  # the advised way out
    assert first[0].xid in report.committed and len(report.replaced) == 2
    assert_exactly_once(w) and w.ch.visible_rows() == 12


@pytest.mark.parametrize("parts", [2, 5])
def test_a_replay_under_another_partitioning_with_nothing_committed_writes_the_batch_once(parts: int) -> None:
    w = World()
    c = w.coordinator()
    _crashed_then_restarted(w, "log.write")
    report = w.coordinator().commit_batch(0, _sliced(c, parts, 1))
    assert len(report.committed) == parts and w.ch.visible_rows() == 12
    assert w.keys_of(0) == {("q1", 0, p): 1 for p in range(parts)}
    again = w.coordinator().commit_batch(0, _sliced(c, 3, 2))  # and once more: already done
    assert again.already_done and w.ch.visible_rows() == 12


def test_a_replay_whose_decided_xids_all_live_commits_them_and_rolls_back_other_partitions() -> None:
    w = World()
    c = w.coordinator()
    first = _sliced(c, 3, 0)
    w.faults.arm(0, "crash", lambda op, ph: op == "log.write" and ph == "after")
    with pytest.raises(Crash):
        w.coordinator().commit_batch(0, first)
    w.faults.disarm()
    replay = _sliced(c, 5, 1)  # the decided 3 cover the whole batch: the 5 are duplicates of it
    report = w.coordinator().commit_batch(0, replay)
    assert set(report.committed) == {m.xid for m in first}
    assert set(report.rolled_back) == {m.xid for m in replay} and w.ch.visible_rows() == 12


# ----------------------------------------------------------------------------------------
# sessions checked before the decision; in-doubt and busy sessions
# ----------------------------------------------------------------------------------------


def test_a_session_dead_before_the_decision_rolls_back_the_whole_batch_and_commits_nothing() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    w.ch.tx[ms[2].xid].status = "dead"  # its session expired while later tasks ran
    with pytest.raises(NotCommittedError, match=r"partitions \[2\] are gone before the commit") as info:
        w.coordinator().commit_batch(0, ms)
    assert "Nothing of the batch was committed" in str(info.value)
    assert f"lost xids ['{ms[2].xid}']" in str(info.value)
    assert "restarting the query replays the batch" in str(info.value)
    assert w.log.read(0) is None and w.keys_of(0) == {} and w.ch.commit_calls == []
    assert {w.registry.everything[m.xid].state for m in ms} == {"aborted"}
    w.coordinator().commit_batch(0, [prepare(c, p, 1) for p in range(PARTS)])  # re-run: once
    assert_exactly_once(w)


def test_a_chosen_session_dead_before_the_decision_is_swapped_for_a_live_duplicate() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    speculative = prepare(c, 1, 1)
    w.ch.tx[ms[1].xid].status = "dead"
    report = w.coordinator().commit_batch(0, ms + [speculative])
    assert speculative.xid in report.committed and [p.xid for p in w.log.read(0).chosen][1] == speculative.xid
    assert_exactly_once(w)


def test_an_in_doubt_commit_names_the_visible_partitions_and_the_recover_command() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    real_commit = w.ch.commit

    def commit(target, p):
        if p.partition == 2:
            raise OutcomeUnknownError("UNKNOWN_STATUS_OF_TRANSACTION", xid=p.xid)
        real_commit(target, p)

    w.ch.commit = commit  # type: ignore[method-assign]
    w.ch.lookup = lambda target, p: (
        CommitOutcome.COMMITTED  # type: ignore[method-assign]
        if w.ch.tx[p.xid].status == "committed"
        else CommitOutcome.PENDING
    )
    with pytest.raises(OutcomeUnknownError) as info:
        w.coordinator().commit_batch(0, ms)
    text = str(info.value)
    assert "partitions [2] are in doubt" in text and "partitions [0, 1] are committed and visible" in text
    assert (
        "python -m clickhouse_tx recover --url http://fake:8123 --table db.events --mode transaction --txn-id q1 "
        "--checkpoint memory://decisions/q1" in text
    )
    assert "s3cret" not in text and not w.log.read(0).done


def test_abort_tries_a_straggler_again_until_its_session_is_free_and_rolls_it_back() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    straggler = prepare(c, 1, 1)
    real_rollback = w.ch.rollback
    refusals = []

    def rollback(target, p):
        if p.xid == straggler.xid and len(refusals) < 8:  # more than one round's retries
            refusals.append(p.xid)
            raise OutcomeUnknownError("session busy; roll back again later", xid=p.xid, code=373)
        real_rollback(target, p)

    w.ch.rollback = rollback  # type: ignore[method-assign]
    report = w.coordinator().abort_batch(0, ms + [straggler])
    assert report.left == () and set(report.rolled_back) == {m.xid for m in ms + [straggler]}
    assert w.registry.everything[straggler.xid].state == "aborted"
    assert len(refusals) == 8


def test_abort_and_commit_never_raise_when_a_straggler_holds_its_session() -> None:
    w = World()
    c = w.coordinator()
    ms = [prepare(c, p, 0) for p in range(PARTS)]
    straggler = prepare(c, 1, 1)  # a speculative attempt still inserting: its session is locked
    real_rollback = w.ch.rollback

    def rollback(target, p):
        if p.xid == straggler.xid:
            raise OutcomeUnknownError("session busy; roll back again later", xid=p.xid, code=373)
        real_rollback(target, p)

    w.ch.rollback = rollback  # type: ignore[method-assign]
    report = w.coordinator().abort_batch(0, ms + [straggler], straggler_wait_s=2.0)
    assert report.left == (straggler.xid,) and set(report.rolled_back) == {m.xid for m in ms}
    assert w.registry.everything[straggler.xid].state == "aborting"  # fenced: it can never commit
    ms2 = [prepare(c, p, 2) for p in range(PARTS)]
    straggler2 = prepare(c, 1, 3)
    straggler = straggler2
    w.coordinator().commit_batch(0, ms2 + [straggler2])  # committed; the straggler left to GC
    assert_exactly_once(w)


def test_the_contracts_declare_every_method_each_implementation_offers(tmp_path) -> None:
    w = World()
    modes = [mode_io_for(m) for m in Mode] + [w.ch]
    assert [type(m).__name__ for m in modes if not isinstance(m, CommitModeIO)] == []
    for registry in (KeeperMapRegistry(TARGET), w.registry):
        assert isinstance(registry, RegistryIO)
    for log in (FileDecisionLog(str(tmp_path), "q1"), w.log):
        assert isinstance(log, DecisionLogIO) and log.root_uri


def test_every_mode_declares_its_capabilities_and_only_staging_leaves_stage_tables() -> None:
    assert {m: m.capabilities.stage_tables for m in Mode} == {m: m is Mode.STAGING for m in Mode}
    assert {m for m in Mode if m.capabilities.visible_on_insert} == {Mode.DEDUP, Mode.NONE}


def test_a_mode_without_sessions_says_its_prepared_work_is_there_without_asking_the_server() -> None:
    unreachable = dataclasses.replace(TARGET, url="http://127.0.0.1:9")
    p = msg("x", 0)
    assert all(mode_io_for(m).renew(unreachable, p) for m in (Mode.STAGING, Mode.DEDUP, Mode.NONE))


def test_the_factory_passes_the_registry_and_the_retry_policy_to_the_constructors(tmp_path) -> None:
    retry = RetryPolicy(max_attempts=2)
    co = build_coordinator(TARGET, "dedup", "q1", str(tmp_path), retry=retry)
    assert isinstance(co.mode_io, DedupMode) and co.mode_io.registry is co.registry
    assert co.registry.retry is retry and co.retry is retry
    assert isinstance(co.log, FileDecisionLog) and co.log.arbiter is None and co.log.semantics == "posix-link"
