"""The contracts between the protocol (pure) and its I/O (ClickHouse, the decision log).

Everything that crosses from a Spark executor to the driver is a :class:`Prepared`
(frozen, picklable, plain data). The coordinator decides with pure functions over
these values and talks to the outside world only through the three protocols below,
so it can be driven by scripted fakes with a fault injected at every call.

Every method the coordinator and recovery call is declared here; an implementation
without the capability has an explicit, documented no-op. What differs by nature
between the modes is declared once, as data: :attr:`Mode.capabilities`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import pyarrow as pa

from clickhouse_tx.retry import NO_RETRY, RetryPolicy


class Mode(str, enum.Enum):
    """How a prepared partition becomes visible."""

    TRANSACTION = "transaction"
    STAGING = "staging"
    DEDUP = "dedup"
    NONE = "none"

    @property
    def capabilities(self) -> "ModeCapabilities":
        """What this mode's prepared work is made of (:class:`ModeCapabilities`)."""
        return _CAPABILITIES[self]


@dataclasses.dataclass(frozen=True)
class ModeCapabilities:
    """What differs by nature between the commit modes, declared once per :class:`Mode`.

    Attributes
    ----------
    visible_on_insert:
        Rows are visible as they are inserted (``dedup``, ``none``): the executor
        checks a partition's values before its first insert, not while it streams.
    stage_tables:
        Prepare leaves one table per xid (``staging``): ``gc`` lists the leftovers
        (:func:`clickhouse_tx.modes.staging.tables.leftover_stages`) and drops them.
    """

    visible_on_insert: bool = False
    stage_tables: bool = False


_CAPABILITIES: Mapping[Mode, ModeCapabilities] = {
    Mode.TRANSACTION: ModeCapabilities(),
    Mode.STAGING: ModeCapabilities(stage_tables=True),
    Mode.DEDUP: ModeCapabilities(visible_on_insert=True),
    Mode.NONE: ModeCapabilities(visible_on_insert=True),
}


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    """How an ``https://`` server is trusted and how this client proves itself: the options of
    clickhouse-connect's ``get_client``, with their meaning (:mod:`clickhouse_tx.client.tls` builds the
    ``ssl.SSLContext`` from them; ``docs/options.md``, "HTTPS").

    Attributes
    ----------
    verify
        Check the server's certificate and host name. False: any certificate is accepted.
    ca_cert
        A PEM file (or a directory of hashed PEM files) of the CAs trusted instead of the
        operating system's; ``"certifi"``: the ``certifi`` package's bundle of public CAs.
        None: the operating system's trust store.
    client_cert, client_cert_key
        A client certificate (PEM, with any intermediates) and its unencrypted key, for a
        server that requires one; the key may be inside ``client_cert``.
    """

    verify: bool = True
    ca_cert: str | None = None
    client_cert: str | None = None
    client_cert_key: str | None = None


#: Verify against the operating system's CAs, no client certificate: clickhouse-connect's defaults.
DEFAULT_TLS = TlsSettings()


@dataclasses.dataclass(frozen=True)
class Target:
    """Where rows go: a ClickHouse server and one table.

    ``password`` never appears in ``repr`` or in errors.

    ``read_retry`` is how the client retries what repeating cannot change: a read, or
    a statement its caller marks idempotent, outside a session, after a connection
    failure, a lost reply or a transient server error (a Keeper connection loss). The
    writer sets it from its ``retry.*`` options; the default retries nothing.

    With ``route_column`` set (multi-table routing, mode ``transaction`` only), each
    row goes to the table its ``route_column`` value names, which must be one of
    ``route_tables`` (``(database, table)`` pairs); ``database``/``table`` then only
    say where the registry and markers live and what ``Prepared.table`` shows.

    ``tls`` is how an ``https://`` server is trusted (:class:`TlsSettings`); unused over ``http://``.
    """

    url: str
    database: str
    table: str
    user: str = "default"
    password: str = dataclasses.field(default="", repr=False)
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 300.0
    session_timeout_s: int = 3600
    route_column: str | None = None
    route_tables: tuple[tuple[str, str], ...] = ()
    read_retry: RetryPolicy = NO_RETRY
    tls: TlsSettings = DEFAULT_TLS


@dataclasses.dataclass(frozen=True)
class WriteContext:
    """Identity of one write attempt of one partition (built on the executor)."""

    txn_id: str
    batch: int
    partition: int
    attempt: int
    #: One id per run of the job or query (drawn on the driver when the writer is built):
    #: tells a replay's attempts from an earlier run's (mode dedup's layout claims).
    run: str = ""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """Which attempt, of which partition and query, writes where: what a :class:`Prepared`
    and a :class:`RegistryEntry` of the same attempt share (their first fields)."""

    xid: str
    txn_id: str
    batch: int
    partition: int
    attempt: int
    mode: Mode
    server: str
    table: str  # fully qualified, unquoted "db.table" for display

    def attempt_fields(self) -> dict[str, Any]:
        """The :class:`Attempt` fields by name: to build the other record of the same attempt."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Attempt)}


@dataclasses.dataclass(frozen=True)
class Prepared(Attempt):
    """What ``prepare`` returns to the driver: picklable, no open handles.

    ``details`` holds mode-specific plain data (the stage table and its partition
    ids for staging, the dedup tokens for dedup); values must be JSON-serialisable.
    """

    rows: int
    checksum: int
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_attempt(cls, ctx: WriteContext, xid: str, mode: Mode, server: str, table: str) -> "Prepared":
        """Attempt ``xid`` of ``ctx`` (its query, batch, partition and attempt number), no rows yet.

        Built once per attempt on the executor, and by recovery for a leftover it found;
        the rows, checksum and details go in with :func:`dataclasses.replace`.
        """
        identity = Attempt(xid, ctx.txn_id, ctx.batch, ctx.partition, ctx.attempt, mode, server, table)
        return cls(**identity.attempt_fields(), rows=0, checksum=0)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mode"] = self.mode.value
        d["details"] = dict(self.details)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Prepared":
        d = dict(d)
        d["mode"] = Mode(d["mode"])
        d["details"] = dict(d.get("details") or {})
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The coordinator's durable choice for one batch: which xid commits each partition.

    Written before the first COMMIT; a later ``version`` replaces a logged xid that
    can no longer commit with a replayed one of the same partition (``docs/design.md`` §5).
    """

    txn_id: str
    batch: int
    chosen: tuple[Prepared, ...]
    version: int = 1
    done: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "txn_id": self.txn_id,
                "batch": self.batch,
                "version": self.version,
                "done": self.done,
                "chosen": [p.to_json() for p in self.chosen],
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, b: bytes) -> "Decision":
        d = json.loads(b)
        return cls(
            txn_id=d["txn_id"],
            batch=int(d["batch"]),
            version=int(d.get("version", 1)),
            done=bool(d.get("done", False)),
            chosen=tuple(Prepared.from_json(p) for p in d["chosen"]),
        )


class CommitOutcome(str, enum.Enum):
    """What a lookup can say about one xid after the fact."""

    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"  # definitely: safe to roll back / replace
    PENDING = "pending"  # still open and committable (session alive)


#: A callback with no argument and no result (e.g. the test-only fault hooks' ``before_commit``).
Hook = Callable[[], None]


@runtime_checkable
class CommitModeIO(Protocol):
    """The I/O of one commit mode. Executor methods must be picklable-free of state.

    Implementations raise :class:`clickhouse_tx.errors.NotCommittedError` when an
    operation definitely did not take effect and
    :class:`clickhouse_tx.errors.OutcomeUnknownError` when it may have.
    """

    mode: Mode

    def validate(self, target: Target, schema: pa.Schema, info: Any = None) -> None:
        """Driver, once per query/job, before any task writes: raise ConfigurationError.

        ``info``: the target's :class:`~clickhouse_tx.conversion.schema.TableInfo` (typed
        ``Any`` here: this module is below ``conversion``), already read and checked
        against ``schema`` by the caller (the sink's checks); None: the mode describes
        the target itself."""

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: write without making visible."""

    def commit(self, target: Target, p: Prepared) -> None:
        """Driver: make ``p`` visible. Idempotent for an already committed ``p``."""

    def rollback(self, target: Target, p: Prepared) -> None:
        """Driver or GC: discard ``p``. Idempotent; a no-op if already gone."""

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """Driver: resolve an in-doubt ``p`` (marker lookup, never a blind retry)."""

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        """Driver, at the start of every commit of ``batch``, before its decision: refuse
        (raise) a run that cut the batch otherwise than an earlier run whose rows are
        already visible. A no-op in modes whose rows stay invisible until the commit."""

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Driver, once per batch commit, after the decision and before the per-xid
        commits: publish every ``p`` of ``ps`` in one step where the mode can (staging
        with ``visibility=batch``); a no-op elsewhere. Raises NotCommittedError when
        nothing of it took effect (the per-xid commits then publish them one by one)."""

    def renew(self, target: Target, p: Prepared) -> bool:
        """Driver, once per chosen xid before a new decision is written: True if ``p``'s
        prepared work is still there, its session renewed so that it lasts until the
        COMMIT. Modes without sessions keep prepared work until it is rolled back:
        theirs is a no-op that says True (:class:`~clickhouse_tx.modes.base.ModeBase`)."""


@runtime_checkable
class RegistryIO(Protocol):
    """Durable, linearizable xid → state map (a KeeperMap table in production)."""

    def register(self, p_or_ctx: "RegistryEntry") -> None:
        """Create the entry in INITIALIZED; raise if the xid exists (fenced)."""

    def transition(
        self, xid: str, expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> bool:
        """Compare-and-set the state; False if the current state is not expected."""

    def transition_many(
        self, xids: Sequence[str], expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> list[str]:
        """Driver, once or twice per batch commit: one compare-and-set over many xids;
        the xids this call moved. The caller settles each xid not returned one by one
        (:meth:`transition`), so a registry without a bulk CAS returns [] and is correct."""

    def get(self, xid: str) -> "RegistryEntry | None": ...

    def get_many(self, xids: Sequence[str]) -> dict[str, "RegistryEntry"]:
        """The entries of ``xids`` that exist, by xid, in one point read where the store
        allows it (an executor's check of its own entry and its run's abort fence)."""

    def list_batch(self, txn_id: str, batch: int) -> list["RegistryEntry"]: ...

    def list_txn(self, txn_id: str) -> list["RegistryEntry"]:
        """Operator side (``gc``): every entry of one query (``txn_id``)."""

    def list_open(self, older_than_s: float | None = None) -> list["RegistryEntry"]:
        """Entries not finished, not updated for ``older_than_s`` if given. A view of
        the registry restricted to one mode (``python -m clickhouse_tx gc --mode``)
        lists that mode's only."""

    def list_open_all_modes(self, older_than_s: float | None = None) -> list["RegistryEntry"]:
        """Operator side (``gc``): :meth:`list_open` over every mode, also through a view
        restricted to one mode (a batch job's stage may hold xids of several)."""

    def forget(self, xids: Sequence[str], committed: Sequence[str] = ()) -> None:
        """Driver (once per done batch) and ``gc``: delete the finished entries among
        ``xids``, and the COMMITTING ones among ``committed`` (xids of a done batch
        whose COMMIT took effect); nothing reads them again. Best effort for its callers."""


@dataclasses.dataclass(frozen=True)
class RegistryEntry(Attempt):
    state: str
    payload: Mapping[str, object] = dataclasses.field(default_factory=dict)
    created_ms: int = 0
    updated_ms: int = 0

    @classmethod
    def of_attempt(cls, p: "Prepared", state: str, now_ms: int) -> "RegistryEntry":
        """The entry that registers attempt ``p`` in ``state`` at ``now_ms``."""
        return cls(**p.attempt_fields(), state=state, created_ms=now_ms, updated_ms=now_ms)


@runtime_checkable
class DecisionLogIO(Protocol):
    """One decision per (txn_id, batch); write-once per version, atomically."""

    @property
    def root_uri(self) -> str:
        """Where the log lives, as an operator passes it to ``python -m clickhouse_tx
        recover --checkpoint`` (the runbooks of :mod:`clickhouse_tx.errors` name it)."""

    def read(self, batch: int) -> Decision | None: ...

    def write(self, decision: Decision) -> None:
        """Atomic; raise DecisionConflictError if this version already exists."""

    def mark_done(self, batch: int) -> None: ...

    def batches(self) -> Iterable[int]: ...
