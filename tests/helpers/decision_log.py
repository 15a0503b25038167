"""Decisions of a test query ``q`` (batch 3 by default), and a race of decision-log writers.

Used by the unit tests of the file decision log and by its integration tests on S3.
"""

from __future__ import annotations

import threading
from typing import Callable

from clickhouse_tx.decision_log import FileDecisionLog
from clickhouse_tx.errors import DecisionConflictError
from clickhouse_tx.interfaces import Decision, Mode, Prepared


def prepared(xid: str, partition: int = 0, batch: int = 3) -> Prepared:
    return Prepared(
        xid=xid,
        txn_id="q",
        batch=batch,
        partition=partition,
        attempt=0,
        mode=Mode.STAGING,
        server="http://h:8123",
        table="db.t",
        rows=10,
        checksum=7,
        details={"stage": f"stage_{xid}", "partition_ids": ["all"]},
    )


def decision(version: int = 1, batch: int = 3, xids: tuple[str, ...] = ("a", "b")) -> Decision:
    return Decision(
        txn_id="q", batch=batch, version=version, chosen=tuple(prepared(x, i, batch) for i, x in enumerate(xids))
    )


def race(make_log: Callable[[], FileDecisionLog], writers: int = 8) -> list[str]:
    """``writers`` threads, each with its own log, write version 1 of batch 3 at once: the winners."""
    winners: list[str] = []
    barrier = threading.Barrier(writers)

    def writer(i: int) -> None:
        log = make_log()
        barrier.wait()
        try:
            log.write(decision(1, xids=(f"x{i}",)))
            winners.append(f"x{i}")
        except DecisionConflictError:
            pass

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return winners
