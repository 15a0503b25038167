"""Batch ``.mode("overwrite")``: replace a table's contents atomically, never truncate-then-write.

1. Driver, in ``writer(schema, overwrite=True)`` (once per job), :func:`create_stage`:
   check the target as for any write (``create_table`` included), then ``CREATE TABLE
   <db>.<stage> AS <target>`` (same columns, engine, keys and settings) and validate
   the commit mode on the stage. The writer (``spark_datasource.sink.job_writers.OverwriteWriter``)
   is built from what it returns and runs no DDL itself.
2. Executors, once per partition attempt: prepare into the *stage* through the normal
   coordinator and commit mode (so a retried or speculative task is exactly-once in
   the stage, as in an append; mode ``none`` stays at-least-once).
3. Driver ``commit`` (once per job, in a fresh worker): commit the prepared
   partitions into the stage (``Coordinator.commit_batch``), then swap the stage in:
   ``EXCHANGE TABLES <target> AND <stage>`` where the database engine does it
   atomically (Atomic, Replicated), else per partition ``ALTER TABLE <target> REPLACE
   PARTITION ID ... FROM <stage>`` plus ``DROP PARTITION`` for partitions of the
   target absent from the stage, all in one ClickHouse transaction (atomic for
   read-committed readers). Where the server refuses that transaction (no
   experimental transactions, or an ``Ordinary`` database) the same statements run
   one by one: each partition is replaced atomically, the whole is not, and a
   WARNING says so when the job starts and when it swaps. Then drop the stage.
4. Driver ``abort`` (a failed job): roll back what was prepared, drop the stage. The
   target was never touched.

A concurrent reader sees the old table or the new one, never an empty or partial one
(with ``EXCHANGE`` or the transaction; with partition-by-partition replacement it can
see some partitions new and others old). If the driver dies between the stage commit and the swap, the
target keeps its old contents and the stage ``_ctx_ow_<txn>_<hex>`` is left behind:
``python -m clickhouse_tx gc --checkpoint <decision_log root> --txn-id <job's txn>`` drops it.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from pyspark.sql.types import StructType

from clickhouse_tx.client import sql as q
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.staging.tables import OVERWRITE_STAGE_PREFIX, create_stage_table, overwrite_stage_name
from spark_datasource.options.writer_options import WriterOptions

log = logging.getLogger("clickhouse_tx.spark")


#: Database engines where ``EXCHANGE TABLES`` is one atomic rename (renameat2).
EXCHANGE_ENGINES = frozenset({"Atomic", "Replicated"})

__all__ = [
    "OverwriteStage",
    "OVERWRITE_STAGE_PREFIX",
    "NOT_ATOMIC_WARNING",
    "create_stage",
    "drop_stage",
    "swap_in",
    "swap_method",
]


def _client(target: Target):
    from clickhouse_tx.client.http import ClickHouseHTTP

    return ClickHouseHTTP(target)


#: Logged when an overwrite cannot be atomic: what a reader may see, and what to do.
NOT_ATOMIC_WARNING = (
    "overwrite of %s is NOT atomic: database engine %s cannot EXCHANGE TABLES and the server "
    "refuses a transaction around REPLACE PARTITION (%s). Partitions are replaced one by one: "
    "a concurrent reader can see some partitions new and others old, and a driver that dies "
    "mid-swap leaves the table mixed (run the overwrite again). For an atomic overwrite use an "
    "Atomic database, or a server with allow_experimental_transactions."
)


def swap_method(target: Target) -> str:
    """How :func:`swap_in` will swap (driver, once per overwrite job, before any task writes).

    ``exchange`` where the database engine swaps tables atomically; else
    ``replace_partition`` (in one transaction) when the server accepts a transaction;
    else ``replace_partition_each`` (not atomic: logs :data:`NOT_ATOMIC_WARNING`).
    """
    engine = _database_engine(target)
    if engine in EXCHANGE_ENGINES:
        return "exchange"
    refused = _transaction_refused(target) if engine != "Ordinary" else "Ordinary databases have no transactions"
    if refused is None:
        return "replace_partition"
    log.warning(NOT_ATOMIC_WARNING, f"{target.database}.{target.table}", engine, refused)
    return "replace_partition_each"


def _database_engine(target: Target) -> str:
    with _client(target) as c:
        rows = c.query_json(
            "SELECT engine FROM system.databases WHERE name = {d:String}", params={"d": target.database}
        )
    return str(rows[0]["engine"]) if rows else ""


def _session(target: Target):
    from clickhouse_tx.client.http import ClickHouseHTTP

    return ClickHouseHTTP(target, session_id=f"clickhouse_tx_ow_{uuid.uuid4().hex}", session_timeout=60)


def _transaction_refused(target: Target) -> str | None:
    """None if the server runs ``BEGIN TRANSACTION``, else its refusal."""
    from clickhouse_tx.errors import ServerError

    with _session(target) as s:
        try:
            s.command("BEGIN TRANSACTION")
            s.command("ROLLBACK")
        except ServerError as e:
            return e.message
    return None


def _partition_ids(c, database: str, table: str) -> list[str]:
    rows = c.query_json(
        "SELECT DISTINCT partition_id FROM system.parts WHERE database = {d:String} "
        "AND table = {t:String} AND active AND rows > 0 ORDER BY partition_id",
        params={"d": database, "t": table},
    )
    return [str(r["partition_id"]) for r in rows]


def _replace_statements(c, target: Target, stage: str) -> list[str]:
    """``REPLACE PARTITION`` for every partition of the stage, ``DROP`` for the target's others."""
    fq_target = q.qualified(target.database, target.table)
    new = _partition_ids(c, target.database, stage)
    old = _partition_ids(c, target.database, target.table)
    return [
        f"ALTER TABLE {fq_target} REPLACE PARTITION ID {q.quote_string(pid)} FROM {q.qualified(target.database, stage)}"
        for pid in new
    ] + [f"ALTER TABLE {fq_target} DROP PARTITION ID {q.quote_string(pid)}" for pid in sorted(set(old) - set(new))]


def _replace_in_transaction(target: Target, statements: list[str]) -> str | None:
    """Run ``statements`` in one transaction; None when committed, the refusal when not.

    A refusal (no transactions, an Ordinary database) is only possible before COMMIT,
    so nothing changed then; any other error is raised.
    """
    from clickhouse_tx.client.codes import NOT_IMPLEMENTED
    from clickhouse_tx.errors import ServerError

    with _session(target) as s:
        try:
            s.command("BEGIN TRANSACTION")
            for sql in statements:
                s.command(sql)
        except ServerError as e:
            try:
                s.command("ROLLBACK")
            except ServerError:
                pass  # the transaction never began
            if e.code == NOT_IMPLEMENTED:
                return e.message
            raise
        s.command("COMMIT")
    return None


def swap_in(target: Target, stage: str, method: str | None = None) -> str:
    """Make ``<db>.<stage>``'s rows the contents of the target (driver, once per job).

    Parameters
    ----------
    target
        The table to overwrite.
    stage
        Name of the stage table in the target's database (same structure).
    method
        ``exchange``, ``replace_partition`` (one transaction; falls back to
        ``replace_partition_each`` with a WARNING if the server refuses it) or
        ``replace_partition_each``; default: :func:`swap_method`.

    Returns
    -------
    str
        The method used. After ``exchange`` the stage holds the old rows; after the
        others it still holds the new ones (copied, not moved). The caller drops it
        either way.
    """
    method = method or swap_method(target)
    if method == "exchange":
        with _client(target) as c:
            c.command(
                f"EXCHANGE TABLES {q.qualified(target.database, target.table)} AND "
                f"{q.qualified(target.database, stage)}"
            )
        return method
    if method not in ("replace_partition", "replace_partition_each"):
        raise ValueError(f"unknown swap method {method!r}")
    with _client(target) as c:
        statements = _replace_statements(c, target, stage)
        if method == "replace_partition":
            refused = _replace_in_transaction(target, statements)
            if refused is None:
                return method
            log.warning(NOT_ATOMIC_WARNING, f"{target.database}.{target.table}", _database_engine(target), refused)
        for sql in statements:
            c.command(sql)
    return "replace_partition_each"


def drop_stage(target: Target, stage: str) -> None:
    """``DROP TABLE IF EXISTS <db>.<stage> SYNC`` (driver; idempotent)."""
    with _client(target) as c:
        c.command(f"DROP TABLE IF EXISTS {q.qualified(target.database, stage)} SYNC", idempotent=True)


@dataclasses.dataclass(frozen=True)
class OverwriteStage:
    """What :func:`create_stage` set up for one overwrite job (picklable, no connections).

    Attributes
    ----------
    options
        The job's options aimed at the stage (``table`` is the stage; executors
        prepare into it as into any table).
    txn_id
        The job's transactional id; it also names the stage.
    name
        The stage table, in the target's database.
    swap
        How :func:`swap_in` will swap it in (:func:`swap_method`).
    conversion
        The target's column types, for the executors' value checks.
    """

    options: WriterOptions
    txn_id: str
    name: str
    swap: str
    conversion: ConversionPlan


def create_stage(opts: WriterOptions, schema: StructType) -> OverwriteStage:
    """The overwrite job's DDL: check the target, ``CREATE TABLE <stage> AS <target>``.

    Driver, once per overwrite job, in ``ClickHouseTxDataSource.writer(schema,
    overwrite=True)``, before any task writes (the writer built from its result runs
    no DDL). Also validates the commit mode on the stage and picks the swap method,
    which warns now if the swap cannot be atomic. A failure after the stage was
    created drops it again.

    Raises
    ------
    ConfigurationError
        The target, the schema or the mode do not fit (as for an append).
    """
    from clickhouse_tx.factory import build_mode_io
    from spark_datasource.sink.setup import prepare_target
    from spark_datasource.sink.type_mapping import spark_schema_to_arrow

    plan = prepare_target(opts, schema)
    txn_id = opts.txn_id() or f"job-{uuid.uuid4().hex[:12]}"
    stage = overwrite_stage_name(txn_id)  # names the job: gc can tell whose a leftover is
    target = opts.target()
    with _client(target) as c:
        create_stage_table(c, opts.database, stage, (opts.database, opts.table), if_not_exists=False)
    stage_opts = dataclasses.replace(opts, table=stage, create_table=False)
    try:
        build_mode_io(opts.mode).validate(stage_opts.target(), spark_schema_to_arrow(schema))
        swap = swap_method(target)
    except BaseException:
        drop_stage(target, stage)
        raise
    log.info("clickhouse_tx overwrite of %s: job %s writes into stage %s", opts.qualified_table, txn_id, stage)
    return OverwriteStage(stage_opts, txn_id, stage, swap, plan)
