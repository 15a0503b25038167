"""The four commit modes against the local stack, driven through the real Coordinator."""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import INVALID_TRANSACTION
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.checksum import arrow_checksum
from clickhouse_tx.errors import ConfigurationError, IllegalTransitionError, NotCommittedError, ServerError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import CommitModeIO, CommitOutcome, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes import mode_io_for
from clickhouse_tx.modes.dedup.chunks import ChunkSizing
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.modes.session_keepalive import KEEP_ALIVE
from clickhouse_tx.modes.staging.mode import StagingMode
from clickhouse_tx.modes.staging.publish import MOVES_AT_ONCE, run_moves
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX, move_sql, stage_name
from clickhouse_tx.modes.transaction import TransactionMode
from clickhouse_tx.store.registry import DEFAULT_TABLE, KeeperMapRegistry
from clickhouse_tx.testing.faults import FaultPlan, InjectedFault, with_faults
from spark_datasource.testing.credentials import target_fields
from tests.helpers.tables import (
    PARTITIONS,
    TXN,
    batches,
    committed_count,
    distinct_ids,
    make_table,
    markers,
    recording_requests,
    rows,
    tables,
)


def _xid(name: str) -> str:
    """``name`` made unique to this run. An xid names the writer's HTTP session, and
    sessions belong to the server, not to the test's database: a server that outlives a
    run (``make test-external``) still holds the last run's session of that name, for
    up to its ``session_timeout``, with the transaction the driver rolled back in it, and
    the next ``BEGIN TRANSACTION`` there fails with INVALID_TRANSACTION."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


class SimulatedCrash(BaseException):
    """The driver dies here (a BaseException: no retry or cleanup path catches it)."""


def prepare_all(co, data: pa.Table, *, batch: int = 0, attempt: int = 0) -> list[Prepared]:
    """One Spark-like task per slice of ``data``: slice i is partition i."""
    per = data.num_rows // 2
    return [co.prepare(WriteContext(TXN, batch, p, attempt), batches(data.slice(p * per, per))) for p in range(2)]


# ------------------------------------------------------------------------------------ all modes


@pytest.mark.parametrize("mode", [m.value for m in Mode])
def test_a_committed_batch_is_visible_exactly_once(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, mode, TXN, str(tmp_path))
    data = rows(2000)
    co.validate(data.schema)
    msgs = prepare_all(co, data)
    assert sum(m.rows for m in msgs) == 2000
    assert msgs[0].checksum == arrow_checksum(data.slice(0, 1000).to_batches())
    report = co.commit_batch(0, msgs)
    assert set(report.committed) == {m.xid for m in msgs}
    assert committed_count(admin, target) == 2000 and distinct_ids(admin, target) == 2000
    if mode != "none":
        assert [(m["xid"], m["rows"]) for m in markers(admin, database)] == [(m.xid, 1000) for m in msgs]
    assert not [t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)]
    # a replayed commit of the same batch changes nothing
    co2 = build_coordinator(target, mode, TXN, str(tmp_path))
    co2.commit_batch(0, msgs)
    assert committed_count(admin, target) == 2000


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_an_aborted_batch_leaves_no_row_and_no_stage_table(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, mode, TXN, str(tmp_path))
    data = rows(1000)
    co.validate(data.schema)
    msgs = prepare_all(co, data)
    co.abort_batch(0, msgs)
    assert committed_count(admin, target) == 0
    assert not [t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)]
    reg = KeeperMapRegistry(target)
    assert {e.state for e in reg.list_batch(TXN, 0)} == {"aborted"}
    assert markers(admin, database) == []


@pytest.mark.parametrize("mode", ["dedup", "none"])
def test_abort_cannot_take_back_rows_in_the_at_least_once_modes(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, mode, TXN, str(tmp_path))
    data = rows(1000)
    co.validate(data.schema)
    co.abort_batch(0, prepare_all(co, data))
    assert committed_count(admin, target) == 1000  # documented: visible since prepare


# ------------------------------------------------------------------------------------ transaction


def test_a_read_committed_reader_never_sees_rows_of_an_open_transaction(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, "transaction", TXN, str(tmp_path))
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        r = ClickHouseHTTP(target)
        while not stop.is_set():
            seen.append(committed_count(r, target))

    t = threading.Thread(target=reader)
    t.start()
    try:
        msgs = prepare_all(co, rows(20_000))
        while len(seen) < 5:  # make sure the reader ran while the transactions were open
            time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    assert seen and set(seen) == {0}
    co.commit_batch(0, msgs)
    assert committed_count(admin, target) == 20_000


def test_a_plain_select_outside_a_transaction_does_see_uncommitted_rows(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    """The documented caveat (docs/design.md §4): readers who need read-committed use implicit_transaction=1."""
    target = make_table(admin, database)
    co = build_coordinator(target, "transaction", TXN, str(tmp_path))
    msgs = prepare_all(co, rows(1000))
    fq = q.qualified(database, "events")
    assert admin.query_json(f"SELECT count() AS c FROM {fq}") == [{"c": 1000}]
    assert committed_count(admin, target) == 0
    co.abort_batch(0, msgs)


@dataclasses.dataclass
class CrashOnCommit:
    """Delegates to a real mode; the driver "dies" on the ``n``-th commit call.

    The batch's step (``commit_together``) is skipped, so every xid takes the per-xid
    commit: the path a failed batched step falls back to.
    """

    inner: CommitModeIO
    n: int
    calls: int = 0

    @property
    def mode(self) -> Mode:
        return self.inner.mode

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: object = None) -> None:
        pass

    def commit(self, target: Target, p: Prepared) -> None:
        self.calls += 1
        if self.calls == self.n:
            raise SimulatedCrash(f"driver died before committing {p.xid}")
        self.inner.commit(target, p)


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_a_driver_crash_between_commits_is_rolled_forward_on_replay(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, mode, TXN, str(tmp_path))
    data = rows(2000)
    msgs = prepare_all(co, data)
    co.context = dataclasses.replace(co.context, mode_io=CrashOnCommit(mode_io_for(mode), n=2))
    with pytest.raises(SimulatedCrash):
        co.commit_batch(0, msgs)
    assert committed_count(admin, target) == 1000  # the first partition only
    # Spark restarts the query: a fresh driver-side writer commits the same batch again
    replay = build_coordinator(target, mode, TXN, str(tmp_path))
    report = replay.commit_batch(0, msgs)
    assert report.replay
    assert committed_count(admin, target) == 2000 and distinct_ids(admin, target) == 2000
    assert sorted(m["xid"] for m in markers(admin, database)) == sorted(m.xid for m in msgs)


def test_a_duplicate_attempt_of_a_partition_is_rolled_back(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, "transaction", TXN, str(tmp_path))
    data = rows(2000)
    first = prepare_all(co, data)
    speculative = co.prepare(WriteContext(TXN, 0, 0, 1), batches(data.slice(0, 1000)))
    report = co.commit_batch(0, first + [speculative])
    assert len(report.committed) == 2 and len(report.rolled_back) == 1
    assert committed_count(admin, target) == 2000 and distinct_ids(admin, target) == 2000
    loser = next(p for p in first + [speculative] if p.xid in report.rolled_back)
    assert TransactionMode().lookup(target, loser) is CommitOutcome.NOT_COMMITTED
    # The batch is done: its finished entries are dropped, the registry keeps only xids in flight.
    assert KeeperMapRegistry(target).get(loser.xid) is None
    assert KeeperMapRegistry(target).list_batch(loser.txn_id, loser.batch) == []


def test_the_rows_of_an_expired_session_never_become_visible(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = dataclasses.replace(make_table(admin, database), session_timeout_s=1)
    mode = TransactionMode()
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("expiring-xid-1"), batches(rows(500)))
    assert mode.lookup(target, p) is CommitOutcome.PENDING
    KEEP_ALIVE.unwatch(p.xid)  # the executor died, and its keep-alive thread with it
    # The executor "died": nobody touches the session (a lookup would keep it alive),
    # so the server expires it after 1 s idle and rolls the transaction back.
    deadline = time.monotonic() + 60
    while True:
        time.sleep(3)
        if mode.lookup(target, p) is CommitOutcome.NOT_COMMITTED:
            break
        assert time.monotonic() < deadline, "the session never expired"
    fq = q.qualified(database, "events")
    assert admin.query_json(f"SELECT count() AS c FROM {fq}") == [{"c": 0}]  # even a plain read
    with pytest.raises(NotCommittedError):
        mode.commit(target, p)
    assert committed_count(admin, target) == 0


def test_transaction_lookup_commit_and_rollback_are_idempotent(admin: ClickHouseHTTP, database: str) -> None:
    target = make_table(admin, database)
    mode = TransactionMode()
    mode.validate(target, rows(1).schema)
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("idem-xid-1"), batches(rows(300)))
    assert mode.lookup(target, p) is CommitOutcome.PENDING
    mode.commit(target, p)
    assert mode.lookup(target, p) is CommitOutcome.COMMITTED
    mode.commit(target, p)  # committing a committed xid: no-op
    mode.rollback(target, p)  # the session holds no transaction any more: no-op
    assert committed_count(admin, target) == 300
    gone = dataclasses.replace(p, xid=_xid("never-prepared-xid"))
    mode.rollback(target, gone)
    assert mode.lookup(target, gone) is CommitOutcome.NOT_COMMITTED
    with pytest.raises(NotCommittedError):
        mode.commit(target, gone)


def test_a_writer_still_running_after_the_driver_rolled_its_transaction_back_writes_nothing_more(
    admin: ClickHouseHTTP, database: str
) -> None:
    """Spark may give up on a task whose Python worker keeps running (a stopped query, a
    killed task): the driver's abort rolls the xid back while its writer is between two
    statements. The writer's next statement in the session must fail. After a ROLLBACK
    it ran outside any transaction and its rows were visible at once: duplicates once
    the batch was replayed."""
    target = make_table(admin, database)
    mode = TransactionMode()
    mode.validate(target, rows(1).schema)
    fq = q.qualified(database, "events")
    # prepared (BEGIN, INSERT, marker), then rolled back while its writer lives on
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("fenced-prepared-xid"), batches(rows(100)))
    KEEP_ALIVE.unwatch(p.xid)
    # only BEGIN sent when the driver rolls it back
    begun = dataclasses.replace(p, xid=_xid("fenced-begun-xid"))
    for fenced in (p, begun):
        with ClickHouseHTTP(target, session_id=fenced.xid, session_timeout=target.session_timeout_s) as writer:
            if fenced is begun:
                writer.command("BEGIN TRANSACTION")
            mode.rollback(target, fenced)
            with pytest.raises(ServerError) as refused:
                writer.insert_arrow_stream(fq, rows(1).schema, batches(rows(50)))
            assert refused.value.code == INVALID_TRANSACTION
            with pytest.raises(ServerError):
                writer.command("COMMIT")
        mode.rollback(target, fenced)  # again: a no-op
    assert committed_count(admin, target) == 0
    assert admin.query_json(f"SELECT count() AS c FROM {fq} SETTINGS implicit_transaction = 1") == [{"c": 0}]
    assert mode.lookup(target, p) is CommitOutcome.NOT_COMMITTED
    with pytest.raises(NotCommittedError):
        mode.commit(target, p)


def test_an_empty_partition_commits_with_a_zero_row_marker(admin: ClickHouseHTTP, database: str) -> None:
    target = make_table(admin, database)
    mode = TransactionMode()
    mode.validate(target, rows(1).schema)
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("empty-xid-1"), iter(()))
    mode.commit(target, p)
    assert p.rows == 0 and mode.lookup(target, p) is CommitOutcome.COMMITTED


# ------------------------------------------------------------------------------------ staging


def test_a_half_moved_stage_is_rolled_forward_and_cannot_be_rolled_back(admin: ClickHouseHTTP, database: str) -> None:
    target = make_table(admin, database)
    mode = StagingMode()
    mode.validate(target, rows(1).schema)
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("stage-xid-1"), batches(rows(4000)))
    assert p.details["partitions"] == ["0", "1", "2", "3"]
    assert committed_count(admin, target) == 0 and mode.lookup(target, p) is CommitOutcome.PENDING
    stage = q.qualified(database, stage_name(p.xid))
    admin.command(f"ALTER TABLE {stage} MOVE PARTITION ID '2' TO TABLE {q.qualified(database, 'events')}")
    with pytest.raises(IllegalTransitionError, match="already moved"):
        mode.rollback(target, p)
    mode.commit(target, p)
    assert committed_count(admin, target) == 4000 and distinct_ids(admin, target) == 4000
    assert stage_name(p.xid) not in tables(admin, database)
    assert mode.lookup(target, p) is CommitOutcome.COMMITTED
    mode.commit(target, p)  # no-op
    assert committed_count(admin, target) == 4000


def test_a_staging_commit_without_dead_letters_never_asks_for_a_dead_letter_stage(
    admin: ClickHouseHTTP, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two round trips of every staging commit (the dead-letter stage's COMMENT and DROP)
    are skipped when the partition's prepare staged no dead letter."""
    target = make_table(admin, database)
    mode = StagingMode()
    mode.validate(target, rows(1).schema)
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("stage-xid-nodl"), batches(rows(400)))
    assert p.details["dead_letters"] == 0
    sent = recording_requests(monkeypatch)
    mode.commit(target, p)
    monkeypatch.undo()
    assert sent and not [r for r in sent if "_ctx_dlstage_" in r]
    assert committed_count(admin, target) == 400
    assert stage_name(p.xid) not in tables(admin, database)


def test_a_staging_batch_is_published_with_its_reads_markers_and_drops_batched(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per stage only its MOVEs; the batch's COMMENTs, partitions and drops are one request each."""
    target = make_table(admin, database)
    co = build_coordinator(target, "staging", TXN, str(tmp_path))
    msgs = [co.prepare(WriteContext(TXN, 0, p, 0), batches(rows(100, start=100 * p))) for p in range(6)]
    sent = recording_requests(monkeypatch)
    build_coordinator(target, "staging", TXN, str(tmp_path)).commit_batch(0, msgs)
    monkeypatch.undo()
    on_stages = [r for r in sent if STAGE_PREFIX in r]
    moves = sum(len(p.details["partitions"]) for p in msgs)
    assert moves > 6 and len([r for r in on_stages if "MOVE PARTITION" in r]) == moves
    assert len(on_stages) == moves + 3
    assert committed_count(admin, target) == 600 and distinct_ids(admin, target) == 600
    assert len(markers(admin, database)) == 6
    assert not [t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)]


def test_a_staging_batch_stopped_after_its_first_move_is_rolled_forward_once(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    """A crash inside the batched publish (one stage partition moved, no marker) leaves what a
    per-xid commit rolls forward: the replay publishes every row once."""
    target = make_table(admin, database)
    co = build_coordinator(target, "staging", TXN, str(tmp_path))
    msgs = [co.prepare(WriteContext(TXN, 0, p, 0), batches(rows(100, start=100 * p))) for p in range(4)]
    plan = FaultPlan("in_batch_transaction", "raise")
    faulty = with_faults(build_coordinator(target, "staging", TXN, str(tmp_path)), plan)
    with pytest.raises(InjectedFault):
        faulty.commit_batch(0, msgs)
    assert 0 < committed_count(admin, target) < 400 and not markers(admin, database)  # one stage partition moved
    build_coordinator(target, "staging", TXN, str(tmp_path)).commit_batch(0, msgs)
    assert committed_count(admin, target) == 400 and distinct_ids(admin, target) == 400
    assert len(markers(admin, database)) == 4


def test_a_batchs_moves_are_all_sent_though_one_fails_and_the_failure_is_raised(
    admin: ClickHouseHTTP, database: str
) -> None:
    """The MOVEs go several at a time; one that fails stops neither the others nor its
    worker's next ones, and the commit still hears of it."""
    target = make_table(admin, database)
    mode = StagingMode()
    mode.validate(target, rows(1).schema)
    ps = [
        mode.prepare(
            target, WriteContext(TXN, 0, part, 0), _xid(f"moves-xid-{part}"), batches(rows(10, start=10 * part))
        )
        for part in range(2 * MOVES_AT_ONCE)
    ]
    into = q.qualified(database, "events")
    moves = [move_sql(database, stage_name(p.xid), pid, into) for p in ps for pid in p.details["partitions"]]
    moves.insert(1, move_sql(database, "no_such_stage", "0", into))  # the first worker's first MOVE
    with pytest.raises(ServerError):
        run_moves(target, moves)
    assert committed_count(admin, target) == 10 * len(ps) and distinct_ids(admin, target) == 10 * len(ps)


def test_a_rolled_back_stage_is_not_committed(admin: ClickHouseHTTP, database: str) -> None:
    target = make_table(admin, database)
    mode = StagingMode()
    mode.validate(target, rows(1).schema)
    p = mode.prepare(target, WriteContext(TXN, 0, 0, 0), _xid("stage-xid-2"), batches(rows(100)))
    mode.rollback(target, p)
    mode.rollback(target, p)  # idempotent
    assert mode.lookup(target, p) is CommitOutcome.NOT_COMMITTED
    with pytest.raises(NotCommittedError):
        mode.commit(target, p)
    assert committed_count(admin, target) == 0


@pytest.mark.parametrize("block_rows", [None, 500], ids=["one_part_per_partition", "many_parts_per_partition"])
def test_a_reader_during_move_partition_sees_whole_partitions_only(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, block_rows: int | None
) -> None:
    """Measures what a concurrent reader sees while staging commits (see docs/modes.md).

    The stage is not merged before its commit (no OPTIMIZE FINAL): with small insert
    blocks each partition is several parts, and MOVE PARTITION must still move them at once.
    """
    target = make_table(admin, database)
    if block_rows is not None:
        target = dataclasses.replace(
            target,
            settings={
                "max_insert_block_size": str(block_rows),
                "min_insert_block_size_rows": str(block_rows),
                "min_insert_block_size_bytes": "0",
            },
        )
    mode = StagingMode()
    mode.validate(target, rows(1).schema)
    per_partition, commits = 2500, 12
    seen: collections.Counter[int] = collections.Counter()
    stop = threading.Event()

    def reader() -> None:
        r = ClickHouseHTTP(target)
        while not stop.is_set():
            seen[committed_count(r, target)] += 1

    prepared = [
        mode.prepare(
            target,
            WriteContext(TXN, i, 0, 0),
            f"mv-xid-{i}",
            batches(rows(per_partition * PARTITIONS, start=i * 1_000_000), 5000),
        )
        for i in range(commits)
    ]
    parts = int(
        admin.command(
            "SELECT count() FROM system.parts WHERE database = {d:String} AND table = {t:String} AND active",
            params={"d": database, "t": stage_name(prepared[0].xid)},
        ).strip()
    )
    if block_rows is None:
        assert parts >= PARTITIONS
    else:
        assert parts > PARTITIONS, f"the stage should hold several parts per partition, has {parts}"
    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for p in prepared:
            mode.commit(target, p)
    finally:
        stop.set()
        for t in threads:
            t.join()
    total_reads = sum(seen.values())
    torn = {c: n for c, n in seen.items() if c % per_partition}
    between_partitions = sum(n for c, n in seen.items() if c % per_partition == 0 and c % (per_partition * PARTITIONS))
    result = {
        "commits": commits,
        "partitions_per_commit": PARTITIONS,
        "rows_per_partition": per_partition,
        "reads": total_reads,
        "reads_inside_one_partition_move": sum(torn.values()),
        "reads_between_partitions_of_one_commit": between_partitions,
    }
    (tmp_path / "move_partition_visibility.json").write_text(json.dumps(result))
    print("MOVE PARTITION visibility:", json.dumps(result))
    assert committed_count(admin, target) == per_partition * PARTITIONS * commits
    assert total_reads > 0
    assert not torn, f"a reader saw a partition half-moved: {torn}"


# ------------------------------------------------------------------------------------ dedup


def test_a_retried_dedup_attempt_with_other_batch_sizes_is_deduplicated(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, "dedup", TXN, str(tmp_path))
    co.context = dataclasses.replace(co.context, mode_io=DedupMode(ChunkSizing.fixed(300)))
    data = rows(1000)
    a0 = co.prepare(WriteContext(TXN, 0, 0, 0), batches(data, 70))
    a1 = co.prepare(WriteContext(TXN, 0, 0, 1), batches(data, 999))
    assert a0.details["chunks"] == a1.details["chunks"] == 4
    assert committed_count(admin, target) == 1000
    co.commit_batch(0, [a0, a1])
    assert committed_count(admin, target) == 1000 and distinct_ids(admin, target) == 1000


def test_dedup_refuses_a_table_without_a_dedup_window_and_says_how_to_fix_it(
    admin: ClickHouseHTTP, database: str
) -> None:
    target = make_table(admin, database, settings="")
    with pytest.raises(ConfigurationError, match=r"MODIFY SETTING non_replicated_deduplication_window = 1000"):
        DedupMode().validate(target, rows(1).schema)
    assert tables(admin, database) == {"events"}


# ------------------------------------------------------------------------------------ bad input


def _nothing_left_behind(admin: ClickHouseHTTP, database: str, expected_tables: set[str]) -> None:
    names = tables(admin, database)
    assert not [t for t in names if t.startswith(STAGE_PREFIX)]
    assert DEFAULT_TABLE not in names, "validation must not touch the registry"
    assert names == expected_tables


@pytest.mark.parametrize("mode", [m.value for m in Mode])
def test_a_missing_table_is_named_before_anything_is_written(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = Target(url=admin.target.url, database=database, table="no_such_table", **target_fields())
    co = build_coordinator(target, mode, TXN, str(tmp_path))
    with pytest.raises(ConfigurationError, match=rf"{database}\.no_such_table does not exist"):
        co.validate(rows(1).schema)
    _nothing_left_behind(admin, database, set())


@pytest.mark.parametrize("mode", [m.value for m in Mode])
def test_a_data_column_missing_from_the_table_is_named(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    schema = pa.schema([("id", pa.uint64()), ("s", pa.string()), ("surprise", pa.string())])
    with pytest.raises(ConfigurationError, match=r"`surprise` \(string\) is not a column of"):
        build_coordinator(target, mode, TXN, str(tmp_path)).validate(schema)
    _nothing_left_behind(admin, database, {"events"})


@pytest.mark.parametrize("mode", [m.value for m in Mode])
def test_an_incompatible_type_names_the_column_and_both_types(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    schema = pa.schema([("id", pa.list_(pa.int64())), ("s", pa.string())])
    with pytest.raises(ConfigurationError, match=r"`id`.*list<item: int64>.*UInt64"):
        build_coordinator(target, mode, TXN, str(tmp_path)).validate(schema)
    _nothing_left_behind(admin, database, {"events"})


@pytest.mark.parametrize("engine", ["Log", "ReplicatedMergeTree('/clickhouse/tables/{database}/events', 'r1')"])
def test_transaction_mode_refuses_a_non_merge_tree_or_replicated_table_and_suggests_staging(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, engine: str
) -> None:
    target = make_table(admin, database, engine=engine, settings="")
    try:
        with pytest.raises(ConfigurationError, match=r"mode 'staging'"):
            build_coordinator(target, "transaction", TXN, str(tmp_path)).validate(rows(1).schema)
        _nothing_left_behind(admin, database, {"events"})
    finally:
        admin.command(f"DROP TABLE IF EXISTS {q.qualified(database, 'events')} SYNC")


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_a_replay_of_a_rolled_back_partition_is_not_swallowed_by_the_dedup_window(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    # The table has a dedup window: a rolled-back insert must not leave a block hash
    # behind that makes ClickHouse drop the identical block of the replay.
    target = make_table(admin, database, settings="non_replicated_deduplication_window = 1000")
    data = rows(2000)
    first = build_coordinator(target, mode, "q", str(tmp_path))
    p = first.prepare(WriteContext("q", 7, 0, 0), batches(data))
    first.abort_batch(7, [p])
    again = build_coordinator(target, mode, "q", str(tmp_path))
    p2 = again.prepare(WriteContext("q", 7, 0, 1), batches(data))
    build_coordinator(target, mode, "q", str(tmp_path)).commit_batch(7, [p2])
    assert committed_count(admin, target) == 2000
    assert distinct_ids(admin, target) == 2000
