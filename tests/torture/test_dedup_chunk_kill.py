"""Mode dedup: a driver SIGKILLed between the chunks of a partition, restarted, writes every row once.

Every other kill test writes partitions of one chunk. Here each partition is three
chunks at the production sizing (``ChunkSizing()``: 12-byte rows make chunks of
1,048,576 rows), and dedup rows are visible as soon as a chunk is inserted, so a
kill can leave a partition's first chunks in the table and its last one not.

The child process (``python -m tests.torture.test_dedup_chunk_kill run ...``) is a
driver without Spark: it prepares each batch's partitions one after another with the
real Coordinator in mode dedup (the shared stack, a local decision log), its rows
arriving in record batches of a size drawn per run, commits the batch and prints it,
which stands in for Spark's commit log. The parent polls the table and SIGKILLs the
child's process group right after the table passes a row count drawn at random, so
most kills land between two chunks of one partition; then it restarts the child from
the batch after the last one printed, with a new attempt and run id, as Spark would.
Every id must end in ClickHouse exactly once, and no registry entry may stay open.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import target_fields
from tests.helpers.spark_writes import open_registry_entries
from tests.helpers.tables import events_table
from tests.helpers.torture import kill_session, start_child

TXN = "chunked"
BATCHES = 3
PARTS = 2
#: Three chunks at the production sizing: 1,048,576 + 1,048,576 + 102,848 rows.
ROWS = 2_200_000
TOTAL = BATCHES * PARTS * ROWS
#: Kills at most; one is skipped when every row is already in (the kill would land in the commit).
KILLS = 6


def _batches(batch: int, partition: int, size: int) -> Iterator[pa.RecordBatch]:
    base = (batch * PARTS + partition) * ROWS
    for start in range(base, base + ROWS, size):
        ids = np.arange(start, min(start + size, base + ROWS), dtype=np.uint64)
        yield pa.record_batch({"id": ids, "k": (ids % 1000).astype(np.uint32)})


def _child(args: dict) -> None:
    from clickhouse_tx.factory import build_coordinator
    from clickhouse_tx.interfaces import WriteContext

    target = Target(url=args["url"], database=args["database"], table="events", **target_fields())
    co = build_coordinator(target, "dedup", TXN, args["chk"])
    attempt = int(time.time() * 1000) % 1_000_000  # a new attempt number per run
    run = uuid.uuid4().hex[:8]  # and a new run, as a restarted Spark job draws
    for b in range(args["start"], BATCHES):
        msgs = [
            co.prepare(WriteContext(TXN, b, p, attempt, run), _batches(b, p, args["batch_rows"])) for p in range(PARTS)
        ]
        co.commit_batch(b, msgs)
        print(json.dumps({"done": b}), flush=True)


def _count(admin: ClickHouseHTTP, fq: str) -> int:
    return int(admin.query_json(f"SELECT count() AS n FROM {fq}")[0]["n"])


def _run(args: dict, admin: ClickHouseHTTP, fq: str, kill_past: int | None) -> tuple[list[int], int | None]:
    """Run the child; with ``kill_past``, SIGKILL it once the table holds more rows than that.

    Returns the batches it reported done and the row count read just before the kill.
    """
    proc = start_child(args, stdout=subprocess.PIPE, module="tests.torture.test_dedup_chunk_kill")
    seen = None
    if kill_past is not None:
        while proc.poll() is None:
            seen = _count(admin, fq)
            if seen > kill_past:
                kill_session(proc)
                break
            time.sleep(0.02)
    out, err = proc.communicate(timeout=600)
    done = [json.loads(line)["done"] for line in out.decode().splitlines() if line.startswith("{")]
    if proc.returncode != -signal.SIGKILL:
        assert proc.returncode == 0, err.decode()[-3000:]
        seen = None
    return done, seen


@pytest.mark.timeout(1200)
def test_a_dedup_driver_killed_between_the_chunks_of_its_partitions_and_restarted_writes_every_row_once(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    admin, fq = events_table(
        clickhouse_url, database, "id UInt64, k UInt32", "non_replicated_deduplication_window = 1000"
    )
    rnd = random.Random(int(os.environ.get("CTX_KILL_SEED", "7")))
    last, runs, kills, mid_partition = -1, 0, 0, 0
    while last < BATCHES - 1:
        runs += 1
        args = {
            "url": clickhouse_url,
            "database": database,
            "chk": str(tmp_path / "chk"),
            "start": last + 1,
            "batch_rows": rnd.choice([7_919, 10_000, 65_536, 100_003]),
        }
        # Past the rows already in, so the kill lands while this run inserts.
        now = _count(admin, fq)
        kill_past = rnd.randrange(now, TOTAL) if kills < KILLS and now < TOTAL else None
        done, seen = _run(args, admin, fq, kill_past)
        if seen is not None:
            kills += 1
            mid_partition += seen % ROWS != 0
        last = max(done, default=last)
        print(f"run {runs}: {args['batch_rows']}-row batches, kill past {kill_past} rows at {seen}, done up to {last}")
    rows = admin.query_json(f"SELECT count() AS n, uniqExact(id) AS u, min(id) AS lo, max(id) AS hi FROM {fq}")
    print(f"dedup chunk kill: {kills} SIGKILLs, {mid_partition} between two chunks of a partition, rows {rows[0]}")
    assert rows == [{"n": TOTAL, "u": TOTAL, "lo": 0, "hi": TOTAL - 1}]
    assert kills >= 3 and mid_partition >= 2, "the kills did not land between chunks: nothing was tested"
    assert open_registry_entries(clickhouse_url, database) == 0


if __name__ == "__main__" and sys.argv[1:2] == ["run"]:
    _child(json.loads(sys.argv[2]))
