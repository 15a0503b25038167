"""Batch ``.mode("overwrite")``: replace a table's contents atomically, never truncate-then-write.

1. Driver, in ``writer(schema, overwrite=True)`` (once per job): check the target as
   for any write (``create_table`` included), then ``CREATE TABLE <db>.<stage> AS
   <target>`` (same columns, engine, keys and settings) and validate the commit mode
   on the stage.
2. Executors, once per partition attempt: prepare into the *stage* through the normal
   coordinator and commit mode (so a retried or speculative task is exactly-once in
   the stage, as in an append; mode ``none`` stays at-least-once).
3. Driver ``commit`` (once per job, in a fresh worker): commit the prepared
   partitions into the stage (``Coordinator.commit_batch``), then swap the stage in:
   ``EXCHANGE TABLES <target> AND <stage>`` where the database engine does it
   atomically (Atomic, Replicated), else per partition ``ALTER TABLE <target> REPLACE
   PARTITION ID ... FROM <stage>`` plus ``DROP PARTITION`` for partitions of the
   target absent from the stage (each step atomic, the whole not); then drop the
   stage, which then holds the old rows.
4. Driver ``abort`` (a failed job): roll back what was prepared, drop the stage. The
   target was never touched.

A concurrent reader sees the old table or the new one, never an empty or partial one
(with ``EXCHANGE``). If the driver dies between the stage commit and the swap, the
target keeps its old contents and the stage ``_ctx_ow_*`` is left behind (drop it).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from clickhouse_tx import sql as q
from clickhouse_tx.interfaces import Target

from .writer import ClickHouseTxBatchWriter, _coordinator, _prepared
from .writer_options import WriterOptions

log = logging.getLogger("clickhouse_tx.spark")

#: Stage tables of overwrite jobs start with this (then a job-unique hex id).
OVERWRITE_STAGE_PREFIX = "_ctx_ow_"
#: Database engines where ``EXCHANGE TABLES`` is one atomic rename (renameat2).
EXCHANGE_ENGINES = frozenset({"Atomic", "Replicated"})

__all__ = ["OverwriteWriter", "OVERWRITE_STAGE_PREFIX", "swap_in", "swap_method"]


def _client(target: Target):
    from clickhouse_tx.http_client import ClickHouseHTTP

    return ClickHouseHTTP(target)


def swap_method(target: Target) -> str:
    """``exchange`` if the target's database engine swaps tables atomically, else ``replace_partition``."""
    with _client(target) as c:
        rows = c.query_json("SELECT engine FROM system.databases WHERE name = {d:String}",
                            params={"d": target.database})
    engine = str(rows[0]["engine"]) if rows else ""
    return "exchange" if engine in EXCHANGE_ENGINES else "replace_partition"


def _partition_ids(c, database: str, table: str) -> list[str]:
    rows = c.query_json(
        "SELECT DISTINCT partition_id FROM system.parts WHERE database = {d:String} "
        "AND table = {t:String} AND active AND rows > 0 ORDER BY partition_id",
        params={"d": database, "t": table})
    return [str(r["partition_id"]) for r in rows]


def swap_in(target: Target, stage: str, method: str | None = None) -> str:
    """Make ``<db>.<stage>``'s rows the contents of the target (driver, once per job).

    Parameters
    ----------
    target
        The table to overwrite.
    stage
        Name of the stage table in the target's database (same structure).
    method
        ``exchange`` or ``replace_partition``; default: :func:`swap_method`.

    Returns
    -------
    str
        The method used. After ``exchange`` the stage holds the old rows; after
        ``replace_partition`` it still holds the new ones (copied, not moved). The
        caller drops it either way.
    """
    method = method or swap_method(target)
    fq_target = q.qualified(target.database, target.table)
    fq_stage = q.qualified(target.database, stage)
    with _client(target) as c:
        if method == "exchange":
            c.command(f"EXCHANGE TABLES {fq_target} AND {fq_stage}")
        elif method == "replace_partition":
            new = _partition_ids(c, target.database, stage)
            old = _partition_ids(c, target.database, target.table)
            for pid in new:
                c.command(f"ALTER TABLE {fq_target} REPLACE PARTITION ID {q.quote_string(pid)} "
                          f"FROM {fq_stage}")
            for pid in sorted(set(old) - set(new)):
                c.command(f"ALTER TABLE {fq_target} DROP PARTITION ID {q.quote_string(pid)}")
        else:
            raise ValueError(f"unknown swap method {method!r}")
    return method


def drop_stage(target: Target, stage: str) -> None:
    """``DROP TABLE IF EXISTS <db>.<stage> SYNC`` (driver; idempotent)."""
    with _client(target) as c:
        c.command(f"DROP TABLE IF EXISTS {q.qualified(target.database, stage)} SYNC")


class OverwriteWriter(ClickHouseTxBatchWriter):
    """``df.write.mode("overwrite")``: prepare into a stage table, swap it in on commit.

    Built on the driver by ``ClickHouseTxDataSource.writer(schema, overwrite=True)``,
    which creates the stage table; pickled to the executors (``write``, inherited)
    and to the commit/abort worker. Holds only options and names (picklable).

    Parameters
    ----------
    opts
        The parsed options (their ``table`` is the table to overwrite).
    schema
        The Spark schema of the rows.
    """

    def __init__(self, opts: WriterOptions, schema: StructType) -> None:
        from clickhouse_tx.factory import build_mode_io

        from .type_mapping import spark_schema_to_arrow
        from .writer_setup import prepare_target

        plan = prepare_target(opts, schema)
        txn_id = opts.txn_id() or f"job-{uuid.uuid4().hex[:12]}"
        stage = f"{OVERWRITE_STAGE_PREFIX}{uuid.uuid4().hex}"
        self.final_opts = opts
        target = opts.target()
        with _client(target) as c:
            c.command(f"CREATE TABLE {q.qualified(opts.database, stage)} AS "
                      f"{q.qualified(opts.database, opts.table)}")
        stage_opts = dataclasses.replace(opts, table=stage, create_table=False)
        try:
            build_mode_io(opts.mode).validate(stage_opts.target(), spark_schema_to_arrow(schema))
        except BaseException:
            drop_stage(target, stage)
            raise
        self.stage = stage
        super().__init__(stage_opts, schema, txn_id, plan)
        log.info("clickhouse_tx overwrite of %s: job %s writes into stage %s",
                 opts.qualified_table, txn_id, stage)

    @property
    def display_table(self) -> str:
        return self.final_opts.qualified_table

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        """Driver, once per job: commit into the stage, swap it in, drop the stage."""
        started = time.monotonic()
        report = _coordinator(self.opts, self.txn_id).commit_batch(0, _prepared(messages))
        target = self.final_opts.target()
        method = swap_in(target, self.stage)
        drop_stage(target, self.stage)
        log.info("clickhouse_tx overwrite of %s committed (%s, %d rows): %s",
                 self.display_table, method, report.rows, report)
        self._metrics(0, "committed", messages, committed_partitions=len(report.committed),
                      rows=report.rows, commit_seconds=time.monotonic() - started,
                      rolled_back=len(report.rolled_back), replay=report.replay,
                      durations={**report.durations, "swap_and_drop": time.monotonic() - started
                                 - report.durations.get("total", 0.0)})

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        """Driver, once per failed job: roll back, drop the stage; the target is untouched."""
        try:
            self._abort(messages, 0)
        finally:
            drop_stage(self.final_opts.target(), self.stage)
