"""``format("clickhouse_tx")``: the data source, which checks everything on the driver and builds the writers.

``writer`` (once per batch job) and ``streamWriter`` (for every micro-batch's write and
again for its commit) run on the driver: they parse the options, check the server, the
table and the schema, and refuse what is not supported before any task writes. The
writers they return are :mod:`spark_datasource.sink.writer` (appends, streams) and
:mod:`spark_datasource.sink.job_writers` (published appends, overwrites).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.conversion.schema import TableInfo
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.sink.job_append import already_written, plan_job
from spark_datasource.sink.job_writers import AppendJobWriter, OverwriteWriter, SkippedJobWriter
from spark_datasource.sink.overwrite import create_stage
from spark_datasource.sink.writer import ClickHouseTxBatchWriter, ClickHouseTxStreamWriter

log = logging.getLogger("clickhouse_tx.spark")


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

    def _parsed(self, streaming: bool) -> tuple[WriterOptions, str]:
        """The options, parsed and checked, and the transactional id they give."""
        opts = WriterOptions.parse(self.options, streaming=streaming)
        reject_unsupported(opts)
        # Streaming: the id is read from (or first stored in) the checkpoint, before any
        # task writes; an explicit id that differs from the stored one is refused here.
        opts = opts.with_query_identity()
        opts.check_batch_job_not_done()
        return opts, opts.txn_id()

    def writer(self, schema: StructType, overwrite: bool) -> ClickHouseTxBatchWriter:
        """Driver, once per batch job; the writer is pickled to executors and the commit."""
        from clickhouse_tx.client.tls import check_tls
        from spark_datasource.sink.setup import check_target

        if overwrite:
            opts = WriterOptions.parse(self.options, streaming=False)
            reject_unsupported(opts, overwrite=True)
            return OverwriteWriter(opts, schema, create_stage(opts, schema))
        opts, txn_id = self._parsed(streaming=False)
        check_tls(opts.target())  # before the client is built: each error names its option
        # One client of the target and one description of it for the job's driver set-up:
        # the checks, the key, the stages (the mode's validate has its own).
        with ClickHouseHTTP(opts.target()) as client:
            plan, info = check_target(client, opts, schema)
            return self._job_writer(opts, schema, txn_id, plan, info, client)

    @staticmethod
    def _job_writer(
        opts: WriterOptions,
        schema: StructType,
        txn_id: str,
        plan: ConversionPlan,
        info: TableInfo | None,
        client: ClickHouseHTTP,
    ) -> ClickHouseTxBatchWriter:
        """The batch job's writer: skipped (its key recorded), published at once, or per partition."""
        done = already_written(opts, client)
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
        job = plan_job(opts, schema, txn_id, plan, client, info)
        if job is not None:
            return AppendJobWriter(opts, schema, job)
        return ClickHouseTxBatchWriter(dataclasses.replace(opts, visibility="partition"), schema, txn_id, plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ClickHouseTxStreamWriter:
        """Driver, in Spark's Python workers: for every micro-batch's write (the writer
        pickled to the executors) and again for its commit. The workers are reused
        across micro-batches less than a minute apart (docs/performance.md, "Python
        workers: per process, not per micro-batch"), so a check is cached per worker."""
        from spark_datasource.sink.setup import prepare_target

        opts, txn_id = self._parsed(streaming=True)
        # Spark calls streamWriter before every commit, in a reused Python worker: a
        # target checked moments ago for the same options and schema is not checked
        # again (a few round trips per micro-batch otherwise).
        key = (repr(sorted((k.lower(), v) for k, v in dict(self.options).items())), schema.json())
        now = time.monotonic()
        checked_at, plan = _CHECKED.get(key, (-_RECHECK_S, None))
        if plan is None or now - checked_at >= _RECHECK_S:
            plan = prepare_target(opts, schema)
            _CHECKED[key] = (now, plan)
        return ClickHouseTxStreamWriter(opts, schema, txn_id, plan)
