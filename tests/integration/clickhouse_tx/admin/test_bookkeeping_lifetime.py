"""Every bookkeeping record has a lifetime: mode dedup's layout records, helper key rows, run fences.

Drives the mode's I/O as the Spark writer does (the coordinator on the embedded stack):
a batch job is one batch under a fresh transactional id, dropped by
``DedupMode.forget_batch`` at its end (what ``ClickHouseTxBatchWriter.commit`` calls), a
stream is batches 0, 1, ... of one id. ``gc`` runs as the operator runs it, in a child
process, without a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import DedupLayoutError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords
from clickhouse_tx.interfaces import Prepared, Target, WriteContext
from clickhouse_tx.modes.dedup.chunks import ChunkSizing
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.modes.dedup.records import LAYOUT_TABLE
from clickhouse_tx.protocol.coordinator import Coordinator
from tests.helpers.cli import run_cli
from tests.helpers.tables import batches, committed_count, distinct_ids, make_table, rows

PARTS = 4


def _coordinator(target: Target, tmp_path: Path, txn: str) -> Coordinator:
    co = build_coordinator(target, "dedup", txn, str(tmp_path / txn))
    mode = DedupMode(ChunkSizing.fixed(300), registry=co.registry)
    co.context = dataclasses.replace(co.context, mode_io=mode)
    return co


def _cut(t: pa.Table, n: int) -> list[pa.Table]:
    return [t.take(list(range(p, t.num_rows, n))) for p in range(n)]


def _prepare(co: Coordinator, txn: str, batch: int, first: int, n: int = PARTS, run: str = "r") -> list[Prepared]:
    parts = _cut(rows(400, start=first), n)
    return [co.prepare(WriteContext(txn, batch, p, 0, run), batches(t)) for p, t in enumerate(parts)]


def _layouts(admin: ClickHouseHTTP, database: str) -> dict[tuple[str, int], int]:
    """Layout records per (txn, batch)."""
    sql = f"SELECT txn_id, batch, count() AS n FROM {q.qualified(database, LAYOUT_TABLE)} GROUP BY txn_id, batch"
    return {(str(r["txn_id"]), int(r["batch"])): int(r["n"]) for r in admin.query_json(sql)}


def test_ten_dedup_batch_jobs_leave_no_layout_records_once_each_job_is_done(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    for job in range(10):
        txn = f"job{job}"
        co = _coordinator(target, tmp_path, txn)
        co.commit_batch(0, _prepare(co, txn, 0, job * 400))
        # what a job leaves before its end (10 per job: 4 claims, 4 end records, seal, first run);
        # before the change they stayed, 10, 20, ... 100 rows after ten jobs
        assert _layouts(admin, database) == {(txn, 0): 10}
        assert co.mode_io.forget_batch(target, txn, 0) == 10  # type: ignore[attr-defined]
        assert _layouts(admin, database) == {}
    assert committed_count(admin, target) == 4000 and distinct_ids(admin, target) == 4000


def test_a_stream_keeps_the_layout_records_of_its_last_committed_batch_only(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    co = _coordinator(target, tmp_path, "stream")
    for batch in range(12):
        co.commit_batch(batch, _prepare(co, "stream", batch, batch * 400))
        assert _layouts(admin, database) == {("stream", batch): 10}
    assert committed_count(admin, target) == 4800 and distinct_ids(admin, target) == 4800


def _status(url: str, database: str) -> dict[str, object]:
    out = run_cli("status", "--url", url, "--table", f"{database}.events", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["bookkeeping"]


def _key_rows(url: str, database: str, app: str, n: int) -> None:
    records = BatchRecords(Target(url=url, database=database, table="events"))
    records.ensure_table()
    with ClickHouseHTTP(records.target) as c:
        for b in range(n):
            c.command(records.insert_sql(BatchKey(app, b, "query-1"), f"a{b}", [f"{database}.events"], 1, 0))


def test_gc_drops_a_stopped_querys_and_finished_jobs_records_and_keeps_an_in_flight_batchs(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, clickhouse_url: str
) -> None:
    target = make_table(admin, database)
    stopped = _coordinator(target, tmp_path, "stopped")
    for batch in range(3):  # a stream stopped after batch 2: its records stay until gc
        stopped.commit_batch(batch, _prepare(stopped, "stopped", batch, batch * 400))
    killed = _coordinator(target, tmp_path, "killed")  # a job whose driver died before its end
    killed.commit_batch(0, _prepare(killed, "killed", 0, 5000))
    live = _coordinator(target, tmp_path, "live")  # in flight: inserted, not committed
    _prepare(live, "live", 7, 9000)
    sealed = _coordinator(target, tmp_path, "sealed")  # died after its commit's seal
    sealed.mode_io.check_layout(target, 0, _prepare(sealed, "sealed", 0, 20000))
    _key_rows(clickhouse_url, database, "helper", 5)
    before = _layouts(admin, database)
    assert before == {("stopped", 2): 10, ("killed", 0): 10, ("live", 7): 9, ("sealed", 0): 10}
    status = _status(clickhouse_url, database)
    assert status["layouts"] == {
        "claims": 16, "chunk_records": 16, "seals": 3, "first_run": 4, "foreach_batch": 0, "batches": 4,
        "unsealed_batches": 1,
    }  # fmt: skip
    assert status["key_rows"] == 5

    common = ["gc", "--url", clickhouse_url, "--table", f"{database}.events", "--json"]
    kept = run_cli(*common)  # the default retention (3 days): everything is younger
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["records"]["layout_records"] == 0
    out = run_cli(*common, "--retention", "0s")
    assert out.returncode == 0, out.stderr
    dropped = json.loads(out.stdout)["records"]
    assert sorted(dropped["layout_batches"]) == ["killed/0", "stopped/2"]
    assert dropped["layout_records"] == 20 and dropped["key_rows"] == 4
    assert _layouts(admin, database) == {("live", 7): 9, ("sealed", 0): 10}  # what a replay needs
    assert _status(clickhouse_url, database)["key_rows"] == 1  # the app's newest stays

    # A replay of the stopped stream's last batch after gc: the same cut inserts nothing,
    # another cut is refused before it inserts (its batch is committed, its records gone).
    replay = _coordinator(target, tmp_path, "stopped")
    assert all(p.rows == 0 for p in _prepare(replay, "stopped", 2, 800, run="r2"))
    with pytest.raises(DedupLayoutError, match="layout records .* are gone"):
        _prepare(replay, "stopped", 2, 800, n=5, run="r3")
    assert committed_count(admin, target) == 1200 + 400 + 400 + 400
    assert _layouts(admin, database) == {("live", 7): 9, ("sealed", 0): 10}
