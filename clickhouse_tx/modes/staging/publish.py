"""Stages published together: a batch's in one request set, one transaction, or one with views.

Mode ``staging`` publishes a stage by ``MOVE PARTITION`` on its own. A batch's stages go
together (:func:`publish_partitions`: the batch's reads, markers and drops batched, only
the MOVEs one per stage partition). Two cases need a transaction around the moves
(:class:`~clickhouse_tx.modes.staging.mode.StagingMode`):
``visibility=batch`` (every stage of a batch and their markers in one transaction,
:func:`publish_batch`) and a target read by materialized views (the stage's rows by
``INSERT ... SELECT``, which the views see, with its marker, :func:`publish_xid`).
Each transaction runs in a named session (:mod:`clickhouse_tx.modes.staging.tables`), so
whoever comes after a dead driver settles what it left open before looking at the
markers, and the rows go in once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ClickHouseTxError, NotCommittedError, OutcomeUnknownError, ServerBusyError
from clickhouse_tx.interfaces import Hook, Prepared, Target
from clickhouse_tx.modes.staging.tables import (
    BATCH_SESSION_TIMEOUT_S,
    batch_session,
    dead_letter_stage_name,
    move_sql,
    plan_of,
    publish_session,
    settle_session,
    stage_name,
)
from clickhouse_tx.store.markers import CommitMarkers

log = logging.getLogger(__name__)

#: How long a batch commit waits for stage parts a rolled-back MOVE left locked.
LOCKED_PARTS_WAIT_S = 120.0

#: MOVEs of a batch's stages sent at once (each worker on its own connection). The server
#: runs the moves into one target one after the other, but overlaps the rest of each
#: request: 128 MOVEs took a median 801 ms 8 at a time and 1,102 ms one at a time
#: (``python -m benchmarks.stage_moves``, embedded server, 2 cores); on a server with
#: more cores, or a Replicated target's Keeper round trips, there is more to overlap.
MOVES_AT_ONCE = 8


def _session(target: Target, session_id: str) -> ClickHouseHTTP:
    """A client in the named session of a publishing transaction."""
    return ClickHouseHTTP(target, session_id=session_id, session_timeout=BATCH_SESSION_TIMEOUT_S)


def publish_xid(c: ClickHouseHTTP, target: Target, markers: CommitMarkers, p: Prepared) -> None:
    """Driver, per xid of a target with views: its stages' rows and its marker in one transaction.

    In the xid's own session (:func:`publish_session`), settled first: a driver that
    died inside this transaction left it open, or its COMMIT still running; whoever
    comes next ends it before looking at the marker, so the rows go in once.
    """
    markers.ensure_table()  # DDL is refused inside a transaction
    statements = publish_sql(c, target, [p], by_insert=True)
    with _session(target, publish_session(p.xid)) as s:
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


def publish_partitions(target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> bool:
    """Driver, once per batch commit (``visibility=partition``, no views): publish ``ps``
    with the batch's requests batched.

    One read of the batch's markers; for the stages without one, one read of their
    COMMENTs and one of their partitions (:func:`publish_sql`), their MOVEs
    :data:`MOVES_AT_ONCE` at a time (:func:`run_moves`), one INSERT of every marker,
    and one ``DROP ... SYNC`` of every stage. Each request's effect is the one the
    per-xid commit (:meth:`~clickhouse_tx.modes.staging.mode.StagingMode.commit`) makes, in
    the same order per stage (MOVEs, marker, drop), so a crash anywhere leaves what that
    commit rolls forward: a stage whose partitions are moved, or some of them, and no
    marker yet. ``before_commit`` runs after the batch's first MOVE (the test-only
    fault hooks: the batch is then part moved, no marker written).

    Returns
    -------
    bool
        Whether the stages were dropped. Once every marker is in, the batch is
        published whatever the DROP does: a DROP that failed (ClickHouse restarting
        under it, its reply lost) leaves the stages to the per-xid commits, which find
        the markers and drop them.

    Raises
    ------
    NotCommittedError
        A stage is gone with no marker (then the per-xid commits decide, stage by stage).
    OutcomeUnknownError
        A request's reply was lost before every marker was in: the commit stops in
        doubt, as a per-xid one would.
    """
    with ClickHouseHTTP(target) as c:
        markers = CommitMarkers(target, c)
        done = {str(m["xid"]) for m in markers.list(ps[0].txn_id, ps[0].batch)}
        todo = [p for p in ps if p.xid not in done]
        if todo:
            moves = publish_sql(c, target, todo, by_insert=False)
            if moves:
                c.command(moves[0])
                if before_commit is not None:
                    before_commit()
                run_moves(target, moves[1:])
            markers.ensure_table()
            c.command(markers.insert_sql(*todo))
        stages = [n for p in ps for n in (dead_letter_stage_name(p.xid), stage_name(p.xid))]
        names = [q.qualified(target.database, n) for n in stages]
        # SYNC, as every drop of a stage: without it a Replicated stage keeps its Keeper
        # path until the server's delayed drop (a replay's stage of the same name would
        # collide with it), and an Atomic database keeps its files as long. It used to
        # be left out so the commit would not wait for the stages' files; that wait is
        # small, as the moved stages hold only empty covering parts and the parts the
        # MOVEs outdated, and one request drops them all: 32 stages took 73-93 ms with
        # SYNC and 7-8 ms without, in a batch commit of 0.5-1.0 s (embedded stack).
        try:
            c.command(f"DROP TABLE IF EXISTS {', '.join(names)} SYNC", idempotent=True)
        except ClickHouseTxError as exc:
            log.info("batch %d published; its stages are dropped one by one (%s)", ps[0].batch, exc)
            return False
        return True


def run_moves(target: Target, moves: Sequence[str], at_once: int = MOVES_AT_ONCE) -> None:
    """Driver: send ``moves`` (each a stage's own partition), ``at_once`` at a time.

    Each worker sends its share one after the other on its own connection. Every MOVE
    is sent even if one fails (a stage moved in part is what a crash leaves too, and
    the per-xid commits finish it); then a lost reply is raised first, since the
    commit must stop in doubt on it, else the first error.
    """
    if not moves:
        return
    workers = max(1, min(at_once, len(moves)))

    def send(share: Sequence[str]) -> list[ClickHouseTxError]:
        errors: list[ClickHouseTxError] = []
        with ClickHouseHTTP(target) as c:
            for sql in share:
                try:
                    c.command(sql)
                except ClickHouseTxError as exc:
                    errors.append(exc)
        return errors

    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="clickhouse-tx-move") as pool:
        shares = [moves[i::workers] for i in range(workers)]
        errors = [e for found in pool.map(send, shares) for e in found]
    if errors:
        raise next((e for e in errors if isinstance(e, OutcomeUnknownError)), errors[0])


def publish_batch(
    target: Target, ps: Sequence[Prepared], *, by_insert: bool, before_commit: Hook | None = None
) -> None:
    """Driver, once per batch commit, before the per-xid commits: publish ``ps`` at once
    (mode staging with ``visibility=batch``). Inside one transaction: MOVE every
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
    batch = ps[0].batch
    markers = CommitMarkers(target)
    markers.ensure_table()  # DDL is refused inside a transaction
    deadline = time.monotonic() + LOCKED_PARTS_WAIT_S
    with _session(target, batch_session(ps[0].txn_id, batch)) as c:
        if settle_session(c):  # a dead attempt's transaction was open: its MOVEs left locks
            wait_for_unlocked_stages(target, ps, deadline)
        while True:
            try:
                _publish(c, target, markers, ps, by_insert, before_commit)
                return
            except ServerBusyError as exc:
                if time.monotonic() >= deadline:
                    raise NotCommittedError(
                        f"batch {batch}: stage parts stayed locked for {LOCKED_PARTS_WAIT_S:.0f} s ({exc.message})",
                        xid=ps[0].xid,
                    ) from exc
                log.info("batch %d: waiting for locked stage parts (%s)", batch, exc.message)
                wait_for_unlocked_stages(target, ps, deadline)
            except NotCommittedError:
                # The per-xid commits take over: the MOVEs a rollback just undid must be free.
                wait_for_unlocked_stages(target, ps, deadline)
                raise


def wait_for_unlocked_stages(target: Target, ps: Sequence[Prepared], deadline: float) -> None:
    """Wait (outside the batch's session) until no stage of ``ps`` holds a rolled-back MOVE's part.

    A MOVE that a transaction rolled back leaves an outdated copy of the part in the
    stage (``remove_time`` zero); until ClickHouse's cleanup removes it, a MOVE of that
    partition fails with PART_IS_TEMPORARILY_LOCKED. Retrying inside a transaction
    meanwhile would MOVE, then roll back, the stages that are free, and lock them
    again: so wait for all of them first.
    """
    names = [n for p in ps for n in (stage_name(p.xid), dead_letter_stage_name(p.xid))]
    # A client of its own: a read in the batch's session would hold it, and the
    # partitions' parallel per-xid commits all settle that session.
    with ClickHouseHTTP(target) as c:
        _poll_locked_parts(c, target.database, names, deadline)


def _poll_locked_parts(c: ClickHouseHTTP, database: str, names: list[str], deadline: float) -> None:
    while time.monotonic() < deadline:
        rows = c.query_json(  # the names in the body: more of them than a URL holds
            "SELECT count() AS n FROM system.parts WHERE database = {d:String} "
            f"AND table IN {q.quote_strings(names)} AND NOT active AND remove_time = toDateTime(0)",
            params={"d": database},
        )
        if not rows or int(rows[0]["n"]) == 0:
            return
        time.sleep(1.0)


def _publish(
    c: ClickHouseHTTP,
    target: Target,
    markers: CommitMarkers,
    ps: Sequence[Prepared],
    by_insert: bool,
    before_commit: Hook | None,
) -> None:
    """One attempt of :func:`publish_batch` in the batch's session ``c`` (settled)."""
    done = {str(m["xid"]) for m in markers.list(ps[0].txn_id, ps[0].batch)}
    todo = [p for p in ps if p.xid not in done]
    if not todo:
        return
    statements = publish_sql(c, target, todo, by_insert=by_insert)
    statements.append(markers.insert_sql(*todo))
    try:
        c.command("BEGIN TRANSACTION")
        for sql in statements:
            c.command(sql)
        if before_commit is not None:
            before_commit()
        c.command("COMMIT")
    except ClickHouseTxError as exc:
        _after_failed_batch_commit(c, markers, todo, exc)


def _after_failed_batch_commit(
    c: ClickHouseHTTP, markers: CommitMarkers, todo: Sequence[Prepared], exc: ClickHouseTxError
) -> None:
    """Settle the batch's session, then the markers say whether the COMMIT landed.

    A refusal before running (:class:`ServerBusyError`) is raised again as it is, once
    the session is settled, for :func:`publish_batch` to wait and try again.
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


def settle_batch_of(target: Target, p: Prepared, plan: dict[str, Any]) -> bool:
    """Before a per-xid MOVE of a ``visibility=batch`` stage: end the batch's transaction.

    A driver that died inside :func:`publish_batch` leaves its transaction open
    (until :data:`BATCH_SESSION_TIMEOUT_S`); its MOVEs hide the stage's partitions
    from a plain read, so a per-xid commit (``recover``) would move nothing and
    write the marker of rows that the rollback then takes back. True if a
    transaction was rolled back (the caller starts over); either way the stage's
    parts are unlocked when it returns.
    """
    session = plan.get("clickhouse_tx_batch_session")
    if not isinstance(session, str):
        return False
    with _session(target, session) as c:
        rolled_back = settle_session(c)
        # Also when another xid's commit rolled it back: this stage's parts may still be locked.
        wait_for_unlocked_stages(target, [p], time.monotonic() + LOCKED_PARTS_WAIT_S)
    return rolled_back


def publish_sql(c: ClickHouseHTTP, target: Target, ps: Sequence[Prepared], *, by_insert: bool) -> list[str]:
    """The statements publishing every stage and dead-letter stage of ``ps`` (read before BEGIN).

    MOVEs, or with materialized views on the target (``by_insert``)
    ``INSERT ... SELECT``s, which the views see (dead letters too: an INSERT that a
    rollback undoes leaves no locked part behind, unlike a MOVE). Two reads for the
    whole batch (the stages' COMMENTs, their partitions with rows), not two per
    stage: they run while the batch waits for its commit.
    """
    publish = insert_sql if by_insert else moves_sql
    db = target.database
    names = [n for p in ps for n in (stage_name(p.xid), dead_letter_stage_name(p.xid))]
    # The names go in the body, not as a parameter in the URL: a batch of hundreds of
    # partitions names more stages than a URL holds.
    listed = q.quote_strings(names)
    comments = {
        str(r["name"]): str(r["comment"])
        for r in c.query_json(
            f"SELECT name, comment FROM system.tables WHERE database = {{d:String}} AND name IN {listed}",
            params={"d": db},
        )
    }
    partitions: dict[str, list[str]] = {}
    for r in c.query_json(
        "SELECT DISTINCT table, partition_id FROM system.parts WHERE database = {d:String} "
        f"AND table IN {listed} AND active AND rows > 0 ORDER BY table, partition_id",
        params={"d": db},
    ):
        partitions.setdefault(str(r["table"]), []).append(str(r["partition_id"]))
    out: list[str] = []
    for p in ps:
        stage, dl = stage_name(p.xid), dead_letter_stage_name(p.xid)
        if stage not in comments:
            raise NotCommittedError(f"stage table {db}.{stage} is gone and no marker exists", xid=p.xid)
        out += publish(db, stage, partitions.get(stage, []), q.qualified(target.database, target.table))
        into = plan_of(comments.get(dl)).get("clickhouse_tx_into")
        if isinstance(into, list) and len(into) == 2:
            out += publish(db, dl, partitions.get(dl, []), q.qualified(*into))
    return out


def moves_sql(database: str, name: str, pids: Sequence[str], into: str) -> list[str]:
    """One ``MOVE PARTITION`` of stage ``name`` per partition id of ``pids``."""
    return [move_sql(database, name, pid, into) for pid in pids]


def insert_sql(database: str, name: str, pids: Sequence[str], into: str) -> list[str]:
    """One ``INSERT ... SELECT`` of stage ``name`` (none if it holds no rows).

    An INSERT the server contract keeps whole (:attr:`~clickhouse_tx.client.contract.InsertKind.KEEP`,
    set by the client): a target with a deduplication window would otherwise drop a
    block equal to an earlier one (the same rows written by two batches), which a
    MOVE never did.
    """
    if not pids:
        return []
    return [f"INSERT INTO {into} SELECT * FROM {q.qualified(database, name)}"]
