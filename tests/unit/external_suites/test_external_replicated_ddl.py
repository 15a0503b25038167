"""The Replicated profile of ``make test-external``: the DDL of its targets and what it asks of the server (pure)."""

from __future__ import annotations

import types

import pytest

from tests.helpers import external, replicated


class _Item:
    """The parts of a pytest item the selection reads: a mode parameter and the test's module."""

    def __init__(self, mode: str, module: object) -> None:
        self.callspec = types.SimpleNamespace(params={"mode": mode})
        self.module = module


def test_a_replicated_target_is_created_on_the_cluster_with_the_servers_macros_and_a_dedup_window() -> None:
    ddl = replicated.replicated_table_ddl("ctx_db", "events", "p Int32, o Int64, v String", "(p, o)", "p", "default")
    assert ddl == [
        "CREATE DATABASE IF NOT EXISTS `ctx_db` ON CLUSTER `default`",
        "CREATE TABLE `ctx_db`.`events` ON CLUSTER `default` (p Int32, o Int64, v String) "
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') "
        "PARTITION BY p ORDER BY (p, o) SETTINGS replicated_deduplication_window = 1000",
    ]


def test_a_replicated_target_without_a_partition_key_has_no_partition_clause() -> None:
    ddl = replicated.replicated_table_ddl("d", "t", "id UInt64", "id", None, "c")
    assert ddl[1] == (
        "CREATE TABLE `d`.`t` ON CLUSTER `c` (id UInt64) "
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') "
        "ORDER BY id SETTINGS replicated_deduplication_window = 1000"
    )


def test_hostile_database_table_and_cluster_names_are_quoted_as_identifiers() -> None:
    db, table, cluster = "db`; DROP DATABASE x; --", "ev\\ents`", "clu`ster"
    ddl = replicated.replicated_table_ddl(db, table, "id UInt64", "id", None, cluster)
    assert ddl[0] == "CREATE DATABASE IF NOT EXISTS `db\\`; DROP DATABASE x; --` ON CLUSTER `clu\\`ster`"
    assert ddl[1].startswith("CREATE TABLE `db\\`; DROP DATABASE x; --`.`ev\\\\ents\\`` ON CLUSTER `clu\\`ster` (")
    assert replicated.drop_database_ddl(db, cluster) == (
        "DROP DATABASE IF EXISTS `db\\`; DROP DATABASE x; --` ON CLUSTER `clu\\`ster` SYNC"
    )


def test_the_profile_needs_both_the_url_and_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(external.ENV_URL, "http://ch.example:8123")
    monkeypatch.delenv(external.ENV_CLUSTER, raising=False)
    assert replicated.cluster_profile() is None
    monkeypatch.setenv(external.ENV_CLUSTER, "default")
    profile = replicated.cluster_profile()
    assert profile is not None and profile.cluster == "default"
    monkeypatch.delenv(external.ENV_URL)
    assert replicated.cluster_profile() is None


def test_the_skip_reason_names_both_variables_and_why_the_embedded_engine_cannot_run_it() -> None:
    assert replicated.SKIP_REASON == (
        "needs a real ClickHouse cluster: set CLICKHOUSE_TX_EXTERNAL_URL and CLICKHOUSE_TX_EXTERNAL_CLUSTER "
        "(the embedded engine cannot write into Replicated tables)"
    )


def test_a_replicated_test_is_skipped_only_for_the_registry_not_for_transactions_or_the_non_replicated_window() -> None:
    lacks = {"transactions": "UNSUPPORTED", "dedup_window": "kept twice"}
    module = types.SimpleNamespace(ddl=replicated.replicated_table_ddl)
    assert external.lacking_for(_Item("staging", module), lacks) is None
    assert external.lacking_for(_Item("dedup", module), lacks) is None
    assert (
        external.lacking_for(_Item("dedup", module), {"keepermap": "UNKNOWN_STORAGE"}) == "mode dedup needs keepermap"
    )
    # the same mode into a non-replicated target still needs what its reads and table need
    assert external.lacking_for(_Item("staging", None), lacks) == "mode staging needs transactions"
