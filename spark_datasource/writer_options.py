"""The ``clickhouse_tx`` writer's options, parsed once into a frozen value.

Spark hands a Python data source its options as a case-insensitive dict of strings
(``pyspark.sql.datasource.CaseInsensitiveDict``; keys arrive lower-cased). What Spark
itself adds, measured with pyspark 4.3 (see ``docs/options.md``):

- batch ``save(path)`` adds ``path``; streaming adds ``checkpointLocation`` and
  ``queryName`` only when the user set them on the ``DataStreamWriter``
  (``.option("checkpointLocation", ...)`` / ``.queryName(...)``). A checkpoint set
  through the ``spark.sql.streaming.checkpointLocation`` conf is NOT passed.
- nothing else (no ``spark.*`` keys).

:meth:`WriterOptions.parse` runs wherever the data source builds its writer: on the
driver's Python worker, once per batch job, and again for every streaming commit
(Spark builds a fresh stream writer per commit), so every default it derives is a pure
function of the options (and the working directory, against which a relative
checkpoint location is resolved), except the batch ``transactional_id`` (fresh per job,
prefixed by the option when given; the batch writer instance, options included, is
pickled to the executors and to the commit, so it stays the same for the whole job).
The streaming ``transactional_id`` is settled afterwards by
:meth:`WriterOptions.with_query_identity`, which reads the checkpoint. The value is
frozen and picklable.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tempfile
import uuid
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar
from urllib.parse import urlsplit, urlunsplit

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import canonical_location
from clickhouse_tx.interfaces import Mode, Target
from clickhouse_tx.sql import split_table

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.retry import RetryPolicy
    from clickhouse_tx.shard_placement import ShardPlacement as ShardLayout

#: The parsed type of one option (``from_options``'s ``get``).
T = TypeVar("T")

__all__ = ["WriterOptions", "KNOWN_OPTIONS"]

# Lower-case, as Spark delivers them. Prefixed families are listed with a trailing '.'.
KNOWN_OPTIONS = (
    "url",
    "user",
    "password",
    "database",
    "table",
    "path",
    "mode",
    "transactional_id",
    "checkpointlocation",
    "queryname",
    "decision_log",
    "batch_size",
    "batch_bytes",
    "connect_timeout",
    "request_timeout",
    "session_timeout",
    "create_table",
    "order_by",
    "partition_by",
    "engine",
    "table_column",
    "tables",
    "allow_nullable_into_non_nullable",
    "retry.attempts",
    "retry.max_seconds",
    "strict_precision",
    "bad_rows",
    "dead_letter_table",
    "visibility",
    "idempotence_key",
    "shards",
    "sharding_key",
    "shard_weights",
)
_PREFIXES = ("setting.", "fault.")

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _bad(option: str, value: str, expected: str) -> ConfigurationError:
    shown = value if len(value) <= 200 else value[:200] + "..."
    return ConfigurationError(f"option {option}={shown!r}: expected {expected}")


def _bool(option: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise _bad(option, value, "true/false/1/0/yes/no")


def _positive_int(option: str, value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise _bad(option, value, "a positive integer") from None
    if n <= 0:
        raise _bad(option, value, "a positive integer")
    return n


#: The shortest ``session_timeout`` (seconds) the writer accepts. The executors' keep-alive
#: (``clickhouse_tx.modes.transaction.SessionKeepAlive``) touches a prepared session every
#: ``session_timeout / 4`` seconds, each touch given at most ``max(1, session_timeout / 2)``,
#: and only while its Python worker lives. Below this floor one slow touch (a worker starved
#: of CPU, a busy server) or the start of the driver's commit outlasts the session.
MIN_SESSION_TIMEOUT_S = 10


def _session_timeout(option: str, value: str) -> int:
    n = _positive_int(option, value)
    if n < MIN_SESSION_TIMEOUT_S:
        raise _bad(
            option,
            value,
            f"at least {MIN_SESSION_TIMEOUT_S} seconds: prepared sessions wait for the driver's commit "
            "and are kept alive only by touches every session_timeout/4 s from the executors, so a "
            "shorter timeout may expire them before the commit (docs/options.md)",
        )
    return n


def _positive_float(option: str, value: str) -> float:
    try:
        x = float(value.strip())
    except ValueError:
        raise _bad(option, value, "a positive number of seconds") from None
    if not math.isfinite(x) or x <= 0:
        raise _bad(option, value, "a positive number of seconds")
    return x


def _url(value: str) -> str:
    v = value.strip()
    try:
        parts = urlsplit(v)
        _ = parts.port  # raises ValueError on a non-numeric port
    except ValueError:
        raise _bad("url", _redact_url(v), "http(s)://host[:port]") from None
    if parts.username is not None or parts.password is not None:
        # The URL would carry the password into every repr and log line.
        raise ConfigurationError(
            f"option url={_redact_url(v)!r}: do not put credentials in the url; use the user and password options"
        )
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise _bad("url", _redact_url(v), "http(s)://host[:port]")
    if parts.query or parts.fragment:
        raise _bad("url", _redact_url(v), "a url without query or fragment (use setting.<name> options)")
    return urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), "", ""))


def _redact_url(v: str) -> str:
    from clickhouse_tx.http_client import safe_url  # the one credential-free form of a URL

    return safe_url(v)


def _explicit_txn_id(opts: Mapping[str, str]) -> str | None:
    if "transactional_id" not in opts:
        return None
    txn = opts["transactional_id"].strip()
    if not _ID.match(txn):
        raise _bad("transactional_id", opts["transactional_id"], "1-128 characters of A-Z a-z 0-9 _ . -")
    return txn


def _batch_job_id(explicit: str | None) -> str:
    """A batch job's id: fresh per job, with the ``transactional_id`` option as prefix.

    Batch ids start at 0 in every job, so a reused id would meet an earlier job's
    decision for batch 0 and write nothing. Keying each job apart makes two jobs with
    the same option write their rows and never see each other's registry entries.
    """
    job = uuid.uuid4().hex
    return f"{explicit}.job-{job[:12]}" if explicit else f"batch-{job}"


def _batch_log(txn: str) -> str:
    # Batch commit runs in a Python worker on the driver host: a local dir works. The
    # decision log adds clickhouse_tx/<txn_id> below this root itself.
    return os.path.join(tempfile.gettempdir(), "clickhouse_tx_batch")


def _route_tables(raw: str | None, database: str) -> tuple[tuple[str, str], ...]:
    """``tables``: comma-separated ``db.table`` or ``table`` (in ``database``), deduplicated."""
    if raw is None:
        return ()
    out: list[tuple[str, str]] = []
    for item in raw.split(","):
        name = item.strip()
        if not name:
            raise _bad("tables", raw, "a comma-separated list of db.table or table names (no empty entries)")
        db, t = _table_name("tables", raw, name, database, f"db.table or table names ({name!r} is neither)")
        if (db, t) not in out:
            out.append((db, t))
    return tuple(out)


def _dead_letter_table(opts: Mapping[str, str], database: str, mode: Mode) -> tuple[str, str] | None:
    """``bad_rows`` / ``dead_letter_table``: the dead-letter table, or None (``bad_rows=fail``)."""
    bad_rows = opts.get("bad_rows", "fail").strip().lower()
    raw = opts.get("dead_letter_table", "").strip()
    if bad_rows not in ("fail", "dead_letter"):
        raise _bad("bad_rows", opts["bad_rows"], "fail or dead_letter")
    if bad_rows == "fail":
        if raw:
            raise ConfigurationError(f"option dead_letter_table={raw!r} needs bad_rows=dead_letter")
        return None
    if not raw:
        raise ConfigurationError(
            "option bad_rows=dead_letter needs the option dead_letter_table "
            "(table or database.table; created when missing)"
        )
    if mode not in (Mode.TRANSACTION, Mode.DEDUP, Mode.STAGING):
        raise ConfigurationError(
            f"option bad_rows=dead_letter with mode={mode.value!r}: dead letters are written "
            "exactly once in modes 'transaction' (in the partition's transaction), 'dedup' "
            "(with the partition's deduplication token) and 'staging' (in a stage moved with "
            "the partition's) only"
        )
    if opts.get("table_column", "").strip():
        raise ConfigurationError("option bad_rows=dead_letter cannot be combined with table_column")
    return _table_name("dead_letter_table", raw, raw, database, "table or database.table")


def _check_faults(faults: Mapping[str, str]) -> None:
    """``fault.*``: refused outside the test suite, and a bad step fails here, on the driver."""
    if not faults:
        return
    from clickhouse_tx.faults import FaultPlan, check_enabled

    check_enabled(faults)
    try:
        FaultPlan.parse(faults)
    except ValueError as exc:
        raise ConfigurationError(f"option {exc}") from None


def _no_semicolon(option: str, value: str) -> str:
    # order_by/partition_by/engine are SQL expressions by nature (user-trusted), but a
    # ';' can only be a mistake or an injection: refuse it.
    if ";" in value or "\x00" in value:
        raise _bad(option, value, "one SQL expression (no ';')")
    v = value.strip()
    if not v:
        raise _bad(option, value, "a non-empty SQL expression")
    return v


#: Options holding one value each: option -> (WriterOptions field, parser). An option
#: not given keeps the field's default; each parser names the option in its error.
_SCALAR_OPTIONS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "batch_size": ("batch_size", _positive_int),
    "batch_bytes": ("batch_bytes", _positive_int),
    "connect_timeout": ("connect_timeout_s", _positive_float),
    "request_timeout": ("request_timeout_s", _positive_float),
    "session_timeout": ("session_timeout_s", _session_timeout),
    "create_table": ("create_table", _bool),
    "order_by": ("order_by", _no_semicolon),
    "partition_by": ("partition_by", _no_semicolon),
    "engine": ("engine", _no_semicolon),
    "allow_nullable_into_non_nullable": ("allow_nullable_into_non_nullable", _bool),
    "strict_precision": ("strict_precision", _bool),
    "retry.attempts": ("retry_attempts", _positive_int),
    "retry.max_seconds": ("retry_max_seconds", _positive_float),
}


@dataclasses.dataclass(frozen=True)
class WriterOptions:
    """Every option of the ``clickhouse_tx`` writer, validated.

    Build with :meth:`parse`; see ``docs/options.md`` for each option. ``password``
    never appears in ``repr``/``str`` or in any error message.
    """

    url: str
    table: str
    database: str = "default"
    user: str = "default"
    password: str = dataclasses.field(default="", repr=False)
    mode: Mode = Mode.TRANSACTION
    transactional_id: str = ""
    streaming: bool = False
    checkpoint_location: str | None = None
    query_name: str | None = None
    decision_log: str = ""
    batch_size: int = 65536
    batch_bytes: int = 64 * 1024 * 1024
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 300.0
    session_timeout_s: int = 3600
    create_table: bool = False
    order_by: str | None = None
    partition_by: str | None = None
    engine: str = "MergeTree"
    table_column: str | None = None
    #: Routing targets (``tables`` option) as ``(database, table)`` pairs, in given order.
    tables: tuple[tuple[str, str], ...] = ()
    allow_nullable_into_non_nullable: bool = False
    #: Sub-second digits a DateTime/DateTime64 column cannot hold fail the task
    #: instead of being truncated toward the past.
    strict_precision: bool = False
    #: ``bad_rows=dead_letter``: where rows holding a value that does not fit go,
    #: as ``(database, table)``, instead of failing the task (None: ``bad_rows=fail``).
    dead_letter_table: tuple[str, str] | None = None
    #: ``partition`` (each Spark partition of a batch appears on its own) or ``batch``
    #: (the whole batch appears at once, in one ClickHouse transaction: a streaming
    #: micro-batch in mode staging, or a whole batch job). ``auto``, the batch jobs'
    #: default: ``batch`` where the target takes it, else ``partition`` with a WARNING.
    visibility: str = "partition"
    #: A batch job's key (a scheduler's run id): a job whose key is already recorded
    #: for the table writes nothing (``docs/options.md``). Empty: none.
    idempotence_key: str = ""
    retry_attempts: int = 5
    retry_max_seconds: float = 60.0
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    # Raw ``fault.*`` options for the test-only fault hooks; parsed by their owner.
    faults: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    #: A batch job keyed by the user's own ``transactional_id`` and ``decision_log``:
    #: running it again replays its unfinished decision (a finished one is refused).
    resumable_batch_job: bool = False
    #: ``shards``: per shard, its replicas' URLs (empty: the one server of ``url``,
    #: which is then shard 0's first replica); ``sharding_key``, ``shard_weights``: how
    #: rows are spread (:mod:`clickhouse_tx.shards`, ``docs/deployment.md``).
    shards: tuple[tuple[str, ...], ...] = ()
    sharding_key: str | None = None
    shard_weights: tuple[int, ...] = ()

    @property
    def qualified_table(self) -> str:
        """``db.table`` for display (unquoted; never used in SQL)."""
        return f"{self.database}.{self.table}"

    def txn_id(self) -> str:
        """The transactional id (alias of ``transactional_id``, used by ``writer.py``).

        Raises
        ------
        RuntimeError
            A streaming id not yet read from the checkpoint (:meth:`with_query_identity`).
        """
        if not self.transactional_id:
            raise RuntimeError(
                "the streaming transactional_id is read from the checkpoint: "
                "call WriterOptions.with_query_identity() first"
            )
        return self.transactional_id

    def with_query_identity(self) -> "WriterOptions":
        """These options with the streaming query's transactional id settled (driver).

        Runs in ``streamWriter``, before any task writes, and again before each commit.
        With a ``checkpointLocation`` the id comes from the checkpoint
        (:func:`clickhouse_tx.query_identity.resolve_stream_txn_id`): stored there on
        first use, derived from Spark's query id, so no spelling of the location and no
        query name changes it; an explicit ``transactional_id`` must match it. Without
        a checkpoint (explicit id and ``decision_log``) the options are returned as is.
        Batch options are returned as is.

        Raises
        ------
        ConfigurationError
            The explicit id differs from the stored one, or Spark's metadata is not
            where the checkpoint location points.
        """
        if not self.streaming or self.checkpoint_location is None:
            return self
        from clickhouse_tx.query_identity import resolve_stream_txn_id

        txn = resolve_stream_txn_id(
            checkpoint=canonical_location(self.checkpoint_location, os.getcwd()),
            raw_checkpoint=self.checkpoint_location,
            query_name=self.query_name,
            explicit=self.transactional_id or None,
            decision_root=self.decision_log,
        )
        return dataclasses.replace(self, transactional_id=txn)

    def check_batch_job_not_done(self) -> None:
        """Driver, once per resumable batch job, before any task writes: refuse a finished one.

        Batch ids start at 0 in every job, so a job whose decision for batch 0 is done
        would commit nothing; it is refused instead of skipped. An unfinished one is
        replayed (its decision rolled forward), which is how a failed job is finished.

        Raises
        ------
        ConfigurationError
            The decision log already holds a finished job under this id.
        """
        if not self.resumable_batch_job:
            return
        from clickhouse_tx.decision_log import FileDecisionLog

        decision = FileDecisionLog(self.decision_log, self.transactional_id).read(0)
        if decision is not None and decision.done:
            raise ConfigurationError(
                f"the batch job with transactional_id {self.transactional_id!r} and decision_log "
                f"{self.decision_log!r} has already committed ({len(decision.chosen)} partitions); "
                "it would write nothing. Give a new transactional_id, or leave out decision_log "
                "(each job then gets a fresh id)"
            )

    def commit_visibility(self) -> str:
        """The ``visibility`` of the per-partition commit (what the commit mode is built with).

        A batch job publishes itself at once through its job stage, not through the
        commit mode (:mod:`clickhouse_tx.job_publish`): its partitions commit one by one.
        """
        return self.visibility if self.streaming else "partition"

    def decision_log_uri(self, txn_id: str | None = None) -> str:
        """Where the decision log lives.

        An explicit or streaming ``decision_log`` is returned as is; the batch default
        is per job, so it follows ``txn_id`` when the caller chose a different one.
        """
        if txn_id and not self.streaming and self.decision_log == _batch_log(self.transactional_id):
            return _batch_log(txn_id)
        return self.decision_log

    def retry_policy(self) -> "RetryPolicy":
        """The coordinator's :class:`~clickhouse_tx.retry.RetryPolicy` (``retry.*`` options)."""
        from clickhouse_tx.retry import RetryPolicy

        return RetryPolicy(max_attempts=self.retry_attempts, max_total_s=self.retry_max_seconds)

    def target(self) -> Target:
        """The :class:`clickhouse_tx.interfaces.Target` these options describe."""
        # Options named like the Target fields they fill, then the others.
        connection = ("url", "database", "table", "user", "password")
        timeouts = ("connect_timeout_s", "request_timeout_s", "session_timeout_s")
        return Target(
            **{name: getattr(self, name) for name in (*connection, *timeouts)},
            settings=dict(self.settings),
            route_column=self.table_column,
            route_tables=self.tables,
            read_retry=self.retry_policy(),
        )

    def shard_layout(self) -> "ShardLayout | None":
        """The :class:`~clickhouse_tx.shards.ShardLayout` of a sharded write; None for one server."""
        if not self.shards:
            return None
        from clickhouse_tx.shard_placement import ShardPlacement as ShardLayout

        return ShardLayout(self.shards, self.shard_weights, self.sharding_key)

    def check_routing(self) -> None:
        """Driver, when the writer is built: the routing options must go together.

        Kept out of :meth:`parse` (which checks each value alone) so that every option
        can be parsed and shown; the writer calls this before any task writes.

        Raises
        ------
        ConfigurationError
            ``tables`` without ``table_column`` or the reverse, or routing in a mode
            other than ``transaction``.
        """
        if self.table_column is None:
            if self.tables:
                raise ConfigurationError(
                    "option tables is only used with option table_column (the column naming "
                    "each row's table); give both, or neither"
                )
            return
        if not self.tables:
            raise ConfigurationError(
                f"option table_column={self.table_column!r} needs the option tables: the "
                "comma-separated list of tables rows may be routed to (db.table or table), "
                "all checked on the driver before any task writes"
            )
        if self.mode is not Mode.TRANSACTION:
            raise ConfigurationError(
                f"option table_column={self.table_column!r} with mode={self.mode.value!r}: "
                "multi-table routing is supported in mode 'transaction' only (one transaction "
                "spans every table of a partition); use mode transaction, or write one "
                "DataFrame per table (filter on the column)"
            )

    def route_targets(self) -> list[Target]:
        """One plain (non-routing) :class:`Target` per table of the ``tables`` option."""
        base = self.target()
        return [
            dataclasses.replace(base, database=db, table=t, route_column=None, route_tables=()) for db, t in self.tables
        ]

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> "WriterOptions":
        """Validate Spark's options dict.

        Parameters
        ----------
        options
            The data source's ``self.options`` (any case; keys are compared
            lower-cased, as Spark delivers them). Values are strings.
        streaming
            True when building a stream writer: then ``transactional_id`` and
            ``decision_log`` default from ``queryName``/``checkpointLocation``.

        Raises
        ------
        ConfigurationError
            On an unknown option (with close matches), a missing required option or a
            malformed value (naming the option and the value, never the password).
        """
        opts = _lower_keys(options)
        _refuse_unknown(opts)
        url = _required_url(opts)
        database, table = _target_table(opts)
        mode = _mode(opts)
        identity = _identity(opts, streaming)
        settings, faults = _prefixed(opts)
        table_column = opts.get("table_column", "").strip() or None
        if "table_column" in opts and table_column is None:
            raise _bad("table_column", opts["table_column"], "a column name")
        return cls(
            url=url,
            table=table,
            database=database,
            user=opts.get("user", "default") or "default",
            password=opts.get("password", ""),
            mode=mode,
            streaming=streaming,
            **identity,
            settings=settings,
            faults=faults,
            table_column=table_column,
            tables=_route_tables(opts.get("tables"), database),
            dead_letter_table=_dead_letter_table(opts, database, mode),
            visibility=_visibility(opts, mode, streaming),
            idempotence_key=_idempotence_key(opts, streaming),
            **_sharding(opts),
            **_scalar_values(opts),  # type: ignore[arg-type]
        )


# -- WriterOptions.parse, step by step (each reads the lower-cased options dict) ------------


def _lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    """Keys stripped and lower-cased (as Spark delivers them), values as strings."""
    opts: dict[str, str] = {}
    for k, v in dict(options).items():
        key = str(k).strip().lower()
        if key in opts:
            raise ConfigurationError(f"option {key} is given twice (options are case-insensitive)")
        opts[key] = "" if v is None else str(v)
    return opts


def _refuse_unknown(opts: Mapping[str, str]) -> None:
    """Every key is a known option or of a prefixed family; else name the close matches."""
    unknown = sorted(k for k in opts if k not in KNOWN_OPTIONS and not k.startswith(_PREFIXES))
    if unknown:
        lines = []
        for k in unknown:
            close = difflib.get_close_matches(k, KNOWN_OPTIONS, n=3, cutoff=0.6)
            lines.append(k + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise ConfigurationError("unknown clickhouse_tx option(s): " + "; ".join(lines))


def _required_url(opts: Mapping[str, str]) -> str:
    if "shards" in opts:
        if opts.get("url", "").strip():
            raise ConfigurationError(
                "options url and shards are given together: give url for one server, or shards "
                "(',' between shards, '|' between replicas) for a cluster, not both"
            )
        return _sharding(opts)["shards"][0][0]
    if not opts.get("url", "").strip():
        raise ConfigurationError("option url is required (e.g. http://127.0.0.1:8123)")
    return _url(opts["url"])


def _target_table(opts: Mapping[str, str]) -> tuple[str, str]:
    """``(database, table)`` from ``table`` (or ``save(path)``) and ``database``."""
    table_raw = opts.get("table", "").strip()
    path = opts.get("path", "").strip()
    if not table_raw and path:
        table_raw = path  # df.write.format("clickhouse_tx").save("db.events")
    elif table_raw and path and path != table_raw:
        raise ConfigurationError(f"option table={table_raw!r} and save(path={path!r}) disagree; give one")
    if not table_raw:
        raise ConfigurationError("option table is required (table or database.table)")
    if "database" not in opts:
        return _table_name("table", table_raw, table_raw, "default", "table or database.table")
    database = opts["database"].strip()
    if not database:
        raise _bad("database", opts["database"], "a non-empty database name")
    return database, table_raw  # with an explicit database, dots belong to the table name


def _table_name(option: str, raw: str, name: str, database: str, expected: str) -> tuple[str, str]:
    """``name`` (part of option ``raw``) as ``(database, table)``, refused as the option's value."""
    try:
        return split_table(name, database)
    except ConfigurationError:
        raise _bad(option, raw, expected) from None


def _visibility(opts: Mapping[str, str], mode: Mode, streaming: bool) -> str:
    """``visibility``, checked here, on the driver.

    Streaming (default ``partition``): ``batch`` needs mode staging. Batch jobs (default
    ``auto``; ``partition`` in mode none): ``batch`` and ``auto`` publish the whole job
    at once through a job stage (:mod:`clickhouse_tx.job_publish`), which options
    routing rows to several tables or servers, a resumable job and mode none cannot.
    """
    from clickhouse_tx.modes import mode_io_for

    if streaming:
        value = opts.get("visibility", "partition").strip().lower()
        mode_io_for(mode, visibility=value)  # names a value it does not know, and batch outside staging
        return value
    whole_job_refused = _whole_job_refused(opts, mode)
    value = opts.get("visibility", "partition" if whole_job_refused else "auto").strip().lower()
    if value not in ("partition", "batch", "auto"):
        raise _bad("visibility", opts["visibility"], "partition, batch or auto (batch jobs)")
    if value != "partition" and whole_job_refused:
        raise ConfigurationError(f"option visibility={value} {whole_job_refused}; use visibility=partition")
    return value


def _whole_job_refused(opts: Mapping[str, str], mode: Mode) -> str | None:
    """Why a batch job with these options cannot be published at once; None when it can."""
    if mode is Mode.NONE:
        return "with mode='none': an at-least-once write has no job to publish at once"
    if opts.get("table_column", "").strip():
        return "with table_column: the job spans several tables"
    if "shards" in opts:
        return "with shards: the job spans several servers"
    if "transactional_id" in opts and "decision_log" in opts:
        return "for a resumable batch job (transactional_id with decision_log): it is finished per partition"
    return None


def _idempotence_key(opts: Mapping[str, str], streaming: bool) -> str:
    """``idempotence_key``: batch jobs only, 1-256 printable characters."""
    if "idempotence_key" not in opts:
        return ""
    raw = opts["idempotence_key"]
    if streaming:
        raise ConfigurationError(
            "option idempotence_key is for batch jobs; a streaming query is made idempotent by its checkpoint"
        )
    key = raw.strip()
    if not key or len(key) > 256 or not key.isprintable():
        raise _bad("idempotence_key", raw, "1-256 printable characters (e.g. a scheduler's run id)")
    return key


def _mode(opts: Mapping[str, str]) -> Mode:
    mode_raw = opts.get("mode", "transaction")
    try:
        return Mode(mode_raw.strip().lower())
    except ValueError:
        raise _bad("mode", mode_raw, "one of " + ", ".join(m.value for m in Mode)) from None


def _identity(opts: Mapping[str, str], streaming: bool) -> dict[str, Any]:
    """``transactional_id``, ``decision_log`` and what they derive from, as fields.

    A streaming id stays empty until :meth:`WriterOptions.with_query_identity` reads
    it from the checkpoint; a batch job gets a fresh id unless it has its own id and
    ``decision_log`` (then it is resumable).
    """
    chk = opts.get("checkpointlocation", "").strip() or None
    qname = opts.get("queryname", "").strip() or None
    txn = _explicit_txn_id(opts)
    if streaming and chk is None and ("transactional_id" not in opts or "decision_log" not in opts):
        raise ConfigurationError(
            "a streaming write needs .option('checkpointLocation', ...) on the writer "
            "(a checkpoint set through spark.sql.streaming.checkpointLocation is not "
            "passed to data sources), or explicit transactional_id and decision_log"
        )
    resumable = not streaming and txn is not None and "decision_log" in opts
    if streaming:
        txn = txn or ""  # checked against the stored one by with_query_identity()
    elif not resumable:
        txn = _batch_job_id(txn)
    # A resumable batch job replays an unfinished decision when run again
    # (check_batch_job_not_done refuses a finished one on the driver).
    return {
        "transactional_id": txn,
        "checkpoint_location": chk,
        "query_name": qname,
        "decision_log": _decision_log(opts, streaming, chk, txn),  # type: ignore[arg-type]
        "resumable_batch_job": resumable,
    }


def _decision_log(opts: Mapping[str, str], streaming: bool, chk: str | None, txn: str) -> str:
    if "decision_log" in opts:
        decision_log = opts["decision_log"].strip()
        if not decision_log:
            raise _bad("decision_log", opts["decision_log"], "a path or URI")
        return decision_log
    if streaming:
        # The decision log lives at <checkpointLocation>/clickhouse_tx/<txn_id>/
        # (clickhouse_tx.layout), the checkpoint spelled one way.
        return canonical_location(chk, os.getcwd())  # type: ignore[arg-type]
    return _batch_log(txn)


def _prefixed(opts: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``setting.<name>`` (ClickHouse settings) and ``fault.*`` (test-only hooks)."""
    settings: dict[str, str] = {}
    faults: dict[str, str] = {}
    for k, v in opts.items():
        if k.startswith("setting."):
            name = k[len("setting.") :]
            if not _SETTING.match(name):
                raise ConfigurationError(f"option {k}: {name!r} is not a ClickHouse setting name")
            settings[name] = v
        elif k.startswith("fault."):
            faults[k] = v
    _check_faults(faults)
    return settings, faults


def _scalar_values(opts: Mapping[str, str]) -> dict[str, object]:
    """The :data:`_SCALAR_OPTIONS` given, parsed, by field; absent ones keep the field default."""
    return {field: parser(name, opts[name]) for name, (field, parser) in _SCALAR_OPTIONS.items() if name in opts}


def _sharding(opts: Mapping[str, str]) -> dict[str, Any]:
    """``shards`` (each URL checked like ``url``), ``sharding_key``, ``shard_weights`` as fields."""
    from clickhouse_tx.shard_placement import parse_shard_urls, parse_weights

    if "shards" not in opts:
        for name in ("sharding_key", "shard_weights"):
            if name in opts:
                raise ConfigurationError(f"option {name} needs the option shards (the cluster's servers)")
        return {}
    if opts.get("visibility", "").strip().lower() == "batch":
        raise ConfigurationError(
            "option visibility=batch with shards: a batch spans several servers and one ClickHouse "
            "transaction cannot; use visibility=partition (the default)"
        )
    shards = tuple(tuple(_url(u) for u in replicas) for replicas in parse_shard_urls(opts["shards"]))
    key = opts.get("sharding_key", "").strip() or None
    if "sharding_key" in opts and key is None:
        raise _bad("sharding_key", opts["sharding_key"], "a column name")
    weights = parse_weights(opts["shard_weights"], len(shards)) if "shard_weights" in opts else ()
    return {"shards": shards, "sharding_key": key, "shard_weights": weights}
