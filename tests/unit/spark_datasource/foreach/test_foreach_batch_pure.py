"""The exactly-once foreachBatch helper without servers: its options, its key, its checks.

The writes themselves (a real SparkSession and the embedded stack) are in
``tests/spark/spark_datasource/foreach/test_foreach_batch.py``; the COMMIT's settlement in
``tests/integration/clickhouse_tx/foreach/test_foreach_keys.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.foreach.keys import BatchKey, BatchRecords, attempt_id, batch_prefix, check_recorded, key_session
from clickhouse_tx.interfaces import Mode
from spark_datasource.foreach.helper import clickhouse_tx_batch, clickhouse_tx_transaction
from spark_datasource.foreach.options import ForeachOptions
from spark_datasource.foreach.query import query_identity
from spark_datasource.foreach.write import BatchTransaction
from spark_datasource.options.writer_options import WriterOptions

URL = "http://127.0.0.1:8123"
BASE = BatchKey("events", 3, "query-1", "/chk/events")
KEY = BASE.scoped(["db.events"])


def _row(
    batch_id: int, query_id: str = "query-1", checkpoint: str = "/chk/events", tables: tuple[str, ...] = ("db.events",)
) -> dict[str, object]:
    return {
        "app_id": "events",
        "batch_id": batch_id,
        "query_id": query_id,
        "checkpoint": checkpoint,
        "rows": 10,
        "tables": list(tables),
        "committed_at": "2026-01-02 03:04:05.000",
    }


def test_an_unknown_option_fails_when_the_helper_is_built_naming_a_close_match() -> None:
    with pytest.raises(ConfigurationError, match="batch_size"):
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", bacth_size=5)


@pytest.mark.parametrize("name", ["transactional_id", "checkpointLocation", "table_column", "shards", "visibility"])
def test_an_option_of_the_sink_alone_is_refused_when_the_helper_is_built(name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"option {name} is the clickhouse_tx sink's"):
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", **{name: "x"})


def test_a_malformed_writer_option_is_refused_as_the_sink_refuses_it() -> None:
    with pytest.raises(ConfigurationError) as sink:
        WriterOptions.parse({"url": URL, "table": "db.events", "session_timeout": "3"}, streaming=False)
    with pytest.raises(ConfigurationError) as helper:
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", session_timeout=3)
    assert str(helper.value) == str(sink.value)


@pytest.mark.parametrize("mode", ["staging", "none"])
def test_the_helper_takes_modes_transaction_and_dedup_and_points_the_others_to_the_sink(mode: str) -> None:
    for built in ("transaction", "dedup"):
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", mode=built)
    with pytest.raises(ConfigurationError, match=r"writeStream.format\('clickhouse_tx'\)"):
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", mode=mode)


@pytest.mark.parametrize("app_id", ["", "   ", "x" * 257, "tab\there"])
def test_an_app_id_that_names_no_stream_is_refused_naming_the_option(app_id: str) -> None:
    with pytest.raises(ConfigurationError, match="option app_id="):
        clickhouse_tx_batch(url=URL, table="db.events", app_id=app_id)


def test_python_values_reach_the_writer_options_as_the_strings_the_sink_takes() -> None:
    parsed = ForeachOptions.parse(
        app_id=" events ",
        checkpoint_location=None,
        options={"url": URL, "table": "events", "database": "db", "create_table": True, "batch_size": 500},
    )
    assert parsed.app_id == "events"
    assert parsed.writer.create_table is True and parsed.writer.batch_size == 500
    assert (parsed.writer.database, parsed.writer.table, parsed.writer.mode) == ("db", "events", Mode.TRANSACTION)
    assert parsed.for_table("other", "t").target().database == "other"


def test_a_malformed_checkpoint_location_is_refused_when_the_helper_is_built() -> None:
    with pytest.raises(ConfigurationError, match="file: URI must be absolute"):
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", checkpoint_location="file://host/chk")


def test_the_context_keeps_its_key_table_in_the_database_it_is_given() -> None:
    tx = clickhouse_tx_transaction(url=URL, app_id="orders", batch_id=7, database="shop")
    assert (tx.options.writer.database, tx.options.writer.table) == ("shop", "clickhouse_tx_batches")
    assert tx.batch_id == 7 and tx.key is None and not tx.skipped


@pytest.mark.parametrize("batch_id", [-1, True, "3", 2.0])
def test_a_batch_id_that_spark_would_not_give_is_refused(batch_id: object) -> None:
    parsed = ForeachOptions.parse(app_id="a", checkpoint_location=None, options={"url": URL, "table": "db.t"})
    with pytest.raises(ConfigurationError, match="batch_id="):
        BatchTransaction(parsed, batch_id)  # type: ignore[arg-type]


def test_a_recorded_key_is_skipped_and_an_unrecorded_one_is_written() -> None:
    assert check_recorded([_row(3)], KEY) == _row(3)
    assert check_recorded([], KEY) is None


def test_a_row_of_the_same_batch_naming_only_other_tables_leaves_this_calls_tables_to_be_written() -> None:
    assert check_recorded([_row(3, tables=("db.other",))], KEY) is None
    both = BASE.scoped(["db.b", "db.a", "db.a"])
    assert both.tables == ("db.a", "db.b")
    assert check_recorded([_row(3, tables=("db.b", "db.a"))], both) == _row(3, tables=("db.b", "db.a"))


@pytest.mark.parametrize(("recorded", "call"), [(("db.a", "db.b"), ("db.a",)), (("db.a",), ("db.a", "db.b"))])
def test_a_row_of_the_same_batch_sharing_some_of_the_tables_is_refused_naming_app_id_and_the_context(
    recorded: tuple[str, ...], call: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_recorded([_row(3, tables=recorded)], BASE.scoped(call))
    text = str(info.value)
    assert "option app_id='events'" in text and "clickhouse_tx_transaction" in text and "nothing was written" in text
    assert f"recorded tables {list(recorded)}" in text and f"this call writes tables {list(call)}" in text


def test_a_row_of_the_app_id_from_another_query_is_refused_naming_app_id_and_both_queries() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_recorded([_row(41, query_id="query-0", checkpoint="/chk/old")], KEY)
    text = str(info.value)
    assert "option app_id='events'" in text
    assert "query query-0 (checkpoint /chk/old) recorded batch 41" in text
    assert "batch 3 comes from query query-1 (checkpoint /chk/events)" in text
    assert "nothing was written" in text


def test_the_key_row_quotes_what_the_user_named() -> None:
    key = BatchKey("it's", 5, "q'1", "/chk/o'k")
    sql = BatchRecords(WriterOptions.parse({"url": URL, "table": "db.t"}, streaming=False).target()).insert_sql(
        key, "attempt", ["db.a", "db.b'"], 12, 34
    )
    assert "'it\\'s', 5, 'q\\'1', '/chk/o\\'k', 'attempt', ['db.a', 'db.b\\''], 12, 34, now64(3)" in sql
    assert sql.startswith("INSERT INTO `db`.`clickhouse_tx_batches` (")


def test_the_key_row_of_a_transaction_is_inserted_only_while_the_session_runs_that_transaction() -> None:
    records = BatchRecords(WriterOptions.parse({"url": URL, "table": "db.t"}, streaming=False).target())
    tid = "(7,8,'0f0e0d0c-0000-0000-0000-000000000001')"
    sql = records.insert_sql(KEY, "attempt", ["db.events"], 1, 2, fence=tid)
    assert " SELECT 'events', 3, " in sql
    assert sql.endswith("WHERE toString(transactionID()) = '(7,8,\\'0f0e0d0c-0000-0000-0000-000000000001\\')'")


def test_every_attempt_at_a_key_writes_in_the_keys_session_under_an_id_of_its_own() -> None:
    key = BatchKey("events to ch/1", 9, "q")
    first, second = attempt_id(key), attempt_id(key)
    assert first != second and key_session(key) == key_session(BatchKey("events to ch/1", 9, "q"))
    assert re.fullmatch(r"clickhouse_tx_fb_[A-Za-z0-9_]+_9", key_session(key)), key_session(key)
    assert first.startswith(key_session(key) + "_") and re.fullmatch(r"[A-Za-z0-9_]+_[0-9a-f]{12}", first)


def test_each_table_set_of_a_batch_has_a_session_of_its_own_and_shares_the_batchs_token_prefix() -> None:
    a, b = BASE.scoped(["db.a"]), BASE.scoped(["db.b"])
    assert len({key_session(a), key_session(b), key_session(BASE)}) == 3
    assert all(key_session(k).startswith(batch_prefix(BASE) + "_") for k in (a, b))
    assert batch_prefix(a) == batch_prefix(b) == "clickhouse_tx_fb_events_3"
    with pytest.raises(ValueError):
        a.scoped(["db.b"])


def test_outside_a_query_the_identity_comes_from_the_checkpoint_given(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "0b6f-query"}) + "\n")
    assert query_identity(None, str(tmp_path)) == ("0b6f-query", str(tmp_path))
    assert query_identity(None, f"file://{tmp_path}/") == ("0b6f-query", str(tmp_path))


def test_a_checkpoint_without_spark_metadata_is_refused_naming_checkpoint_location(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="option checkpoint_location="):
        query_identity(None, str(tmp_path))


def test_outside_a_query_and_without_a_checkpoint_the_helper_asks_for_checkpoint_location() -> None:
    # With or without a SparkSession in this process: no micro-batch runs on this thread,
    # so Spark's local property names no query.
    with pytest.raises(ConfigurationError, match="give it checkpoint_location"):
        query_identity(None, None)


@pytest.mark.parametrize("value", [0, -1, "ten", True, 1.5])
def test_a_driver_max_bytes_that_is_no_positive_integer_is_refused_naming_the_option(value: object) -> None:
    with pytest.raises(ConfigurationError, match="option driver_max_bytes="):
        clickhouse_tx_batch(url=URL, table="db.events", app_id="events", driver_max_bytes=value)  # type: ignore[arg-type]


def test_driver_max_bytes_defaults_to_256_mib_and_the_options_kept_for_the_sink_never_show_the_password() -> None:
    parsed = ForeachOptions.parse(
        app_id="a", checkpoint_location=None, options={"url": URL, "table": "db.t", "password": "s3cret"}
    )
    assert parsed.driver_max_bytes == 256 * 1024 * 1024
    assert ("password", "s3cret") in parsed.sink_options and "s3cret" not in repr(parsed)
    given = ForeachOptions.parse(
        app_id="a", checkpoint_location=None, options={"url": URL, "table": "db.t"}, driver_max_bytes="1024"
    )
    assert given.driver_max_bytes == 1024


def test_a_one_table_context_past_driver_max_bytes_is_refused_as_a_context_not_as_mode_dedup() -> None:
    tx = clickhouse_tx_transaction(url=URL, app_id="events", batch_id=3, database="db", driver_max_bytes=1)
    tx._pending.append(("db", "events", None))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as e:
        tx._too_large(KEY, "db", "events", None)  # type: ignore[arg-type]
    assert "a clickhouse_tx_transaction context writes every table from the driver" in str(e.value)
    assert "driver_max_bytes=1" in str(e.value) and "nothing of the batch was written" in str(e.value)
