"""The pure protocol as a model: one batch of one query over the fakes, every schedule.

What a schedule chooses (see :class:`Bounds` for the limits):

- the first run's partitioning, and for each restart of the query its partitioning
  (1-3 partitions slicing the same rows: ids ``i % n == p``) and the spelling of its
  checkpoint location (the transactional id comes from the identity layer,
  :func:`checkpoint_identity`, run once on a real temporary checkpoint);
- which pending task prepares next; a task attempt that fails is retried once, a task
  that fails twice fails the run (Spark aborts the batch);
- at every step of every fake call (each before/after point of ``tests.unit.fakes``):
  nothing, a crash of the calling process (executor, driver or operator), an error
  (before the effect: refused; after it: the reply lost), a ClickHouse restart (every
  open transaction dies), or, inside a driver call, the zombie attempt of partition 0 (a
  task attempt whose message never reaches the driver) preparing there; at most
  ``max_events`` of these per schedule;
- while the query is down: restart it, or let the operator run ``recover`` and ``gc``
  first;
- after a batch is done: stop, let the zombie finish late, or replay the batch again
  (Spark lost its commit log entry).

A commit that raises is followed by Spark's ``abort`` of the batch; a crash restarts
the query. Every choice point checks the invariants of :meth:`_Schedule.check`; a run
that reports the batch committed checks :meth:`_Schedule.check_done`; the end of every
schedule replays the batch without faults (under the decided partitioning when the
replay is refused, as the error advises) and checks it is then exactly once.

Mode: ``transaction`` only; the fakes simulate no other.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from clickhouse_tx.admin.recovery import gc_stale, resolve_in_doubt
from clickhouse_tx.errors import (
    ClickHouseTxError,
    LostTransactionError,
    NotCommittedError,
    OutcomeUnknownError,
    TransientError,
)
from clickhouse_tx.interfaces import Decision, Prepared, RegistryEntry, WriteContext
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.retry import RetryPolicy
from tests.model.explorer import AtBoundary, Chooser, Violation
from tests.unit.fakes import TARGET, Crash, FakeCallFaults, FakeDecisionLog, World, _Tx

BATCH = 1
SCHEMA = pa.schema([("id", pa.int64()), ("tag", pa.int64())])
ZOMBIE_ATTEMPT = 99
RETRY = RetryPolicy(max_attempts=3, max_total_s=1.0, base_delay_s=0.0, max_delay_s=0.0)
FINISHED = (TxState.COMMITTED.value, TxState.ABORTED.value)
#: what commit_batch may raise besides a crash (docstring of Coordinator.commit_batch)
DOCUMENTED = (NotCommittedError, LostTransactionError, OutcomeUnknownError)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The size of the explored world."""

    first_partitions: tuple[int, ...] = (2, 3)
    replay_partitions: tuple[int, ...] = (1, 2, 3)
    rows: int = 6
    attempts: int = 2  # per task and run
    max_runs: int = 3  # the first run and its restarts
    max_events: int = 1  # faults and the zombie's interleaving per schedule
    fault_kinds: tuple[str, ...] = ("crash", "error", "kill")
    zombie: bool = True  # partition 0 of the first run has an attempt that never reports
    operator: bool = True  # before a restart, the operator may run recover and gc


# ----------------------------------------------------------------------------------------
# The identity layer: one transactional id per spelling of the checkpoint
# ----------------------------------------------------------------------------------------


def spellings(root: Path) -> list[tuple[str, str]]:
    """``(raw checkpointLocation, working directory)`` pairs naming one directory."""
    chk = root / "chk"
    return [(str(chk), "/"), (f"{chk}/", "/"), (f"file://{chk}", "/"), ("chk", str(root)), (f"file:{chk}/./", "/")]


def checkpoint_identity(root: Path, resolve: Callable[[str, str], str] | None = None) -> list[tuple[str, str]]:
    """The transactional id each spelling resolves to, through the real identity layer.

    Writes Spark's ``metadata`` into ``root/chk`` and resolves every spelling in turn
    (the first stores ``clickhouse_tx/query.json``, the others read it back), as the
    query's restarts would. ``resolve(raw, cwd)`` replaces the layer (planted bugs).
    """
    from clickhouse_tx.ids import canonical_location
    from clickhouse_tx.store.query_identity import resolve_stream_txn_id

    (root / "chk").mkdir(parents=True, exist_ok=True)
    (root / "chk" / "metadata").write_text(json.dumps({"id": "7f6a4ad8-1b4e-4f7e-9b0e-2f1c3f3a9d10"}) + "\n")

    def real(raw: str, cwd: str) -> str:
        loc = canonical_location(raw, cwd)
        return resolve_stream_txn_id(checkpoint=loc, explicit=None)

    return [(raw, (resolve or real)(raw, cwd)) for raw, cwd in spellings(root)]


# ----------------------------------------------------------------------------------------
# One schedule
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _HookedFaults(FakeCallFaults):
    """The fakes' fault plan, handing every before/after point to the schedule."""

    hook: Callable[[str, str], None] | None = None

    def hit(self, op: str, phase: str) -> None:
        if self.hook is not None:
            self.hook(op, phase)


@functools.lru_cache(maxsize=4096)
def _decode(data: bytes) -> Decision:
    return Decision.from_bytes(data)


@functools.lru_cache(maxsize=64)
def _rows(rows: int, n: int, p: int) -> pa.RecordBatch:
    """Partition ``p`` of ``n`` of the batch's rows (ids ``i % n == p``); immutable, so shared."""
    ids = [BATCH * 1000 + i for i in range(rows) if i % n == p]
    return pa.RecordBatch.from_pydict({"id": ids, "tag": [0] * len(ids)}, schema=SCHEMA)


@dataclasses.dataclass
class _Spark:
    """What the schedule itself holds between driver calls (part of every snapshot)."""

    phase: str = "start"  # start | tasks | operator | after_done | final
    run: int = 0
    n: int = 0
    first_n: int = 0
    txn: str = ""
    msgs: tuple[Prepared, ...] = ()
    pending: tuple[int, ...] = ()
    failures: tuple[int, ...] = ()
    zombie: str = "ready"  # ready | ran | none
    events: int = 0  # faults and zombie interleavings so far
    written: tuple[tuple[tuple[str, int, int], bytes], ...] = ()  # every decision version seen
    done_seen: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A boundary: the fakes' data and :class:`_Spark`, copied."""

    spark: _Spark
    tx: tuple[tuple[str, tuple[tuple[str, int, int], int, str, tuple[int, ...]]], ...]
    rollbacks_of_committed: tuple[str, ...]
    entries: tuple[tuple[str, RegistryEntry], ...]
    forgotten: tuple[tuple[str, RegistryEntry], ...]
    logs: tuple[tuple[str, tuple[tuple[int, tuple[tuple[int, bytes], ...]], ...], tuple[int, ...]], ...]


class _Schedule:
    """The world of one schedule and the choices that drive it."""

    def __init__(
        self,
        chooser: Chooser,
        bounds: Bounds,
        ids: Sequence[tuple[str, str]],
        snap: Snapshot | None = None,
        checked: set[bytes] | None = None,
        outcomes: collections.Counter[str] | None = None,
    ) -> None:
        self.chooser, self.bounds, self.ids = chooser, bounds, ids
        self.checked = checked if checked is not None else set()  # fakes' states already checked
        self.outcomes = outcomes if outcomes is not None else collections.Counter()
        self.faults = _HookedFaults(hook=self._at_step)
        self.world = World(txn_id=ids[0][1], faults=self.faults)
        self.logs: dict[str, FakeDecisionLog] = {}
        self.quiet = False  # the zombie or the final replay runs: no choices
        self.driving = False  # a driver call (commit, abort) runs: the zombie may interleave
        self.zombie_xid = f"{ids[0][1]}-b{BATCH}-p0-a{ZOMBIE_ATTEMPT}"
        self.action = "start"
        self.hits = 0  # steps of fake calls since the last boundary
        self.s = _Spark(txn=ids[0][1], zombie="ready" if bounds.zombie else "none")
        self.written: dict[tuple[str, int, int], bytes] = {}
        if snap is not None:
            self.restore(snap)

    def snapshot(self) -> Snapshot:
        ch, reg = self.world.ch, self.world.registry
        self.s.written = tuple(self.written.items())
        return Snapshot(
            spark=dataclasses.replace(self.s),
            tx=tuple((x, (t.key, t.rows, t.status, t.ids)) for x, t in ch.tx.items()),
            rollbacks_of_committed=tuple(ch.rollbacks_of_committed),
            entries=tuple(reg.entries.items()),
            forgotten=tuple(reg.forgotten.items()),
            logs=tuple(
                (t, tuple((b, tuple(vs.items())) for b, vs in lg.versions.items()), tuple(lg.done))
                for t, lg in self.logs.items()
            ),
        )

    def restore(self, snap: Snapshot) -> None:
        ch, reg = self.world.ch, self.world.registry
        self.s = dataclasses.replace(snap.spark)
        self.written = dict(self.s.written)
        ch.tx = {x: _Tx(key=k, rows=r, status=st, ids=i) for x, (k, r, st, i) in snap.tx}
        ch.rollbacks_of_committed = list(snap.rollbacks_of_committed)
        reg.entries, reg.forgotten = dict(snap.entries), dict(snap.forgotten)
        for txn, versions, done in snap.logs:
            lg = self.log_of(txn)
            lg.versions = {b: dict(vs) for b, vs in versions}
            lg.done = set(done)

    # -- plumbing --------------------------------------------------------------------------
    def log_of(self, txn: str) -> FakeDecisionLog:
        if txn not in self.logs:
            self.logs[txn] = FakeDecisionLog(txn, self.faults)
        return self.logs[txn]

    def coordinator(self, txn: str) -> Coordinator:
        return Coordinator(
            txn,
            TARGET,
            self.world.ch,
            self.world.registry,
            self.log_of(txn),
            retry=RETRY,
            sleep=lambda s: None,
            clock=lambda: 1000.0,
            xid_factory=lambda t, b, p, a: f"{t}-b{b}-p{p}-a{a}",
        )

    def world_digest(self) -> bytes:
        """The fakes' state alone: what the invariants of :meth:`check` judge."""
        ch = self.world.ch
        reg = self.world.registry
        world = (
            sorted((x, t.status, t.key, t.ids) for x, t in ch.tx.items()),
            ch.rollbacks_of_committed,
            sorted((x, e.state, sorted(e.payload.items())) for x, e in reg.entries.items()),
            sorted((x, e.state) for x, e in reg.forgotten.items()),
            sorted(
                (t, sorted((b, sorted(vs.items())) for b, vs in lg.versions.items()), sorted(lg.done))
                for t, lg in self.logs.items()
            ),
        )
        return hashlib.blake2b(repr(world).encode(), digest_size=16).digest()

    def digest(self, world: bytes, *step: object) -> bytes:
        """The fakes' state, the schedule's own (Spark's messages, budgets) and the step."""
        s = self.s
        mine = (
            s.phase,
            s.run,
            s.n,
            s.first_n,
            s.txn,
            [m.xid for m in s.msgs],
            s.pending,
            s.failures,
            s.zombie,
            s.events,
            s.done_seen,
            step,
        )
        return hashlib.blake2b(world + repr(mine).encode(), digest_size=16).digest()

    def choose(self, where: str, options: Sequence[str], *, boundary: bool) -> int:
        if self.chooser.replaying:  # checked and counted when this prefix was first explored
            return self.chooser.choose(where, options, None, boundary=boundary)
        world = self.world_digest()
        if world not in self.checked:  # the invariants are functions of the fakes' state
            self.check()
            self.checked.add(world)
        digest = self.digest(world, where) if boundary else self.digest(world, self.action, where, self.hits)
        return self.chooser.choose(where, options, digest, boundary=boundary)

    # -- the choices at every step of a fake call ---------------------------------------------
    def _at_step(self, op: str, phase: str) -> None:
        if self.quiet:
            return
        self.hits += 1
        options = ["go on"]
        if self.s.events < self.bounds.max_events:
            options += list(self.bounds.fault_kinds)
            if self.s.zombie == "ready" and self.driving:
                options.append("the zombie prepares here")
        what = options[self.choose(f"{self.action}: {op}/{phase}", options, boundary=False)]
        if what != "go on":
            self.s.events += 1
        if what == "crash":
            raise Crash(f"crash at {op} {phase}")
        if what == "error":
            if phase == "before":
                raise TransientError(f"injected: {op} refused")
            raise OutcomeUnknownError(f"injected: reply of {op} lost")
        if what == "kill":
            self.world.ch.kill_sessions()
        if what.startswith("zombie"):
            self.run_zombie()

    def run_zombie(self) -> None:
        """Partition 0's lost attempt of the first run prepares now, atomically.

        Its message never reaches the driver (a speculative or presumed-dead task); a
        zombie that dies after registering is what a failed task attempt already is.
        """
        self.s.zombie = "ran"
        self.quiet = True
        ctx = WriteContext(self.ids[0][1], BATCH, 0, ZOMBIE_ATTEMPT)
        try:
            self.coordinator(ctx.txn_id).prepare(ctx, self.data(self.s.first_n, 0))
        except NotCommittedError:
            pass  # fenced: it never reaches the driver either way
        finally:
            self.quiet = False

    def data(self, n: int, p: int) -> Iterator[pa.RecordBatch]:
        return iter([_rows(self.bounds.rows, n, p)])

    # -- invariants ------------------------------------------------------------------------
    def visible(self) -> collections.Counter[int]:
        """How many times each row id of the batch is visible (any xid, any txn id)."""
        return collections.Counter(
            i for t in self.world.ch.tx.values() if t.status == "committed" and t.key[1] == BATCH for i in t.ids
        )

    def latest(self, txn: str) -> Decision | None:
        vs = self.log_of(txn).versions.get(BATCH)
        return _decode(vs[max(vs)]) if vs else None

    def check(self) -> None:
        """At every choice point: never twice, nothing undecided, decisions immutable."""
        twice = {i: c for i, c in self.visible().items() if c > 1}
        if twice:
            raise Violation(f"rows visible more than once: {twice}")
        zombie = self.world.ch.tx.get(self.zombie_xid)
        if zombie is not None and zombie.status == "committed":
            raise Violation(f"the zombie {self.zombie_xid}, which never reported, is visible")
        if self.world.ch.rollbacks_of_committed:
            raise Violation(f"committed xids rolled back: {self.world.ch.rollbacks_of_committed}")
        self._check_decisions()
        registry = self.world.registry.everything
        for xid, t in self.world.ch.tx.items():
            if t.status != "committed":
                continue
            latest = self.latest(t.key[0])
            if latest is None:
                raise Violation(f"xid {xid} is visible but its batch has no decision")
            if xid not in {p.xid for p in latest.chosen}:
                raise Violation(
                    f"xid {xid} is visible but not in the latest decision "
                    f"v{latest.version} {[p.xid for p in latest.chosen]}"
                )
            e = registry.get(xid)
            if e is not None and e.state in (TxState.ABORTING.value, TxState.ABORTED.value):
                raise Violation(f"xid {xid} is visible but the registry says {e.state}")
        for txn in self.logs:
            latest = self.latest(txn)
            for p in latest.chosen if latest is not None else ():
                t = self.world.ch.tx.get(p.xid)
                if t is not None and t.status == "rolled_back":
                    raise Violation(
                        f"decided xid {p.xid} (v{latest.version}) was rolled back while it could still commit"
                    )

    def _check_decisions(self) -> None:
        for txn, lg in self.logs.items():
            for b, vs in lg.versions.items():
                for v, data in vs.items():
                    if self.written.setdefault((txn, b, v), data) != data:
                        raise Violation(f"decision v{v} of batch {b} changed")
            if lg.done and txn not in self.s.done_seen:
                self.s.done_seen += (txn,)
        missing = [k for k in self.written if k[2] not in self.logs[k[0]].versions.get(k[1], {})]
        if missing:
            raise Violation(f"decision versions disappeared: {missing}")
        undone = [t for t in self.s.done_seen if BATCH not in self.logs[t].done]
        if undone:
            raise Violation(f"batch marked done, then not: {undone}")

    def check_done(self, how: str, *, reported: bool = True) -> None:
        """The batch is done: every row once, exactly the decided xids, their entries finished.

        ``reported``: commit_batch returned, so every other xid of the batch is finished
        too; otherwise a crash may have left a rollback to GC, but never a decided xid
        COMMITTING.
        """
        self.check()
        want = {BATCH * 1000 + i: 1 for i in range(self.bounds.rows)}
        if self.visible() != want:
            raise Violation(
                f"{how}: the batch is done but rows visible {dict(self.visible())}, want each of {sorted(want)} once"
            )
        latest = self.latest(self.s.txn)
        committed = {x for x, t in self.world.ch.tx.items() if t.status == "committed"}
        if latest is None or committed != {p.xid for p in latest.chosen}:
            raise Violation(f"{how}: committed xids {sorted(committed)} are not the decision's")
        if BATCH not in self.log_of(self.s.txn).done:
            raise Violation(f"{how}: reported committed, not marked done")
        open_ = [
            e.xid
            for e in self.world.registry.entries.values()
            if e.xid != self.zombie_xid
            and (e.state == TxState.COMMITTING.value or reported and e.state not in FINISHED)
        ]
        if open_:
            raise Violation(f"{how}: registry entries left unfinished: {open_}")

    # -- the query's runs: one phase between two boundaries ------------------------------
    def play(self) -> str:
        """Run phases until the schedule ends (or the chooser stops at a boundary)."""
        while True:
            phase = self.s.phase
            if phase == "start":
                self.start_run()
            elif phase == "tasks":
                self.next_task()
            elif phase == "operator":
                self.operator()
            elif phase == "after_done":
                if not self.after_done():
                    return "committed" if self.s.zombie != "late" else "committed, zombie late"
            else:
                return self.final_replay()

    def start_run(self) -> None:
        """A (re)start of the query: its partitioning and its checkpoint's spelling."""
        s = self.s
        if s.run >= self.bounds.max_runs:
            s.phase = "final"
            return
        if s.run == 0:
            ns = self.bounds.first_partitions
            k = self.choose("run 0 partitions", [f"n={n}" for n in ns], boundary=True)
            s.n = s.first_n = ns[k]
        else:
            ns = self.bounds.replay_partitions
            options = [f"n={n}, checkpoint {raw!r}" for n in ns for raw, _ in self.ids]
            k = self.choose(f"restart {s.run}", options, boundary=True)
            s.n, s.txn = ns[k // len(self.ids)], self.ids[k % len(self.ids)][1]
        s.msgs, s.pending, s.failures, s.phase = (), tuple(range(s.n)), (0,) * s.n, "tasks"

    def next_task(self) -> None:
        """One task attempt of the run (Spark retries a failed one once); then the commit."""
        s = self.s
        k = self.choose("next task", [f"partition {p}" for p in s.pending], boundary=True) if len(s.pending) > 1 else 0
        p = s.pending[k]
        attempt = s.run * 10 + s.failures[p]
        self.action = f"run {s.run} task p{p} attempt {attempt}"
        try:
            msg = self.coordinator(s.txn).prepare(WriteContext(s.txn, BATCH, p, attempt), self.data(s.n, p))
        except (Crash, NotCommittedError):
            s.failures = tuple(f + (q == p) for q, f in enumerate(s.failures))
            if s.failures[p] >= self.bounds.attempts:
                self.abort()  # the task failed: Spark aborts the batch, the query stops
                self.end_run("task failed")
            return
        s.msgs += (msg,)
        s.pending = tuple(q for q in s.pending if q != p)
        if not s.pending:
            self.end_run(self.commit())

    def end_run(self, ending: str) -> None:
        self.s.run += 1
        if ending == "committed":
            self.s.phase = "after_done"
        else:
            more = self.bounds.operator and self.s.run < self.bounds.max_runs
            self.s.phase = "operator" if more else "start"

    def operator(self) -> None:
        """The query is down: the operator may finish in-doubt xids and collect leftovers."""
        options = ["restart the query", "the operator runs recover and gc, then the query restarts"]
        k = self.choose("query down", options, boundary=True)  # may stop here: phase unchanged
        self.s.phase = "start"
        if not k:
            return
        self.action, self.driving = "operator recover and gc", True
        txns = sorted({txn for _, txn in self.ids})
        try:
            resolve_in_doubt(
                TARGET, self.world.ch, self.world.registry, self.log_of, txn_ids=txns, retry=RETRY, clock=lambda: 1000.0
            )
            gc_stale(
                TARGET,
                self.world.ch,
                self.world.registry,
                self.log_of,
                older_than_s=0.0,
                txn_ids=txns,
                retry=RETRY,
                clock=lambda: 1000.0,
                overwrite_stages=False,
            )
        except (Crash, ClickHouseTxError):
            pass  # the operator's run died or failed; the query's restart still rolls forward
        finally:
            self.driving = False

    def abort(self) -> None:
        self.action, self.driving = f"run {self.s.run} abort", True
        try:
            self.coordinator(self.s.txn).abort_batch(BATCH, self.s.msgs)
        except (Crash, ClickHouseTxError):
            pass  # the query fails anyway; what is left is rolled back by the next run or GC
        finally:
            self.driving = False

    def commit(self) -> str:
        """The driver commits; Spark aborts the batch when the commit raises."""
        self.action, self.driving = f"run {self.s.run} commit", True
        try:
            self.coordinator(self.s.txn).commit_batch(BATCH, self.s.msgs)
        except Crash:
            return "driver crash"
        except DOCUMENTED as e:
            self.outcomes[type(e).__name__] += 1
            self.abort()
            return "refused" if isinstance(e, LostTransactionError) else type(e).__name__
        except Exception as e:
            raise Violation(f"commit_batch raised an undocumented {type(e).__name__}: {e}") from e
        finally:
            self.driving = False
        self.check_done(f"run {self.s.run} commit")
        self.outcomes["committed" if self.s.n == self.s.first_n else "committed under another partitioning"] += 1
        return "committed"

    def after_done(self) -> bool:
        """True if the schedule goes on: Spark replays the done batch."""
        options = ["stop"]
        if self.s.zombie == "ready":
            options.append("zombie finishes late, stop")
        if self.s.run < self.bounds.max_runs:
            options.append("Spark lost its commit log entry: replay the batch")
        what = options[self.choose("after the commit", options, boundary=True)]
        self.action = "after the commit"
        if what.startswith("zombie"):
            self.run_zombie()
            self.s.zombie = "late"
            self.check_done("after the late zombie")
        self.s.phase = "start"
        return what.startswith("Spark")

    def final_replay(self) -> str:
        """No more faults: restart on the same checkpoint until the batch is done.

        A batch marked done is replayed too: the schedule ended in a commit that did not
        return (a crash past ``mark_done``), so Spark's commit log lacks the batch and its
        restart replays it; the replay of a done batch finishes what the crash left (its
        decided xids recorded, its entries dropped: docs/protocol.md, step 6).
        """
        self.quiet = True
        s = self.s
        n = s.n
        for attempt in range(2):
            self.action = "final replay"
            c = self.coordinator(s.txn)
            s.msgs = tuple(c.prepare(WriteContext(s.txn, BATCH, p, 90 + attempt), self.data(n, p)) for p in range(n))
            try:
                c.commit_batch(BATCH, s.msgs)
            except LostTransactionError:
                latest = self.latest(s.txn)
                assert latest is not None
                if attempt or len(latest.chosen) == n:
                    raise Violation(f"a fault-free replay under the decided partitioning (n={n}) was refused") from None
                n = len(latest.chosen)  # as the error advises
                continue
            except Exception as e:
                raise Violation(f"a fault-free replay raised {type(e).__name__}: {e}") from e
            self.check_done("the fault-free replay")
            return "done by the final replay"
        raise AssertionError("unreachable")


@dataclasses.dataclass
class ProtocolModel:
    """The scenario the explorer runs (:class:`tests.model.explorer.Model`)."""

    bounds: Bounds
    ids: Sequence[tuple[str, str]]
    checked: set[bytes] = dataclasses.field(default_factory=set)
    #: how the explored driver commits ended (each commit call executed counts once)
    outcomes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def start(self) -> Snapshot:
        return _Schedule(Chooser([], stop=False), self.bounds, self.ids).snapshot()

    def play(self, snap: Snapshot, chooser: Chooser) -> tuple[str, Snapshot | None, bytes | None]:
        sched = _Schedule(chooser, self.bounds, self.ids, snap, self.checked, self.outcomes)
        try:
            return sched.play(), None, None
        except AtBoundary:
            return "boundary", sched.snapshot(), sched.digest(sched.world_digest(), "boundary")
