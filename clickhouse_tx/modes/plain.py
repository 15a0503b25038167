"""Mode ``none``: a plain INSERT from the executor, nothing at commit.

At-least-once: a retried task or a replayed batch inserts its rows again. It is the
baseline every benchmark compares the other modes against, and the only mode that
works on any table engine. No markers are written.
"""

from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa

from clickhouse_tx.conversion.checksum import CountingBatches
from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes.base import ModeBase, peek_schema
from clickhouse_tx.modes.views import dependent_views, describe_views

log = logging.getLogger(__name__)


class PlainMode(ModeBase):
    """At-least-once baseline: INSERT and forget."""

    mode = Mode.NONE

    def validate(self, target: Target, schema: pa.Schema, info: TableInfo | None = None) -> None:
        """Driver, once per query: the table exists and accepts the schema.

        Logs a warning naming the target's materialized views, if any: a replayed
        insert runs them again, so their tables are at-least-once too.
        """
        info = self.described(target, schema, info)
        views = dependent_views(target)
        if views:
            log.warning(
                "mode none: the materialized views on %s (%s) get every row at least once, like the "
                "table: a retried task or replayed batch adds its rows to them again (modes "
                "transaction, staging and dedup keep them exactly once; docs/modes.md)",
                self.display(target),
                describe_views(views),
            )
        self.refuse_read_only(target, info)

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor: one streaming INSERT; rows are visible at once."""
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        if schema is not None:
            with self.client(target) as c:
                # A token of this attempt's own: ClickHouse never drops its blocks as
                # repeats (Replicated tables do by default), so a reply writing fewer
                # rows than were sent is always an error, never a deduplicated block.
                c.insert_arrow_stream(
                    self.target_sql(target), schema, counted, settings={"insert_deduplication_token": xid}
                )
        return self.prepared_counted(target, ctx, xid, counted, {})

    def commit(self, target: Target, p: Prepared) -> None:
        """Nothing to do: the rows went in during prepare."""

    def rollback(self, target: Target, p: Prepared) -> None:
        """Cannot undo: the rows stay (at-least-once)."""
        log.info("mode none cannot roll back xid %s; its rows stay", p.xid)

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """Always COMMITTED: rows are visible from the moment prepare returned."""
        return CommitOutcome.COMMITTED
