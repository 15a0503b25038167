"""A batch job made visible in one step: its stage moved into the target in one ClickHouse transaction.

A batch job (``df.write``) in modes ``transaction``, ``staging`` and ``dedup`` writes
every partition into a **job stage**, a table created ``AS`` the target for this job
alone, through the normal two-phase commit (so retried and speculative tasks are
exactly-once in the stage). Nothing of the job is visible in the target until
:func:`publish_job`, on the driver, once per job, after the stage committed:

1. ``BEGIN TRANSACTION`` in a session of the job's own;
2. if the ``idempotence_key`` was recorded meanwhile (another run of the same job),
   ``ROLLBACK`` and report :attr:`Published.SKIPPED`;
3. ``ALTER TABLE <stage> MOVE PARTITION ID ... TO TABLE <target>`` for every partition
   of the stage (and of the dead-letter stage, into the dead-letter table);
4. one row in :data:`JOBS_TABLE` (the job's transactional id, its key, its rows);
5. ``COMMIT``.

The job row is the durable proof that the job is visible, as an xid's marker is for a
partition: a COMMIT whose reply was lost is settled by reading it, never by publishing
again. So a job stopped anywhere before the COMMIT leaves nothing in the target, and a
plain re-run writes each row once; the only window a re-run cannot tell apart is after
the COMMIT and before Spark's ``commit`` returned, which the ``idempotence_key`` closes.

Pure SQL text and I/O through the one transport; no Spark.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Any, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP, reuse_or_open
from clickhouse_tx.conversion.schema import TableInfo, describe_table
from clickhouse_tx.errors import ClickHouseTxError, NotCommittedError, OutcomeUnknownError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import Hook, Target
from clickhouse_tx.modes.staging.tables import settle_session
from clickhouse_tx.modes.views import dependent_views
from clickhouse_tx.store.markers import CommittedReader

log = logging.getLogger("clickhouse_tx.publish")

#: One row per published batch job, in the target's database.
JOBS_TABLE = "clickhouse_tx_jobs"
#: Idle seconds after which the server rolls back a publishing transaction whose driver died.
PUBLISH_SESSION_TIMEOUT_S = 60

_JOBS_COLUMNS = (
    ("txn_id", "String"),
    ("idempotence_key", "String"),
    ("table", "String"),
    ("rows", "UInt64"),
    ("committed_at", "DateTime64(3)"),
)


class Published(str, enum.Enum):
    """What :func:`publish_job` did."""

    PUBLISHED = "published"  # this call's COMMIT made the job visible
    ALREADY = "already"  # the job's row was there: an earlier attempt published it
    SKIPPED = "skipped"  # another job recorded the same idempotence key first


@dataclasses.dataclass(frozen=True)
class JobStage:
    """Where one batch job's rows wait until :func:`publish_job` (picklable, names only).

    Attributes
    ----------
    txn_id
        The job's transactional id (its row in :data:`JOBS_TABLE`).
    stage
        The stage table, in the target's database, created ``AS`` the target.
    dead_letter_stage
        ``(stage, dead-letter table)`` when the job sets rows aside (``bad_rows=dead_letter``).
    idempotence_key
        The user's key for the job ('' for none).
    views
        The materialized views that read the target (``db.view``): the stage is then
        published by ``INSERT ... SELECT``, which runs them, instead of ``MOVE PARTITION``,
        which does not.
    """

    txn_id: str
    stage: str
    dead_letter_stage: tuple[str, tuple[str, str]] | None = None
    idempotence_key: str = ""
    views: tuple[str, ...] = ()

    def stages(self) -> list[str]:
        """Every table this job created (the dead-letter stage first)."""
        return ([self.dead_letter_stage[0]] if self.dead_letter_stage else []) + [self.stage]


@dataclasses.dataclass(frozen=True)
class Publishability:
    """Whether a job into a target can be published at once, and how (:func:`publishability`).

    ``refused``: why not (None: it can). ``views``: the materialized views an insert
    into the target runs (``db.view``), which the publishing ``INSERT ... SELECT`` runs
    once, in the same transaction.
    """

    refused: str | None
    views: tuple[str, ...] = ()


def publishability(c: ClickHouseHTTP, target: Target, info: TableInfo) -> Publishability:
    """Whether a job into ``target`` can be published in one transaction (driver, once per batch job).

    ClickHouse transactions take non-replicated ``*MergeTree`` tables only, on a server
    with ``allow_experimental_transactions`` (probed with an implicit transaction, which
    leaves nothing open): the target, and every table its materialized views write into.

    Parameters
    ----------
    c
        The job's session-less client: the probe and the views' reads run on it.
    target
        The user's table.
    info
        ``target`` as the caller described it (:func:`describe_table`), once per job.
    """
    if not info.is_merge_tree or info.is_replicated:
        return Publishability(
            f"table {info.display} has engine {info.engine} (transactions take non-replicated *MergeTree)"
        )
    try:
        c.command("SELECT 1", settings={"implicit_transaction": 1}, idempotent=True)
    except ClickHouseTxError as exc:
        return Publishability(f"the server refused a transaction ({exc.message})")
    views = dependent_views(target, c)
    for v in views:
        into = describe_table(c, *v.target) if v.target is not None else None
        if into is None or not into.is_merge_tree or into.is_replicated:
            what = f"{into.display} is {into.engine}" if into else "the server does not say which table"
            return Publishability(
                f"materialized view {v.display} writes into a table a transaction cannot hold ({what})"
            )
    return Publishability(None, tuple(f"{v.view[0]}.{v.view[1]}" for v in views))


class JobRecords:
    """The published jobs of one database (:data:`JOBS_TABLE`); read-committed reads.

    ``client``: a session-less client for the DDL and the reads outside a transaction
    (the caller's, left open); None: one of ``target``'s per call, closed after.
    """

    def __init__(self, target: Target, client: ClickHouseHTTP | None = None) -> None:
        self.target = target
        self.client = client
        self.table = q.qualified(target.database, JOBS_TABLE)

    def ensure_table(self) -> None:
        """``CREATE TABLE IF NOT EXISTS`` (driver, once per job; DDL is refused inside a transaction)."""
        with reuse_or_open(self.target, self.client) as c:
            c.command(
                q.record_table_ddl(self.table, _JOBS_COLUMNS, ("table", "idempotence_key", "txn_id")), idempotent=True
            )

    def _one(
        self, where: str, params: Mapping[str, object], client: ClickHouseHTTP | None = None
    ) -> dict[str, Any] | None:
        sql = f"SELECT * FROM {self.table} WHERE {where} ORDER BY committed_at LIMIT 1"
        if client is not None:  # inside the publishing transaction: its snapshot, no setting
            rows = client.query_json(sql, params=params)
        else:
            with reuse_or_open(self.target, self.client) as c:
                rows = CommittedReader(c).query_json(sql, params)
        return rows[0] if rows else None

    def by_key(self, key: str, client: ClickHouseHTTP | None = None) -> dict[str, Any] | None:
        """The job that recorded ``key`` for this table first, or None."""
        params = {"k": key, "t": _display(self.target)}
        return self._one("idempotence_key = {k:String} AND `table` = {t:String}", params, client)

    def by_txn(self, txn_id: str) -> dict[str, Any] | None:
        """The row of job ``txn_id``, or None (not published, or not yet)."""
        return self._one("txn_id = {x:String}", {"x": txn_id})

    def insert_sql(self, job: JobStage, rows: int) -> str:
        values = ", ".join(
            (
                q.quote_string(job.txn_id),
                q.quote_string(job.idempotence_key),
                q.quote_string(_display(self.target)),
                str(int(rows)),
                "now64(3)",
            )
        )
        return f"INSERT INTO {self.table} VALUES ({values})"


def _display(target: Target) -> str:
    return f"{target.database}.{target.table}"


def job_session(txn_id: str) -> str:
    """The session of job ``txn_id``'s publishing transaction (one per job)."""
    return f"clickhouse_tx_job_{sanitize_txn(txn_id)}"


def _publish_statements(c: ClickHouseHTTP, target: Target, job: JobStage) -> list[str]:
    """What publishes the job's stages (read before BEGIN: DDL-free, in the transaction after it).

    ``MOVE PARTITION`` of every partition with rows; with views on the target, one
    ``INSERT ... SELECT`` of the stage instead, so the views see each row once, in the
    same transaction, an INSERT the server contract keeps whole (the stage holds each row
    once already; :mod:`clickhouse_tx.client.contract`).
    """
    into = {job.stage: (target.database, target.table)}
    if job.dead_letter_stage:
        into[job.dead_letter_stage[0]] = job.dead_letter_stage[1]
    rows = c.query_json(
        "SELECT DISTINCT table, partition_id FROM system.parts WHERE database = {d:String} "
        "AND table IN {t:Array(String)} AND active AND rows > 0 ORDER BY table, partition_id",
        params={"d": target.database, "t": list(into)},
    )
    moves = [
        f"ALTER TABLE {q.qualified(target.database, str(r['table']))} MOVE PARTITION ID "
        f"{q.quote_string(str(r['partition_id']))} TO TABLE {q.qualified(*into[str(r['table'])])}"
        for r in rows
        if not (job.views and r["table"] == job.stage)
    ]
    if job.views and any(r["table"] == job.stage for r in rows):
        moves.insert(0, _insert_select(c, target, job.stage))
    return moves


def _insert_select(c: ClickHouseHTTP, target: Target, stage: str) -> str:
    """``INSERT INTO <target> (cols) SELECT cols FROM <stage>``, over the columns an INSERT takes."""
    cols = c.query_json(
        "SELECT name FROM system.columns WHERE database = {d:String} AND table = {t:String} "
        "AND default_kind NOT IN ('MATERIALIZED', 'ALIAS', 'EPHEMERAL') ORDER BY position",
        params={"d": target.database, "t": target.table},
    )
    names = ", ".join(q.quote_identifier(str(r["name"])) for r in cols)
    return (
        f"INSERT INTO {q.qualified(target.database, target.table)} ({names}) SELECT {names} "
        f"FROM {q.qualified(target.database, stage)}"
    )


def publish_job(target: Target, job: JobStage, rows: int, before_commit: Hook | None = None) -> Published:
    """Make the job's stage visible in ``target`` at once (driver, once per job, after the stage committed).

    Parameters
    ----------
    target
        The user's table.
    job
        The job's stages and key.
    rows
        The rows the stage committed (recorded with the job).
    before_commit
        Runs inside the transaction just before its COMMIT (the test-only fault hooks).

    Raises
    ------
    NotCommittedError
        The transaction was refused or rolled back: nothing of the job is visible.
    OutcomeUnknownError
        The COMMIT's reply was lost and the job's row could not be read.
    """
    records = JobRecords(target)
    if records.by_txn(job.txn_id) is not None:
        return Published.ALREADY
    with ClickHouseHTTP(target, session_id=job_session(job.txn_id), session_timeout=PUBLISH_SESSION_TIMEOUT_S) as c:
        statements = _publish_statements(c, target, job)
        try:
            c.command("BEGIN TRANSACTION")
            if job.idempotence_key and records.by_key(job.idempotence_key, client=c) is not None:
                c.command("ROLLBACK")
                return Published.SKIPPED
            for sql in [*statements, records.insert_sql(job, rows)]:
                c.command(sql)
            if before_commit is not None:
                before_commit()
            c.command("COMMIT")
            return Published.PUBLISHED
        except ClickHouseTxError as exc:
            return _after_failed_publish(c, records, job, exc)


def _after_failed_publish(c: ClickHouseHTTP, records: JobRecords, job: JobStage, exc: ClickHouseTxError) -> Published:
    """Settle the session, then the job's row says whether the COMMIT took effect, whatever the error."""
    try:
        settle_session(c)
        found = records.by_txn(job.txn_id)
    except ClickHouseTxError as again:
        raise OutcomeUnknownError(
            f"job {job.txn_id}: publishing failed ({type(exc).__name__}: {exc}) and its outcome "
            f"could not be read ({again}); `python -m clickhouse_tx status` after the server is back tells",
            xid=job.txn_id,
        ) from exc
    # Settled: the transaction is over, so the row is there exactly when the COMMIT took effect.
    if found is not None:
        log.info("job %s: the publishing COMMIT took effect although it failed (%s)", job.txn_id, exc)
        return Published.PUBLISHED
    raise NotCommittedError(
        f"job {job.txn_id}: the transaction publishing the job was rolled back, nothing of it is "
        f"visible ({type(exc).__name__}: {exc})",
        xid=job.txn_id,
    ) from exc


def drop_stages(target: Target, job: JobStage, client: ClickHouseHTTP | None = None) -> None:
    """``DROP TABLE IF EXISTS ... SYNC`` for the job's stages (driver; idempotent).

    ``client``: a session-less client to run them on (the caller's, left open); None:
    one of ``target``'s, closed after.
    """
    with reuse_or_open(target, client) as c:
        for name in job.stages():
            c.command(f"DROP TABLE IF EXISTS {q.qualified(target.database, name)} SYNC", idempotent=True)


__all__: Sequence[str] = [
    "JOBS_TABLE",
    "JobRecords",
    "JobStage",
    "Published",
    "Publishability",
    "publishability",
    "drop_stages",
    "publish_job",
    "job_session",
]
