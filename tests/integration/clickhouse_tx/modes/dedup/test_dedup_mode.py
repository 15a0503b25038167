"""Mode dedup against the embedded stack: content tokens, the zombie fence, the window check."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import (
    DedupLayoutError,
    DedupWindowError,
    NotCommittedError,
    OutcomeUnknownError,
    ReplyLostError,
)
from clickhouse_tx.interfaces import Prepared, Target, WriteContext
from clickhouse_tx.modes.dedup.chunks import ChunkSizing
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.modes.dedup.window import max_block_number
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.store.markers import MARKERS_TABLE
from clickhouse_tx.store.registry import KeeperMapRegistry
from tests.helpers.tables import (
    DEDUP_TXN,
    batches,
    committed_count,
    dedup_coordinator,
    distinct_ids,
    make_table,
    markers,
    recording_requests,
    rows,
)

TXN = DEDUP_TXN


class SimulatedCrash(Exception):
    """The executor dies here."""


def crashing_after(t: pa.Table, n_rows: int, size: int) -> Iterator[pa.RecordBatch]:
    sent = 0
    for b in t.to_batches(max_chunksize=size):
        if sent >= n_rows:
            raise SimulatedCrash(f"executor killed after {sent} rows")
        sent += b.num_rows
        yield b


def insert_elsewhere(mode: object, admin: ClickHouseHTTP, target: Target, start: int, token: str) -> None:
    """Four rows from ``start`` into ``target`` under ``token``, as another writer's chunk (one more part each)."""
    assert isinstance(mode, DedupMode)
    four = rows(4, start=start).to_batches()[0]
    mode._insert(admin, target, four.schema, [four.serialize()], token, 4)


def ids(admin: ClickHouseHTTP, target) -> list[int]:
    fq = q.qualified(target.database, target.table)
    return [r["id"] for r in admin.query_json(f"SELECT id FROM {fq} ORDER BY id SETTINGS implicit_transaction = 1")]


def test_a_dedup_replay_with_other_record_batch_sizes_after_a_partial_attempt_inserts_nothing_twice(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    data = rows(1000)
    with pytest.raises(NotCommittedError, match="executor killed after 700 rows"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0), crashing_after(data, 700, 70))
    assert committed_count(admin, target) == 600  # two chunks of 300 went in, visible at once
    replay = dedup_coordinator(target, tmp_path)
    p = replay.prepare(WriteContext(TXN, 0, 0, 1), batches(data, 999))
    replay.commit_batch(0, [p])
    assert committed_count(admin, target) == 1000 and distinct_ids(admin, target) == 1000


def test_wide_rows_are_cut_into_smaller_chunks_and_their_replay_in_other_record_batches_inserts_nothing_twice(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # several IPC messages a chunk, as chunks of 65 536 rows and more have
    sizing = ChunkSizing(target_bytes=65_536, sample_rows=100, min_rows=100, max_rows=2_000, message_rows=64)
    narrow, wide = make_table(admin, database, "narrow"), make_table(admin, database, "wide")
    data = {"narrow": rows(3000), "wide": rows(3000).set_column(1, "s", pa.array([f"{i:0500d}" for i in range(3000)]))}
    for batch, target in enumerate((narrow, wide)):  # one query: a batch each
        name = target.table
        with pytest.raises(NotCommittedError, match="executor killed"):
            dedup_coordinator(target, tmp_path, sizing).prepare(
                WriteContext(TXN, batch, 0, 0), crashing_after(data[name], 2400, 80)
            )
        partial = committed_count(admin, target)
        replay = dedup_coordinator(target, tmp_path, sizing)
        p = replay.prepare(WriteContext(TXN, batch, 0, 1), batches(data[name], 1_999))
        replay.commit_batch(batch, [p])
        assert committed_count(admin, target) == 3000 and distinct_ids(admin, target) == 3000
        per_chunk = int(p.details["chunk_rows"])
        assert 0 < partial < 3000 and partial % per_chunk == 0  # whole chunks went in before the crash
        assert p.details["chunks"] == -(-3000 // per_chunk)
        if name == "narrow":
            assert per_chunk == sizing.max_rows
        else:  # about 510 bytes a row: 64 KiB hold about 128
            assert sizing.min_rows < per_chunk < 140


def test_a_chunk_sent_as_many_ipc_messages_is_one_block_per_table_partition(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)  # PARTITION BY id % 4
    co = dedup_coordinator(target, tmp_path, ChunkSizing.fixed(2_000, message_rows=64))
    p = co.prepare(WriteContext(TXN, 0, 0, 0), batches(rows(2_000), 100))  # 32 messages
    assert p.details["chunks"] == 1
    assert max_block_number(admin, target) == 4  # one part per table partition, not per message


def test_a_replay_whose_partition_holds_other_rows_is_refused_and_the_original_rows_are_not_swallowed(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # The first attempt of partition 0 wrote rows 0..299 and died; the replay (after a
    # repartitioning upstream) gives partition 0 the rows 5000..5299. A positional token
    # ("partition 0, chunk 0") made ClickHouse drop them as a duplicate: rows lost.
    # Content tokens would insert them, but the rows 0..299 already in the table would
    # then be inserted again by whichever partition now holds them: the replay is
    # refused before it inserts (tests/integration/clickhouse_tx/modes/dedup/test_dedup_claims.py), and the
    # original cut finishes the partition without losing its rows 300..399.
    target = make_table(admin, database)
    with pytest.raises(NotCommittedError):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0), crashing_after(rows(400), 300, 300))
    with pytest.raises(DedupLayoutError):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 1), batches(rows(300, start=5000)))
    replay = dedup_coordinator(target, tmp_path)
    replay.commit_batch(0, [replay.prepare(WriteContext(TXN, 0, 0, 2), batches(rows(400)))])
    assert ids(admin, target) == list(range(400))


def test_equal_chunks_of_one_partition_are_both_inserted(admin: ClickHouseHTTP, database: str, tmp_path: Path) -> None:
    target = make_table(admin, database)
    twice = pa.concat_tables([rows(300), rows(300)])
    co = dedup_coordinator(target, tmp_path)
    co.commit_batch(0, [co.prepare(WriteContext(TXN, 0, 0, 0), batches(twice))])
    assert committed_count(admin, target) == 600


def fencing_after(t: pa.Table, n_rows: int, fence: Callable[[], None]) -> Iterator[pa.RecordBatch]:
    for i, b in enumerate(t.to_batches(max_chunksize=n_rows)):
        if i == 1:
            fence()  # the driver aborts the attempt while its executor still streams
        yield b


def test_a_fenced_zombie_dedup_insert_is_refused(admin: ClickHouseHTTP, database: str, tmp_path: Path) -> None:
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path, xid="zombie-0")
    registry = KeeperMapRegistry(target)

    def fence() -> None:
        assert registry.transition("zombie-0", ["initialized"], "aborting")

    with pytest.raises(NotCommittedError, match="fenced"):
        co.prepare(WriteContext(TXN, 0, 0, 0), fencing_after(rows(1200), 300, fence))
    # the chunk sent before the fence is in (dedup cannot undo it); nothing after it
    assert committed_count(admin, target) == 300


def test_a_chunks_fence_and_window_are_one_request_and_a_registry_elsewhere_still_fences(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The registry on the target's server: each chunk's fence and window in one statement.
    target = make_table(admin, database)
    sent = recording_requests(monkeypatch)
    dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0), batches(rows(600)))
    monkeypatch.undo()
    checks = [r for r in sent if "system.parts" in r]
    assert len(checks) == 2 and all("clickhouse_tx_registry" in r for r in checks)
    # Under another URL the registry is read on its own, and still fences the next chunk.
    co = dedup_coordinator(target, tmp_path, xid="zombie-1")
    elsewhere = KeeperMapRegistry(dataclasses.replace(target, url=target.url.replace("127.0.0.1", "localhost")))
    assert elsewhere.target.url != target.url
    co.context = dataclasses.replace(co.context, mode_io=DedupMode(ChunkSizing.fixed(300), registry=elsewhere))

    def fence() -> None:
        assert elsewhere.transition("zombie-1", ["initialized"], "aborting")

    with pytest.raises(NotCommittedError, match="fenced"):
        co.prepare(WriteContext(TXN, 1, 0, 0), fencing_after(rows(1200, start=600), 300, fence))
    assert committed_count(admin, target) == 900


def test_a_dedup_prepare_stops_before_the_window_fills_and_names_the_fix(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # 4 table partitions: a 300-row chunk writes 4 parts; a window of 10 holds 2 chunks
    target = make_table(admin, database, settings="non_replicated_deduplication_window = 10")
    with pytest.raises(NotCommittedError, match=r"12 parts .* dedup window holds 10.*MODIFY SETTING"):
        dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 0), batches(rows(1200)))
    assert committed_count(admin, target) == 900


def test_a_dedup_commit_is_refused_when_the_window_filled_since_the_first_chunk(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database, settings="non_replicated_deduplication_window = 10")
    co = dedup_coordinator(target, tmp_path)
    p = co.prepare(WriteContext(TXN, 0, 0, 0), batches(rows(600)))  # 8 parts
    other = DedupMode(ChunkSizing.fixed(300), registry=co.registry)
    insert_elsewhere(other, admin, target, 9000, "elsewhere")
    # The coordinator reports the partition as not done (the batch stays open for a
    # replay or recover) and carries the window error as the cause.
    with pytest.raises(OutcomeUnknownError, match="12 parts .* dedup window holds 10") as err:
        co.commit_batch(0, [p])
    assert isinstance(err.value.__cause__, DedupWindowError)
    assert markers(admin, database) == []
    admin.command(
        f"ALTER TABLE {q.qualified(database, 'events')} MODIFY SETTING non_replicated_deduplication_window = 1000"
    )
    dedup_coordinator(target, tmp_path).commit_batch(0, [p])
    assert [m["xid"] for m in markers(admin, database)] == [p.xid]


def test_a_late_attempt_of_a_committed_partition_inserts_nothing_even_after_the_window_moved_on(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    target = make_table(admin, database, settings="non_replicated_deduplication_window = 10")
    data = rows(300)
    co = dedup_coordinator(target, tmp_path)
    co.commit_batch(0, [co.prepare(WriteContext(TXN, 0, 0, 0), batches(data))])
    for i in range(3):  # another writer: 12 parts, the batch's tokens leave the window
        insert_elsewhere(co.mode_io, admin, target, 9000 + 4 * i, f"w{i}")
    late = dedup_coordinator(target, tmp_path).prepare(WriteContext(TXN, 0, 0, 1), batches(data, 7))
    assert distinct_ids(admin, target) == committed_count(admin, target) == 312
    assert late.rows == 0 and late.details["committed_by"]


def _three_partitions_prepared(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> tuple[Target, Coordinator, list[Prepared]]:
    """A batch of three partitions of 100 rows, prepared and not committed."""
    target = make_table(admin, database)
    co = dedup_coordinator(target, tmp_path)
    return (
        target,
        co,
        [co.prepare(WriteContext(TXN, 0, part, 0), batches(rows(100, start=1000 * part))) for part in range(3)],
    )


def _marker_requests(sent: list[str], verb: str) -> list[str]:
    """The requests on the markers table whose statement starts with ``verb`` (an INSERT's
    ``SELECT ... FROM format(...)`` is no read)."""
    return [r for r in sent if MARKERS_TABLE in r and re.search(rf"\}} b['\"]{verb}\b", r)]


def test_a_dedup_batch_commit_reads_the_markers_once_and_writes_them_in_one_insert(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, co, ps = _three_partitions_prepared(admin, database, tmp_path)
    sent = recording_requests(monkeypatch)
    co.commit_batch(0, ps)
    monkeypatch.undo()
    assert len(_marker_requests(sent, "INSERT")) == 1
    assert len(_marker_requests(sent, "SELECT")) == 1  # no lookup per xid
    assert len([r for r in sent if "system.parts" in r]) == 1  # one window check
    assert [m["xid"] for m in markers(admin, database)] == [p.xid for p in ps]
    assert committed_count(admin, target) == distinct_ids(admin, target) == 300


def test_a_dedup_batch_commit_after_some_markers_were_written_writes_only_the_missing_ones(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # A driver that died after the first partition's marker: the next commit of the
    # batch finds it and writes the other two, each xid's marker once.
    target, co, ps = _three_partitions_prepared(admin, database, tmp_path)
    co.mode_io.commit(target, ps[0])
    dedup_coordinator(target, tmp_path).commit_batch(0, ps)
    assert [m["xid"] for m in markers(admin, database)] == [p.xid for p in ps]


def test_a_dedup_batch_commit_whose_markers_insert_lost_its_reply_finds_them_and_writes_none_twice(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server wrote the batch's markers, the reply never came: the per-xid commits
    # look each marker up before writing it, so every xid has exactly one.
    target, co, ps = _three_partitions_prepared(admin, database, tmp_path)
    post = ClickHouseHTTP._post
    lost: list[str] = []

    def reply_lost_once(self: ClickHouseHTTP, **kw: object) -> object:
        reply = post(self, **kw)  # type: ignore[arg-type]
        if not lost and "INSERT INTO" in repr(kw["data"]) and MARKERS_TABLE in repr(kw["data"]):
            lost.append(repr(kw["data"]))
            raise ReplyLostError("reply lost after the server ran the INSERT")
        return reply

    monkeypatch.setattr(ClickHouseHTTP, "_post", reply_lost_once)
    co.commit_batch(0, ps)
    monkeypatch.undo()
    assert lost and all(p.xid in lost[0] for p in ps)  # the one INSERT of all three
    assert [m["xid"] for m in markers(admin, database)] == [p.xid for p in ps]
    assert committed_count(admin, target) == distinct_ids(admin, target) == 300


def test_a_dedup_batch_whose_window_filled_for_one_partition_commits_the_others_and_names_the_window(
    admin: ClickHouseHTTP, database: str, tmp_path: Path
) -> None:
    # 4 parts per 300-row chunk: 12 parts since partition 0's first chunk, 8 since
    # partition 1's, in a window of 10. The batch is not done; partition 1 is.
    target = make_table(admin, database, settings="non_replicated_deduplication_window = 10")
    co = dedup_coordinator(target, tmp_path)
    ps = [co.prepare(WriteContext(TXN, 0, part, 0), batches(rows(300, start=1000 * part))) for part in range(2)]
    insert_elsewhere(co.mode_io, admin, target, 9000, "elsewhere")
    with pytest.raises(OutcomeUnknownError, match="12 parts .* dedup window holds 10") as err:
        co.commit_batch(0, ps)
    assert isinstance(err.value.__cause__, DedupWindowError)
    assert [m["xid"] for m in markers(admin, database)] == [ps[1].xid]
    admin.command(
        f"ALTER TABLE {q.qualified(database, 'events')} MODIFY SETTING non_replicated_deduplication_window = 1000"
    )
    dedup_coordinator(target, tmp_path).commit_batch(0, ps)
    assert [m["xid"] for m in markers(admin, database)] == [p.xid for p in ps]
