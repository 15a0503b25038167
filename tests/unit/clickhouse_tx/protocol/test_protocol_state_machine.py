"""Random schedules of prepare / commit / abort / crash / server restart / recovery.

A hypothesis ``RuleBasedStateMachine`` drives several batches of one query over
the fakes. Each batch is a fixed set of row ids; a run of its tasks slices it into
``n`` partitions (ids ``i % n == p``), and a restarted query may slice it otherwise
(``repartition``: another repartition(n), minPartitions or Kafka partition count).
Whatever the interleaving, each row id is visible at most once at every moment,
every row of a batch exactly once from the first successful commit of its batch
on, nothing while its batch has no decision, and a final fault-free replay of
every batch (with the decided partitioning when a replay under another one is
refused, as the error advises) leaves every row exactly once.
"""

from __future__ import annotations

import itertools
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from clickhouse_tx.admin.recovery import gc_stale, resolve_in_doubt
from clickhouse_tx.errors import ClickHouseTxError, LostTransactionError
from clickhouse_tx.interfaces import Prepared, WriteContext
from tests.unit.fakes import TARGET, Crash, World

#: schedules (hypothesis examples) run in this process; reported by tests/unit/conftest.py
SCHEDULES = {
    "started": 0,
    "finished": 0,
    "steps": 0,
    "crashes": 0,
    "commits_ok": 0,
    "repartitioned_commits_ok": 0,
    "refused_replays": 0,
}

PARTITIONS = {0: 2, 1: 3, 2: 1}  # the first run's partition count per batch
ROWS = {0: 6, 1: 9, 2: 4}  # row ids 0..ROWS[b]-1 make up batch b
BATCHES = st.sampled_from(sorted(PARTITIONS))
KINDS = st.sampled_from(["crash", "error", "kill"])
FAULT_AT = st.none() | st.integers(0, 60)


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        SCHEDULES["started"] += 1
        self.w = World(txn_id="q1")
        self.attempts = itertools.count()
        self.msgs: dict[int, list[Prepared]] = {b: [] for b in PARTITIONS}
        self.layout = dict(PARTITIONS)  # partition count of the batch's current run
        self.committed_once: set[int] = set()

    def _coord(self):
        return self.w.coordinator()

    def _arm(self, fault_at: int | None, kind: str) -> None:
        if fault_at is None:
            self.w.faults.disarm()
        else:
            self.w.faults.arm(fault_at, kind)

    def _prepare(self, b: int, p: int, parts: int | None = None):
        n = parts or self.layout[b]
        ids = [i for i in range(ROWS[b]) if i % n == p]
        data = iter(
            [
                pa.RecordBatch.from_pydict(
                    {"id": ids, "tag": [0] * len(ids)}, schema=pa.schema([("id", pa.int64()), ("tag", pa.int64())])
                )
            ]
        )
        return self._coord().prepare(WriteContext("q1", b, p, next(self.attempts)), data)

    @rule(b=BATCHES, n=st.integers(1, 4))
    def repartition(self, b: int, n: int) -> None:
        """The query restarts with another partitioning (only between runs of the batch)."""
        SCHEDULES["steps"] += 1
        if not self.msgs[b]:
            self.layout[b] = n

    @rule(b=BATCHES, p=st.integers(0, 3), fault_at=st.none() | st.integers(0, 8), kind=KINDS)
    def prepare(self, b: int, p: int, fault_at: int | None, kind: str) -> None:
        SCHEDULES["steps"] += 1
        self._arm(fault_at, kind)
        try:
            self.msgs[b].append(self._prepare(b, p % self.layout[b]))
        except (Crash, ClickHouseTxError):
            pass  # the task failed; its leftovers are a zombie for commit/abort/GC
        finally:
            self.w.faults.disarm()

    @rule(b=BATCHES, fault_at=st.none() | st.integers(0, 30), kind=KINDS)
    def run_tasks(self, b: int, fault_at: int | None, kind: str) -> None:
        """Spark runs every task of the batch (each failed task retried once)."""
        SCHEDULES["steps"] += 1
        self._arm(fault_at, kind)
        try:
            for p in range(self.layout[b]):
                for _ in range(2):
                    try:
                        self.msgs[b].append(self._prepare(b, p))
                        break
                    except (Crash, ClickHouseTxError):
                        continue
        finally:
            self.w.faults.disarm()

    @rule(b=BATCHES, fault_at=FAULT_AT, kind=KINDS)
    def commit(self, b: int, fault_at: int | None, kind: str) -> None:
        SCHEDULES["steps"] += 1
        # Spark commits only when every partition's task succeeded: run the missing ones
        for p in sorted(set(range(self.layout[b])) - {m.partition for m in self.msgs[b]}):
            self.msgs[b].append(self._prepare(b, p))
        msgs = self.msgs[b]
        self._arm(fault_at, kind)
        ok = False
        try:
            self._coord().commit_batch(b, msgs)
            ok = True
        except Crash:
            SCHEDULES["crashes"] += 1
        except LostTransactionError:
            SCHEDULES["refused_replays"] += 1
        except ClickHouseTxError:
            pass  # the query fails; Spark replays the batch after a restart
        finally:
            self.w.faults.disarm()
            self.msgs[b] = []  # a replay re-runs every task: new attempts, new xids
        if ok:
            SCHEDULES["commits_ok"] += 1
            SCHEDULES["repartitioned_commits_ok"] += self.layout[b] != PARTITIONS[b]
            self.committed_once.add(b)
            self._assert_exactly_once(b)

    @rule(b=BATCHES, fault_at=FAULT_AT, kind=KINDS)
    def abort(self, b: int, fault_at: int | None, kind: str) -> None:
        SCHEDULES["steps"] += 1
        self._arm(fault_at, kind)
        try:
            self._coord().abort_batch(b, self.msgs[b])
        except (Crash, ClickHouseTxError):
            pass
        finally:
            self.w.faults.disarm()
            self.msgs[b] = []

    @rule()
    def restart_clickhouse(self) -> None:
        SCHEDULES["steps"] += 1
        self.w.ch.kill_sessions()

    @rule(fault_at=FAULT_AT, kind=KINDS, gc=st.booleans())
    def recover(self, fault_at: int | None, kind: str, gc: bool) -> None:
        SCHEDULES["steps"] += 1
        self.w.now[0] += 120
        self._arm(fault_at, kind)
        try:
            resolve_in_doubt(TARGET, self.w.ch, self.w.registry, lambda t: self.w.log)
            if gc:
                gc_stale(TARGET, self.w.ch, self.w.registry, lambda t: self.w.log, older_than_s=60)
        except Crash:
            pass
        finally:
            self.w.faults.disarm()

    # -- checks ----------------------------------------------------------------------------
    def _assert_exactly_once(self, b: int) -> None:
        assert self.w.ch.visible_ids("q1", b) == {i: 1 for i in range(ROWS[b])}

    @invariant()
    def never_twice_and_nothing_without_a_decision(self) -> None:
        for b in PARTITIONS:
            visible = self.w.ch.visible_ids("q1", b)
            assert all(n == 1 for n in visible.values()), (b, visible)
            if self.w.log.read(b) is None:
                assert not visible, f"batch {b} visible without a decision"
        assert self.w.ch.rollbacks_of_committed == []
        for b in self.committed_once:
            self._assert_exactly_once(b)

    def teardown(self) -> None:
        # Spark restarts the query: every batch not done is replayed without faults; a
        # replay under another partitioning that is refused is followed by the advised
        # one, under the decided partitioning.
        self.w.faults.disarm()
        for b in PARTITIONS:
            try:
                self._coord().commit_batch(b, [self._prepare(b, p) for p in range(self.layout[b])])
            except LostTransactionError:
                decided = self.w.log.read(b)
                n = len(decided.chosen)
                assert n != self.layout[b], "refused under the decided partitioning"
                self._coord().commit_batch(b, [self._prepare(b, p, n) for p in range(n)])
            self._assert_exactly_once(b)
            for e in self.w.registry.history("q1", b):
                assert e.state in ("committed", "aborted"), e
        SCHEDULES["finished"] += 1


#: Schedules per run: 600 in make test; make test-unit sets CLICKHOUSE_TX_MODEL_EXAMPLES lower
#: (a smaller bound of the same search, for the edit loop).
MAX_EXAMPLES = int(os.environ.get("CLICKHOUSE_TX_MODEL_EXAMPLES", "600"))


def test_random_schedules_of_crashes_and_replays_keep_every_partition_exactly_once_or_absent() -> None:
    before = SCHEDULES["finished"]
    run_state_machine_as_test(
        ProtocolMachine,
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            derandomize=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    ran = SCHEDULES["finished"] - before
    print(
        f"protocol schedules run: {ran}, rule steps: {SCHEDULES['steps']}, "
        f"successful commits: {SCHEDULES['commits_ok']} ({SCHEDULES['repartitioned_commits_ok']} "
        f"under another partitioning), refused replays: {SCHEDULES['refused_replays']}, "
        f"driver crashes: {SCHEDULES['crashes']}"
    )
    assert ran >= MAX_EXAMPLES
    assert SCHEDULES["commits_ok"] > 0 and SCHEDULES["crashes"] > 0
    assert SCHEDULES["repartitioned_commits_ok"] > 0


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
