"""Mode ``transaction``: ClickHouse MVCC transactions held open in an HTTP session.

prepare (executor, once per partition attempt)
    Open the HTTP session ``session_id = xid`` (``session_timeout`` =
    ``target.session_timeout_s``), ``BEGIN TRANSACTION``, stream the Arrow batches
    as one ``INSERT ... FORMAT ArrowStream``, insert the xid's marker row into
    ``clickhouse_tx_commits`` in the same transaction, and return without
    committing. Any error: ``ROLLBACK`` (best effort) and re-raise.
commit (driver)
    ``COMMIT`` in that session. A lost reply is :class:`OutcomeUnknownError`; a
    session that is gone, or a transaction that is not running any more, is
    resolved by the marker: present = already committed (no-op), absent =
    :class:`NotCommittedError`.
rollback (driver, GC, ``recover``)
    A statement that fails (:data:`FENCE`) in the session: ClickHouse rolls the
    transaction back and the session refuses every later statement until a ROLLBACK,
    so a writer that is still running cannot write in it again. Not ``ROLLBACK``: it
    would leave the session without a transaction, and a running writer's next INSERT
    would then commit on its own. A session that is gone is a no-op.
lookup (driver)
    marker visible (read-committed) -> COMMITTED; else the session still holds a
    running transaction -> PENDING; else NOT_COMMITTED.

Multi-table routing (``target.route_column``): prepare splits every Arrow batch by
that column with ``pyarrow.compute`` (one filter per table present in the batch, no
Python per row), drops the column and buffers the pieces per table, so **the whole
partition is held in memory** in this case. A value that names no table of
``target.route_tables`` (or a null) raises :class:`ConfigurationError` before
anything is sent. Then the one session does BEGIN, one INSERT per table that got
rows (dedup token ``<xid>:<db>.<table>``), one marker row for the xid (``rows`` =
the partition's total) and no COMMIT: commit, rollback and lookup act on the
session and the xid, so they are the same as for one table.

When the executor dies the session expires after ``session_timeout`` and the server
rolls the transaction back; a server restart loses every prepared transaction.
Needs a non-replicated ``*MergeTree`` target and a server with transactions on.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import FUNCTION_THROW_IF_VALUE_IS_NON_ZERO, INVALID_TRANSACTION, SESSION_NOT_FOUND
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.checksum import CountingBatches, batch_checksum, combine, finish
from clickhouse_tx.conversion.dead_letters import write_dead_letters
from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.errors import (
    ConfigurationError,
    NotCommittedError,
    OutcomeUnknownError,
    ReplyLostError,
    ServerError,
    TransientError,
)
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes.base import ModeBase, distributed_hint, peek_schema
from clickhouse_tx.modes.session_keepalive import KEEP_ALIVE, NO_TRANSACTION_ID
from clickhouse_tx.store.markers import CommitMarkers

log = logging.getLogger(__name__)


#: What :meth:`TransactionMode.rollback` runs in another party's session. A statement
#: that fails inside a transaction rolls it back and leaves the session refusing every
#: later statement (INVALID_TRANSACTION) until a ROLLBACK, which only the writer itself
#: sends, on its way out. After a ROLLBACK from the driver, the writer's next INSERT
#: would run outside any transaction and commit on its own
#: (``tests/integration/clickhouse_tx/modes/test_modes.py`` holds it).
FENCE = "SELECT throwIf(1, 'clickhouse_tx: rolled back by the driver; this session writes nothing more')"


class TransactionMode(ModeBase):
    """Exactly-once per partition via one open transaction per xid (the default mode)."""

    mode = Mode.TRANSACTION

    # -- driver --------------------------------------------------------------------------
    def validate(self, target: Target, schema: pa.Schema, info: TableInfo | None = None) -> None:
        """Driver, once per query: table, schema, engine, transactions enabled, the views' tables, markers table."""
        info = self.described(target, schema, info)
        if info.is_replicated or not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'transaction' needs a "
                "non-replicated *MergeTree table (ClickHouse transactions support nothing else); "
                "use mode 'staging' (exactly-once on any MergeTree, incl. Replicated) or 'dedup'"
                + distributed_hint(info)
            )
        self.require_transactions(target, "mode 'transaction'", instead="or use mode 'staging'")
        # The target's materialized views insert inside the partition's transaction:
        # committed with its rows, rolled back with them (docs/modes.md, "Materialized views").
        self.transactional_views(target, "mode 'transaction'")
        self.markers(target).ensure_table()

    # -- executor ------------------------------------------------------------------------
    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: write inside an open transaction."""
        markers = self.markers(target)
        markers.ensure_table()  # DDL is refused inside a transaction: do it first
        if target.route_column:
            return self._prepare_routed(target, ctx, xid, batches, markers)
        converted = batches  # keeps the dead letters the conversion set aside, if any
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        with self._open_transaction(target, xid) as session:
            if schema is not None:
                # Block dedup (non_replicated_deduplication_window) is not transactional:
                # a rolled-back insert leaves its block hashes behind, and the replay's
                # identical blocks would be dropped as duplicates. The server contract
                # turns deduplication off (clickhouse_tx.client.contract); a token unique
                # to this attempt also keys any dedup log on the xid, on a server or
                # profile that deduplicates anyway.
                session.insert_arrow_stream(
                    self.target_sql(target), schema, counted, settings={"insert_deduplication_token": xid}
                )
            letters = write_dead_letters(session, converted, table=self.display(target), ctx=ctx, xid=xid)
            details = {"session_timeout_s": target.session_timeout_s, "dead_letters": letters}
            p = self.prepared_counted(target, ctx, xid, counted, details)
            markers.insert(p, client=session)
            return p

    def _prepare_routed(
        self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch], markers: CommitMarkers
    ) -> Prepared:
        """Executor: split the partition by ``route_column``, then one transaction for all."""
        routed = RoutedBatches(target)
        for b in batches:
            routed.add(b)  # raises on an unknown table before the session is opened
        with self._open_transaction(target, xid) as session:
            for (db, table), parts in routed.parts.items():
                # Same reason as for one table (see prepare), per table of the xid.
                session.insert_arrow_stream(
                    q.qualified(db, table),
                    parts[0].schema,
                    iter(parts),
                    settings={"insert_deduplication_token": f"{xid}:{db}.{table}"},
                )
            p = self.prepared(
                target,
                ctx,
                xid,
                routed.rows,
                finish(routed.checksum_total),
                {"session_timeout_s": target.session_timeout_s, "routed_rows": routed.rows_per_table()},
            )
            markers.insert(p, client=session)
            return p

    @contextlib.contextmanager
    def _open_transaction(self, target: Target, xid: str) -> Iterator[ClickHouseHTTP]:
        """The xid's session with ``BEGIN TRANSACTION`` done; ROLLBACK if the block fails.

        On success the transaction stays open (prepared): the driver commits it.
        """
        session = self.client(target, session_id=xid, session_timeout=target.session_timeout_s)
        try:
            session.command("BEGIN TRANSACTION")
            yield session
        except BaseException:
            _quiet_rollback(session)  # best effort: the session expires anyway
            raise
        finally:
            session.close()
        KEEP_ALIVE.watch(target, xid)

    # -- driver --------------------------------------------------------------------------
    def renew(self, target: Target, p: Prepared) -> bool:
        """Driver, before a batch's decision is written: is ``p``'s transaction still open?

        One request in the xid's session (``session_check=1``, so a gone session is
        not re-created); like every request it restarts the session's idle timer, so
        the session cannot expire between this check and the COMMIT that follows.
        False if the session or its transaction is gone (expired, server restarted).
        """
        session = self.client(target, session_id=p.xid, session_timeout=target.session_timeout_s)
        try:
            tid = session.command("SELECT transactionID()", session_check=True).strip()
        except ServerError as e:
            if e.code in (SESSION_NOT_FOUND, INVALID_TRANSACTION):
                return False
            raise  # SESSION_IS_LOCKED arrives as a (transient) ServerBusyError
        finally:
            session.close()
        return tid != NO_TRANSACTION_ID

    def commit(self, target: Target, p: Prepared) -> None:
        """Driver: COMMIT in the xid's session; idempotent for a committed xid."""
        # A lost reply is resolved by the marker first, which needs no session.
        session = self.client(target, session_id=p.xid, session_timeout=target.session_timeout_s)
        try:
            session.command("COMMIT", session_check=True)
        except ReplyLostError as e:
            raise OutcomeUnknownError(f"COMMIT sent but its reply was lost: {e.message}", xid=p.xid) from None
        except ServerError as e:
            if isinstance(e, TransientError):
                # Refused before running (SESSION_IS_LOCKED: the keep-alive or a late
                # lookup holds the session for a moment; a busy server): retried.
                raise
            if e.code not in (SESSION_NOT_FOUND, INVALID_TRANSACTION):
                # e.g. UNKNOWN_STATUS_OF_TRANSACTION (the server lost touch with Keeper
                # mid-COMMIT): it may have committed; the caller looks it up.
                raise OutcomeUnknownError(f"COMMIT failed: {e.message}", xid=p.xid, code=e.code, name=e.name) from None
            if self.markers(target).lookup(p.xid) is not None:
                return  # committed before (a replayed commit): no-op
            # A failed transaction stays as it is: a ROLLBACK here would reopen the
            # session to its writer's statements outside any transaction (see FENCE).
            raise NotCommittedError(f"cannot commit: {e.message}", xid=p.xid, code=e.code, name=e.name) from None
        finally:
            session.close()

    def rollback(self, target: Target, p: Prepared) -> None:
        """Driver, GC or ``recover``: roll ``p``'s transaction back and fence its session.

        Runs :data:`FENCE` in the session. Afterwards nothing sent in that session can
        become visible: the writer of ``p`` may still be running (a task Spark gave up
        on, a speculative attempt), and its next statement fails with
        INVALID_TRANSACTION. A no-op if the session is gone or its transaction already
        failed; after a COMMIT it changes nothing.
        """
        session = self.client(target, session_id=p.xid, session_timeout=target.session_timeout_s)
        try:
            session.command(FENCE, session_check=True)
        except ServerError as e:
            if e.code not in (FUNCTION_THROW_IF_VALUE_IS_NON_ZERO, SESSION_NOT_FOUND, INVALID_TRANSACTION):
                raise  # SESSION_IS_LOCKED is a (transient) ServerBusyError: rolled back again
        finally:
            session.close()

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        """Driver: COMMITTED (marker), PENDING (transaction still open) or NOT_COMMITTED."""
        if self.markers(target).lookup(p.xid) is not None:
            return CommitOutcome.COMMITTED
        session = self.client(target, session_id=p.xid, session_timeout=target.session_timeout_s)
        try:
            tid = session.command("SELECT transactionID()", session_check=True).strip()
        except ServerError as e:
            if e.code == SESSION_NOT_FOUND:
                return CommitOutcome.NOT_COMMITTED
            if e.code == INVALID_TRANSACTION:  # the transaction failed: it can never commit
                return CommitOutcome.NOT_COMMITTED
            raise  # SESSION_IS_LOCKED (a COMMIT may be running) is a ServerBusyError: looked up again
        finally:
            session.close()
        if tid == NO_TRANSACTION_ID:
            # No open transaction; the marker was checked first, but a COMMIT may have
            # landed between the two reads: look once more.
            if self.markers(target).lookup(p.xid) is not None:
                return CommitOutcome.COMMITTED
            return CommitOutcome.NOT_COMMITTED
        return CommitOutcome.PENDING


class RoutedBatches:
    """One partition's batches split per routed table (executor; holds them in memory).

    Parameters
    ----------
    target
        A routing target: ``route_column`` names the column, ``route_tables`` the
        allowed ``(database, table)`` pairs; a value is ``db.table`` or ``table``
        (then in ``target.database``).
    """

    def __init__(self, target: Target) -> None:
        if not target.route_column:
            raise ValueError("RoutedBatches needs a target with route_column")
        self.column = target.route_column
        self.allowed = [f"{db}.{t}" for db, t in target.route_tables]
        self.spellings: dict[str, tuple[str, str]] = {}
        for db, t in target.route_tables:
            self.spellings[f"{db}.{t}"] = (db, t)
            if db == target.database:
                self.spellings.setdefault(t, (db, t))
        self.parts: dict[tuple[str, str], list[pa.RecordBatch]] = {}
        self.rows = 0
        self.checksum_total = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Split ``batch`` by the routing column and buffer the pieces (column dropped)."""
        if batch.num_rows == 0:
            return
        idx = batch.schema.get_field_index(self.column)
        if idx < 0:
            raise ConfigurationError(
                f"option table_column={self.column!r}: the data has no such column "
                f"(columns: {', '.join(batch.schema.names)})"
            )
        col = batch.column(idx)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if col.null_count:
            raise ConfigurationError(
                f"column {self.column!r} (option table_column) is null in {col.null_count} row(s): "
                f"every row must name one of the tables {', '.join(self.allowed)} (option tables)"
            )
        data = batch.remove_column(idx)
        for value in pc.unique(col).to_pylist():
            key = self.spellings.get(value)
            if key is None:
                shown = value if len(value) <= 200 else value[:200] + "..."
                raise ConfigurationError(
                    f"column {self.column!r} (option table_column) names table {shown!r}, which "
                    f"is not in the option tables ({', '.join(self.allowed)}); nothing of this "
                    "partition is written"
                )
            piece = data.filter(pc.equal(col, pa.scalar(value, col.type)))
            self.parts.setdefault(key, []).append(piece)
            self.rows += piece.num_rows
            self.checksum_total = combine(self.checksum_total, batch_checksum(piece))

    def rows_per_table(self) -> dict[str, int]:
        """``{"db.table": rows}`` of the tables that got rows (plain data for ``details``)."""
        return {f"{db}.{t}": sum(p.num_rows for p in parts) for (db, t), parts in self.parts.items()}


def _quiet_rollback(session: ClickHouseHTTP) -> None:
    try:
        session.command("ROLLBACK", session_check=True)
    except Exception as exc:
        log.debug("rollback of failed transaction %s: %s", session.session_id, exc)
