"""The ``clickhouse_tx`` Spark data source's batch and streaming Arrow writers.

The data source that builds them is :mod:`spark_datasource.datasource`; the writers
of staged jobs (published appends, overwrites) are :mod:`spark_datasource.sink.job_writers`.
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
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.interfaces import Prepared, WriteContext
from clickhouse_tx.testing.faults import FaultPlan, with_faults
from spark_datasource import worker_gc
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.sink.metrics import append_metrics, batch_metrics

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.interfaces import Target
    from clickhouse_tx.protocol.batch_commit import CommitReport
    from clickhouse_tx.protocol.coordinator import Coordinator

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
        """What :mod:`spark_datasource.sink.metrics` needs of this message (plain data)."""
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
    (:func:`clickhouse_tx.sharding.io.build_sharded_coordinator`); executors prepare
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

    placement = opts.shard_placement()
    if placement is None:
        coordinator = one(opts.target())
    else:
        from clickhouse_tx.sharding.io import build_sharded_coordinator

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
    from clickhouse_tx.sharding.io import prepare_sharded

    placement = opts.shard_placement()
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
        report = coordinator.abort_batch(batch, prepared, discard_decided=self.discard_decided, run=self.run)
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
        self._forget_job_records()  # done (and published): no run of this id comes again

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver, once per failed job."""
        try:
            self._abort(messages, 0)
        finally:
            if not self.opts.resumable_batch_job:  # a fresh id per job: never run again
                self._forget_job_records()

    def _forget_job_records(self) -> None:
        """Driver, once per job, at its end: drop its mode ``dedup`` layout records on every
        server it wrote (:meth:`~clickhouse_tx.modes.dedup.mode.DedupMode.forget_batch`). A
        resumable job that is done is refused before any task writes, a fresh id is never
        reused, so nothing reads them again. Best effort: ``gc`` drops what this leaves."""
        from clickhouse_tx.factory import build_mode_io, build_registry
        from clickhouse_tx.interfaces import Mode
        from clickhouse_tx.modes.dedup.mode import DedupMode

        if self.opts.mode is not Mode.DEDUP:
            return
        for url in [shard[0] for shard in self.opts.shards] or [self.opts.url]:
            target = dataclasses.replace(self.opts, url=url, shards=()).target()
            mode_io = build_mode_io(Mode.DEDUP, registry=build_registry(target))
            try:
                assert isinstance(mode_io, DedupMode)
                mode_io.forget_batch(target, self.txn_id, 0)
            except Exception as exc:  # housekeeping never fails a job
                log.info("clickhouse_tx %s: layout records not dropped (gc drops them): %s", self.txn_id, exc)


class ClickHouseTxStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """Streaming writes: one transaction per partition per micro-batch."""

    streaming = True

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, once per micro-batch, in a fresh Python worker."""
        self._commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, once per failed micro-batch."""
        self._abort(messages, batchId)
