"""The commit path of mode ``transaction`` against the local stack: sessions and outcomes.

What the server does with ``session_timeout`` (fixed when the session is created,
as in ClickHouse's ``NamedSessionsStorage``), how prepared sessions are kept alive
and checked, and how a COMMIT with an unknown outcome or a busy session is settled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import SESSION_IS_LOCKED, SESSION_NOT_FOUND
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ServerError, TransientError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import CommitOutcome, Target, WriteContext
from clickhouse_tx.modes.session_keepalive import KEEP_ALIVE
from clickhouse_tx.modes.transaction import TransactionMode
from clickhouse_tx.retry import RetryPolicy
from spark_datasource.testing.credentials import target_fields
from tests.helpers.tables import TXN, batches, committed_count, make_table, rows

UNKNOWN_STATUS_OF_TRANSACTION = 659


def _alive(target: Target, sid: str) -> bool:
    c = ClickHouseHTTP(target, session_id=sid, session_timeout=1)
    try:
        c.command("SELECT 1", session_check=True)
        return True
    except ServerError as e:
        assert e.code == SESSION_NOT_FOUND, e
        return False
    finally:
        c.close()


def test_a_session_keeps_the_timeout_it_was_created_with_and_each_request_restarts_it(
    admin: ClickHouseHTTP, database: str
) -> None:
    target = Target(url=admin.target.url, database=database, table="t", **target_fields())
    sid = f"fixed-{uuid.uuid4().hex}"
    c = ClickHouseHTTP(target, session_id=sid, session_timeout=3)
    c.command("SELECT 1")
    # A later request asking for 1 s (as COMMIT once did to free the session early)
    # changes nothing: ClickHouse fixes the timeout at creation.
    c.command("SELECT 1", session_check=True, session_timeout=1)
    for _ in range(3):  # 4.5 s in all, never 3 s idle: each request restarts the timer
        time.sleep(1.5)
        assert _alive(target, sid)
    time.sleep(4.5)  # idle past 3 s: gone
    assert not _alive(target, sid)
    c.close()


def test_the_keep_alive_holds_a_prepared_session_past_its_timeout_until_it_is_committed(
    admin: ClickHouseHTTP, database: str
) -> None:
    long = make_table(admin, database)  # session_timeout 3600: touched every 15 minutes
    target = dataclasses.replace(long, session_timeout_s=2)
    mode = TransactionMode()
    # A worker process that prepared for a job with the default timeout first (its
    # keep-alive then waited 15 minutes between touches and let 2 s sessions expire).
    earlier = mode.prepare(
        long, WriteContext(TXN, 0, 1, 0), f"long-{uuid.uuid4().hex[:8]}", batches(rows(10, start=1000))
    )
    time.sleep(0.5)
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), f"kept-{uuid.uuid4().hex[:8]}", batches(rows(300)))
    assert p.xid in KEEP_ALIVE.watching()
    touches = KEEP_ALIVE.touches
    time.sleep(7)  # more than three timeouts
    assert KEEP_ALIVE.touches > touches
    assert mode.renew(target, p)
    mode.commit(target, p)
    mode.rollback(long, earlier)
    assert committed_count(admin, target) == 300
    deadline = time.monotonic() + 10
    while p.xid in KEEP_ALIVE.watching():  # the transaction is over: it stops by itself
        assert time.monotonic() < deadline, "the keep-alive kept touching a committed session"
        time.sleep(0.2)


def test_renew_says_a_session_that_expired_is_gone(admin: ClickHouseHTTP, database: str) -> None:
    target = dataclasses.replace(make_table(admin, database), session_timeout_s=1)
    mode = TransactionMode()
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), f"gone-{uuid.uuid4().hex[:8]}", batches(rows(10)))
    KEEP_ALIVE.unwatch(p.xid)  # its executor died
    time.sleep(3)
    assert mode.renew(target, p) is False
    assert mode.lookup(target, p) is CommitOutcome.NOT_COMMITTED


def test_a_commit_refused_because_the_session_is_busy_did_not_run_and_is_retried(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    # every sleep between attempts 0-0.5 s: the retries outlast the 1 s hold below
    retry = RetryPolicy(max_attempts=30, max_total_s=30.0, base_delay_s=0.5, max_delay_s=0.5)
    co = build_coordinator(target, "transaction", TXN, str(tmp_path), retry=retry)
    p = co.prepare(WriteContext(TXN, 0, 0, 0), batches(rows(100)))
    KEEP_ALIVE.unwatch(p.xid)
    busy = ClickHouseHTTP(target, session_id=p.xid, session_timeout=target.session_timeout_s)
    holder = threading.Thread(target=lambda: busy.command("SELECT sleep(1.5)", session_check=True))
    holder.start()
    time.sleep(0.5)
    with pytest.raises(TransientError) as info:  # SESSION_IS_LOCKED: refused before it ran
        TransactionMode().commit(target, p)
    assert info.value.code == SESSION_IS_LOCKED
    holder.join()
    busy.close()
    holder = threading.Thread(
        target=lambda: ClickHouseHTTP(target, session_id=p.xid, session_timeout=target.session_timeout_s).command(
            "SELECT sleep(1)", session_check=True
        )
    )
    holder.start()
    time.sleep(0.3)
    report = co.commit_batch(0, [p])  # retried within retry.*, committed once
    holder.join()
    assert report.committed == (p.xid,) and committed_count(admin, target) == 100


@pytest.mark.parametrize("landed", [True, False], ids=["commit-landed", "commit-not-run"])
def test_unknown_status_of_transaction_from_commit_is_settled_by_lookup_never_by_a_blind_retry(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, "transaction", TXN, str(tmp_path))
    msgs = [co.prepare(WriteContext(TXN, 0, p, 0), batches(rows(100, start=100 * p))) for p in range(2)]
    real = ClickHouseHTTP.command
    commits: list[str] = []

    def command(self, sql, *args, **kwargs):
        if sql == "COMMIT" and self.session_id == msgs[0].xid:
            commits.append(self.session_id)
            if len(commits) == 1:  # the first COMMIT of partition 0 meets a Keeper hiccup
                if landed:
                    real(self, sql, *args, **kwargs)
                raise ServerError(
                    "COMMIT: Connection loss during commit",
                    xid=self.session_id,
                    code=UNKNOWN_STATUS_OF_TRANSACTION,
                    name="UNKNOWN_STATUS_OF_TRANSACTION",
                )
        return real(self, sql, *args, **kwargs)

    monkeypatch.setattr(ClickHouseHTTP, "command", command)
    report = co.commit_batch(0, msgs)
    assert set(report.committed) == {m.xid for m in msgs}
    assert committed_count(admin, target) == 200
    # landed: the marker shows it committed, no second COMMIT; not run: the session
    # still holds the transaction (PENDING), so it is committed once more.
    assert len(commits) == (1 if landed else 2)


@contextlib.contextmanager
def _straggler(admin: ClickHouseHTTP, database: str, tmp_path: Path, seconds: int) -> Iterator[tuple[Target, Any, Any]]:
    """(target, coordinator, prepared xid) while a straggler's statement runs in the xid's
    session for ``seconds``: the session is locked until the block ends."""
    target = make_table(admin, database)
    co = build_coordinator(target, "transaction", TXN, str(tmp_path))
    p = co.prepare(WriteContext(TXN, 0, 0, 0), batches(rows(100)))
    KEEP_ALIVE.unwatch(p.xid)
    straggler = ClickHouseHTTP(target, session_id=p.xid, session_timeout=target.session_timeout_s)
    holder = threading.Thread(
        target=lambda: straggler.command(
            f"SELECT sleepEachRow(0.5) FROM numbers({2 * seconds}) SETTINGS max_block_size = 1 FORMAT Null",
            session_check=True,
        )
    )
    holder.start()
    time.sleep(0.5)
    try:
        yield target, co, p
    finally:
        holder.join()
        straggler.close()


def test_abort_waits_for_a_straggler_that_holds_its_session_and_then_rolls_it_back(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    from clickhouse_tx.store.registry import KeeperMapRegistry

    with _straggler(admin, database, tmp_path, 4) as (target, co, p):  # longer than the client's retries
        report = co.abort_batch(0, [p])
        assert report.rolled_back == (p.xid,) and report.left == ()
        assert KeeperMapRegistry(target).get(p.xid).state == "aborted"
    assert committed_count(admin, target) == 0
    # nothing holds the target: a synchronous DROP does not wait behind an open transaction
    admin.command(f"DROP TABLE {q.qualified(target.database, target.table)} SYNC")


def test_abort_does_not_raise_when_a_straggler_holds_its_session_past_the_wait_and_recover_finishes_it(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    from clickhouse_tx.admin.recovery import resolve_in_doubt
    from clickhouse_tx.store.registry import KeeperMapRegistry

    with _straggler(admin, database, tmp_path, 12) as (target, co, p):
        report = co.abort_batch(0, [p], straggler_wait_s=1.0)  # SESSION_IS_LOCKED throughout: no exception
        assert report.left == (p.xid,) and report.rolled_back == ()
        registry = KeeperMapRegistry(target)
        assert registry.get(p.xid).state == "aborting"  # fenced: it can never commit
    done = resolve_in_doubt(target, TransactionMode(), registry, lambda t: None)
    assert p.xid in done.rolled_back and registry.get(p.xid).state == "aborted"
    assert committed_count(admin, target) == 0
