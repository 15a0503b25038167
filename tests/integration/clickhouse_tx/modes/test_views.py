"""Materialized views on the target: found on the driver, kept exactly once or refused, per mode.

The target ``events (id, s)`` feeds a chain of two views (``tests/helpers/views.py``): a
rollup of the rows per ``id % 4`` and a view summing the rollup. Driven through the real
Coordinator on the shared stack; the SIGKILLed Spark drivers are in
``tests/torture/test_views_kill.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Prepared, WriteContext
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX
from clickhouse_tx.modes.views import DependentView, dependent_views
from tests.helpers.cli import run_cli
from tests.helpers.tables import PARTITIONS, TXN, batches, committed_count, make_table, rows, tables
from tests.helpers.views import add_rollup_views, assert_views_count_once

EXACTLY_ONCE = ["transaction", "staging", "dedup"]


class SimulatedCrash(BaseException):
    """The driver dies here (a BaseException: no retry or cleanup path catches it)."""


def per_key(n: int) -> dict[int, int]:
    return {k: len(range(k, n, PARTITIONS)) for k in range(PARTITIONS)}


def prepare_all(co, data: pa.Table, *, attempt: int = 0) -> list[Prepared]:
    """One Spark-like task per half of ``data``: half i is partition i."""
    per = data.num_rows // 2
    return [co.prepare(WriteContext(TXN, 0, p, attempt), batches(data.slice(p * per, per))) for p in range(2)]


def test_dependent_views_lists_a_chain_in_dependency_order_with_the_table_each_writes_into(
    admin: ClickHouseHTTP, database: str, clickhouse_url: str
) -> None:
    target = make_table(admin, database)
    add_rollup_views(clickhouse_url, database, "id % 4")
    db = q.quote_identifier(database)
    admin.command(
        f"CREATE MATERIALIZED VIEW {db}.inner_mv ENGINE = MergeTree ORDER BY id AS SELECT id FROM {db}.events"
    )
    admin.command(f"CREATE VIEW {db}.plain_view AS SELECT * FROM {db}.events")  # runs on no insert

    views = dependent_views(target)

    by_view = {v.view[1]: v for v in views}
    assert set(by_view) == {"events_by_key_mv", "events_total_mv", "inner_mv"}
    assert by_view["events_by_key_mv"] == DependentView(
        (database, "events_by_key_mv"), (database, "events"), (database, "events_by_key")
    )
    assert by_view["events_total_mv"] == DependentView(
        (database, "events_total_mv"), (database, "events_by_key"), (database, "events_total")
    )
    inner = by_view["inner_mv"].target
    assert inner is not None and inner[1].startswith(".inner") and inner[1] in tables(admin, database)
    names = [v.view[1] for v in views]
    assert names.index("events_by_key_mv") < names.index("events_total_mv")


@pytest.mark.parametrize("mode", EXACTLY_ONCE)
def test_a_committed_batch_and_its_replays_count_each_row_once_in_a_chain_of_two_views(
    admin: ClickHouseHTTP, database: str, clickhouse_url: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    add_rollup_views(clickhouse_url, database, "id % 4")
    data = rows(2000)
    first = build_coordinator(target, mode, TXN, str(tmp_path))
    first.validate(data.schema)
    prepare_all(first, data)  # the driver dies after the prepares: no decision
    co = build_coordinator(target, mode, TXN, str(tmp_path))  # the restarted query replays the batch
    co.validate(data.schema)
    msgs = prepare_all(co, data, attempt=1)
    co.commit_batch(0, msgs)
    build_coordinator(target, mode, TXN, str(tmp_path)).commit_batch(0, msgs)  # and its commit once more

    assert committed_count(admin, target) == 2000
    assert_views_count_once(clickhouse_url, database, per_key(2000))
    assert not [t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)]


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_a_staging_driver_dead_inside_the_publishing_transaction_is_rolled_forward_once_in_the_views(
    admin: ClickHouseHTTP,
    database: str,
    clickhouse_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    visibility: str,
) -> None:
    target = make_table(admin, database)
    add_rollup_views(clickhouse_url, database, "id % 4")
    data = rows(2000)
    co = build_coordinator(target, "staging", TXN, str(tmp_path), visibility=visibility)
    co.validate(data.schema)
    msgs = prepare_all(co, data)
    command = ClickHouseHTTP.command

    def dies_at_commit(self: ClickHouseHTTP, sql: str, *args: object, **kw: object) -> str:
        if sql == "COMMIT" and self.session_id and "clickhouse_tx_" in self.session_id:
            raise SimulatedCrash(self.session_id)  # its INSERTs ran; the transaction stays open
        return command(self, sql, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ClickHouseHTTP, "command", dies_at_commit)
    with pytest.raises(SimulatedCrash):
        co.commit_batch(0, msgs)
    monkeypatch.undo()
    assert committed_count(admin, target) == 0  # nothing of an open transaction is visible

    build_coordinator(target, "staging", TXN, str(tmp_path), visibility=visibility).commit_batch(0, msgs)

    assert committed_count(admin, target) == 2000
    assert_views_count_once(clickhouse_url, database, per_key(2000))


def test_mode_dedup_refuses_views_whose_tables_keep_no_deduplication_window_naming_them_and_the_modes_that_keep_them(
    admin: ClickHouseHTTP, database: str, clickhouse_url: str, tmp_path: Path
) -> None:
    target = make_table(admin, database)
    add_rollup_views(clickhouse_url, database, "id % 4", window=False)
    co = build_coordinator(target, "dedup", TXN, str(tmp_path))

    with pytest.raises(ConfigurationError) as e:
        co.validate(rows(1).schema)

    msg = str(e.value)
    assert f"{database}.events_by_key_mv -> {database}.events_by_key" in msg
    assert f"{database}.events_total_mv -> {database}.events_total" in msg
    assert "non_replicated_deduplication_window = 0" in msg and "'transaction' and 'staging'" in msg
    assert committed_count(admin, target) == 0


@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_a_view_into_a_table_no_transaction_can_hold_is_refused_before_anything_is_written(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    target = make_table(admin, database)
    db = q.quote_identifier(database)
    admin.command(f"CREATE TABLE {db}.mem (id UInt64) ENGINE = Memory")
    admin.command(f"CREATE MATERIALIZED VIEW {db}.mem_mv TO {db}.mem AS SELECT id FROM {db}.events")
    co = build_coordinator(target, mode, TXN, str(tmp_path))

    with pytest.raises(ConfigurationError, match=rf"{database}\.mem_mv -> {database}\.mem.*is Memory"):
        co.validate(rows(1).schema)


def test_mode_none_warns_that_the_views_get_rows_at_least_once(
    admin: ClickHouseHTTP, database: str, clickhouse_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = make_table(admin, database)
    add_rollup_views(clickhouse_url, database, "id % 4")
    co = build_coordinator(target, "none", TXN, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.modes.plain"):
        co.validate(rows(1).schema)
    assert any("at least once" in r.message and "events_by_key_mv" in r.message for r in caplog.records)


def test_verify_lists_the_views_it_could_not_check_and_why(
    admin: ClickHouseHTTP, database: str, clickhouse_url: str
) -> None:
    make_table(admin, database)
    add_rollup_views(clickhouse_url, database, "id % 4")
    admin.command(f"INSERT INTO {q.qualified(database, 'events')} SELECT number, 'v' FROM numbers(100)")

    out = run_cli(
        "verify",
        "--url",
        clickhouse_url,
        "--table",
        f"{database}.events",
        "--topic-col",
        "",
        "--partition-col",
        "id",
        "--offset-col",
        "id",
        "--json",
        "-",
        "--quiet",
    )

    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [(v["view"], v["table"]) for v in report["views_not_checked"]] == [
        (f"{database}.events_by_key_mv", f"{database}.events_by_key"),
        (f"{database}.events_total_mv", f"{database}.events_total"),
    ]
    assert all("cannot recompute" in v["why"] for v in report["views_not_checked"])
