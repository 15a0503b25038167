"""The ``foreachBatch`` helper's ``dedup`` write (``clickhouse_tx.foreach.dedup``) on the embedded server.

An attempt stopped between its chunks (an exception from the test's hook, where a
SIGKILL would stop it), then the replay of the same key with the same rows in another
order, cut into other record batches, and with its tables in another order: every row
once, one key row (a replay with other rows is refused: ``test_foreach_replay_contents.py``).
The targets are ``MergeTree`` tables with
``non_replicated_deduplication_window``, which drop a block by its token as
``Replicated`` tables do.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.conversion.dead_letters import dead_letter_ddl
from clickhouse_tx.conversion.schema import conversion_columns, describe_table
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.foreach import dedup as batch_dedup
from clickhouse_tx.foreach.dedup import write_batch_dedup
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords, TableRows
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.dedup.chunks import ChunkSizing
from spark_datasource.testing.credentials import target_fields
from tests.helpers.spark_writes import read_committed, run_sql

ROWS = 1000
SMALL = ChunkSizing.fixed(128, message_rows=50)  # 8 chunks of ROWS rows


class Stop(Exception):
    """Where the driver dies in the kill tests: the attempt stops, nothing after runs."""


def _target(url: str, database: str, table: str = "a") -> Target:
    return Target(url=url, database=database, table=table, **target_fields())


def _create(url: str, database: str, *tables: str) -> None:
    for t in tables:
        run_sql(
            url,
            f"CREATE TABLE `{database}`.`{t}` (id Int64, v String) ENGINE = MergeTree ORDER BY id "
            "SETTINGS non_replicated_deduplication_window = 1000",
        )
    BatchRecords(_target(url, database)).ensure_table()


def _rows(ids: range, seed: int, batch_rows: int) -> list[pa.RecordBatch]:
    """The rows ``ids``, shuffled by ``seed`` and cut into record batches of ``batch_rows``."""
    order = list(ids)
    random.Random(seed).shuffle(order)
    table = pa.table({"id": pa.array(order, pa.int64()), "v": pa.array([f"v{i % 13}" for i in order])})
    return table.to_batches(max_chunksize=batch_rows)


def _stop_after(part: int, chunk: int):
    def hook(p: int, c: int) -> None:
        if (p, c) == (part, chunk):
            raise Stop(f"stopped after chunk {c} of part {p}")

    return hook


def _ids(url: str, database: str, table: str) -> list[int]:
    return [int(r[0]) for r in read_committed(url, f"SELECT id FROM `{database}`.`{table}` ORDER BY id")]


def _keys(url: str, database: str) -> list[tuple[str, str]]:
    return [tuple(r) for r in read_committed(url, f"SELECT batch_id, rows FROM `{database}`.clickhouse_tx_batches")]


def test_a_replay_in_another_order_after_an_attempt_stopped_between_chunks_adds_every_row_once(
    clickhouse_url: str, database: str
) -> None:
    _create(clickhouse_url, database, "a")
    key = BatchKey("orders", 7, "query-1")
    first = [TableRows(database, "a", _rows(range(ROWS), seed=1, batch_rows=333))]
    with pytest.raises(Stop):
        write_batch_dedup(_target(clickhouse_url, database), key, first, sizing=SMALL, after_chunk=_stop_after(0, 2))
    assert len(_ids(clickhouse_url, database, "a")) == 3 * 128  # three chunks went in, visible at once
    assert _keys(clickhouse_url, database) == []

    replay = [TableRows(database, "a", _rows(range(ROWS), seed=2, batch_rows=97))]
    assert write_batch_dedup(_target(clickhouse_url, database), key, replay, sizing=SMALL) == ROWS

    assert _ids(clickhouse_url, database, "a") == list(range(ROWS))
    assert _keys(clickhouse_url, database) == [("7", str(ROWS))]


def test_without_the_canonical_order_the_same_rows_in_another_order_would_be_refused_as_other_rows(
    clickhouse_url: str, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The order is what makes the replay's chunks the first attempt's: without it the same
    # rows cut into other chunks, which the first attempt's record tells from its own.
    monkeypatch.setattr(batch_dedup, "canonical_order", lambda table, display: table)
    _create(clickhouse_url, database, "a")
    key = BatchKey("orders", 7, "query-1")
    first = [TableRows(database, "a", _rows(range(ROWS), seed=1, batch_rows=333))]
    with pytest.raises(Stop):
        write_batch_dedup(_target(clickhouse_url, database), key, first, sizing=SMALL, after_chunk=_stop_after(0, 2))
    replay = [TableRows(database, "a", _rows(range(ROWS), seed=2, batch_rows=97))]
    with pytest.raises(ConfigurationError, match="carries other rows than its first attempt"):
        write_batch_dedup(_target(clickhouse_url, database), key, replay, sizing=SMALL)
    assert len(_ids(clickhouse_url, database, "a")) == 3 * 128


def test_a_two_table_replay_with_its_tables_in_the_other_order_adds_each_tables_rows_once(
    clickhouse_url: str, database: str
) -> None:
    _create(clickhouse_url, database, "a", "b")
    key = BatchKey("split", 3, "query-1")
    evens, odds = range(0, ROWS, 2), range(1, ROWS, 2)
    first = [TableRows(database, "a", _rows(evens, 1, 100)), TableRows(database, "b", _rows(odds, 1, 100))]
    with pytest.raises(Stop):
        write_batch_dedup(_target(clickhouse_url, database), key, first, sizing=SMALL, after_chunk=_stop_after(1, 0))
    replay = [TableRows(database, "b", _rows(odds, 5, 64)), TableRows(database, "a", _rows(evens, 5, 64))]
    write_batch_dedup(_target(clickhouse_url, database), key, replay, sizing=SMALL)

    assert _ids(clickhouse_url, database, "a") == list(evens)
    assert _ids(clickhouse_url, database, "b") == list(odds)
    assert _keys(clickhouse_url, database) == [("3", str(ROWS))]


def test_equal_rows_of_one_batch_are_all_kept_and_the_same_rows_in_the_next_batch_too(
    clickhouse_url: str, database: str
) -> None:
    # Equal chunks of one batch differ by their count k; another batch id names other blocks.
    _create(clickhouse_url, database, "a")
    same = pa.record_batch({"id": pa.array([1] * 256, pa.int64()), "v": pa.array(["x"] * 256)})
    target = _target(clickhouse_url, database)
    for batch in (0, 1):
        write_batch_dedup(target, BatchKey("same", batch, "query-1"), [TableRows(database, "a", [same])], sizing=SMALL)
    assert len(_ids(clickhouse_url, database, "a")) == 512


def test_dead_letters_of_a_replayed_batch_are_kept_once(clickhouse_url: str, database: str) -> None:
    run_sql(
        clickhouse_url,
        f"CREATE TABLE `{database}`.n (id Int64, v UInt8) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 1000",
    )
    run_sql(clickhouse_url, dead_letter_ddl(database, "dl", dedup_window=True))
    target = _target(clickhouse_url, database, "n")
    BatchRecords(target).ensure_table()
    with ClickHouseHTTP(target) as c:
        info = describe_table(c, database, "n")
    data = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    plan = ConversionPlan(info.display, conversion_columns(info, data), dead_letter_table=(database, "dl"))

    def part(seed: int) -> TableRows:
        ids = list(range(100))
        random.Random(seed).shuffle(ids)
        rows = pa.record_batch({"id": pa.array(ids, pa.int64()), "v": pa.array([i * 10 for i in ids], pa.int64())})
        return TableRows(database, "n", plan.apply([rows]))

    key = BatchKey("letters", 0, "query-1")
    with pytest.raises(Stop):
        write_batch_dedup(target, key, [part(1)], sizing=SMALL, before_key=lambda: (_ for _ in ()).throw(Stop()))
    write_batch_dedup(target, key, [part(2)], sizing=SMALL)

    assert _ids(clickhouse_url, database, "n") == list(range(26))  # v = 10 * id fits UInt8 up to 250
    assert int(read_committed(clickhouse_url, f"SELECT count() FROM `{database}`.dl")[0][0]) == 74
