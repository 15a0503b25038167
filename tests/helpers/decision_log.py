"""Decisions of a test query ``q`` (batch 3 by default), and a race of decision-log writers.

Used by the unit tests of the file decision log and by its integration tests on S3;
this module is also the entry point of one racing driver process (:func:`race_processes`).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Callable

from clickhouse_tx.errors import DecisionConflictError
from clickhouse_tx.interfaces import Decision, Mode, Prepared
from clickhouse_tx.store.decision_log import FileDecisionLog
from spark_datasource.testing.credentials import target_fields


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


def race_processes(url: str, database: str, log_uri: str, writers: int = 3) -> list[str]:
    """``writers`` Python processes (drivers) write version 1 of batch 3 of ``q`` at once: the winners.

    Each builds its log with the factory, as a driver does, from ``log_uri`` (an S3 URI
    whose credentials come from the environment), then waits for a common start time
    so that their claims overlap; each prints ``won`` or ``lost``.
    """
    start_at = time.time() + 8  # after every interpreter has imported pyarrow and built its log
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.decision_log", url, database, log_uri, f"p{i}", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(writers)
    ]
    winners = []
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        if p.returncode != 0 or out.strip() not in ("won", "lost"):
            raise AssertionError(f"decision writer p{i} failed ({p.returncode}): {out} {err[-2000:]}")
        if out.strip() == "won":
            winners.append(f"p{i}")
    return winners


def _race_child(url: str, database: str, log_uri: str, xid: str, start_at: str) -> None:
    from clickhouse_tx.factory import build_decision_log
    from clickhouse_tx.interfaces import Target

    log = build_decision_log(Target(url=url, database=database, table="events", **target_fields()), "q", log_uri)
    time.sleep(max(0.0, float(start_at) - time.time()))
    try:
        log.write(decision(1, xids=(xid,)))
        print("won")
    except DecisionConflictError:
        print("lost")


if __name__ == "__main__":
    _race_child(*sys.argv[1:6])
