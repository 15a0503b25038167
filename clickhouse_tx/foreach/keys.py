"""A micro-batch written once, keyed by ``(app_id, batch_id, tables)``: its rows and its key row in one transaction.

What the exactly-once ``foreachBatch`` helper (:mod:`spark_datasource.foreach.write`, on
the driver, once per micro-batch and call) stands on. Delta Lake's ``txnAppId``/``txnVersion``
idea, with the key written in the same ClickHouse transaction as the rows. The key names
the tables the call writes (:class:`~clickhouse_tx.foreach.key_check.BatchKey`, which
says why): two calls of one micro-batch into other tables are two keys, each written once.

1. :meth:`BatchRecords.recorded` reads the key table :data:`BATCHES_TABLE` of the
   target database, read-committed (``implicit_transaction = 1``): a row of the batch
   naming exactly the call's tables means the call is visible, and it is skipped; a row
   of the same ``app_id`` written by another streaming query (another checkpoint, whose
   batch ids restarted at 0), or one naming some of the call's tables among others, is
   refused (:func:`~clickhouse_tx.foreach.key_check.check_recorded`, pure).
   Before it, :func:`settle_key` ends what an earlier attempt left in the key's HTTP
   session (:func:`key_session`, named by the key): a driver killed inside its
   transaction left it open, its rows seen by plain reads until the session expired
   (an hour by default), and ``DROP ... SYNC`` of its tables waiting; its ROLLBACK now
   comes from the replay, and a COMMIT still running is waited out.
2. :func:`write_batch`: ``BEGIN TRANSACTION`` in the key's session, its ``transactionID()``
   read, one streamed ``INSERT ... FORMAT ArrowStream`` per table (and the dead letters the
   conversion set aside), each after checking the session still runs that transaction,
   one key row naming this attempt (:func:`attempt_id`), ``COMMIT``. Any error before the
   COMMIT rolls the transaction back: nothing of the batch is visible. The key row is
   fenced by the transaction, not the session: it is ``INSERT ... SELECT ... WHERE
   toString(transactionID()) = <BEGIN's>``, so after another attempt's ROLLBACK in the
   shared session it inserts nothing, where a plain INSERT would commit a key row on its
   own, without its rows, and the restart would skip the batch.
3. A COMMIT that fails in any way (its reply lost included) is settled, never sent
   again (:func:`settle_commit`): the session's transaction is ended, then this
   attempt's key row says whether the COMMIT took effect. If it cannot be read,
   :class:`~clickhouse_tx.errors.OutcomeUnknownError` names the key.

Two writers of the same key at the same moment are not serialised (ClickHouse
transactions do not conflict on inserts): a streaming query runs one micro-batch at a
time, and Spark refuses to run two queries on one checkpoint. Were two to run anyway,
the second's :func:`settle_key` rolls back the first's open transaction, which then
fails (its key row, fenced, is not written): never both written. Needs non-replicated
``*MergeTree`` tables and a server with transactions on, like mode ``transaction``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import uuid
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP, reuse_or_open
from clickhouse_tx.conversion.checksum import CountingBatches, combine, finish
from clickhouse_tx.conversion.dead_letters import write_dead_letters
from clickhouse_tx.errors import ClickHouseTxError, NotCommittedError, OutcomeUnknownError
from clickhouse_tx.foreach.key_check import BatchKey, check_recorded
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import Hook, Target, WriteContext
from clickhouse_tx.modes.base import peek_schema
from clickhouse_tx.modes.session_keepalive import NO_TRANSACTION_ID
from clickhouse_tx.modes.staging.tables import settle_session
from clickhouse_tx.store.markers import CommittedReader

log = logging.getLogger("clickhouse_tx.spark.foreach_batch")

#: One row per written micro-batch, in the target's database.
BATCHES_TABLE = "clickhouse_tx_batches"

_COLUMNS = (
    ("app_id", "String"),
    ("batch_id", "UInt64"),
    ("query_id", "String"),
    ("checkpoint", "String"),
    ("attempt", "String"),
    ("tables", "Array(String)"),
    ("rows", "UInt64"),
    ("checksum", "UInt64"),
    ("committed_at", "DateTime64(3)"),
)
_SELECT = ", ".join(q.quote_identifier(n) for n, _ in _COLUMNS)


@dataclasses.dataclass(frozen=True)
class TableRows:
    """Rows of one micro-batch for one table: ``batches`` is read once, while it is sent."""

    database: str
    table: str
    batches: Iterable[pa.RecordBatch]

    @property
    def display(self) -> str:
        return f"{self.database}.{self.table}"


class BatchRecords:
    """The key table of one database: DDL, read-committed reads, the key row's INSERT.

    ``client``: a session-less client for the DDL and the reads (the caller's, left
    open); None: one of ``target``'s per call, closed after.
    """

    def __init__(self, target: Target, client: ClickHouseHTTP | None = None) -> None:
        self.target = target
        self.client = client
        self.table = q.qualified(target.database, BATCHES_TABLE)

    def ensure_table(self) -> None:
        """``CREATE TABLE IF NOT EXISTS`` (driver, once per micro-batch; DDL is refused inside a transaction)."""
        with reuse_or_open(self.target, self.client) as c:
            c.command(q.record_table_ddl(self.table, _COLUMNS, ("app_id", "batch_id")), idempotent=True)

    def _read(self, where: str, params: Mapping[str, object]) -> list[dict[str, Any]]:
        sql = f"SELECT {_SELECT} FROM {self.table} WHERE {where} ORDER BY committed_at LIMIT 100"
        with reuse_or_open(self.target, self.client) as c:
            return CommittedReader(c).query_json(sql, params)

    def recorded(self, key: BatchKey) -> Mapping[str, Any] | None:
        """The key's committed row (skip the batch) or None (write it); see :func:`check_recorded`."""
        rows = self._read(
            "app_id = {a:String} AND (batch_id = {b:UInt64} OR query_id != {q:String})",
            {"a": key.app_id, "b": key.batch_id, "q": key.query_id},
        )
        return check_recorded(rows, key)

    def by_attempt(self, key: BatchKey, attempt: str) -> Mapping[str, Any] | None:
        """The row ``attempt`` wrote for ``key``, once committed; else None."""
        rows = self._read(
            "app_id = {a:String} AND batch_id = {b:UInt64} AND attempt = {t:String}",
            {"a": key.app_id, "b": key.batch_id, "t": attempt},
        )
        return rows[0] if rows else None

    def insert_sql(
        self, key: BatchKey, attempt: str, tables: Sequence[str], rows: int, checksum: int, fence: str | None = None
    ) -> str:
        """The key row's ``INSERT``.

        ``fence``: the ``transactionID()`` text of the batch's transaction (mode
        ``transaction``). The row is then inserted only while the session still runs that
        transaction: after another attempt's ROLLBACK in the shared session the INSERT
        would otherwise run on its own and commit a key row without its rows.
        """
        values = (
            q.quote_string(key.app_id),
            str(int(key.batch_id)),
            q.quote_string(key.query_id),
            q.quote_string(key.checkpoint),
            q.quote_string(attempt),
            "[" + ", ".join(q.quote_string(t) for t in tables) + "]",
            str(int(rows)),
            str(int(checksum)),
            "now64(3)",
        )
        if fence is None:
            return f"INSERT INTO {self.table} ({_SELECT}) VALUES ({', '.join(values)})"
        where = f"toString(transactionID()) = {q.quote_string(fence)}"
        return f"INSERT INTO {self.table} ({_SELECT}) SELECT {', '.join(values)} WHERE {where}"


def batch_prefix(key: BatchKey) -> str:
    """``clickhouse_tx_fb_<app_id>_<batch_id>`` (safe characters): what names the batch's dedup tokens."""
    return f"clickhouse_tx_fb_{sanitize_txn(key.app_id)}_{key.batch_id}"


def key_session(key: BatchKey) -> str:
    """The HTTP session of ``key``'s transaction: every attempt at the key (its tables
    included, by a digest of their names) writes in it."""
    if not key.tables:
        return batch_prefix(key)
    digest = hashlib.sha256("\n".join(key.tables).encode()).hexdigest()[:8]
    return f"{batch_prefix(key)}_{digest}"


def attempt_id(key: BatchKey) -> str:
    """A fresh id of one attempt at writing ``key``: its key row's and its tokens' (safe characters)."""
    return f"{key_session(key)}_{uuid.uuid4().hex[:12]}"


def settle_key(target: Target, key: BatchKey) -> None:
    """Driver, before a micro-batch's key is read: end what an earlier attempt left in
    :func:`key_session` (ROLLBACK an open transaction, wait for a running COMMIT), so the
    key row read next is final. Raises :class:`OutcomeUnknownError` when a COMMIT runs on."""
    with ClickHouseHTTP(target, session_id=key_session(key), session_timeout=target.session_timeout_s) as c:
        if settle_session(c):
            log.warning("clickhouse_tx: %s: rolled back the transaction an earlier attempt left open", key)


def write_batch(target: Target, key: BatchKey, parts: Sequence[TableRows], before_commit: Hook | None = None) -> int:
    """Write ``parts`` and ``key``'s row in one ClickHouse transaction (driver, once per micro-batch).

    Parameters
    ----------
    target
        Connection, settings and timeouts; the key table lives in ``target.database``.
    key
        The micro-batch (checked beforehand with :meth:`BatchRecords.recorded`).
    parts
        The rows per table, each streamed into its own INSERT.
    before_commit
        Runs inside the transaction just before its COMMIT (tests).

    Returns
    -------
    int
        The rows written (dead letters not counted).

    Raises
    ------
    NotCommittedError
        Nothing of the batch is visible (any error before the COMMIT is re-raised as it is).
    OutcomeUnknownError
        The COMMIT failed and the key row could not be read.
    """
    key = key.scoped(p.display for p in parts)
    records = BatchRecords(target)
    attempt = attempt_id(key)
    with ClickHouseHTTP(target, session_id=key_session(key), session_timeout=target.session_timeout_s) as c:
        c.command("BEGIN TRANSACTION")
        try:
            tid = _require_open_transaction(c, key)
            rows, checksum = _insert_parts(c, key, attempt, parts, tid)
            tables = list(dict.fromkeys(p.display for p in parts))
            c.command(records.insert_sql(key, attempt, tables, rows, checksum, fence=tid), session_check=True)
            if before_commit is not None:
                before_commit()
        except BaseException:
            with contextlib.suppress(ClickHouseTxError):
                settle_session(c)  # ROLLBACK; the session expires anyway
            raise
        try:
            c.command("COMMIT", session_check=True)
        except ClickHouseTxError as exc:
            settle_commit(c, records, key, attempt, exc)
    return rows


def _insert_parts(
    c: ClickHouseHTTP, key: BatchKey, attempt: str, parts: Sequence[TableRows], tid: str
) -> tuple[int, int]:
    """Every part's INSERT (and dead letters) in ``c``'s transaction ``tid``: (rows, checksum)."""
    rows, total = 0, 0
    for i, part in enumerate(parts):
        schema, batches = peek_schema(iter(part.batches))
        counted = CountingBatches(batches)
        if schema is not None:
            _require_open_transaction(c, key, tid)
            # A token unique to this attempt and part: block dedup is not transactional, and a
            # rolled-back attempt's block hashes would drop the replay's identical blocks.
            token = f"{attempt}:{i}"
            c.insert_arrow_stream(
                q.qualified(part.database, part.table), schema, counted, settings={"insert_deduplication_token": token}
            )
        ctx = WriteContext(txn_id=key.app_id, batch=key.batch_id, partition=i, attempt=0)
        dead = f"{attempt}:{i}:dead_letters"
        write_dead_letters(c, part.batches, table=part.display, ctx=ctx, xid=attempt, token=dead)
        rows += counted.rows
        total = combine(total, counted.checksum)
    return rows, finish(total)


def _require_open_transaction(c: ClickHouseHTTP, key: BatchKey, tid: str | None = None) -> str:
    """The session still holds its transaction, ``tid`` when given (and its idle timer restarts);
    the transaction's id.

    An INSERT in a session that expired would open a new session and commit on its own,
    and one after another attempt's ROLLBACK (and maybe BEGIN) in the shared session would
    commit on its own or in that attempt's transaction: checked right before each one,
    with ``session_check`` so a gone session fails.
    """
    now = c.command("SELECT transactionID()", session_check=True).strip()
    if now == NO_TRANSACTION_ID or (tid is not None and now != tid):
        raise NotCommittedError(f"{key}: the batch's transaction is gone before its INSERT", xid=c.session_id)
    return now


def settle_commit(
    c: ClickHouseHTTP, records: BatchRecords, key: BatchKey, attempt: str, exc: ClickHouseTxError
) -> None:
    """After a failed COMMIT in ``c``'s session: end the transaction, then read ``attempt``'s key row.

    Returns when the row is there (the COMMIT took effect).

    Raises
    ------
    NotCommittedError
        The transaction was rolled back: nothing of the batch is visible.
    OutcomeUnknownError
        The session or the key row could not be read; it names the key.
    """
    try:
        settle_session(c)
        found = records.by_attempt(key, attempt)
    except ClickHouseTxError as again:
        raise OutcomeUnknownError(
            f"{key}: COMMIT failed ({type(exc).__name__}: {exc}) and its outcome could not be read "
            f"({again}); the row of attempt {attempt!r} in {records.table} tells whether it took effect. "
            "Restarting the query on its checkpoint reads it: the batch is skipped if it did, written if not",
            xid=attempt,
        ) from exc
    if found is not None:
        log.info("clickhouse_tx: %s: the COMMIT took effect although it failed (%s)", key, exc)
        return
    raise NotCommittedError(
        f"{key}: the batch's transaction was rolled back, nothing of it is visible ({type(exc).__name__}: {exc})",
        xid=attempt,
    ) from exc


__all__: Sequence[str] = [
    "BATCHES_TABLE",
    "BatchKey",
    "BatchRecords",
    "TableRows",
    "attempt_id",
    "batch_prefix",
    "check_recorded",
    "key_session",
    "settle_commit",
    "settle_key",
    "write_batch",
]
