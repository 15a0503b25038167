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
import time
import uuid
from typing import Any, Iterator, Sequence

import pyarrow as pa

from clickhouse_tx import sql as q
from clickhouse_tx.arrow_checksum import CountingBatches
from clickhouse_tx.dead_letters import write_dead_letters
from clickhouse_tx.errors import (
    ClickHouseTxError,
    ConfigurationError,
    IllegalTransitionError,
    NotCommittedError,
    OutcomeUnknownError,
    ServerBusyError,
)
from clickhouse_tx.http_client import ClickHouseHTTP
from clickhouse_tx.http_errors import INVALID_TRANSACTION, SESSION_IS_LOCKED, SESSION_NOT_FOUND, ReplyLostError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import CommitOutcome, Hook, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CommitMarkers
from clickhouse_tx.modes.base import ModeBase, peek_schema
from clickhouse_tx.views import dependent_views, describe_views

log = logging.getLogger(__name__)

STAGE_PREFIX = "_ctx_stage_"
#: Stage tables of dead letters (beside the stage of the same xid; not a STAGE_PREFIX name,
#: so ``gc`` reaches them through the rollback of their xid's stage).
DEAD_LETTER_STAGE_PREFIX = "_ctx_dlstage_"
#: Stage tables of batch overwrite jobs (``spark_datasource.overwrite``).
OVERWRITE_STAGE_PREFIX = "_ctx_ow_"
#: Idle seconds after which the server rolls back a batch transaction whose driver died
#: holding it (its MOVEs lock the stages' parts until then).
BATCH_SESSION_TIMEOUT_S = 60
#: How long a replay waits for a batch COMMIT still running in the session (SESSION_IS_LOCKED).
SETTLE_WAIT_S = 30.0
#: How long a batch commit waits for stage parts a rolled-back MOVE left locked.
LOCKED_PARTS_WAIT_S = 120.0


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
    """Exactly-once per partition via stage tables and ``MOVE PARTITION``.

    ``whole_batch=True`` (writer option ``visibility=batch``) publishes every partition
    of a batch in one ClickHouse transaction (:meth:`commit_together`).
    """

    mode = Mode.STAGING

    def __init__(self, *, whole_batch: bool = False) -> None:
        self.whole_batch = whole_batch
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
    def validate(self, target: Target, schema: pa.Schema) -> None:
        """Driver, once per query: table, schema, a MergeTree-family engine, markers table.

        With ``visibility=batch`` also a non-replicated table and a server that runs
        transactions (the one publishing transaction needs both). So too when materialized
        views read the target: ``MOVE PARTITION`` does not run them, so the commit
        publishes the stage by ``INSERT INTO target SELECT * FROM stage`` (which they see)
        in one transaction with the marker, and each view's table must be one a
        transaction holds.
        """
        info = self.describe_and_check(target, schema)
        if not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'staging' moves partitions "
                "and needs a *MergeTree table (Replicated ones included); use mode 'none' for "
                "other engines"
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
            c.command(f"CREATE TABLE IF NOT EXISTS {stage} AS {self.target_sql(target)}", idempotent=True)
            try:
                if schema is not None:
                    c.insert_arrow_stream(stage, schema, counted)
                letters = self._stage_dead_letters(c, target, ctx, xid, converted)
                partitions = self._partitions(c, target.database, stage_name(xid))
                plan: dict[str, Any] = {"clickhouse_tx_partitions": partitions}
                if self.whole_batch:  # a per-xid commit (recover) settles the batch's session first
                    plan["clickhouse_tx_batch_session"] = batch_session(ctx.txn_id, ctx.batch)
                _record_plan(c, stage, plan)
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
        c.command(f"CREATE TABLE IF NOT EXISTS {stage} AS {q.qualified(*plan.dead_letter_table)}", idempotent=True)
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
                comment = self._comment(c, target.database, stage_name(p.xid))
                if comment is None:
                    raise NotCommittedError(
                        f"stage table {target.database}.{stage_name(p.xid)} is "
                        "gone and no marker exists: it was rolled back",
                        xid=p.xid,
                    )
                if self._settle_batch_of(target, p, _plan_of(comment)):
                    self.commit(target, p)  # the batch's transaction may have published it meanwhile
                    return
                if self.publishes_by_insert(target):
                    self._publish_xid(c, target, markers, p)
                    self._drop_stages(c, target, p.xid, letters=letters)
                    return
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

    def publishes_by_insert(self, target: Target) -> bool:
        """Driver: True when materialized views read the target (read once per mode object).

        Then a commit publishes a stage by ``INSERT ... SELECT`` in a transaction (the
        views see the rows once) instead of ``MOVE PARTITION`` (which they never see).
        """
        key = (target.url, target.database, target.table)
        if key not in self._has_views:
            self._has_views[key] = bool(dependent_views(target))
        return self._has_views[key]

    def _publish_xid(self, c: ClickHouseHTTP, target: Target, markers: CommitMarkers, p: Prepared) -> None:
        """Driver, per xid of a target with views: its stages' rows and its marker in one transaction.

        In the xid's own session (:func:`publish_session`), settled first: a driver that
        died inside this transaction left it open, or its COMMIT still running; whoever
        comes next ends it before looking at the marker, so the rows go in once.
        """
        markers.ensure_table()  # DDL is refused inside a transaction
        statements = self._publish_sql(c, target, [p])
        with self.client(target, publish_session(p.xid), BATCH_SESSION_TIMEOUT_S) as s:
            settle_session(s)
            if markers.lookup(p.xid) is not None:
                return
            statements.append(markers.insert_sql(p))
            try:
                s.command("BEGIN TRANSACTION")
                for sql in statements:
                    s.command(sql)
                s.command("COMMIT")
            except ClickHouseTxError as exc:
                settle_session(s)
                if markers.lookup(p.xid) is not None:
                    return  # the COMMIT landed; only its reply was lost
                raise NotCommittedError(
                    f"the transaction publishing stage {stage_name(p.xid)} failed and was rolled back "
                    f"({type(exc).__name__}: {exc})",
                    xid=p.xid,
                ) from exc

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Driver, once per batch commit, before the per-xid commits: publish ``ps`` at once.

        A no-op unless ``visibility=batch``. Inside one transaction: MOVE every
        partition of every stage (and dead-letter stage) of ``ps`` not yet published,
        insert their markers, COMMIT. ``before_commit`` runs just before the COMMIT
        (the test-only fault hooks).

        Raises
        ------
        NotCommittedError
            The transaction was refused or rolled back (a stage gone, parts locked for
            :data:`LOCKED_PARTS_WAIT_S`): nothing of it is visible; the per-xid commits
            publish the batch instead.
        OutcomeUnknownError
            A COMMIT of this batch was still running after :data:`SETTLE_WAIT_S`.
        """
        if not self.whole_batch or not ps:
            return
        batch = ps[0].batch
        markers = self.markers(target)
        markers.ensure_table()  # DDL is refused inside a transaction
        deadline = time.monotonic() + LOCKED_PARTS_WAIT_S
        with self.client(target, batch_session(ps[0].txn_id, batch), BATCH_SESSION_TIMEOUT_S) as c:
            if settle_session(c):  # a dead attempt's transaction was open: its MOVEs left locks
                self._wait_for_unlocked_stages(target, ps, deadline)
            while True:
                try:
                    self._publish(c, target, markers, ps, before_commit)
                    return
                except ServerBusyError as exc:
                    if time.monotonic() >= deadline:
                        raise NotCommittedError(
                            f"batch {batch}: stage parts stayed locked for {LOCKED_PARTS_WAIT_S:.0f} s ({exc.message})",
                            xid=ps[0].xid,
                        ) from exc
                    log.info("batch %d: waiting for locked stage parts (%s)", batch, exc.message)
                    self._wait_for_unlocked_stages(target, ps, deadline)
                except NotCommittedError:
                    # The per-xid commits take over: the MOVEs a rollback just undid must be free.
                    self._wait_for_unlocked_stages(target, ps, deadline)
                    raise

    def _wait_for_unlocked_stages(self, target: Target, ps: Sequence[Prepared], deadline: float) -> None:
        """Wait (outside the batch's session) until no stage of ``ps`` holds a rolled-back MOVE's part.

        A MOVE that a transaction rolled back leaves an outdated copy of the part in the
        stage (``remove_time`` zero); until ClickHouse's cleanup removes it (about 30 s
        here) a MOVE of that partition fails with PART_IS_TEMPORARILY_LOCKED. Retrying
        inside a transaction meanwhile would MOVE, then roll back, the stages that are
        free, and lock them again: so wait for all of them first.
        """
        names = [n for p in ps for n in (stage_name(p.xid), dead_letter_stage_name(p.xid))]
        # A client of its own: a read in the batch's session would hold it, and the
        # partitions' parallel per-xid commits all settle that session.
        with self.client(target) as c:
            self._poll_locked_parts(c, target.database, names, deadline)

    @staticmethod
    def _poll_locked_parts(c: ClickHouseHTTP, database: str, names: list[str], deadline: float) -> None:
        while time.monotonic() < deadline:
            rows = c.query_json(
                "SELECT count() AS n FROM system.parts WHERE database = {d:String} "
                "AND table IN {t:Array(String)} AND NOT active AND remove_time = toDateTime(0)",
                params={"d": database, "t": names},
            )
            if not rows or int(rows[0]["n"]) == 0:
                return
            time.sleep(1.0)

    def _publish(
        self,
        c: ClickHouseHTTP,
        target: Target,
        markers: CommitMarkers,
        ps: Sequence[Prepared],
        before_commit: Hook | None,
    ) -> None:
        """One attempt of :meth:`commit_together` in the batch's session ``c`` (settled)."""
        done = {str(m["xid"]) for m in markers.list(ps[0].txn_id, ps[0].batch)}
        todo = [p for p in ps if p.xid not in done]
        if not todo:
            return
        statements = self._publish_sql(c, target, todo)
        statements.append(markers.insert_sql(*todo))
        try:
            c.command("BEGIN TRANSACTION")
            for sql in statements:
                c.command(sql)
            if before_commit is not None:
                before_commit()
            c.command("COMMIT")
        except ClickHouseTxError as exc:
            self._after_failed_batch_commit(c, markers, todo, exc)

    def _after_failed_batch_commit(
        self, c: ClickHouseHTTP, markers: CommitMarkers, todo: Sequence[Prepared], exc: ClickHouseTxError
    ) -> None:
        """Settle the batch's session, then the markers say whether the COMMIT landed.

        A refusal before running (:class:`ServerBusyError`) is raised again as it is, once
        the session is settled, for :meth:`commit_together` to wait and try again.
        """
        settle_session(c)
        done = {str(m["xid"]) for m in markers.list(todo[0].txn_id, todo[0].batch)}
        if all(p.xid in done for p in todo):
            return  # the COMMIT landed; only its reply was lost
        if isinstance(exc, ServerBusyError):
            raise exc
        raise NotCommittedError(
            f"batch {todo[0].batch}: the transaction publishing {len(todo)} stages at once "
            f"failed and was rolled back ({type(exc).__name__}: {exc})",
            xid=todo[0].xid,
        ) from exc

    def _settle_batch_of(self, target: Target, p: Prepared, plan: dict[str, Any]) -> bool:
        """Before a per-xid MOVE of a ``visibility=batch`` stage: end the batch's transaction.

        A driver that died inside :meth:`commit_together` leaves its transaction open
        (until :data:`BATCH_SESSION_TIMEOUT_S`); its MOVEs hide the stage's partitions
        from a plain read, so a per-xid commit (``recover``) would move nothing and
        write the marker of rows that the rollback then takes back. True if a
        transaction was rolled back (the caller starts over); either way the stage's
        parts are unlocked when it returns.
        """
        session = plan.get("clickhouse_tx_batch_session")
        if not isinstance(session, str):
            return False
        with self.client(target, session, BATCH_SESSION_TIMEOUT_S) as c:
            rolled_back = settle_session(c)
            # Also when another xid's commit rolled it back: this stage's parts may still be locked.
            self._wait_for_unlocked_stages(target, [p], time.monotonic() + LOCKED_PARTS_WAIT_S)
        return rolled_back

    def _publish_sql(self, c: ClickHouseHTTP, target: Target, ps: Sequence[Prepared]) -> list[str]:
        """The statements publishing every stage and dead-letter stage of ``ps`` (read before BEGIN).

        MOVEs, or with materialized views on the target (:meth:`publishes_by_insert`)
        ``INSERT ... SELECT``s, which the views see (dead letters too: an INSERT that a
        rollback undoes leaves no locked part behind, unlike a MOVE). Two reads for the
        whole batch (the stages' COMMENTs, their partitions with rows), not two per
        stage: they run while the batch waits for its commit.
        """
        publish = self._insert_sql if self.publishes_by_insert(target) else self._moves_sql
        db = target.database
        names = [n for p in ps for n in (stage_name(p.xid), dead_letter_stage_name(p.xid))]
        comments = {
            str(r["name"]): str(r["comment"])
            for r in c.query_json(
                "SELECT name, comment FROM system.tables WHERE database = {d:String} AND name IN {t:Array(String)}",
                params={"d": db, "t": names},
            )
        }
        partitions: dict[str, list[str]] = {}
        for r in c.query_json(
            "SELECT DISTINCT table, partition_id FROM system.parts WHERE database = {d:String} "
            "AND table IN {t:Array(String)} AND active AND rows > 0 ORDER BY table, partition_id",
            params={"d": db, "t": names},
        ):
            partitions.setdefault(str(r["table"]), []).append(str(r["partition_id"]))
        out: list[str] = []
        for p in ps:
            stage, dl = stage_name(p.xid), dead_letter_stage_name(p.xid)
            if stage not in comments:
                raise NotCommittedError(f"stage table {db}.{stage} is gone and no marker exists", xid=p.xid)
            out += publish(db, stage, partitions.get(stage, []), self.target_sql(target))
            into = _plan_of(comments.get(dl)).get("clickhouse_tx_into")
            if isinstance(into, list) and len(into) == 2:
                out += publish(db, dl, partitions.get(dl, []), q.qualified(*into))
        return out

    @classmethod
    def _moves_sql(cls, database: str, name: str, pids: Sequence[str], into: str) -> list[str]:
        return [cls._move_sql(database, name, pid, into) for pid in pids]

    @staticmethod
    def _insert_sql(database: str, name: str, pids: Sequence[str], into: str) -> list[str]:
        """One ``INSERT ... SELECT`` of stage ``name`` (none if it holds no rows).

        ``insert_deduplicate = 0``: a target with a deduplication window would drop a
        block equal to an earlier one (the same rows written by two batches), which a
        MOVE never did.
        """
        if not pids:
            return []
        return [f"INSERT INTO {into} SETTINGS insert_deduplicate = 0 SELECT * FROM {q.qualified(database, name)}"]

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
            c.command(self._move_sql(database, name, pid, into))

    @staticmethod
    def _move_sql(database: str, name: str, pid: str, into: str) -> str:
        return f"ALTER TABLE {q.qualified(database, name)} MOVE PARTITION ID {q.quote_string(pid)} TO TABLE {into}"

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
        source (seen on 26.9), so "active" alone would list moved partitions again.
        """
        rows = c.query_json(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {d:String} "
            "AND table = {t:String} AND active AND rows > 0 ORDER BY partition_id",
            params={"d": database, "t": name},
        )
        return [str(r["partition_id"]) for r in rows]


def batch_session(txn_id: str, batch: int) -> str:
    """The session of batch ``batch``'s publishing transaction.

    Named, not random, so a replay (another driver process) or ``recover`` finds and
    settles what an attempt that died left open in it. One name for every decision
    version: whoever comes next settles whatever is open, and a MOVE is idempotent.
    """
    return f"clickhouse_tx_batch_{sanitize_txn(txn_id)}_{int(batch)}"


def publish_session(xid: str) -> str:
    """The session of the transaction publishing ``xid``'s stage into a target with views.

    Named by the xid, as :func:`batch_session` is by the batch, so a replay or
    ``recover`` settles what a dead driver left open in it before it looks at the marker.
    """
    return f"clickhouse_tx_publish_{xid}"


def settle_session(c: ClickHouseHTTP) -> bool:
    """End what an earlier attempt left in ``c``'s session, so its outcome is final.

    ROLLBACK an open transaction (then True); a session that does not exist, or holds
    no transaction, has nothing open (a COMMIT there finished, or never came). A
    session still busy (SESSION_IS_LOCKED: a COMMIT running) is waited for.
    """
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        try:
            c.command("ROLLBACK", session_check=True)
            return True
        except ClickHouseTxError as exc:
            if exc.code in (SESSION_NOT_FOUND, INVALID_TRANSACTION):
                return False
            if exc.code != SESSION_IS_LOCKED and not isinstance(exc, ReplyLostError):
                raise
            if time.monotonic() >= deadline:
                raise OutcomeUnknownError(
                    f"the batch transaction in session {c.session_id} is still running after "
                    f"{SETTLE_WAIT_S:.0f} s; a replay settles it",
                    xid=c.session_id,
                ) from exc
        time.sleep(0.5)


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
    c.command(f"ALTER TABLE {stage} MODIFY COMMENT {q.quote_string(json.dumps(plan))}", idempotent=True)


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
    "settle_session",
]
