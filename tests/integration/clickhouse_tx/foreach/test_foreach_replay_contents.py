"""The ``foreachBatch`` helper in mode ``dedup`` catches a replay that is not the same batch
(``clickhouse_tx.foreach.contents``), on the embedded server.

A first attempt stopped between its chunks (an exception from the test's hook, where a
SIGKILL would stop it) leaves its record and some rows; its replay with other values is
refused before any chunk, with the same rows in another order it completes the batch. A
first attempt that sent nothing leaves no record that could block its replay: stopped
before the record, or its first INSERT refused before it was sent. The records live as
long as their batch can be replayed: the next batch's key row drops them, ``gc`` drops
the last one once its key row is there.
"""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pytest

from clickhouse_tx.admin.bookkeeping import gc_bookkeeping
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ConfigurationError, RequestNotSentError
from clickhouse_tx.foreach.contents import record_key
from clickhouse_tx.foreach.dedup import write_batch_dedup
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords, TableRows
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.dedup.chunks import ChunkSizing
from clickhouse_tx.store.registry import KeeperMapRegistry
from spark_datasource.testing.credentials import target_fields
from tests.helpers.spark_writes import read_committed, run_sql

ROWS = 1000
SMALL = ChunkSizing.fixed(128, message_rows=50)  # 8 chunks of ROWS rows


class Stop(Exception):
    """Where the driver dies in the kill tests: the attempt stops, nothing after runs."""


def _target(url: str, database: str) -> Target:
    return Target(url=url, database=database, table="sums", **target_fields())


def _create(url: str, database: str) -> Target:
    run_sql(
        url,
        f"CREATE TABLE `{database}`.sums (k Int64, total Float64) ENGINE = MergeTree ORDER BY k "
        "SETTINGS non_replicated_deduplication_window = 1000",
    )
    target = _target(url, database)
    BatchRecords(target).ensure_table()
    return target


def _sums(database: str, seed: int, nudge: float = 0.0, batch_rows: int = 333) -> list[TableRows]:
    """ROWS groups' sums of doubles in an order drawn by ``seed``; ``nudge`` added to every
    sum, as a replay that added the doubles in another order gets other last bits."""
    ks = list(range(ROWS))
    random.Random(seed).shuffle(ks)
    table = pa.table({"k": pa.array(ks, pa.int64()), "total": pa.array([k * 0.1 + nudge for k in ks])})
    return [TableRows(database, "sums", table.to_batches(max_chunksize=batch_rows))]


def _stop_after_chunk(chunk: int):
    def hook(part: int, c: int) -> None:
        if c == chunk:
            raise Stop(f"stopped after chunk {c}")

    return hook


def _stop() -> None:
    raise Stop("stopped after the record")


def _rows(url: str, database: str) -> list[list[str]]:
    return read_committed(url, f"SELECT k, total FROM `{database}`.sums ORDER BY k, total")


def _records(url: str, database: str) -> list[str]:
    out = run_sql(url, f"SELECT xid FROM `{database}`.clickhouse_tx_layouts ORDER BY xid FORMAT TSV")
    return out.split()


def test_a_replay_with_other_doubles_after_a_first_attempt_stopped_between_chunks_is_refused_before_any_chunk(
    clickhouse_url: str, database: str
) -> None:
    target = _create(clickhouse_url, database)
    key = BatchKey("sums", 4, "query-1")
    with pytest.raises(Stop):
        write_batch_dedup(target, key, _sums(database, 1), sizing=SMALL, after_chunk=_stop_after_chunk(2))
    first = _rows(clickhouse_url, database)
    assert len(first) == 3 * 128

    with pytest.raises(ConfigurationError) as refused:
        write_batch_dedup(target, key, _sums(database, 2, nudge=1e-12), sizing=SMALL)
    text = str(refused.value)
    for part in (f"{database}.sums", "app_id='sums'", "batch 4", "first attempt 1000 rows", "this replay 1000 rows"):
        assert part in text, part
    assert "floating-point columns ['total']" in text and "mode 'transaction'" in text and "new app_id" in text
    assert _rows(clickhouse_url, database) == first  # nothing of the replay went in
    assert BatchRecords(target).recorded(key.scoped([f"{database}.sums"])) is None

    # The same rows as the first attempt, in another order and cut: the batch completes, once.
    assert write_batch_dedup(target, key, _sums(database, 3, batch_rows=71), sizing=SMALL) == ROWS
    assert len(_rows(clickhouse_url, database)) == ROWS
    assert {r[0] for r in _rows(clickhouse_url, database)} == {str(k) for k in range(ROWS)}


def test_a_first_attempt_stopped_after_its_record_binds_its_replay_as_one_that_may_have_inserted(
    clickhouse_url: str, database: str
) -> None:
    # Whether its first chunk reached the table cannot be read back: refused, never guessed.
    target = _create(clickhouse_url, database)
    key = BatchKey("sums", 0, "query-1")
    with pytest.raises(Stop):
        write_batch_dedup(target, key, _sums(database, 1), sizing=SMALL, after_record=_stop)
    with pytest.raises(ConfigurationError, match="carries other rows"):
        write_batch_dedup(target, key, _sums(database, 1, nudge=1e-12), sizing=SMALL)
    assert write_batch_dedup(target, key, _sums(database, 5), sizing=SMALL) == ROWS
    assert len(_rows(clickhouse_url, database)) == ROWS


def test_a_first_attempt_whose_first_insert_was_not_sent_leaves_no_record_and_its_replay_writes_its_own_rows(
    clickhouse_url: str, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _create(clickhouse_url, database)
    key = BatchKey("sums", 0, "query-1")

    def refused(*args: object, **kwargs: object) -> int:
        raise RequestNotSentError("connection refused (test)")

    with monkeypatch.context() as m:
        m.setattr(ClickHouseHTTP, "insert_arrow_messages", refused)
        with pytest.raises(RequestNotSentError):
            write_batch_dedup(target, key, _sums(database, 1), sizing=SMALL)
    assert _records(clickhouse_url, database) == []
    assert write_batch_dedup(target, key, _sums(database, 2, nudge=1e-12), sizing=SMALL) == ROWS
    assert len(_rows(clickhouse_url, database)) == ROWS


def test_the_next_batchs_key_row_drops_the_record_and_gc_drops_the_last_one_once_its_key_row_is_there(
    clickhouse_url: str, database: str
) -> None:
    target = _create(clickhouse_url, database)
    keys = [BatchKey("sums", b, "query-1").scoped([f"{database}.sums"]) for b in range(3)]
    for key in keys[:2]:
        write_batch_dedup(target, key, _sums(database, key.batch_id), sizing=SMALL)
    assert _records(clickhouse_url, database) == [record_key(keys[1])]
    with pytest.raises(Stop):  # batch 2 killed before its key row: its record must stay
        write_batch_dedup(target, keys[2], _sums(database, 2), sizing=SMALL, before_key=_stop)
    assert _records(clickhouse_url, database) == [record_key(keys[1]), record_key(keys[2])]

    registry = KeeperMapRegistry(target)
    later = time.time() + 10
    dropped = gc_bookkeeping(target, registry, retention_s=5, clock=lambda: later)
    assert dropped.layout_records == 1  # batch 1's: batch 1 has its key row; batch 2 has none
    assert _records(clickhouse_url, database) == [record_key(keys[2])]
