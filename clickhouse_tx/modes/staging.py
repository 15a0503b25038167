"""Mode ``staging``: write into a per-xid stage table, MOVE its partitions on commit.

Works on any ``*MergeTree`` target, Replicated and Cloud included (the ClickLoad
pattern; Spark ClickHouse connector issue #145), and staged data survives server
restarts, unlike an open transaction.

prepare (executor, once per partition attempt)
    ``CREATE TABLE <db>.<stage> AS <target>`` (stage = :func:`stage_name` of the
    xid), stream the rows into it (no ``OPTIMIZE ... FINAL``: MOVE PARTITION moves all
    parts of a partition at once, and merging a large partition's parts rewrote every
    row once more: ``benchmarks/spark_write.py``), record the stage's partition ids in the
    stage table's COMMENT (durable: :meth:`rollback` uses it to refuse undoing a
    half-moved stage) and return them in ``details``. With dead letters
    (``bad_rows=dead_letter``) they go into a second stage beside the first,
    ``CREATE TABLE <db>.<dl stage> AS <dead-letter table>`` (:func:`dead_letter_stage_name`,
    same xid), whose COMMENT names the dead-letter table and its partition ids.
commit (driver)
    If the marker exists: committed (drop a leftover stage). Else, for every
    partition still in the stage, ``ALTER TABLE <stage> MOVE PARTITION ID '<id>' TO
    TABLE <target>``, then the same from the dead-letter stage into the dead-letter
    table; then the marker row; then ``DROP TABLE`` of the dead-letter stage and of the
    stage. MOVE empties the source partition, so re-running a half-done commit moves
    only what is left: roll-forward is idempotent.
rollback (driver, GC)
    ``DROP TABLE IF EXISTS`` of both stages, unless some partitions of either were
    moved already (a commit was under way): that cannot be undone and raises instead.
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
from typing import Any, Iterator

import pyarrow as pa

from clickhouse_tx import sql as q
from clickhouse_tx._transport import ClickHouseHTTP, ReplyLostError
from clickhouse_tx.dead_letters import write_dead_letters
from clickhouse_tx.errors import ConfigurationError, IllegalTransitionError, NotCommittedError, OutcomeUnknownError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CountingBatches
from clickhouse_tx.modes.base import ModeBase, peek_schema

log = logging.getLogger(__name__)

STAGE_PREFIX = "_ctx_stage_"
#: Stage tables of dead letters (beside the stage of the same xid; not a STAGE_PREFIX name,
#: so ``gc`` reaches them through the rollback of their xid's stage).
DEAD_LETTER_STAGE_PREFIX = "_ctx_dlstage_"
#: Stage tables of batch overwrite jobs (``spark_datasource.overwrite``).
OVERWRITE_STAGE_PREFIX = "_ctx_ow_"


def stage_name(xid: str) -> str:
    """Name of the stage table of ``xid`` (in the target's database)."""
    return STAGE_PREFIX + xid


def dead_letter_stage_name(xid: str) -> str:
    """Name of the dead-letter stage table of ``xid`` (in the target's database)."""
    return DEAD_LETTER_STAGE_PREFIX + xid


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
                "other engines"
            )
        self.markers(target).ensure_table()

    # -- executor ------------------------------------------------------------------------
    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: fill the stage tables; nothing reaches the target."""
        stage = q.qualified(target.database, stage_name(xid))
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        with self.client(target) as c:
            c.command(f"CREATE TABLE {stage} AS {self.target_sql(target)}")
            try:
                if schema is not None:
                    c.insert_arrow_stream(stage, schema, counted)
                letters = self._stage_dead_letters(c, target, ctx, xid, converted)
                partitions = self._partitions(c, target.database, stage_name(xid))
                _record_plan(c, stage, {"clickhouse_tx_partitions": partitions})
            except BaseException:
                self._drop_stages(c, target, xid, quiet=True)
                raise
        details = {"stage": stage_name(xid), "partitions": partitions, "dead_letters": letters}
        return self.prepared_counted(target, ctx, xid, counted, details)

    def _stage_dead_letters(
        self, c: ClickHouseHTTP, target: Target, ctx: WriteContext, xid: str, converted: object
    ) -> int:
        """Executor: the partition's dead letters into their own stage (none: no stage)."""
        plan = getattr(converted, "plan", None)
        if not getattr(converted, "dead_letters", None) or plan is None or plan.dead_letter_table is None:
            return 0
        name = dead_letter_stage_name(xid)
        stage = q.qualified(target.database, name)
        c.command(f"CREATE TABLE {stage} AS {q.qualified(*plan.dead_letter_table)}")
        # A fresh stage (the target's xid): the rows' own dedup token is enough.
        n = write_dead_letters(c, converted, table=self.display(target), ctx=ctx, xid=xid, stage=stage)
        _record_plan(
            c,
            stage,
            {
                "clickhouse_tx_partitions": self._partitions(c, target.database, name),
                "clickhouse_tx_into": list(plan.dead_letter_table),
            },
        )
        return n

    # -- driver --------------------------------------------------------------------------
    def commit(self, target: Target, p: Prepared) -> None:
        """Driver: move what is left of both stages, write the marker, drop the stages."""
        markers = self.markers(target)
        # The prepare of this xid said it staged no dead letter (a message, not a
        # registry entry, whose details may be empty): its dead-letter stage was never
        # created, so two of the commit's round trips (its COMMENT, its DROP) are skipped.
        letters = p.details.get("dead_letters") != 0
        with self.client(target) as c:
            try:
                if markers.lookup(p.xid) is not None:
                    self._drop_stages(c, target, p.xid, letters=letters)
                    return
                if self._comment(c, target.database, stage_name(p.xid)) is None:
                    raise NotCommittedError(
                        f"stage table {target.database}.{stage_name(p.xid)} is "
                        "gone and no marker exists: it was rolled back",
                        xid=p.xid,
                    )
                self._move(c, target.database, stage_name(p.xid), self.target_sql(target))
                into = (
                    (
                        _plan_of(self._comment(c, target.database, dead_letter_stage_name(p.xid))).get(
                            "clickhouse_tx_into"
                        )
                    )
                    if letters
                    else None
                )
                if isinstance(into, list) and len(into) == 2:
                    self._move(c, target.database, dead_letter_stage_name(p.xid), q.qualified(*into))
                markers.ensure_table()
                markers.insert(p, client=c)
                self._drop_stages(c, target, p.xid, letters=letters)
            except ReplyLostError as e:
                raise OutcomeUnknownError(f"commit step lost its reply: {e.message}", xid=p.xid) from None

    def rollback(self, target: Target, p: Prepared) -> None:
        """Driver or GC: drop both stages; refuse if partitions of either were already moved."""
        with self.client(target) as c:
            for name in (stage_name(p.xid), dead_letter_stage_name(p.xid)):
                planned = _plan_of(self._comment(c, target.database, name)).get("clickhouse_tx_partitions")
                if not isinstance(planned, list):
                    continue
                left = set(self._partitions(c, target.database, name))
                moved = [str(pid) for pid in planned if str(pid) not in left]
                if moved:
                    raise IllegalTransitionError(
                        f"cannot roll back: partitions {moved} of stage {name} were already "
                        "moved by a commit; roll it forward instead",
                        xid=p.xid,
                    )
            self._drop_stages(c, target, p.xid)

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """Driver: COMMITTED (marker), PENDING (stage exists) or NOT_COMMITTED."""
        if self.markers(target).lookup(p.xid) is not None:
            return CommitOutcome.COMMITTED
        with self.client(target) as c:
            if self._comment(c, target.database, stage_name(p.xid)) is not None:
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
        return [(name[len(STAGE_PREFIX) :], age) for name, age in tables_named(target, STAGE_PREFIX)]

    # -- helpers -------------------------------------------------------------------------
    def _move(self, c: ClickHouseHTTP, database: str, name: str, into: str) -> None:
        """MOVE every partition still in stage ``name`` into ``into`` (none left: nothing)."""
        for pid in self._partitions(c, database, name):
            c.command(
                f"ALTER TABLE {q.qualified(database, name)} MOVE PARTITION ID {q.quote_string(pid)} TO TABLE {into}"
            )

    @staticmethod
    def _drop_stages(c: ClickHouseHTTP, target: Target, xid: str, *, quiet: bool = False, letters: bool = True) -> None:
        """Drop the dead-letter stage (unless ``letters`` is False: none was created), then
        the stage (the one :meth:`lookup` reads goes last)."""
        names = (dead_letter_stage_name(xid), stage_name(xid)) if letters else (stage_name(xid),)
        for name in names:
            try:
                c.command(f"DROP TABLE IF EXISTS {q.qualified(target.database, name)} SYNC")
            except Exception as exc:  # after a failed prepare: GC drops it later
                if not quiet:
                    raise
                log.info("could not drop stage %s after a failed prepare: %s", name, exc)

    @staticmethod
    def _comment(c: ClickHouseHTTP, database: str, name: str) -> str | None:
        """The COMMENT of table ``name``; None if it does not exist."""
        rows = c.query_json(
            "SELECT comment FROM system.tables WHERE database = {d:String} AND name = {t:String}",
            params={"d": database, "t": name},
        )
        return str(rows[0]["comment"]) if rows else None

    @staticmethod
    def _partitions(c: ClickHouseHTTP, database: str, name: str) -> list[str]:
        """Partition ids of stage ``name`` that still hold rows.

        ``rows > 0``: MOVE PARTITION leaves an empty covering part behind in the
        source (seen on 26.9), so "active" alone would list moved partitions again.
        """
        rows = c.query_json(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {d:String} "
            "AND table = {t:String} AND active AND rows > 0 ORDER BY partition_id",
            params={"d": database, "t": name},
        )
        return [str(r["partition_id"]) for r in rows]


def tables_named(target: Target, prefix: str) -> list[tuple[str, float]]:
    """(name, age in seconds) of the tables of the target's database whose names start with ``prefix``."""
    with ClickHouseHTTP(target) as c:
        rows = c.query_json(
            "SELECT name, dateDiff('second', metadata_modification_time, now()) AS age "
            "FROM system.tables WHERE database = {d:String} AND startsWith(name, {p:String}) "
            "ORDER BY name",
            params={"d": target.database, "p": prefix},
        )
    return [(str(r["name"]), float(r["age"])) for r in rows]


def _record_plan(c: ClickHouseHTTP, stage: str, plan: dict[str, Any]) -> None:
    """Executor: the stage's plan into its COMMENT (durable; read by commit and rollback)."""
    c.command(f"ALTER TABLE {stage} MODIFY COMMENT {q.quote_string(json.dumps(plan))}")


def _plan_of(comment: str | None) -> dict[str, Any]:
    """The plan :func:`_record_plan` wrote; empty if none (no table, or another comment)."""
    try:
        d = json.loads(comment or "")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


__all__ = [
    "StagingMode",
    "stage_name",
    "STAGE_PREFIX",
    "dead_letter_stage_name",
    "DEAD_LETTER_STAGE_PREFIX",
    "OVERWRITE_STAGE_PREFIX",
    "overwrite_stage_name",
    "is_overwrite_stage_of",
    "tables_named",
]
