"""Batch appends that are all-or-nothing: the job stage, made on the driver before any task writes.

``df.write.format("clickhouse_tx").mode("append")`` in modes ``transaction``,
``staging`` and ``dedup`` (``visibility`` ``auto``, the batch jobs' default, or
``batch``):

1. Driver, in ``writer(schema, overwrite=False)``, once per job: :func:`plan_job`.
   With an ``idempotence_key`` already recorded for the table, the job is skipped
   (nothing is written, a log line says which job recorded it). Otherwise, where the
   target takes a transaction (:func:`clickhouse_tx.jobs.publish.publishability`),
   ``CREATE TABLE <stage> AS <target>`` (and a dead-letter stage ``AS`` the dead-letter
   table) and the mode is validated on the stage: one client of the target and one
   description of it for the whole plan (the mode's validate has its own). Where it
   does not, ``auto`` falls back to per-partition visibility with a WARNING naming
   why; ``batch`` is refused.
2. Executors: prepare into the stage through the normal coordinator and mode.
3. Driver ``commit``: commit the stage (``Coordinator.commit_batch``), then
   :func:`clickhouse_tx.jobs.publish.publish_job` moves it into the target in one
   transaction with the job's row, then the stages are dropped.
4. Driver ``abort``: roll back what was prepared and drop the stages; the target was
   never touched.
"""

from __future__ import annotations

import dataclasses
import logging

from pyspark.sql.types import StructType

from clickhouse_tx.client.http import ClickHouseHTTP, reuse_or_open
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.conversion.schema import TableInfo, describe_table
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.jobs.publish import JobRecords, JobStage, drop_stages, publishability
from clickhouse_tx.modes.staging.tables import create_stage_table, overwrite_stage_name
from spark_datasource.options.writer_options import WriterOptions

log = logging.getLogger("clickhouse_tx.spark")

#: Logged when a batch job cannot be published at once: what a re-run may do.
PER_PARTITION_WARNING = (
    "batch job into %s is published partition by partition, not at once: %s. A job stopped "
    "after its first COMMIT leaves part of its rows visible, and running it again as it is "
    "writes them twice; give it a transactional_id and decision_log to resume it instead "
    "(docs/modes.md, 'Batch jobs')"
)


@dataclasses.dataclass(frozen=True)
class AppendJob:
    """What :func:`plan_job` set up for one batch job (picklable, names only).

    Attributes
    ----------
    options
        The job's options aimed at the stage (executors prepare into it as into any table).
    job
        The stages, the transactional id and the key :func:`publish_job` needs.
    conversion
        The target's column types, with dead letters aimed at the dead-letter stage.
    """

    options: WriterOptions
    job: JobStage
    conversion: ConversionPlan


def already_written(opts: WriterOptions, client: ClickHouseHTTP | None = None) -> dict[str, object] | None:
    """The job that recorded ``opts.idempotence_key`` for the table, or None (driver, once per job).

    ``client``: the job's session-less client of the target (left open); None: one of its own.
    """
    if not opts.idempotence_key:
        return None
    records = JobRecords(opts.target(), client)
    records.ensure_table()
    return records.by_key(opts.idempotence_key)


def plan_job(
    opts: WriterOptions,
    schema: StructType,
    txn_id: str,
    plan: ConversionPlan,
    client: ClickHouseHTTP | None = None,
    info: TableInfo | None = None,
) -> AppendJob | None:
    """The job's stages (driver, once per batch job, after the target was checked).

    Parameters
    ----------
    opts
        The job's options (the target, ``visibility``, ``dead_letter_table``, ``idempotence_key``).
    schema
        The Spark schema of the rows (the mode is validated on the stage with it).
    txn_id
        The job's transactional id (the stages' names start with it).
    plan
        The target's column types (:func:`spark_datasource.sink.setup.prepare_target`).
    client
        The job's session-less client of the target (left open); None: one of its own.
    info
        The target's description the checks read (:func:`spark_datasource.sink.setup.check_target`);
        None: read here.

    Returns
    -------
    AppendJob or None
        None when the job is published per partition (``visibility=partition``, or
        ``auto`` on a target that cannot take a transaction: logged).

    Raises
    ------
    ConfigurationError
        ``visibility=batch`` on a target that cannot take a transaction.
    """
    if opts.visibility == "partition":
        return None
    target = opts.target()
    # One client and one description of the target for the whole plan: publishability,
    # the job table, the stage made AS the target and a failed plan's drop all read or
    # write the same server (a connection and a system.tables read per step otherwise).
    with reuse_or_open(target, client) as c:
        info = info or describe_table(c, target.database, target.table)
        can = publishability(c, target, info)
        if can.refused is not None:
            if opts.visibility == "batch":
                raise ConfigurationError(f"option visibility=batch: {can.refused}; use visibility=partition or auto")
            log.warning(PER_PARTITION_WARNING, opts.qualified_table, can.refused)
            return None
        JobRecords(target, c).ensure_table()  # DDL is refused inside the publishing transaction
        job = _job_stage(opts, txn_id, can.views)
        stage_opts = _create_stages(c, info, opts, schema, job)
    log.info("clickhouse_tx batch job into %s: job %s writes into stage %s", opts.qualified_table, txn_id, job.stage)
    return AppendJob(stage_opts, job, dataclasses.replace(plan, dead_letter_table=stage_opts.dead_letter_table))


def _job_stage(opts: WriterOptions, txn_id: str, views: tuple[str, ...]) -> JobStage:
    """The job's stage names (and the dead-letter stage's, with its table); nothing created yet."""
    stage = overwrite_stage_name(txn_id)  # the job stage's prefix: gc drops a dead job's leftovers
    letters = (overwrite_stage_name(txn_id), opts.dead_letter_table) if opts.dead_letter_table else None
    return JobStage(txn_id, stage, letters, opts.idempotence_key, views)


def _create_stages(
    c: ClickHouseHTTP, info: TableInfo, opts: WriterOptions, schema: StructType, job: JobStage
) -> WriterOptions:
    """``CREATE TABLE <stage> AS <target>`` (and the dead-letter stage), the mode validated on
    the stage; dropped again on failure. Returns the options aimed at the stage."""
    from clickhouse_tx.factory import build_mode_io
    from spark_datasource.sink.type_mapping import spark_schema_to_arrow

    letters = job.dead_letter_stage
    stage_opts = dataclasses.replace(
        opts, table=job.stage, create_table=False, visibility="partition", dead_letter_table=_on(opts, letters)
    )
    try:
        # ``info`` is the target's description: its engine makes the stage without a second read.
        create_stage_table(
            c, opts.database, job.stage, (opts.database, opts.table), if_not_exists=False, like_info=info
        )
        if letters:
            create_stage_table(c, opts.database, letters[0], letters[1], if_not_exists=False)
        build_mode_io(opts.mode).validate(stage_opts.target(), spark_schema_to_arrow(schema))
    except BaseException:
        drop_stages(opts.target(), job, c)
        raise
    return stage_opts


def _on(opts: WriterOptions, letters: tuple[str, tuple[str, str]] | None) -> tuple[str, str] | None:
    """The dead-letter stage as ``(database, table)``; None without dead letters."""
    return (opts.database, letters[0]) if letters else None
