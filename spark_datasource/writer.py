"""The ``clickhouse_tx`` Spark data source: batch and streaming Arrow writers.

Where each hook runs (Spark's Python Data Source protocol):

- ``ClickHouseTxDataSource.writer`` / ``streamWriter``: driver side (a Python worker
  of the driver), when the query is planned, and again for *every* streaming commit
  (Spark unpickles the data source and calls ``streamWriter`` in a fresh worker), so
  the writer keeps no state in memory between ``write`` and ``commit``: the
  transactional id is read from the checkpoint each time (streaming; stored there on
  first use) or fixed in the pickled writer (batch, fresh per job).
- ``write``: executors, once per partition and task attempt. It prepares one
  transaction and returns a picklable :class:`ClickHouseTxCommitMessage`.
- ``commit`` / ``abort``: driver, once per batch (per job for batch writes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from clickhouse_tx.convert import ConversionPlan
from clickhouse_tx.faults import FaultPlan, with_faults
from clickhouse_tx.interfaces import Prepared, WriteContext

from . import worker_gc
from .batch_append import AppendJob, already_written, plan_job
from .metrics import append_metrics, batch_metrics
from .overwrite import OverwriteStage, create_stage, drop_stage, swap_in
from .writer_options import WriterOptions

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.coordinator import CommitReport, Coordinator
    from clickhouse_tx.interfaces import Target

log = logging.getLogger("clickhouse_tx.spark")


@dataclasses.dataclass(frozen=True)
class ClickHouseTxCommitMessage(WriterCommitMessage):
    """One prepared partition attempt, sent from an executor to the driver (picklable)."""

    prepared: dict[str, Any]  # Prepared.to_json(): plain data so any Python on the driver unpickles it
    prepare_seconds: float = 0.0
    bytes: int = 0  # Arrow bytes of the partition (buffer sizes), for metrics
    #: A sharded write: the xids prepared on the other shards (``prepared`` is the first).
    more: tuple[dict[str, Any], ...] = ()

    def metrics(self) -> dict[str, Any]:
        """What :mod:`spark_datasource.metrics` needs of this message (plain data)."""
        return {
            "rows": sum(int(p.get("rows", 0)) for p in (self.prepared, *self.more)),
            "bytes": self.bytes,
            "prepare_seconds": self.prepare_seconds,
            "attempt": int(self.prepared.get("attempt", 0)),
            "dead_letters": int((self.prepared.get("details") or {}).get("dead_letters", 0)),
        }

    def to_prepared(self) -> Prepared:
        return Prepared.from_json(self.prepared)

    def all_prepared(self) -> list[Prepared]:
        """Every xid this task prepared: one, or one per shard that got rows."""
        return [Prepared.from_json(p) for p in (self.prepared, *self.more)]


def _ours(messages: Sequence[WriterCommitMessage | None]) -> list[ClickHouseTxCommitMessage]:
    # Spark passes None for tasks that failed; only our own messages carry a transaction.
    return [m for m in messages if isinstance(m, ClickHouseTxCommitMessage)]


def _prepared(messages: Sequence[WriterCommitMessage | None]) -> list[Prepared]:
    return [p for m in _ours(messages) for p in m.all_prepared()]


class _ByteCounter:
    """Wrap the executor's batch iterator: add up Arrow buffer sizes as batches pass."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self.bytes = 0
        self.batches = self._passing(batches)  # what the coordinator reads

    def _passing(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            self.bytes += b.nbytes
            yield b


def coordinator_for(opts: WriterOptions, txn_id: str, conversion: "ConversionPlan | None" = None):
    """A fresh coordinator (driver or executor); with ``fault.*`` options, a faulty one.

    With the ``shards`` option it is the driver's coordinator over every shard
    (:func:`clickhouse_tx.sharded_io.build_sharded_coordinator`); executors prepare
    through :func:`_prepare_sharded` instead.
    """
    from clickhouse_tx.factory import build_coordinator

    def one(target: Target) -> Coordinator:
        return build_coordinator(
            target,
            opts.mode,
            txn_id,
            opts.decision_log_uri(txn_id),
            retry=opts.retry_policy(),
            conversion=conversion,
            visibility=opts.commit_visibility(),
        )

    placement = opts.shard_layout()
    if placement is None:
        coordinator = one(opts.target())
    else:
        from clickhouse_tx.sharded_io import build_sharded_coordinator

        coordinator = build_sharded_coordinator(opts.target(), placement, one)
    plan = FaultPlan.parse(opts.faults) if opts.faults else None
    return with_faults(coordinator, plan) if plan else coordinator


def _prepare_sharded(
    opts: WriterOptions,
    txn_id: str,
    conversion: "ConversionPlan | None",
    ctx: WriteContext,
    batches: Iterator[pa.RecordBatch],
) -> list[Prepared]:
    """Executor, once per partition attempt of a sharded write: one xid per shard with rows,
    each prepared by the one-server coordinator of a replica of its shard that answers."""
    from clickhouse_tx.sharded_io import prepare_sharded

    placement = opts.shard_layout()
    assert placement is not None

    def on(shard: int, url: str) -> Coordinator:
        return coordinator_for(dataclasses.replace(opts, url=url, shards=()), txn_id, conversion)

    return prepare_sharded(placement, on, opts.target(), ctx, batches)


def _task_context(streaming: bool) -> tuple[int, int, int]:
    """(batch id, partition id, attempt number) of the running task (executor side)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("clickhouse_tx writer.write must run inside a Spark task")
    batch = 0
    if streaming:
        raw = tc.getLocalProperty("streaming.sql.batchId")
        if raw is None:
            raise RuntimeError("Spark did not pass streaming.sql.batchId to the task; is this a streaming query?")
        batch = int(raw)
    return batch, tc.partitionId(), tc.attemptNumber()


class _WriterBase:
    streaming = False

    def __init__(
        self, opts: WriterOptions, schema: StructType, txn_id: str, conversion: "ConversionPlan | None" = None
    ) -> None:
        self.opts = opts
        self.schema = schema
        self.txn_id = txn_id
        # The table's column types, from the driver's check: pickled with the writer,
        # so executors convert and check values without querying the table.
        self.conversion = conversion
        # Drawn on the driver once per run (a restarted query builds a new writer), so a
        # replay's tasks can tell their own dedup claims from an earlier run's.
        self.run = uuid.uuid4().hex

    @property
    def display_table(self) -> str:
        """``db.table`` the user wrote to, for logs and metrics."""
        return self.opts.qualified_table

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ClickHouseTxCommitMessage:
        """Executor, once per partition attempt: prepare one transaction, do not commit."""
        started = time.monotonic()
        batch, partition, attempt = _task_context(self.streaming)
        worker_gc.before_task()
        ctx = WriteContext(txn_id=self.txn_id, batch=batch, partition=partition, attempt=attempt, run=self.run)
        counted = _ByteCounter(iterator)
        if self.opts.shards:
            first, *rest = _prepare_sharded(self.opts, self.txn_id, self.conversion, ctx, counted.batches)
        else:
            first, rest = coordinator_for(self.opts, self.txn_id, self.conversion).prepare(ctx, counted.batches), []
        return ClickHouseTxCommitMessage(
            first.to_json(), time.monotonic() - started, counted.bytes, tuple(p.to_json() for p in rest)
        )

    def _metrics(self, batch: int, status: str, messages: Sequence[WriterCommitMessage | None], **kwargs: Any) -> None:
        record = batch_metrics(
            txn_id=self.txn_id,
            batch=batch,
            status=status,
            mode=self.opts.mode.value,
            table=self.display_table,
            messages=[m.metrics() for m in _ours(messages)],
            **kwargs,
        )
        append_metrics(self.opts.decision_log_uri(self.txn_id), record)

    def _commit(self, messages: Sequence[WriterCommitMessage | None], batch: int) -> None:
        started = time.monotonic()
        report = coordinator_for(self.opts, self.txn_id).commit_batch(batch, _prepared(messages))
        published = self._after_commit(report)
        log.info("clickhouse_tx %s batch %d committed: %s", self.txn_id, batch, report)
        self._metrics(
            batch,
            "committed",
            messages,
            committed_partitions=len(report.committed),
            rows=report.rows,
            commit_seconds=time.monotonic() - started,
            rolled_back=len(report.rolled_back),
            replay=report.replay,
            durations={**report.durations, **published},
        )

    def _after_commit(self, report: CommitReport) -> dict[str, float]:
        """Driver, after the batch committed: a subclass's last step; its durations (s)."""
        return {}

    #: A batch job's stage is dropped after an abort: its decided xids are rolled back too.
    discard_decided = False

    def _abort(self, messages: Sequence[WriterCommitMessage | None], batch: int) -> None:
        started = time.monotonic()
        prepared = _prepared(messages)
        coordinator = coordinator_for(self.opts, self.txn_id)
        report = coordinator.abort_batch(batch, prepared, discard_decided=self.discard_decided)
        log.warning(
            "clickhouse_tx %s batch %d aborted (%d prepared partitions, %d xids rolled back, "
            "%d fenced and left to GC: %s)",
            self.txn_id,
            batch,
            len(prepared),
            len(report.rolled_back),
            len(report.left),
            ", ".join(report.left) or "none",
        )
        self._metrics(
            batch,
            "aborted",
            messages,
            committed_partitions=0,
            rows=0,
            commit_seconds=time.monotonic() - started,
            rolled_back=len(report.rolled_back),
        )


class ClickHouseTxBatchWriter(_WriterBase, DataSourceArrowWriter):
    """Batch writes (``df.write``): one transaction per partition, committed together."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver, once per job."""
        self._commit(messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver, once per failed job."""
        self._abort(messages, 0)


class ClickHouseTxStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """Streaming writes: one transaction per partition per micro-batch."""

    streaming = True

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, once per micro-batch, in a fresh Python worker."""
        self._commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, once per failed micro-batch."""
        self._abort(messages, batchId)


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

    def _drop_stage(self) -> None:
        """Driver: drop what the job staged (idempotent)."""
        raise NotImplementedError


class AppendJobWriter(_StagedJobWriter):
    """A batch append published at once: prepare into the job stage, publish it on commit.

    Built on the driver by ``ClickHouseTxDataSource.writer`` from what
    :func:`~spark_datasource.batch_append.plan_job` made (the DDL runs there, not
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
        from clickhouse_tx.job_publish import Published, drop_stages, publish_job

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
        from clickhouse_tx.job_publish import drop_stages

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
    from the stage :func:`~spark_datasource.overwrite.create_stage` made (the DDL
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


def reject_unsupported(opts: WriterOptions, overwrite: bool = False) -> None:
    """Driver, when the writer is built: refuse option combinations not implemented.

    Multi-table routing (``table_column``) works for appends in mode ``transaction``
    (one session spans every table of a partition; :meth:`WriterOptions.check_routing`
    refuses the other modes and a missing ``tables``). An overwrite swaps one stage table into one target, so
    routing with ``.mode("overwrite")`` is refused before any task writes.
    """
    from clickhouse_tx.errors import ConfigurationError

    opts.check_routing()
    if opts.shards and (overwrite or opts.table_column):
        raise ConfigurationError(
            "option shards with "
            + ("table_column (multi-table routing)" if opts.table_column else ".mode('overwrite')")
            + ": not supported on a sharded write yet; append into one table, or write each shard "
            "with its own url"
        )
    if opts.table_column and overwrite:
        raise ConfigurationError(
            f"option table_column={opts.table_column!r} with .mode('overwrite'): multi-table "
            "routing is append-only; overwrite each table with its own DataFrame instead"
        )


# Streaming targets checked by this process: key -> (monotonic time, conversion plan).
_CHECKED: dict[tuple[str, str], tuple[float, ConversionPlan]] = {}
_RECHECK_S = 60.0


class ClickHouseTxDataSource(DataSource):
    """``format("clickhouse_tx")``: exactly-once writes into ClickHouse.

    Options are parsed and checked once, on the driver, in ``writer``/``streamWriter``;
    the target table and the schema are checked there too, before any task writes.
    """

    @classmethod
    def name(cls) -> str:
        return "clickhouse_tx"

    def _validated(self, schema: StructType, streaming: bool) -> tuple[WriterOptions, str, ConversionPlan]:
        opts = WriterOptions.parse(self.options, streaming=streaming)
        reject_unsupported(opts)
        # Streaming: the id is read from (or first stored in) the checkpoint, before any
        # task writes; an explicit id that differs from the stored one is refused here.
        opts = opts.with_query_identity()
        opts.check_batch_job_not_done()
        txn_id = opts.txn_id()
        from .writer_setup import prepare_target

        # Spark calls streamWriter before every commit, in a reused Python worker: a
        # target checked moments ago for the same options and schema is not checked
        # again (a few round trips per micro-batch otherwise). Batch jobs always check.
        key = (repr(sorted((k.lower(), v) for k, v in dict(self.options).items())), schema.json())
        now = time.monotonic()
        checked_at, plan = _CHECKED.get(key, (-_RECHECK_S, None))
        if not streaming or plan is None or now - checked_at >= _RECHECK_S:
            plan = prepare_target(opts, schema)
            if streaming:
                _CHECKED[key] = (now, plan)
        return opts, txn_id, plan

    def writer(self, schema: StructType, overwrite: bool) -> ClickHouseTxBatchWriter:
        """Driver, once per batch job; the writer is pickled to executors and the commit."""
        if overwrite:
            opts = WriterOptions.parse(self.options, streaming=False)
            reject_unsupported(opts, overwrite=True)
            return OverwriteWriter(opts, schema, create_stage(opts, schema))
        opts, txn_id, plan = self._validated(schema, streaming=False)
        done = already_written(opts)
        if done is not None:
            log.warning(
                "clickhouse_tx batch job into %s skipped: idempotence_key %r was recorded by job %s at %s "
                "(%s rows); nothing is written",
                opts.qualified_table,
                opts.idempotence_key,
                done.get("txn_id"),
                done.get("committed_at"),
                done.get("rows"),
            )
            return SkippedJobWriter(opts, schema, txn_id, plan)
        log.info(
            "clickhouse_tx batch job into %s: transactional_id %r (%s)",
            opts.qualified_table,
            txn_id,
            "resumable: its own id and decision_log" if opts.resumable_batch_job else "fresh per job",
        )
        job = plan_job(opts, schema, txn_id, plan)
        if job is not None:
            return AppendJobWriter(opts, schema, job)
        return ClickHouseTxBatchWriter(dataclasses.replace(opts, visibility="partition"), schema, txn_id, plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ClickHouseTxStreamWriter:
        """Driver, at query start and before every commit (fresh worker each time)."""
        opts, txn_id, plan = self._validated(schema, streaming=True)
        return ClickHouseTxStreamWriter(opts, schema, txn_id, plan)
