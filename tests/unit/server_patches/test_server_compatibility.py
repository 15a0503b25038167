"""The embedded stack's ``compatibility`` option and the front's reading of INSERTs, without a server:
the value's check, the users file it writes, its place in stack.json, and which INSERTs a
server would queue as asynchronous (server_patches/stack_files.py, chdb_config.py, statements.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from server_patches import chdb_config
from server_patches.errors import HTTPError
from server_patches.stack_files import StackError, StackInfo, check_compatibility, refuse_changes_to_a_running_stack
from server_patches.statements import Statement, bool_setting, inline_insert_text, insert_settings_clause


@pytest.mark.parametrize("value", ["25.8", "24.8", "26.10", " 25.3 "])
def test_a_major_minor_version_is_a_compatibility(value: str) -> None:
    assert check_compatibility(value) == value.strip()


def test_no_compatibility_is_none() -> None:
    assert check_compatibility(None) is None


@pytest.mark.parametrize("value", ["25", "25.8.1", "v25.8", "latest", "", "25.x", "25,8"])
def test_anything_else_is_refused_with_a_message_naming_the_option_and_the_form(value: str) -> None:
    with pytest.raises(StackError) as err:
        check_compatibility(value)
    assert "--compatibility" in str(err.value) and "major.minor" in str(err.value)


def test_the_users_file_gets_the_compatibility_in_its_default_profile_and_keeps_the_rest() -> None:
    root = ET.fromstring(chdb_config.render_users("25.8").split("\n", 1)[1])
    assert root.findtext("profiles/default/compatibility") == "25.8"
    assert root.findtext("profiles/readonly/readonly") == "1"
    assert root.findtext("users/default/profile") == "default"
    assert chdb_config.render_users(None) == chdb_config.USERS_XML.read_text()


def test_the_config_points_at_the_users_file_written_beside_it_only_with_a_compatibility(tmp_path: Path) -> None:
    common = {"zookeeper": [("127.0.0.1", 2181)], "name": "s", "server_uuid": "u"}
    with_it = chdb_config.write(tmp_path / "a" / "config.xml", compatibility="25.8", **common)
    without = chdb_config.write(tmp_path / "b" / "config.xml", **common)

    users = ET.parse(with_it).getroot().findtext("user_directories/users_xml/path")
    assert users == str(tmp_path / "a" / "users.xml")
    assert ET.parse(users).getroot().findtext("profiles/default/compatibility") == "25.8"
    assert ET.parse(without).getroot().findtext("user_directories/users_xml/path") == str(chdb_config.USERS_XML)
    assert not (tmp_path / "b" / "users.xml").exists()


def _info(compatibility: str | None) -> StackInfo:
    return StackInfo(
        dir=Path("/tmp/s"),
        clickhouse_url="http://127.0.0.1:1",
        zookeeper="127.0.0.1:2",
        kafka_bootstrap=None,
        processes={},
        ports={"clickhouse": 1},
        data_dirs={},
        logs={},
        config_file="",
        compatibility=compatibility,
    )


def test_stack_json_records_the_compatibility_and_an_old_one_without_it_reads_as_none() -> None:
    d = _info("25.8").to_json()
    assert d["compatibility"] == "25.8"
    assert StackInfo.from_json(d) == _info("25.8")
    del d["compatibility"]
    assert StackInfo.from_json(d).compatibility is None


def test_a_running_stack_refuses_another_compatibility_and_takes_its_own_or_none() -> None:
    prev = _info("25.8")
    refuse_changes_to_a_running_stack(prev, {}, user=None, password_env=None, compat="25.8")
    refuse_changes_to_a_running_stack(prev, {}, user=None, password_env=None, compat=None)
    with pytest.raises(StackError, match="compatibility '25.8', not '24.8'"):
        refuse_changes_to_a_running_stack(prev, {}, user=None, password_env=None, compat="24.8")


@pytest.mark.parametrize(
    ("sql", "inline"),
    [
        ("INSERT INTO t VALUES (1)", True),
        ("insert into t (a, b) values (1, 'x')", True),
        ("/* c */ INSERT INTO t FORMAT TSV\n1", True),
        ("INSERT INTO t SETTINGS async_insert = 0 VALUES (1)", True),
        ("INSERT INTO t SELECT 1", False),
        ("INSERT INTO t WITH 1 AS x SELECT x", False),
        ("INSERT INTO t (SELECT 1)", False),
        ("INSERT INTO `values` SELECT 1", False),
        ("INSERT INTO FUNCTION file('VALUES.tsv') SELECT 1", False),
        ("INSERT INTO t FROM INFILE '/x' FORMAT TSV", False),
        ("SELECT 'INSERT INTO t VALUES'", False),
    ],
)
def test_an_insert_is_inline_when_its_data_is_in_the_text_and_no_select_feeds_it(sql: str, inline: bool) -> None:
    assert inline_insert_text(sql) is inline


def test_an_insert_whose_data_is_the_body_is_inline() -> None:
    assert Statement("INSERT INTO t", "RowBinary", iter(())).inline_insert


def test_an_inserts_own_settings_are_read_up_to_its_data() -> None:
    assert insert_settings_clause("INSERT INTO t SETTINGS async_insert = 0, log_comment = 'a VALUES b' VALUES (1)") == [
        ("async_insert", "0"),
        ("log_comment", "a VALUES b"),
    ]
    assert insert_settings_clause("INSERT INTO t SETTINGS async_insert=1") == [("async_insert", "1")]
    assert insert_settings_clause("INSERT INTO t VALUES ('SETTINGS x = 1')") == []


@pytest.mark.parametrize(("text", "on"), [("1", True), ("true", True), ("'1'", True), ("0", False), ("false", False)])
def test_a_bool_setting_reads_as_clickhouse_reads_it(text: str, on: bool) -> None:
    assert bool_setting(text) is on
    assert bool_setting(None) is False


def test_an_error_of_the_front_ends_its_text_with_a_full_stop_before_the_name_as_a_server_does() -> None:
    refused = HTTPError(48, "Async inserts inside transactions are not supported", "NOT_IMPLEMENTED")
    assert (
        refused.body()
        == b"Code: 48. DB::Exception: Async inserts inside transactions are not supported. (NOT_IMPLEMENTED)\n"
    )
    assert HTTPError(36, "Say so.", "BAD_ARGUMENTS").body() == b"Code: 36. DB::Exception: Say so. (BAD_ARGUMENTS)\n"


def test_a_setting_newer_than_the_compatibility_keeps_the_engines_default_where_its_old_value_is_a_limit() -> None:
    from server_patches.chdb_config import render_users

    assert "<max_parts_to_move>1000</max_parts_to_move>" in render_users("24.8")
    assert "max_parts_to_move" not in render_users("25.3")
