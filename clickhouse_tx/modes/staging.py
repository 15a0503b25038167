"""Mode ``staging``: write into a per-xid stage table, MOVE its partitions on commit.

Works on any ``*MergeTree`` target, Replicated and Cloud included (the ClickLoad
pattern; Spark ClickHouse connector issue #145), and staged data survives server
restarts, unlike an open transaction.

prepare (executor, once per partition attempt)
    ``CREATE TABLE <db>.<stage> AS <target>`` (stage = :func:`stage_name` of the
    xid), stream the rows into it, ``OPTIMIZE TABLE <stage> FINAL`` (one part per
    partition, so each MOVE moves one part), record the stage's partition ids in the
    stage table's COMMENT (durable: :meth:`rollback` uses it to refuse undoing a
    half-moved stage) and return them in ``details``.
commit (driver)
    If the marker exists: committed (drop a leftover stage). Else, for every
    partition still in the stage, ``ALTER TABLE <stage> MOVE PARTITION ID '<id>' TO
    TABLE <target>``; then the marker row; then ``DROP TABLE <stage>``. MOVE empties
    the source partition, so re-running a half-done commit moves only what is left:
    roll-forward is idempotent.
rollback (driver, GC)
    ``DROP TABLE IF EXISTS <stage>``, unless some partitions were moved already (a
    commit was under way): that cannot be undone and raises instead.
lookup (driver)
    marker -> COMMITTED; stage table exists -> PENDING; else NOT_COMMITTED.

What a concurrent reader sees while partitions move is measured in
``tests/integration/test_modes.py`` and written up in ``docs/modes.md``.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Iterator

import pyarrow as pa

from clickhouse_tx import sql as q
from clickhouse_tx.errors import (ConfigurationError, IllegalTransitionError, NotCommittedError,
                                  OutcomeUnknownError)
from clickhouse_tx.http_client import ClickHouseHTTP, ReplyLostError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CountingBatches
from clickhouse_tx.modes import peek_schema
from clickhouse_tx.modes.base import ModeBase

log = logging.getLogger(__name__)

STAGE_PREFIX = "_ctx_stage_"
#: Stage tables of batch overwrite jobs (``spark_datasource.overwrite``).
OVERWRITE_STAGE_PREFIX = "_ctx_ow_"


def stage_name(xid: str) -> str:
    """Name of the stage table of ``xid`` (in the target's database)."""
    return STAGE_PREFIX + xid


def overwrite_stage_name(txn_id: str) -> str:
    """A fresh name for the stage table of an overwrite job: ``_ctx_ow_<txn>_<32 hex>``.

    The job's (sanitised) txn id in the name lets ``gc`` tell whose a leftover is.
    """
    return f"{OVERWRITE_STAGE_PREFIX}{sanitize_txn(txn_id)}_{uuid.uuid4().hex}"


def is_overwrite_stage_of(name: str, txn_id: str) -> bool:
    """True if ``name`` was made by :func:`overwrite_stage_name` for ``txn_id``."""
    return re.fullmatch(re.escape(OVERWRITE_STAGE_PREFIX + sanitize_txn(txn_id)) + "_[0-9a-f]{32}", name) is not None


class StagingMode(ModeBase):
    """Exactly-once per partition via stage tables and ``MOVE PARTITION``."""

    mode = Mode.STAGING

    # -- driver --------------------------------------------------------------------------
    def validate(self, target: Target, schema: pa.Schema) -> None:
        """Driver, once per query: table, schema, a MergeTree-family engine, markers table."""
        info = self.describe_and_check(target, schema)
        if not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'staging' moves partitions "
                "and needs a *MergeTree table (Replicated ones included); use mode 'none' for "
                "other engines")
        self.markers(target).ensure_table()

    # -- executor ------------------------------------------------------------------------
    def prepare(self, target: Target, ctx: WriteContext, xid: str,
                batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor: fill the stage table; nothing reaches the target."""
        stage = q.qualified(target.database, stage_name(xid))
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        with self.client(target) as c:
            c.command(f"CREATE TABLE {stage} AS {self.target_sql(target)}")
            try:
                if schema is not None:
                    c.insert_arrow_stream(stage, schema, counted)
                    c.command(f"OPTIMIZE TABLE {stage} FINAL")
                partitions = self._partitions(c, target, xid)
                c.command(f"ALTER TABLE {stage} MODIFY COMMENT "
                          f"{q.quote_string(json.dumps({'clickhouse_tx_partitions': partitions}))}")
            except BaseException:
                try:
                    c.command(f"DROP TABLE IF EXISTS {stage} SYNC")
                except Exception as exc:  # noqa: BLE001 - GC drops it later
                    log.info("could not drop stage %s after a failed prepare: %s", stage, exc)
                raise
        return self.prepared(target, ctx, xid, counted.rows, counted.checksum,
                             {"stage": stage_name(xid), "partitions": partitions})

    # -- driver --------------------------------------------------------------------------
    def commit(self, target: Target, p: Prepared) -> None:
        """Driver: move what is left of the stage, write the marker, drop the stage."""
        stage = q.qualified(target.database, stage_name(p.xid))
        markers = self.markers(target)
        with self.client(target) as c:
            try:
                if markers.lookup(p.xid) is not None:
                    c.command(f"DROP TABLE IF EXISTS {stage} SYNC")
                    return
                if not self._stage_exists(c, target, p.xid):
                    raise NotCommittedError(f"stage table {target.database}.{stage_name(p.xid)} is "
                                            "gone and no marker exists: it was rolled back", xid=p.xid)
                for pid in self._partitions(c, target, p.xid):
                    c.command(f"ALTER TABLE {stage} MOVE PARTITION ID {q.quote_string(pid)} "
                              f"TO TABLE {self.target_sql(target)}")
                markers.ensure_table()
                markers.insert(p, client=c)
                c.command(f"DROP TABLE IF EXISTS {stage} SYNC")
            except ReplyLostError as e:
                raise OutcomeUnknownError(f"commit step lost its reply: {e.message}", xid=p.xid) from None

    def rollback(self, target: Target, p: Prepared) -> None:
        """Driver or GC: drop the stage; refuse if partitions were already moved."""
        stage = q.qualified(target.database, stage_name(p.xid))
        with self.client(target) as c:
            rows = c.query_json(
                "SELECT comment FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                params={"d": target.database, "t": stage_name(p.xid)})
            if not rows:
                return
            planned = _planned_partitions(str(rows[0]["comment"]))
            if planned is not None:
                left = set(self._partitions(c, target, p.xid))
                moved = [pid for pid in planned if pid not in left]
                if moved:
                    raise IllegalTransitionError(
                        f"cannot roll back: partitions {moved} of stage {stage_name(p.xid)} were "
                        "already moved into the target by a commit; roll it forward instead",
                        xid=p.xid)
            c.command(f"DROP TABLE IF EXISTS {stage} SYNC")

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """Driver: COMMITTED (marker), PENDING (stage exists) or NOT_COMMITTED."""
        if self.markers(target).lookup(p.xid) is not None:
            return CommitOutcome.COMMITTED
        with self.client(target) as c:
            if self._stage_exists(c, target, p.xid):
                return CommitOutcome.PENDING
        # The marker is written before the stage is dropped: look once more in case a
        # commit finished between the two reads.
        if self.markers(target).lookup(p.xid) is not None:
            return CommitOutcome.COMMITTED
        return CommitOutcome.NOT_COMMITTED

    def leftover_stages(self, target: Target) -> list[tuple[str, float]]:
        """(xid, age in seconds) of every stage table in the target's database.

        Operator side, once per ``gc``: the candidates it matches against the registry.
        """
        return [(name[len(STAGE_PREFIX):], age) for name, age in tables_named(target, STAGE_PREFIX)]

    # -- helpers -------------------------------------------------------------------------
    @staticmethod
    def _stage_exists(c: ClickHouseHTTP, target: Target, xid: str) -> bool:
        return bool(c.query_json(
            "SELECT 1 AS x FROM system.tables WHERE database = {d:String} AND name = {t:String}",
            params={"d": target.database, "t": stage_name(xid)}))

    @staticmethod
    def _partitions(c: ClickHouseHTTP, target: Target, xid: str) -> list[str]:
        """Partition ids of the stage that still hold rows.

        ``rows > 0``: MOVE PARTITION leaves an empty covering part behind in the
        source (seen on 26.9), so "active" alone would list moved partitions again.
        """
        rows = c.query_json(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {d:String} "
            "AND table = {t:String} AND active AND rows > 0 ORDER BY partition_id",
            params={"d": target.database, "t": stage_name(xid)})
        return [str(r["partition_id"]) for r in rows]


def tables_named(target: Target, prefix: str) -> list[tuple[str, float]]:
    """(name, age in seconds) of the tables of the target's database whose names start with ``prefix``."""
    with ClickHouseHTTP(target) as c:
        rows = c.query_json(
            "SELECT name, dateDiff('second', metadata_modification_time, now()) AS age "
            "FROM system.tables WHERE database = {d:String} AND startsWith(name, {p:String}) "
            "ORDER BY name", params={"d": target.database, "p": prefix})
    return [(str(r["name"]), float(r["age"])) for r in rows]


def _planned_partitions(comment: str) -> list[str] | None:
    try:
        d = json.loads(comment)
    except ValueError:
        return None
    parts = d.get("clickhouse_tx_partitions") if isinstance(d, dict) else None
    return [str(x) for x in parts] if isinstance(parts, list) else None


__all__ = ["StagingMode", "stage_name", "STAGE_PREFIX", "OVERWRITE_STAGE_PREFIX", "overwrite_stage_name",
           "is_overwrite_stage_of", "tables_named"]
