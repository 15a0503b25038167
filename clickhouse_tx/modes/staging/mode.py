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
    only what is left: roll-forward is idempotent. A batch's xids go through these
    steps together first (:meth:`StagingMode.commit_together`: one markers read, one
    COMMENT read, one partitions read, the MOVEs, one INSERT of the markers, one
    DROP), the same steps in the same order per stage; what that leaves undone, xid
    by xid.
rollback (driver, GC)
    ``DROP TABLE IF EXISTS`` of both stages, unless some partitions of either were
    moved already (a commit was under way): that cannot be undone and raises instead.
lookup (driver)
    marker -> COMMITTED; stage table exists -> PENDING; else NOT_COMMITTED.

What a concurrent reader sees while partitions move is measured in
``tests/integration/clickhouse_tx/modes/test_modes.py`` and written up in ``docs/modes.md``.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.checksum import CountingBatches
from clickhouse_tx.conversion.dead_letters import write_dead_letters
from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.errors import (
    ClickHouseTxError,
    ConfigurationError,
    IllegalTransitionError,
    NotCommittedError,
    OutcomeUnknownError,
    ReplyLostError,
)
from clickhouse_tx.interfaces import CommitOutcome, Hook, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes.base import ModeBase, distributed_hint, peek_schema
from clickhouse_tx.modes.staging.publish import publish_batch, publish_partitions, publish_xid, settle_batch_of
from clickhouse_tx.modes.staging.tables import (
    batch_session,
    create_stage_table,
    dead_letter_stage_name,
    move_sql,
    plan_of,
    record_plan,
    stage_name,
)
from clickhouse_tx.modes.views import dependent_views, describe_views

log = logging.getLogger(__name__)


class StagingMode(ModeBase):
    """Exactly-once per partition via stage tables and ``MOVE PARTITION``.

    ``whole_batch=True`` (writer option ``visibility=batch``) publishes every partition
    of a batch in one ClickHouse transaction (:meth:`commit_together`).
    """

    mode = Mode.STAGING

    def __init__(self, *, whole_batch: bool = False) -> None:
        self.whole_batch = whole_batch
        # Driver: xids of the batch being committed that commit_together published
        # (moved, marked, dropped), so their per-xid commit has nothing left to do.
        self._published: set[str] = set()
        # Driver: whether each target has materialized views, read once per mode object
        # (Spark builds one per batch job and per streaming commit).
        self._has_views: dict[tuple[str, str, str], bool] = {}

    def __repr__(self) -> str:
        return f"StagingMode(whole_batch={self.whole_batch})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StagingMode) and other.whole_batch == self.whole_batch

    def __hash__(self) -> int:
        return hash((type(self), self.whole_batch))

    # -- driver --------------------------------------------------------------------------
    def validate(self, target: Target, schema: pa.Schema, info: TableInfo | None = None) -> None:
        """Driver, once per query: table, schema, a MergeTree-family engine, markers table.

        With ``visibility=batch`` also a non-replicated table and a server that runs
        transactions (the one publishing transaction needs both). So too when materialized
        views read the target: ``MOVE PARTITION`` does not run them, so the commit
        publishes the stage by ``INSERT INTO target SELECT * FROM stage`` (which they see)
        in one transaction with the marker, and each view's table must be one a
        transaction holds.
        """
        info = self.described(target, schema, info)
        if not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'staging' moves partitions "
                "and needs a *MergeTree table (Replicated ones included); use mode 'none' for "
                f"other engines{distributed_hint(info)}"
            )
        views = dependent_views(target)
        if views:
            if info.is_replicated:
                raise self.views_error(
                    target,
                    views,
                    f"MOVE PARTITION does not run views, so mode 'staging' publishes into a table with views by "
                    f"INSERT ... SELECT in a ClickHouse transaction, which cannot hold {info.display} ({info.engine})",
                )
            needed = f"mode 'staging' into {info.display}, which has materialized views ({describe_views(views)}),"
            self.require_transactions(target, needed, instead="or use mode 'dedup'")
            self.transactional_views(target, "mode 'staging'")
        if self.whole_batch:
            if info.is_replicated:
                raise ConfigurationError(
                    f"table {info.display} has engine {info.engine}: option visibility=batch "
                    "publishes a batch in one ClickHouse transaction, and transactions support "
                    "non-replicated *MergeTree tables only; use visibility=partition"
                )
            self.require_transactions(target, "option visibility=batch")
        self.refuse_read_only(target, info)
        self.markers(target).ensure_table()

    # -- executor ------------------------------------------------------------------------
    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: fill the stage tables; nothing reaches the target."""
        stage = q.qualified(target.database, stage_name(xid))
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        with self.client(target) as c:
            # The stage is this xid's alone, so one left by a try whose reply was lost is ours.
            create_stage_table(c, target.database, stage_name(xid), (target.database, target.table), if_not_exists=True)
            try:
                if schema is not None:
                    c.insert_arrow_stream(stage, schema, counted)
                letters = self._stage_dead_letters(c, target, ctx, xid, converted)
                partitions = self._partitions(c, target.database, stage_name(xid))
                plan: dict[str, Any] = {"clickhouse_tx_partitions": partitions}
                if self.whole_batch:  # a per-xid commit (recover) settles the batch's session first
                    plan["clickhouse_tx_batch_session"] = batch_session(ctx.txn_id, ctx.batch)
                record_plan(c, stage, plan)
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
        create_stage_table(c, target.database, name, plan.dead_letter_table, if_not_exists=True)
        # A fresh stage (the target's xid): the rows' own dedup token is enough.
        n = write_dead_letters(c, converted, table=self.display(target), ctx=ctx, xid=xid, stage=stage)
        record_plan(
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
        if p.xid in self._published:
            return
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
                comment = self._comment(c, target.database, stage_name(p.xid))
                if comment is None:
                    raise NotCommittedError(
                        f"stage table {target.database}.{stage_name(p.xid)} is "
                        "gone and no marker exists: it was rolled back",
                        xid=p.xid,
                    )
                if settle_batch_of(target, p, plan_of(comment)):
                    self.commit(target, p)  # the batch's transaction may have published it meanwhile
                    return
                if self.publishes_by_insert(target):
                    publish_xid(c, target, markers, p)
                    self._drop_stages(c, target, p.xid, letters=letters)
                    return
                self._move(c, target.database, stage_name(p.xid), self.target_sql(target))
                into = (
                    (
                        plan_of(self._comment(c, target.database, dead_letter_stage_name(p.xid))).get(
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

    def publishes_by_insert(self, target: Target) -> bool:
        """Driver: True when materialized views read the target (read once per mode object).

        Then a commit publishes a stage by ``INSERT ... SELECT`` in a transaction (the
        views see the rows once) instead of ``MOVE PARTITION`` (which they never see).
        """
        key = (target.url, target.database, target.table)
        if key not in self._has_views:
            self._has_views[key] = bool(dependent_views(target))
        return self._has_views[key]

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Driver, once per batch commit, before the per-xid commits: publish ``ps`` together.

        With ``visibility=batch``, in one transaction
        (:func:`~clickhouse_tx.modes.staging.publish.publish_batch`, which says what it
        raises). Otherwise, into a target without views, with the batch's requests
        batched (:func:`~clickhouse_tx.modes.staging.publish.publish_partitions`): it only
        saves round trips, so any error but a lost reply leaves the partitions to
        :meth:`commit`, one by one, as before. ``before_commit`` runs inside either (the
        test-only fault hooks).
        """
        self._published = set()  # one batch's at a time
        if not ps:
            return
        if self.whole_batch:
            publish_batch(target, ps, by_insert=self.publishes_by_insert(target), before_commit=before_commit)
            return
        if self.publishes_by_insert(target):
            return  # each stage in its own transaction with its marker (publish_xid)
        try:
            dropped = publish_partitions(target, ps, before_commit=before_commit)
        except OutcomeUnknownError:
            raise
        except ClickHouseTxError as exc:
            log.info("batch %d: stages not published together (%s); publishing them one by one", ps[0].batch, exc)
            return
        if dropped:  # else each commit finds its marker and drops its stages
            self._published.update(p.xid for p in ps)

    def rollback(self, target: Target, p: Prepared) -> None:
        """Driver or GC: drop both stages; refuse if partitions of either were already moved."""
        with self.client(target) as c:
            for name in (stage_name(p.xid), dead_letter_stage_name(p.xid)):
                planned = plan_of(self._comment(c, target.database, name)).get("clickhouse_tx_partitions")
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

    # -- helpers -------------------------------------------------------------------------
    def _move(self, c: ClickHouseHTTP, database: str, name: str, into: str) -> None:
        """MOVE every partition still in stage ``name`` into ``into`` (none left: nothing)."""
        for pid in self._partitions(c, database, name):
            c.command(move_sql(database, name, pid, into))

    @staticmethod
    def _drop_stages(c: ClickHouseHTTP, target: Target, xid: str, *, quiet: bool = False, letters: bool = True) -> None:
        """Drop the dead-letter stage (unless ``letters`` is False: none was created), then
        the stage (the one :meth:`lookup` reads goes last)."""
        names = (dead_letter_stage_name(xid), stage_name(xid)) if letters else (stage_name(xid),)
        for name in names:
            try:
                c.command(f"DROP TABLE IF EXISTS {q.qualified(target.database, name)} SYNC", idempotent=True)
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
        source, so "active" alone would list moved partitions again.
        """
        rows = c.query_json(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {d:String} "
            "AND table = {t:String} AND active AND rows > 0 ORDER BY partition_id",
            params={"d": database, "t": name},
        )
        return [str(r["partition_id"]) for r in rows]


__all__ = ["StagingMode"]
