"""A committing driver SIGKILLed again and again while its decision log compacts.

The child process (``python -m tests.torture.test_decision_log_kill run ...``) is a
driver without Spark: it prepares and commits batches with the real Coordinator
(transaction mode, the shared stack, a local decision log that keeps only the newest
2 done batches and compacts after every batch) and prints each batch it finished,
which stands in for Spark's commit log. The parent SIGKILLs it at random moments
(mid-commit, mid-mark_done, mid-compaction), then restarts it from the batch after
the last one printed, as Spark would; after every restart it also replays one long
compacted batch, which must commit nothing. Every (batch, partition) must end in
ClickHouse exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import target_fields
from tests.helpers.tables import events_table
from tests.helpers.torture import start_child

TXN = "compacting"
BATCHES = 30
PARTS = 2
ROWS = 50


def _rows(batch: int, partition: int) -> pa.RecordBatch:
    base = batch * 1000 + partition * 100
    return pa.RecordBatch.from_pydict({"id": pa.array(range(base, base + ROWS), pa.uint64())})


def _commit(args: dict, batch: int, attempt: int) -> bool:
    """Prepare every partition of ``batch`` and commit it; True if it was already done."""
    from clickhouse_tx.factory import build_mode_io, build_registry
    from clickhouse_tx.interfaces import WriteContext
    from clickhouse_tx.protocol.coordinator import Coordinator
    from clickhouse_tx.store.decision_log import FileDecisionLog

    target = Target(url=args["url"], database=args["database"], table="events", **target_fields())
    log = FileDecisionLog(args["chk"], TXN, retain_batches=2, compact_every=1)
    co = Coordinator(TXN, target, build_mode_io("transaction"), build_registry(target), log)
    msgs = [co.prepare(WriteContext(TXN, batch, p, attempt), iter([_rows(batch, p)])) for p in range(PARTS)]
    return co.commit_batch(batch, msgs).already_done


def _child(args: dict) -> None:
    attempt = int(time.time() * 1000) % 1_000_000  # a new attempt number per run
    if args["stray"] is not None:
        assert _commit(args, args["stray"], attempt), "a compacted batch was committed again"
    for b in range(args["start"], BATCHES):
        _commit(args, b, attempt)
        print(json.dumps({"done": b}), flush=True)


def _run(args: dict, kill: tuple[int, float] | None) -> list[int]:
    """Run the child; with ``kill = (n, delay)``, SIGKILL it ``delay`` s after its n-th batch.

    Returns the batches it reported done (all of them count, even those printed
    between the decision to kill and the kill: Spark would have recorded them).
    """
    proc = start_child(args, stdout=subprocess.PIPE, module="tests.torture.test_decision_log_kill")
    done: list[int] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        done.append(json.loads(line)["done"])
        if kill is not None and len(done) >= kill[0]:
            time.sleep(kill[1])  # lands inside the next batch: commit, mark_done or compaction
            proc.send_signal(signal.SIGKILL)
            break
    out, err = proc.communicate(timeout=300)
    done += [json.loads(line)["done"] for line in out.decode().splitlines() if line.startswith("{")]
    if kill is None or proc.returncode != -signal.SIGKILL:
        assert proc.returncode == 0, err.decode()[-3000:]
    return done


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_driver_killed_while_its_decision_log_compacts_commits_every_batch_exactly_once(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    admin, fq = events_table(clickhouse_url, database, "id UInt64")
    rnd = random.Random(11)
    last, kills, strays, runs = -1, 0, 0, 0
    while last < BATCHES - 1:
        runs += 1
        stray = rnd.randrange(0, last - 2) if last > 3 else None  # compacted: older than the newest 2
        args = {
            "url": clickhouse_url,
            "database": database,
            "chk": str(tmp_path / "chk"),
            "start": last + 1,
            "stray": stray,
        }
        kill = (rnd.randint(1, 3), rnd.uniform(0.0, 0.15)) if kills < 12 else None
        done = _run(args, kill)
        kills += kill is not None
        strays += stray is not None
        last = max(done, default=last)
        print(f"run {runs}: kill (after batches, delay s) {kill}, done up to batch {last}, stray {stray}")
    rows = admin.query_json(f"SELECT count() AS n, uniqExact(id) AS u FROM {fq} SETTINGS implicit_transaction = 1")
    print(f"decision log kill test: {kills} SIGKILLs, {strays} stray replays of compacted batches, rows {rows[0]}")
    assert rows == [{"n": BATCHES * PARTS * ROWS, "u": BATCHES * PARTS * ROWS}]
    names = sorted(os.listdir(tmp_path / "chk" / "clickhouse_tx" / TXN))
    assert len([n for n in names if n.endswith(".done")]) <= 3  # retained 2, plus one not yet compacted


if __name__ == "__main__" and sys.argv[1:2] == ["run"]:
    _child(json.loads(sys.argv[2]))
