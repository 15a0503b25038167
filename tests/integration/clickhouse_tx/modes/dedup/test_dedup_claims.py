"""Mode dedup on the embedded stack: a replay that cuts a batch otherwise is refused, not inserted.

A "run" here is a set of partition attempts of one batch, as Spark would send after a
restart: ``cut(rows, n)`` deals the rows round-robin into ``n`` partitions, the way
``repartition(n)`` of a replay moves rows to other partition numbers.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import DedupLayoutError, NotCommittedError
from clickhouse_tx.interfaces import Prepared, WriteContext
from clickhouse_tx.modes.dedup import claims as dedup_claims
from clickhouse_tx.modes.dedup import records as dedup_records
from clickhouse_tx.modes.dedup.records import LAYOUT_TABLE
from tests.helpers.tables import (
    DEDUP_TXN as TXN,
)
from tests.helpers.tables import (
    batches,
    committed_count,
    dedup_coordinator,
    distinct_ids,
    make_table,
    recording_requests,
    rows,
)

N = 1200


def cut(t: pa.Table, n: int) -> list[pa.Table]:
    """The rows dealt round-robin into ``n`` partitions (row i to partition i % n)."""
    return [t.take(list(range(p, t.num_rows, n))) for p in range(n)]


def run(co, parts: list[pa.Table], attempt: int = 0, run_id: str = "", batch: int = 0) -> list[Prepared]:
    return [co.prepare(WriteContext(TXN, batch, p, attempt, run_id), batches(t, 100)) for p, t in enumerate(parts)]


def test_a_partition_whose_retry_holds_other_rows_is_refused_before_it_inserts(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    first = cut(rows(N), 3)
    run(dedup_coordinator(target, tmp_path), first)  # inserted (visible), then the driver died
    assert committed_count(admin, target) == N
    with pytest.raises(DedupLayoutError) as info:  # the replay cut in 2
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 1), batches(cut(rows(N), 2)[0]))
    text = str(info.value)
    assert "partition 0" in text and "batch 0 of dq" in text and "original partitioning" in text
    assert committed_count(admin, target) == N  # nothing of the refused partition went in
    co = dedup_coordinator(target, tmp_path)
    co.commit_batch(0, run(co, first, attempt=1))  # the original cut: deduplicated, committed
    assert committed_count(admin, target) == N and distinct_ids(admin, target) == N


def test_after_the_first_commit_started_a_partition_beyond_the_sealed_count_or_with_other_rows_is_refused(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    msgs = run(co, cut(rows(N), 3))
    co.mode_io.check_layout(target, 0, msgs)  # the commit's first step; then the driver died
    replay = cut(rows(N), 5)
    for p in (0, 3, 4):  # other rows in 0; partitions 3 and 4 did not exist
        with pytest.raises(DedupLayoutError, match=r"cut into 3 partitions \(0: 400 rows, 1: 400 rows, 2: 400 rows\)"):
            dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, p, 1), batches(replay[p]))
    assert committed_count(admin, target) == N
    co = dedup_coordinator(target, tmp_path)
    report = co.commit_batch(0, run(co, cut(rows(N), 3), attempt=1))
    assert len(report.committed) == 3
    assert committed_count(admin, target) == N and distinct_ids(admin, target) == N


@pytest.mark.parametrize("runs", [("", ""), ("r1", "r2")], ids=["without run ids", "with run ids"])
def test_a_commit_missing_a_partition_an_earlier_run_inserted_is_refused_and_commits_nothing(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, runs: tuple[str, str]
) -> None:
    # The first run inserted partitions 0..2 of 3 and died before its commit. A replay
    # whose first two partitions hold the same rows but that has no partition 2 (its
    # rows went elsewhere) must not be committed as if it were the whole batch. With
    # run ids, the batch's first run is the earlier one, so the commit reads the claims.
    target = make_table(admin, database)
    first = cut(rows(N), 3)
    run(dedup_coordinator(target, tmp_path), first, run_id=runs[0])
    co = dedup_coordinator(target, tmp_path)
    msgs = run(co, first[:2], attempt=1, run_id=runs[1])
    with pytest.raises(DedupLayoutError, match=r"inserted partitions \[2\]"):
        co.commit_batch(0, msgs)
    assert co.log.read(0) is None  # nothing decided
    co = dedup_coordinator(target, tmp_path)
    co.commit_batch(0, run(co, first, attempt=2))
    assert committed_count(admin, target) == N and distinct_ids(admin, target) == N


def test_the_layout_records_of_earlier_batches_are_dropped_when_a_later_batch_commits(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    for batch in range(3):
        parts = cut(rows(300, start=batch * 300), 2)
        msgs = [co.prepare(WriteContext(TXN, batch, p, 0), batches(t)) for p, t in enumerate(parts)]
        sent = recording_requests(monkeypatch)
        co.commit_batch(batch, msgs)
        monkeypatch.undo()
    # the last commit: one scan (seal, claims, earlier keys), then the seal and one delete
    # (sent side by side, so in either order)
    layouts = [r for r in sent if LAYOUT_TABLE in r]
    assert len(layouts) == 3 and "SELECT" in layouts[0]
    assert sorted("DELETE" in r for r in layouts[1:]) == [False, True]
    left = admin.query_json(f"SELECT DISTINCT batch FROM `{database}`.{LAYOUT_TABLE} ORDER BY batch")
    assert [int(r["batch"]) for r in left] == [2]  # only the last batch: Spark may replay it
    assert committed_count(admin, target) == 900 and distinct_ids(admin, target) == 900


def test_the_commit_of_the_run_that_reached_a_batch_first_seals_it_and_drops_the_batch_before_without_a_scan(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claims are this run's: the seal, the first-run record and the batch before's
    # seal are read by key, the seal written, and the batch before's records (claims,
    # chunk records past each partition's last chunk, seal, first-run record) deleted by
    # the keys its seal names.
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    co.commit_batch(0, run(co, cut(rows(N), 3), run_id="r1"))
    msgs = run(co, cut(rows(N, start=N), 3), run_id="r1", batch=1)
    sent = recording_requests(monkeypatch)
    co.commit_batch(1, msgs)
    monkeypatch.undo()
    layouts = [r for r in sent if LAYOUT_TABLE in r]
    verbs = [r.split(" b", 1)[1][1:].split()[0] for r in layouts]
    assert verbs == ["SELECT", "INSERT", "ALTER"]
    assert "WHERE xid IN" in layouts[0] and "txn_id =" not in layouts[0]  # by key, not a scan
    assert f"{TXN}/0/all" in layouts[0] and f"{TXN}/1/all" in layouts[0]
    assert "DELETE" in layouts[2] and "txn_id =" not in layouts[2] and f"{TXN}/0/2/" in layouts[2]
    left = admin.query_json(f"SELECT DISTINCT batch FROM `{database}`.{LAYOUT_TABLE} ORDER BY batch")
    assert [int(r["batch"]) for r in left] == [1]
    assert committed_count(admin, target) == 2 * N and distinct_ids(admin, target) == 2 * N


def test_records_a_seal_does_not_name_are_dropped_by_the_scan_a_commit_makes_every_scan_every_batches(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task of another run claimed partition 7 of batch 0, which the seal (3 partitions)
    # does not hold: batch 1's commit drops what batch 0's seal names, and the first
    # commit of a batch numbered SCAN_EVERY scans the query's records and drops the rest.
    monkeypatch.setattr(dedup_records, "SCAN_EVERY", 2)
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    co.commit_batch(0, run(co, cut(rows(N), 3), run_id="r1"))
    stray = dedup_records.ClaimRecords.beside(target, co.mode_io.registry)
    stray.claim(TXN, 0, 7, dedup_claims.run_claim("1:x", "r0", inserted=False))
    for batch in (1, 2):
        co.commit_batch(batch, run(co, cut(rows(N, start=batch * N), 3), run_id="r1", batch=batch))
        left = admin.query_json(f"SELECT batch, partition FROM `{database}`.{LAYOUT_TABLE} WHERE batch < {batch}")
        assert [(int(r["batch"]), int(r["partition"])) for r in left] == ([(0, 7)] if batch == 1 else [])
    assert committed_count(admin, target) == 3 * N and distinct_ids(admin, target) == 3 * N


def test_a_partition_with_nothing_to_wait_for_is_claimed_inserted_in_one_request(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new batch: one point read (no seal; the batch's first run is this one, so no claim
    # to wait for and no scan of the batch's records, which grow with its partitions),
    # the claim created already inserted and caught up, and the end record.
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    co.prepare(WriteContext(TXN, 0, 0, 0, run="r1"), batches(rows(300), 100))
    sent = recording_requests(monkeypatch)
    co.prepare(WriteContext(TXN, 0, 1, 0, run="r1"), batches(rows(300, start=300), 100))
    monkeypatch.undo()
    layouts = [r for r in sent if LAYOUT_TABLE in r]
    assert [r.split(" b", 1)[1][1:].split()[0] for r in layouts] == ["SELECT", "INSERT", "INSERT"]
    assert "WHERE xid IN" in layouts[0] and "txn_id =" not in layouts[0]
    claim = dedup_records.ClaimRecords.beside(target, co.mode_io.registry).claim_of(TXN, 0, 1)
    assert claim is not None and claim["inserted"] is True and claim["caught_up"] == "r1"
    assert committed_count(admin, target) == 600


def test_before_any_commit_a_partition_the_first_run_never_started_waits_and_is_refused_if_the_cut_changed(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run r1 cut the batch in 3 and inserted partitions 0 and 1 before it died (2 never
    # started; no commit, so no seal). Executors cannot know a run's partition count: a
    # partition nobody inserted must wait until this run has re-checked 0 and 1.
    target = make_table(admin, database)
    first = cut(rows(N), 3)
    for p in (0, 1):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, p, 0, run="r1"), batches(first[p], 100))
    inserted = committed_count(admin, target)
    assert inserted == 800
    monkeypatch.setattr(dedup_claims, "WAIT_S", 2.0)
    with pytest.raises(DedupLayoutError, match=r"partitions \[0, 1\] .* did not show within 2 s"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 2, 0, run="r2"), batches(first[2]))

    monkeypatch.setattr(dedup_claims, "WAIT_S", 60.0)
    replay = cut(rows(N), 4)  # run r3 cuts it in 4: partition 3 waits, partition 0 is refused
    waiting: dict[str, BaseException] = {}

    def partition_3() -> None:
        try:
            dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 3, 0, run="r3"), batches(replay[3]))
        except BaseException as exc:  # inspected below
            waiting["error"] = exc

    t = threading.Thread(target=partition_3)
    t.start()
    time.sleep(1.0)
    with pytest.raises(DedupLayoutError, match="began with|beginning with"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r3"), batches(replay[0]))
    t.join(60)
    assert isinstance(waiting.get("error"), DedupLayoutError), waiting
    assert "hold other rows" in str(waiting["error"])
    assert committed_count(admin, target) == inserted  # nothing of run r3 went in

    co = dedup_coordinator(target, tmp_path)  # run r4, the original cut: every partition goes through
    msgs = [co.prepare(WriteContext(TXN, 0, p, 0, run="r4"), batches(t, 100)) for p, t in enumerate(first)]
    co.commit_batch(0, msgs)
    assert committed_count(admin, target) == N and distinct_ids(admin, target) == N


def test_a_task_of_another_run_scans_the_batch_and_waits_for_the_claims_of_the_run_that_reached_it_first(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # r2 reached batch 0 first and inserted partition 0 under its cut. A late task of r1
    # (an earlier run's zombie) finds the batch's first run not its own: it scans the
    # batch's records, and its barrier waits for r2's claim, so it inserts nothing.
    target = make_table(admin, database)
    r2 = cut(rows(N), 3)
    dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r2"), batches(r2[0], 100))
    assert committed_count(admin, target) == 400
    monkeypatch.setattr(dedup_claims, "WAIT_S", 1.0)
    sent = recording_requests(monkeypatch)
    with pytest.raises(DedupLayoutError, match=r"partitions \[0\]"):
        r1 = cut(rows(N), 2)
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 1, 0, run="r1"), batches(r1[1], 100))
    monkeypatch.undo()
    assert any(LAYOUT_TABLE in r and "txn_id =" in r for r in sent)  # the scan
    assert committed_count(admin, target) == 400


def part(*ranges: tuple[int, int]) -> pa.Table:
    """One partition's rows: ids from each (start, count) range, in order."""
    return pa.concat_tables([rows(n, start=s) for s, n in ranges])


def test_a_replay_whose_partition_has_the_same_first_chunk_but_another_later_chunk_is_refused_before_it(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # Chunks of 300 rows. Run r1 inserted partition 0 as chunks c0 (ids 0..299) and c1
    # (300..599) and died before its commit; run r2's partition 0 holds the same c0 and
    # another c1 (600..899): the rows of c0 are deduplicated, c1' must not go in.
    target = make_table(admin, database)
    dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r1"), batches(part((0, 600)), 100))
    assert committed_count(admin, target) == 600
    replay = part((0, 300), (600, 300))
    with pytest.raises(DedupLayoutError) as info:
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r2"), batches(replay, 100))
    text = str(info.value)
    assert "batch 0 of dq, partition 0, chunk 1" in text and "original partitioning" in text
    assert "300:" in text  # both fingerprints: rows and digest
    assert committed_count(admin, target) == 600  # nothing of c1' went in
    co = dedup_coordinator(target, tmp_path)  # run r3, the original rows: deduplicated, committed
    co.commit_batch(0, [co.prepare(WriteContext(TXN, 0, 0, 1, run="r3"), batches(part((0, 600))))])
    assert committed_count(admin, target) == 600 and distinct_ids(admin, target) == 600


def test_a_replay_whose_partition_runs_past_the_end_of_the_earlier_runs_partition_is_refused_before_it_inserts(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # Run r1 inserted all of partition 0 (2 chunks) and the driver sealed the batch, then
    # died; run r2's partition 0 holds the same 2 chunks and a third one.
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    msgs = [co.prepare(WriteContext(TXN, 0, 0, 0, run="r1"), batches(part((0, 600))))]
    co.mode_io.check_layout(target, 0, msgs)
    with pytest.raises(DedupLayoutError, match=r"partition 0, chunk 2: .*ended after 2 chunks"):
        dedup_coordinator(target, tmp_path).prepare(
            WriteContext(TXN, 0, 0, 1, run="r2"), batches(part((0, 600), (600, 100)))
        )
    assert committed_count(admin, target) == 600


def dying_after(t: pa.Table, rows_before: int):
    """``t`` as batches of 100 rows that raise (an executor killed) once ``rows_before`` rows went out."""
    sent = 0
    for b in batches(t, 100):
        if sent >= rows_before:
            raise RuntimeError("executor killed")
        sent += b.num_rows
        yield b


def in_thread(fn) -> tuple[threading.Thread, dict[str, BaseException]]:
    out: dict[str, BaseException] = {}

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # inspected by the test
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    return t, out


def test_a_chunk_past_where_the_earlier_run_stopped_inside_a_partition_waits_and_is_refused_if_the_cut_changed(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # Chunks of 300 rows. Run r1: partition 0 (ids 0..599) inserted chunk 0 and its
    # executor died assembling chunk 1; partition 1 (600..899) inserted whole. Run r2
    # cuts otherwise: partition 0 = 0..299 + 600..899 (the same chunk 0; chunk 1 holds
    # r1's partition 1), partition 1 = 300..599. Nothing binds r2's chunk 1 of partition
    # 0: it must wait for r2's partition 1 to re-check r1's, which refuses.
    target = make_table(admin, database)
    with pytest.raises(NotCommittedError, match="executor killed"):  # prepare failed
        dedup_coordinator(target, tmp_path).prepare(
            WriteContext(TXN, 0, 0, 0, run="r1"), dying_after(part((0, 600)), 400)
        )
    dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 1, 0, run="r1"), batches(part((600, 300)), 100))
    assert committed_count(admin, target) == 600
    p0 = part((0, 300), (600, 300))
    t, out = in_thread(
        lambda: dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r2"), batches(p0, 100))
    )
    time.sleep(1.0)
    with pytest.raises(DedupLayoutError, match="began with|beginning with"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 1, 0, run="r2"), batches(part((300, 300))))
    t.join(60)
    assert isinstance(out.get("error"), DedupLayoutError), out
    assert "partition 0" in str(out["error"]) and "hold other rows" in str(out["error"])
    assert committed_count(admin, target) == 600 and distinct_ids(admin, target) == 600  # no row twice

    # Run r3, the original cut, its two partitions side by side as on two executor
    # slots (r1 ran them so): partition 0's chunk 1 waits until partition 1 is re-checked.
    co = dedup_coordinator(target, tmp_path)
    msgs: dict[int, Prepared] = {}
    t, out = in_thread(
        lambda: msgs.setdefault(0, co.prepare(WriteContext(TXN, 0, 0, 0, run="r3"), batches(part((0, 600)), 100)))
    )
    time.sleep(1.0)
    msgs[1] = co.prepare(WriteContext(TXN, 0, 1, 0, run="r3"), batches(part((600, 300)), 100))
    t.join(60)
    assert not out, out
    co.commit_batch(0, [msgs[0], msgs[1]])
    assert committed_count(admin, target) == 900 and distinct_ids(admin, target) == 900


def test_a_partition_the_earlier_run_never_started_waits_until_the_earlier_partitions_later_chunks_are_re_checked(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # Run r1 inserted partition 0 whole as 2 chunks (ids 0..599) and died before its
    # commit. Run r2 cuts it in 2: partition 0 = 0..299 (the same first chunk, then it
    # ends), partition 1 = 300..599 (r1's chunk 1). Partition 1 must not go in once
    # partition 0's first chunk is re-checked: only once all of r1's partition 0 is.
    target = make_table(admin, database)
    dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r1"), batches(part((0, 600)), 100))
    with pytest.raises(DedupLayoutError, match="partition 0, chunk 1"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0, run="r2"), batches(part((0, 300))))
    with pytest.raises(DedupLayoutError, match=r"partitions \[0\] hold other rows"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 1, 0, run="r2"), batches(part((300, 300))))
    assert committed_count(admin, target) == 600 and distinct_ids(admin, target) == 600
