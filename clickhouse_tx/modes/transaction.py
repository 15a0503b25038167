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
rollback (driver, GC)
    ``ROLLBACK`` in the session; a session or transaction that is gone is a no-op.
lookup (driver)
    marker visible (read-committed) -> COMMITTED; else the session still holds a
    running transaction -> PENDING; else NOT_COMMITTED.

When the executor dies the session expires after ``session_timeout`` and the server
rolls the transaction back; a server restart loses every prepared transaction.
Needs a non-replicated ``*MergeTree`` target and a server with transactions on.
"""

from __future__ import annotations

import logging
import uuid
from typing import Iterator

import pyarrow as pa

from clickhouse_tx.errors import (ConfigurationError, NotCommittedError, OutcomeUnknownError,
                                  ServerError)
from clickhouse_tx.http_client import (INVALID_TRANSACTION, SESSION_IS_LOCKED, SESSION_NOT_FOUND,
                                       ClickHouseHTTP, ReplyLostError)
from clickhouse_tx.interfaces import CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.markers import CountingBatches
from clickhouse_tx.modes import peek_schema
from clickhouse_tx.modes.base import ModeBase

log = logging.getLogger(__name__)

#: ``transactionID()`` outside a transaction.
_NO_TID = "(0,0,'00000000-0000-0000-0000-000000000000')"
#: After COMMIT/ROLLBACK the session is useless: ask the server to drop it soon.
_RELEASE_TIMEOUT_S = 1


class TransactionMode(ModeBase):
    """Exactly-once per partition via one open transaction per xid (the default mode)."""

    mode = Mode.TRANSACTION

    # -- driver --------------------------------------------------------------------------
    def validate(self, target: Target, schema: pa.Schema) -> None:
        """Driver, once per query: table, schema, engine, transactions enabled, markers table."""
        info = self.describe_and_check(target, schema)
        if info.is_replicated or not info.is_merge_tree:
            raise ConfigurationError(
                f"table {info.display} has engine {info.engine}: mode 'transaction' needs a "
                "non-replicated *MergeTree table (ClickHouse transactions support nothing else); "
                "use mode 'staging' (exactly-once on any MergeTree, incl. Replicated) or 'dedup'")
        probe = ClickHouseHTTP(target, session_id=f"clickhouse_tx_probe_{uuid.uuid4().hex}",
                               session_timeout=60)
        try:
            probe.command("BEGIN TRANSACTION")
            probe.command("ROLLBACK")
        except ServerError as e:
            raise ConfigurationError(
                f"the server at {probe.server} refused BEGIN TRANSACTION ({e.message}): mode "
                "'transaction' needs allow_experimental_transactions and Keeper, see "
                "server_patches/config.d/transactions.xml; or use mode 'staging'",
                code=e.code, name=e.name) from None
        finally:
            _release(probe)
        self.markers(target).ensure_table()

    # -- executor ------------------------------------------------------------------------
    def prepare(self, target: Target, ctx: WriteContext, xid: str,
                batches: Iterator[pa.RecordBatch]) -> Prepared:
        """Executor, once per partition attempt: write inside an open transaction."""
        markers = self.markers(target)
        markers.ensure_table()  # DDL is refused inside a transaction: do it first
        schema, batches = peek_schema(batches)
        counted = CountingBatches(batches)
        session = self.client(target, session_id=xid, session_timeout=target.session_timeout_s)
        try:
            session.command("BEGIN TRANSACTION")
            if schema is not None:
                # Block dedup (non_replicated_deduplication_window) is not transactional:
                # a rolled-back insert leaves its block hashes behind, and the replay's
                # identical blocks would be dropped as duplicates. A token unique to this
                # attempt keys the dedup log on the xid instead (insert_deduplicate=0 does
                # not switch it off for non-replicated tables: measured on 26.9).
                session.insert_arrow_stream(self.target_sql(target), schema, counted,
                                            settings={"insert_deduplication_token": xid})
            p = self.prepared(target, ctx, xid, counted.rows, counted.checksum,
                              {"session_timeout_s": target.session_timeout_s})
            markers.insert(p, client=session)
            return p
        except BaseException:
            try:
                session.command("ROLLBACK", session_check=True, session_timeout=_RELEASE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the session expires anyway
                log.info("rollback after failed prepare of %s: %s", xid, exc)
            raise
        finally:
            session.close()

    # -- driver --------------------------------------------------------------------------
    def commit(self, target: Target, p: Prepared) -> None:
        """Driver: COMMIT in the xid's session; idempotent for a committed xid."""
        # The COMMIT itself shortens the session's timeout so the server frees it soon
        # after; a lost reply is resolved by the marker first, which needs no session.
        session = self.client(target, session_id=p.xid, session_timeout=_RELEASE_TIMEOUT_S)
        try:
            session.command("COMMIT", session_check=True)
        except ReplyLostError as e:
            raise OutcomeUnknownError(f"COMMIT sent but its reply was lost: {e.message}",
                                      xid=p.xid) from None
        except ServerError as e:
            if e.code == SESSION_IS_LOCKED:
                raise OutcomeUnknownError("session busy with another query; look up again",
                                          xid=p.xid, code=e.code, name=e.name) from None
            if e.code not in (SESSION_NOT_FOUND, INVALID_TRANSACTION):
                # e.g. UNKNOWN_STATUS_OF_TRANSACTION: the marker decides later
                raise OutcomeUnknownError(f"COMMIT failed: {e.message}", xid=p.xid,
                                          code=e.code, name=e.name) from None
            if self.markers(target).lookup(p.xid) is not None:
                return  # committed before (a replayed commit): no-op
            if e.code == INVALID_TRANSACTION:
                _quiet_rollback(session)  # a failed transaction waits for ROLLBACK
            raise NotCommittedError(f"cannot commit: {e.message}", xid=p.xid,
                                    code=e.code, name=e.name) from None
        finally:
            session.close()

    def rollback(self, target: Target, p: Prepared) -> None:
        """Driver or GC: ROLLBACK in the session; a no-op if session or transaction is gone."""
        session = self.client(target, session_id=p.xid, session_timeout=_RELEASE_TIMEOUT_S)
        try:
            session.command("ROLLBACK", session_check=True)
        except ServerError as e:
            if e.code == SESSION_IS_LOCKED:
                raise OutcomeUnknownError("session busy; roll back again later", xid=p.xid,
                                          code=e.code, name=e.name) from None
            if e.code not in (SESSION_NOT_FOUND, INVALID_TRANSACTION):
                raise
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
            if e.code == SESSION_IS_LOCKED:
                raise OutcomeUnknownError("session busy (a COMMIT may be running)", xid=p.xid,
                                          code=e.code, name=e.name) from None
            raise
        finally:
            session.close()
        if tid == _NO_TID:
            # No open transaction; the marker was checked first, but a COMMIT may have
            # landed between the two reads: look once more.
            if self.markers(target).lookup(p.xid) is not None:
                return CommitOutcome.COMMITTED
            _release(self.client(target, session_id=p.xid))
            return CommitOutcome.NOT_COMMITTED
        return CommitOutcome.PENDING


def _release(session: ClickHouseHTTP) -> None:
    """Shorten the session's timeout so the server frees it soon (best effort)."""
    try:
        session.command("SELECT 1", session_check=True, session_timeout=_RELEASE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        log.debug("could not release session %s: %s", session.session_id, exc)


def _quiet_rollback(session: ClickHouseHTTP) -> None:
    try:
        session.command("ROLLBACK", session_check=True, session_timeout=_RELEASE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        log.debug("rollback of failed transaction %s: %s", session.session_id, exc)
