"""The ``clickhouse_tx`` writer's options, parsed once into a frozen value.

Spark hands a Python data source its options as a case-insensitive dict of strings
(``pyspark.sql.datasource.CaseInsensitiveDict``; keys arrive lower-cased). What Spark
itself adds (``docs/options.md`` shows what pyspark passes):

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
from typing import TYPE_CHECKING, Any, Mapping

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import Mode, Target, TlsSettings
from spark_datasource.options import identity as writer_identity
from spark_datasource.options import writer_rules as writer_option_rules
from spark_datasource.options.spec import lower_keys
from spark_datasource.options.writer_specs import WRITER_OPTIONS

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.retry import RetryPolicy
    from clickhouse_tx.sharding.placement import ShardPlacement

__all__ = ["WriterOptions"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriterOptions:
    """Every option of the ``clickhouse_tx`` writer, validated.

    Build with :meth:`parse`; see ``docs/options.md`` for each option. ``password``
    never appears in ``repr``/``str`` or in any error message.
    """

    url: str
    table: str
    database: str
    user: str
    password: str = dataclasses.field(repr=False)
    #: HTTPS: the options of :class:`clickhouse_tx.interfaces.TlsSettings`, by name.
    verify: bool
    ca_cert: str | None
    client_cert: str | None
    client_cert_key: str | None
    mode: Mode
    transactional_id: str = ""
    streaming: bool = False
    checkpoint_location: str | None = None
    decision_log: str = ""
    batch_size: int
    batch_bytes: int
    connect_timeout_s: float
    request_timeout_s: float
    session_timeout_s: int
    create_table: bool
    order_by: str | None
    partition_by: str | None
    engine: str
    table_column: str | None
    #: Routing targets (``tables`` option) as ``(database, table)`` pairs, in given order.
    tables: tuple[tuple[str, str], ...] = ()
    allow_nullable_into_non_nullable: bool
    #: Sub-second digits a DateTime/DateTime64 column cannot hold fail the task
    #: instead of being truncated toward the past.
    strict_precision: bool
    #: ``bad_rows=dead_letter``: where rows holding a value that does not fit go,
    #: as ``(database, table)``, instead of failing the task (None: ``bad_rows=fail``).
    dead_letter_table: tuple[str, str] | None = None
    #: ``partition`` (each Spark partition of a batch appears on its own) or ``batch``
    #: (the whole batch appears at once, in one ClickHouse transaction: a streaming
    #: micro-batch in mode staging, or a whole batch job). ``auto``, the batch jobs'
    #: default: ``batch`` where the target takes it, else ``partition`` with a WARNING.
    visibility: str
    #: A batch job's key (a scheduler's run id): a job whose key is already recorded
    #: for the table writes nothing (``docs/options.md``). Empty: none.
    idempotence_key: str
    retry_attempts: int
    retry_max_seconds: float
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    # Raw ``fault.*`` options for the test-only fault hooks; parsed by their owner.
    faults: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    #: A batch job keyed by the user's own ``transactional_id`` and ``decision_log``:
    #: running it again replays its unfinished decision (a finished one is refused).
    resumable_batch_job: bool = False
    #: ``shards``: per shard, its replicas' URLs (empty: the one server of ``url``,
    #: which is then shard 0's first replica); ``sharding_key``, ``shard_weights``: how
    #: rows are spread (:mod:`clickhouse_tx.sharding.placement`, ``docs/deployment.md``).
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
        (:func:`clickhouse_tx.store.query_identity.resolve_stream_txn_id`): stored there on
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
        txn = writer_identity.settle_stream_txn_id(self.checkpoint_location, self.transactional_id)
        return dataclasses.replace(self, transactional_id=txn)

    def check_batch_job_not_done(self) -> None:
        """Driver, once per resumable batch job, before any task writes: refuse a finished one
        (:func:`spark_datasource.options.identity.refuse_finished_batch_job`).

        Raises
        ------
        ConfigurationError
            The decision log already holds a finished job under this id.
        """
        if self.resumable_batch_job:
            writer_identity.refuse_finished_batch_job(self.decision_log, self.transactional_id)

    def commit_visibility(self) -> str:
        """The ``visibility`` of the per-partition commit (what the commit mode is built with).

        A batch job publishes itself at once through its job stage, not through the
        commit mode (:mod:`clickhouse_tx.jobs.publish`): its partitions commit one by one.
        """
        return self.visibility if self.streaming else "partition"

    def decision_log_uri(self, txn_id: str | None = None) -> str:
        """Where the decision logs live: the same root for every ``txn_id`` (each id's log
        is ``clickhouse_tx/<txn_id>`` below it, as :mod:`clickhouse_tx.store.checkpoint_paths` spells it)."""
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
            tls=TlsSettings(self.verify, self.ca_cert, self.client_cert, self.client_cert_key),
        )

    def shard_placement(self) -> "ShardPlacement | None":
        """The :class:`~clickhouse_tx.sharding.placement.ShardPlacement` of a sharded write; None for one server."""
        if not self.shards:
            return None
        from clickhouse_tx.sharding.placement import ShardPlacement

        return ShardPlacement(self.shards, self.shard_weights, self.sharding_key)

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
            True when building a stream writer: then ``decision_log`` defaults from
            ``checkpointLocation`` (the ``transactional_id`` is settled afterwards, by
            :meth:`with_query_identity`).

        Raises
        ------
        ConfigurationError
            On an unknown option (with close matches), a missing required option or a
            malformed value (naming the option and the value, never the password).
        """
        opts = lower_keys(options)
        WRITER_OPTIONS.refuse_unknown(opts)
        rules = writer_option_rules
        url = rules.required_url(opts)
        database, table = rules.target_table(opts)
        mode: Mode = WRITER_OPTIONS["mode"].read(opts)
        settings, faults = rules.prefixed(opts)
        fields: dict[str, Any] = {
            **rules.field_values(opts),
            **writer_identity.identity(opts, streaming),
            **rules.sharding(opts),
        }
        return cls(
            url=url,
            table=table,
            database=database,
            streaming=streaming,
            settings=settings,
            faults=faults,
            tables=rules.route_tables(opts, database),
            dead_letter_table=rules.dead_letter_table(opts, database, mode),
            visibility=rules.visibility(opts, mode, streaming),
            idempotence_key=rules.idempotence_key(opts, streaming),
            **fields,
        )
