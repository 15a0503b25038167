"""In-memory fakes of the three I/O protocols, with a fault injectable at any step.

Only for unit tests of the pure protocol logic. Every fake calls
:meth:`FakeCallFaults.hit` before and after each effect; the plan numbers those points
(steps) in call order, so a test can run a scenario once to count its steps and
then again with a fault at each one:

- ``crash``: raise :class:`Crash` (a BaseException, like a killed process: no
  ``except Exception`` in the code under test can swallow it);
- ``error``: before the effect raise :class:`TransientError` (definitely not done),
  after it raise :class:`OutcomeUnknownError` (the effect happened, the reply was lost);
- ``server_error``: raise a plain :class:`ServerError` (an exception in the server's
  reply, which says nothing of the outcome), before or after the effect;
- ``kill``: the simulated ClickHouse restarts: every open transaction dies.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx.errors import (
    ClickHouseTxError,
    ConfigurationError,
    DecisionConflictError,
    NotCommittedError,
    OutcomeUnknownError,
    ServerError,
    TransientError,
)
from clickhouse_tx.interfaces import (
    CommitOutcome,
    Decision,
    Hook,
    Mode,
    Prepared,
    RegistryEntry,
    Target,
    WriteContext,
)
from clickhouse_tx.protocol.state import TxState, is_finished, next_state

if TYPE_CHECKING:  # imported lazily at run time: the coordinator module imports much more
    from clickhouse_tx.protocol.coordinator import Coordinator

TARGET = Target(url="http://fake:8123", database="db", table="events", password="s3cret")


class Crash(BaseException):
    """A simulated process death at one step."""


@dataclasses.dataclass
class FakeCallFaults:
    """Numbers every before/after point of every fake call; faults one of them."""

    at: int | None = None
    kind: str = "crash"  # crash | error | server_error | kill
    only: Callable[[str, str], bool] | None = None  # restrict which points are counted
    step: int = 0
    trace: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
    on_kill: Callable[[], None] | None = None
    fired: bool = False

    def hit(self, op: str, phase: str) -> None:
        if self.only is not None and not self.only(op, phase):
            return
        i = self.step
        self.step += 1
        self.trace.append((i, op, phase))
        if i != self.at:
            return
        self.fired = True
        if self.kind == "crash":
            raise Crash(f"crash at step {i} ({op} {phase})")
        if self.kind == "error":
            if phase == "before":
                raise TransientError(f"injected: connection refused at {op}")
            raise OutcomeUnknownError(f"injected: reply of {op} lost")
        if self.kind == "server_error":
            raise ServerError(f"injected: server error {phase} {op}", code=1002, name="UNKNOWN_EXCEPTION")
        if self.kind == "kill":
            assert self.on_kill is not None
            self.on_kill()
            return
        raise ValueError(self.kind)

    def arm(self, at: int, kind: str = "crash", only: Callable[[str, str], bool] | None = None) -> None:
        """Fault the ``at``-th point from now on (counting only points ``only`` accepts)."""
        self.at, self.kind, self.only, self.step, self.fired = at, kind, only, 0, False
        self.trace.clear()

    def disarm(self) -> None:
        self.at = None
        self.only = None


@dataclasses.dataclass
class _Tx:
    key: tuple[str, int, int]
    rows: int
    status: str = "open"  # open | committed | rolled_back | dead
    ids: tuple = ()  # the "id" column's values, to check rows under any partitioning


class FakeClickHouse:
    """A simulated ClickHouse for the ``transaction`` mode: one open transaction per xid.

    Rows of an xid become visible when it commits; its session can die (server
    restart) and then it can never commit.
    """

    mode = Mode.TRANSACTION

    def __init__(self, faults: FakeCallFaults | None = None, *, whole_batch: bool = False) -> None:
        self.faults = faults or FakeCallFaults()
        self.tx: dict[str, _Tx] = {}
        self.rollbacks_of_committed: list[str] = []
        self.commit_calls: list[str] = []
        #: ``visibility=batch``: :meth:`commit_together` publishes a batch's xids in one step.
        self.whole_batch = whole_batch
        self.together_calls: list[tuple[str, ...]] = []

    def _hit(self, op: str, phase: str) -> None:
        self.faults.hit(f"ch.{op}", phase)

    def validate(self, target: Target, schema: pa.Schema) -> None:
        if len(schema) == 0:
            raise ConfigurationError(f"table {target.database}.{target.table}: empty schema")

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        self._hit("prepare", "before")
        rows = 0
        checksum = hashlib.sha256()
        ids: list = []
        for b in batches:
            rows += b.num_rows
            checksum.update(str(b.to_pydict()).encode())
            if "id" in b.schema.names:
                ids.extend(b.column("id").to_pylist())
        self.tx[xid] = _Tx(key=(ctx.txn_id, ctx.batch, ctx.partition), rows=rows, ids=tuple(ids))
        self._hit("prepare", "after")
        attempt = Prepared.for_attempt(ctx, xid, self.mode, target.url, f"{target.database}.{target.table}")
        digest = int(checksum.hexdigest()[:12], 16)
        return dataclasses.replace(attempt, rows=rows, checksum=digest, details={"session_id": xid})

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        """Transaction mode's: nothing to check (its rows are invisible until COMMIT)."""

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Nothing unless ``whole_batch``; then every xid of ``ps`` commits in one step, or none."""
        if not self.whole_batch:
            return
        self._hit("commit_together", "before")
        txs = [self.tx.get(p.xid) for p in ps]
        if any(t is None or t.status in ("dead", "rolled_back") for t in txs):
            raise NotCommittedError("a transaction of the batch is gone: none committed", xid=ps[0].xid)
        self.together_calls.append(tuple(p.xid for p in ps))
        for t in txs:
            assert t is not None
            t.status = "committed"
        self._hit("commit_together", "after")

    def commit(self, target: Target, p: Prepared) -> None:
        self._hit("commit", "before")
        self.commit_calls.append(p.xid)
        t = self.tx.get(p.xid)
        if t is None or t.status in ("dead", "rolled_back"):
            raise NotCommittedError("session expired or transaction rolled back", xid=p.xid)
        t.status = "committed"
        self._hit("commit", "after")

    def rollback(self, target: Target, p: Prepared) -> None:
        self._hit("rollback", "before")
        t = self.tx.get(p.xid)
        if t is not None and t.status == "committed":
            self.rollbacks_of_committed.append(p.xid)
        elif t is not None and t.status == "open":
            t.status = "rolled_back"
        self._hit("rollback", "after")

    def renew(self, target: Target, p: Prepared) -> bool:
        """Is the xid's transaction still open (its session alive)? Renewing is implicit."""
        self._hit("renew", "before")
        t = self.tx.get(p.xid)
        out = t is not None and t.status == "open"
        self._hit("renew", "after")
        return out

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        self._hit("lookup", "before")
        t = self.tx.get(p.xid)
        out = (
            CommitOutcome.COMMITTED
            if t is not None and t.status == "committed"
            else CommitOutcome.PENDING
            if t is not None and t.status == "open"
            else CommitOutcome.NOT_COMMITTED
        )
        self._hit("lookup", "after")
        return out

    # -- test helpers -------------------------------------------------------------------
    def kill_sessions(self) -> None:
        """Server restart: every open transaction is gone for good."""
        for t in self.tx.values():
            if t.status == "open":
                t.status = "dead"

    def visible(self) -> collections.Counter:
        """How many committed xids hold each logical (txn_id, batch, partition)."""
        return collections.Counter(t.key for t in self.tx.values() if t.status == "committed")

    def visible_ids(self, txn_id: str, batch: int) -> collections.Counter:
        """How many times each id of (txn_id, batch) is visible (any partitioning)."""
        return collections.Counter(
            i for t in self.tx.values() if t.status == "committed" and t.key[:2] == (txn_id, batch) for i in t.ids
        )

    def visible_rows(self) -> int:
        return sum(t.rows for t in self.tx.values() if t.status == "committed")


class FakeRegistry:
    """A linearizable xid -> state map; every transition is checked against the state table."""

    def __init__(
        self,
        faults: FakeCallFaults | None = None,
        clock: Callable[[], float] = lambda: 0.0,
        committed_on_server: Callable[[str], bool] = lambda xid: True,
    ) -> None:
        self.faults = faults or FakeCallFaults()
        self.clock = clock
        self.entries: dict[str, RegistryEntry] = {}
        self.forgotten: dict[str, RegistryEntry] = {}
        # checks what a forget claims of the COMMITTING entries it drops
        self.committed_on_server = committed_on_server

    def _hit(self, op: str, phase: str) -> None:
        self.faults.hit(f"registry.{op}", phase)

    def register(self, e: RegistryEntry) -> None:
        self._hit("register", "before")
        if e.xid in self.entries:
            raise ClickHouseTxError(f"xid already registered ({self.entries[e.xid].state})", xid=e.xid)
        if e.state not in (TxState.INITIALIZED.value, TxState.ABORTED.value):
            raise AssertionError(f"register in state {e.state}")
        self.entries[e.xid] = e
        self._hit("register", "after")

    def transition(
        self, xid: str, expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> bool:
        self._hit("transition", "before")
        e = self.entries.get(xid)
        if e is None or e.state not in expected:
            return False
        next_state(e.state, new, xid=xid)  # the code under test must only ask legal moves
        merged = dict(e.payload)
        merged.update(payload or {})
        self.entries[xid] = dataclasses.replace(e, state=new, payload=merged, updated_ms=int(self.clock() * 1000))
        self._hit("transition", "after")
        return True

    def transition_many(
        self, xids: Sequence[str], expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> list[str]:
        """Atomic over all keys, as KeeperMap's strict multi-request is; faults around it."""
        self._hit("transition_many", "before")
        moved = []
        for xid in dict.fromkeys(xids):
            e = self.entries.get(xid)
            if e is None or e.state not in expected:
                continue
            next_state(e.state, new, xid=xid)
            merged = dict(e.payload)
            merged.update(payload or {})
            self.entries[xid] = dataclasses.replace(e, state=new, payload=merged, updated_ms=int(self.clock() * 1000))
            moved.append(xid)
        self._hit("transition_many", "after")
        return moved

    @property
    def everything(self) -> dict[str, RegistryEntry]:
        """Live and forgotten entries: what the checks judge (forgetting is housekeeping)."""
        return {**self.forgotten, **self.entries}

    def history(self, txn_id: str, batch: int) -> list[RegistryEntry]:
        return sorted(
            (e for e in self.everything.values() if e.txn_id == txn_id and e.batch == batch),
            key=lambda e: (e.partition, e.attempt, e.xid),
        )

    def forget(self, xids: Sequence[str], committed: Sequence[str] = ()) -> None:
        """Drop finished entries, and the COMMITTING ones among ``committed`` (as the
        KeeperMap registry does); kept aside for the checks.

        A COMMITTING entry dropped as committed is kept as COMMITTED, the CAS the drop
        stands for, after checking the claim against the server: an xid not committed
        there is a protocol bug, raised as one.
        """
        self._hit("forget", "before")
        for xid in [*xids, *committed]:
            e = self.entries.get(xid)
            if e is not None and xid in committed and e.state == TxState.COMMITTING.value:
                if not self.committed_on_server(xid):
                    raise AssertionError(f"forgot {xid} as committed, but it is not committed on the server")
                self.forgotten[xid] = dataclasses.replace(self.entries.pop(xid), state=TxState.COMMITTED.value)
            elif e is not None and e.state in (TxState.COMMITTED.value, TxState.ABORTED.value):
                self.forgotten[xid] = self.entries.pop(xid)
        self._hit("forget", "after")

    def get(self, xid: str) -> RegistryEntry | None:
        self._hit("get", "before")
        return self.entries.get(xid)

    def get_many(self, xids: Sequence[str]) -> dict[str, RegistryEntry]:
        self._hit("get", "before")
        return {x: self.entries[x] for x in xids if x in self.entries}

    def list_batch(self, txn_id: str, batch: int) -> list[RegistryEntry]:
        self._hit("list_batch", "before")
        return [e for e in self.entries.values() if e.txn_id == txn_id and e.batch == batch]

    def list_open(self, older_than_s: float | None = None) -> list[RegistryEntry]:
        now_ms = self.clock() * 1000
        return [
            e
            for e in self.entries.values()
            if not is_finished(e.state) and (older_than_s is None or e.updated_ms <= now_ms - older_than_s * 1000)
        ]

    def list_open_all_modes(self, older_than_s: float | None = None) -> list[RegistryEntry]:
        return self.list_open(older_than_s)

    def list_txn(self, txn_id: str) -> list[RegistryEntry]:
        return [e for e in self.entries.values() if e.txn_id == txn_id]


class FakeDecisionLog:
    """Decision versions held as bytes (so they round-trip like the file log)."""

    def __init__(self, txn_id: str, faults: FakeCallFaults | None = None) -> None:
        self.txn_id = txn_id
        self.root_uri = f"memory://decisions/{txn_id}"
        self.faults = faults or FakeCallFaults()
        self.versions: dict[int, dict[int, bytes]] = {}
        self.done: set[int] = set()

    def _hit(self, op: str, phase: str) -> None:
        self.faults.hit(f"log.{op}", phase)

    def read(self, batch: int) -> Decision | None:
        self._hit("read", "before")
        vs = self.versions.get(batch)
        if not vs:
            return None
        d = Decision.from_bytes(vs[max(vs)])
        return dataclasses.replace(d, done=batch in self.done)

    def write(self, decision: Decision) -> None:
        self._hit("write", "before")
        vs = self.versions.setdefault(decision.batch, {})
        if decision.version in vs:
            raise DecisionConflictError(f"v{decision.version} of batch {decision.batch} exists")
        vs[decision.version] = decision.to_bytes()
        self._hit("write", "after")

    def mark_done(self, batch: int) -> None:
        self._hit("mark_done", "before")
        self.done.add(batch)
        self._hit("mark_done", "after")

    def batches(self) -> Iterable[int]:
        return sorted(self.versions)


def arrow_batches(rows: int, tag: int = 0) -> Iterator[pa.RecordBatch]:
    """A partition's data: ``rows`` rows in one record batch."""
    yield pa.RecordBatch.from_pydict({"id": list(range(rows)), "tag": [tag] * rows})


@dataclasses.dataclass
class World:
    """One simulated deployment: ClickHouse, registry and decision log sharing a FakeCallFaults."""

    txn_id: str = "q1"
    faults: FakeCallFaults = dataclasses.field(default_factory=FakeCallFaults)
    now: list[float] = dataclasses.field(default_factory=lambda: [1000.0])
    whole_batch: bool = False

    def __post_init__(self) -> None:
        self.ch = FakeClickHouse(self.faults, whole_batch=self.whole_batch)
        self.registry = FakeRegistry(self.faults, clock=lambda: self.now[0], committed_on_server=self._committed)
        self.log = FakeDecisionLog(self.txn_id, self.faults)
        self.faults.on_kill = self.ch.kill_sessions
        self._xids = 0

    def _committed(self, xid: str) -> bool:
        t = self.ch.tx.get(xid)
        return t is not None and t.status == "committed"

    def next_xid(self, txn_id: str, batch: int, partition: int, attempt: int) -> str:
        """Deterministic xids, so a failing schedule replays identically."""
        self._xids += 1
        return f"{txn_id}-b{batch}-p{partition}-a{attempt}-{self._xids:08x}"

    def coordinator(self, **kw) -> Coordinator:
        from clickhouse_tx.protocol.coordinator import Coordinator
        from clickhouse_tx.retry import RetryPolicy

        kw.setdefault("retry", RetryPolicy(max_attempts=3, max_total_s=1.0, base_delay_s=0.0, max_delay_s=0.0))
        kw.setdefault("sleep", lambda s: None)
        kw.setdefault("xid_factory", self.next_xid)
        return Coordinator(self.txn_id, TARGET, self.ch, self.registry, self.log, clock=lambda: self.now[0], **kw)

    def keys_of(self, batch: int) -> dict[tuple[str, int, int], int]:
        return {k: n for k, n in self.ch.visible().items() if k[0] == self.txn_id and k[1] == batch}
