"""``python -m clickhouse_tx check`` without a server: the grants it asks for, a refused setting, its lines."""

from __future__ import annotations

from typing import cast

from clickhouse_tx.admin.grants import Grant, Need, grant_statement, missing, needed
from clickhouse_tx.admin.preflight import CheckResult, check_contract
from clickhouse_tx.client.contract import ServerTraits
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ServerError
from clickhouse_tx.interfaces import Mode, Target

#: A slice of ``system.privileges``: privilege -> the group holding it.
TREE: dict[str, str | None] = {
    "ALL": None,
    "ALTER": "ALL",
    "ALTER TABLE": "ALTER",
    "ALTER MOVE PARTITION": "ALTER TABLE",
    "CREATE": "ALL",
    "CREATE TABLE": "CREATE",
    "INSERT": "ALL",
}
TARGET = Target(url="http://h:8123", database="db", table="events")


def test_a_global_group_grant_covers_every_privilege_under_it() -> None:
    needs = [Need("ALTER MOVE PARTITION", "db"), Need("CREATE TABLE", "db")]
    assert missing(needs, [Grant("ALTER"), Grant("CREATE")], TREE) == []


def test_a_grant_on_one_table_does_not_cover_the_stage_tables_of_the_database() -> None:
    needs = [Need("INSERT", "db", "events"), Need("INSERT", "db")]
    assert missing(needs, [Grant("INSERT", "db", "events")], TREE) == [Need("INSERT", "db")]


def test_a_partial_revoke_takes_back_what_a_wider_grant_gave() -> None:
    grants = [Grant("ALL"), Grant("ALTER MOVE PARTITION", "db", is_partial_revoke=True)]
    assert missing([Need("ALTER MOVE PARTITION", "db"), Need("INSERT", "db")], grants, TREE) == [
        Need("ALTER MOVE PARTITION", "db")
    ]


def test_a_wildcard_database_grant_covers_the_databases_it_prefixes() -> None:
    assert missing([Need("INSERT", "db_prod")], [Grant("INSERT", "db_", is_wildcard=True)], TREE) == []


def test_only_staging_needs_to_move_partitions_and_drop_tables_and_none_needs_no_bookkeeping() -> None:
    staging = {str(n) for n in needed(Mode.STAGING, TARGET)}
    assert {"ALTER MOVE PARTITION ON `db`.*", "DROP TABLE ON `db`.*"} <= staging
    assert not any("MOVE" in str(n) or "DROP" in str(n) for n in needed(Mode.DEDUP, TARGET))
    assert {str(n) for n in needed(Mode.NONE, TARGET)} == {"INSERT ON `db`.`events`", "SELECT ON `db`.`events`"}


def test_the_fix_is_one_grant_statement_per_object() -> None:
    lacking = [Need("CREATE TABLE", "db"), Need("DROP TABLE", "db"), Need("INSERT", "db", "events")]
    assert grant_statement(lacking, "writer") == (
        "GRANT CREATE TABLE, DROP TABLE ON `db`.* TO `writer`; GRANT INSERT ON `db`.`events` TO `writer`"
    )


def test_a_report_line_is_ok_with_an_optional_note_or_fail_with_what_to_change() -> None:
    assert CheckResult("grants", True).line() == "ok  grants"
    assert CheckResult("table db.t", True, "MergeTree").line() == "ok  table db.t (MergeTree)"
    assert CheckResult("mode dedup", False, "run ALTER ...").line() == "FAIL mode dedup: run ALTER ..."


class _ConstrainedProfile:
    """A client whose server refuses ``insert_deduplicate`` by a profile constraint (code 452)."""

    def server_traits(self) -> ServerTraits:
        return ServerTraits(deduplicate_insert=True)

    def query_json(self, sql: str, settings: dict[str, str]) -> list[dict[str, str]]:
        raise ServerError(
            "Setting insert_deduplicate should not be changed", code=452, name="SETTING_CONSTRAINT_VIOLATION"
        )


def test_a_profile_constraint_on_a_pinned_setting_fails_naming_the_setting_and_where_to_allow_it() -> None:
    result = check_contract(cast(ClickHouseHTTP, _ConstrainedProfile()), Mode.DEDUP)
    assert not result.ok
    assert result.detail.startswith("the server refuses the setting insert_deduplicate=0 (a constraint of the user's")
    assert "code 452 SETTING_CONSTRAINT_VIOLATION" in result.detail
    assert "allow it in the user's settings profile" in result.detail
