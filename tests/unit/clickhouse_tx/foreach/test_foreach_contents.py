"""The pure comparison of a ``foreachBatch`` replay in mode ``dedup`` with its first attempt's
record (``clickhouse_tx.foreach.contents``), and which of those records ``gc`` drops."""

from __future__ import annotations

import pyarrow as pa

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.foreach.contents import (
    TableContent,
    content_digest,
    differing,
    record_body,
    replay_differs,
    unstable_inputs,
)
from clickhouse_tx.foreach.key_check import BatchKey
from clickhouse_tx.modes.dedup.lifetime import LayoutRow, by_batch, count_kinds, expired_content_keys
from clickhouse_tx.modes.dedup.records import CONTENT_PARTITION

KEY = BatchKey("sums", 4, "query-1", tables=("db.a",))
CHUNKS = [(128, "aa"), (128, "bb"), (64, "cc")]


def recorded(content: dict[str, TableContent]) -> dict:
    return record_body(KEY, content, "attempt-1", 1_700_000_000_000)["tables"]


def test_the_same_chunks_in_any_order_make_the_same_digest_and_one_other_chunk_another() -> None:
    assert content_digest(CHUNKS) == content_digest(list(reversed(CHUNKS)))
    assert content_digest(CHUNKS) != content_digest([(128, "aa"), (128, "bb"), (64, "cd")])
    assert content_digest(CHUNKS) != content_digest([(128, "aa"), (128, "bb")])
    assert content_digest(CHUNKS) != content_digest([*CHUNKS, (128, "aa")])  # a chunk twice is two tokens


def test_a_replay_with_the_recorded_content_differs_nowhere() -> None:
    mine = {"db.a": TableContent(320, content_digest(CHUNKS))}
    assert differing(recorded(mine), mine) == []


def test_a_replay_with_other_rows_other_dead_letters_or_other_tables_differs_in_those_tables() -> None:
    first = {"db.a": TableContent(320, "d1"), "db.b": TableContent(5, "d2")}
    assert differing(recorded(first), {"db.a": TableContent(320, "d9"), "db.b": TableContent(5, "d2")}) == ["db.a"]
    assert differing(recorded(first), {"db.a": TableContent(320, "d1"), "db.b": TableContent(5, "d2", 1)}) == ["db.b"]
    assert differing(recorded(first), {"db.a": TableContent(320, "d1")}) == ["db.b"]
    assert differing(recorded({"db.a": TableContent(320, "d1")}), first) == ["db.b"]


def test_the_refusal_names_the_table_app_id_batch_both_contents_the_inputs_and_what_to_do() -> None:
    first = {"db.a": TableContent(3, "1111111111111111aaaa")}
    body = record_body(KEY, first, "attempt-1", 1_700_000_000_000)
    error = replay_differs(KEY, body, {"db.a": TableContent(3, "2222222222222222bbbb")}, {"db.a": ["sum in the plan"]})
    text = str(error)
    assert isinstance(error, ConfigurationError)
    for part in (
        "app_id='sums'",
        "batch 4",
        "db.a: first attempt 3 rows, digest 1111111111111111, this replay 3 rows, digest 2222222222222222",
        "sum in the plan",
        "mode 'transaction'",
        "round(sum(x), 9)",
        "array_sort(collect_list(x))",
        "new app_id",
        "2023-11-14 22:13:20 UTC",
        "nothing of this replay was written",
    ):
        assert part in text, part


def test_the_likely_non_deterministic_inputs_come_from_the_plans_functions_and_the_columns_types() -> None:
    plan = "Aggregate [k#1], [k#1, sum(x#2) AS total#5, collect_list(s#3, 0, 0) AS l#6, first(t#4, false)]"
    schema = pa.schema([("k", pa.int64()), ("total", pa.float64()), ("l", pa.list_(pa.string()))])
    found = unstable_inputs(plan, schema)
    assert [f.split(" ")[0] for f in found] == ["sum", "collect_list", "first", "floating-point", "list"]
    assert unstable_inputs("Project [id#1, s#2]", pa.schema([("id", pa.int64())])) == []
    assert unstable_inputs("Project [rand(42) AS r#3, current_timestamp() AS t#4]")[0].startswith("rand")


def content_row(key: str, app: str, batch: int, tables: list[str], ms: int) -> LayoutRow:
    body = {"app_id": app, "batch": batch, "tables": {t: {"rows": 1, "digest": "d"} for t in tables}}
    return LayoutRow(key, f"clickhouse_tx_fb:{app}", batch, CONTENT_PARTITION, 0, ms, content=body)


def test_gc_drops_a_helper_record_once_its_batch_or_a_later_one_has_a_key_row_and_keeps_one_without() -> None:
    rows = [
        content_row("r1", "app", 1, ["db.a"], 1000),
        content_row("r2", "app", 2, ["db.a"], 1000),
        content_row("r3", "app", 3, ["db.a"], 1000),
        content_row("r4", "app", 3, ["db.b"], 1000),
    ]
    key_rows = [("app", 2, frozenset({"db.a"})), ("app", 3, frozenset({"db.b"}))]
    # r1: a later batch is written; r2 and r4: their own key row; r3: batch 3 of db.a never was.
    assert expired_content_keys(rows, key_rows, cut_ms=1000) == ["r1", "r2", "r4"]
    assert expired_content_keys(rows, key_rows, cut_ms=999) == []


def test_helper_records_are_counted_as_their_own_kind_and_are_no_sink_batch() -> None:
    rows = [content_row("r1", "app", 1, ["db.a"], 1000), LayoutRow("q/0/0", "q", 0, 0, 0, 1000)]
    assert count_kinds(rows)["foreach_batch"] == 1
    assert list(by_batch(rows)) == [("q", 0)]
