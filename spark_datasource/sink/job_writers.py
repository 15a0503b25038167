"""The batch writers of jobs written into a stage of their own: published appends and overwrites.

Built on the driver by :meth:`~spark_datasource.datasource.ClickHouseTxDataSource.writer`
after the stage's DDL ran there; pickled to the executors (``write``, inherited from
:class:`~spark_datasource.sink.writer.ClickHouseTxBatchWriter`) and to the commit/abort
worker. On commit the stage moves into the user's table (published in one transaction,
or swapped in); on abort it is dropped and the user's table is untouched.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Iterator

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from clickhouse_tx.testing.faults import FaultPlan
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.sink.job_append import AppendJob
from spark_datasource.sink.overwrite import OverwriteStage, drop_stage, swap_in
from spark_datasource.sink.writer import ClickHouseTxBatchWriter

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.protocol.batch_commit import CommitReport

log = logging.getLogger("clickhouse_tx.spark")


class _StagedJobWriter(ClickHouseTxBatchWriter):
    """A batch job written into a stage of its own and moved into the user's table on commit.

    ``final_opts`` are the user's options (their ``table`` is the user's table); the
    inherited ``opts`` aim at the stage. A failed job rolls back and drops the stage:
    the user's table is untouched.
    """

    discard_decided = True
    final_opts: WriterOptions

    @property
    def display_table(self) -> str:
        return self.final_opts.qualified_table

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver, once per failed job: roll back, drop the stage; the target is untouched."""
        try:
            self._abort(messages, 0)
        finally:
            self._drop_stage()
            self._forget_job_records()  # a staged job's id is fresh: never run again

    def _drop_stage(self) -> None:
        """Driver: drop what the job staged (idempotent)."""
        raise NotImplementedError


class AppendJobWriter(_StagedJobWriter):
    """A batch append published at once: prepare into the job stage, publish it on commit.

    Built on the driver by ``ClickHouseTxDataSource.writer`` from what
    :func:`~spark_datasource.sink.job_append.plan_job` made (the DDL runs there, not
    here); pickled to the executors (``write``, inherited) and to the commit/abort
    worker. Holds only options and names (picklable).

    Parameters
    ----------
    opts
        The parsed options (their ``table`` is the user's table).
    schema
        The Spark schema of the rows.
    job
        The job's stages, options aimed at them, and conversion plan.
    """

    def __init__(self, opts: WriterOptions, schema: StructType, job: AppendJob) -> None:
        self.final_opts = opts
        self.job = job.job
        super().__init__(job.options, schema, job.job.txn_id, job.conversion)

    def _after_commit(self, report: CommitReport) -> dict[str, float]:
        """Driver, once per job, after the stage committed: publish it in one transaction, drop it."""
        from clickhouse_tx.jobs.publish import Published, drop_stages, publish_job

        started = time.monotonic()
        faults = FaultPlan.parse(self.opts.faults) if self.opts.faults else None
        target = self.final_opts.target()
        if faults:
            faults.hit("before_publish", 0)
        hook = (lambda: faults.hit("in_publish", 0)) if faults else None
        n = report.rows
        outcome = publish_job(target, self.job, n, before_commit=hook)
        drop_stages(target, self.job)
        if outcome is Published.SKIPPED:
            log.warning(
                "clickhouse_tx batch job %s into %s wrote nothing: idempotence_key %r was recorded by another "
                "job while it ran",
                self.txn_id,
                self.display_table,
                self.job.idempotence_key,
            )
        else:
            log.info("clickhouse_tx batch job %s published into %s (%d rows)", self.txn_id, self.display_table, n)
        if faults:
            faults.hit("after_publish", 0)
        return {"publish": time.monotonic() - started}

    def _drop_stage(self) -> None:
        from clickhouse_tx.jobs.publish import drop_stages

        drop_stages(self.final_opts.target(), self.job)


class SkippedJobWriter(ClickHouseTxBatchWriter):
    """A batch job whose ``idempotence_key`` is already recorded: its tasks write nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        """Executor, once per partition attempt: nothing to write."""
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver, once per job: nothing to commit."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver, once per failed job: nothing to roll back."""


class OverwriteWriter(_StagedJobWriter):
    """``df.write.mode("overwrite")``: prepare into a stage table, swap it in on commit.

    Built on the driver by ``ClickHouseTxDataSource.writer(schema, overwrite=True)``
    from the stage :func:`~spark_datasource.sink.overwrite.create_stage` made (the DDL
    runs there, not here); pickled to the executors (``write``, inherited) and to the
    commit/abort worker. Holds only options and names (picklable).

    Parameters
    ----------
    opts
        The parsed options (their ``table`` is the table to overwrite).
    schema
        The Spark schema of the rows.
    stage
        The job's stage table and its options.
    """

    def __init__(self, opts: WriterOptions, schema: StructType, stage: OverwriteStage) -> None:
        self.final_opts = opts
        self.stage = stage.name
        self.swap = stage.swap
        super().__init__(stage.options, schema, stage.txn_id, stage.conversion)

    def _after_commit(self, report: CommitReport) -> dict[str, float]:
        """Driver, once per job, after the stage committed: swap it in, drop it."""
        started = time.monotonic()
        target = self.final_opts.target()
        method = swap_in(target, self.stage, self.swap)
        drop_stage(target, self.stage)
        log.info("clickhouse_tx overwrite of %s swapped in (%s, %d rows)", self.display_table, method, report.rows)
        return {"swap_and_drop": time.monotonic() - started}

    def _drop_stage(self) -> None:
        drop_stage(self.final_opts.target(), self.stage)
