"""Quoting of identifiers, literals and query parameters (pure string functions)."""

from __future__ import annotations

import pytest

from clickhouse_tx.client import sql as q

HOSTILE = [
    "plain",
    "with space",
    "a.b",
    "back`tick",
    "``",
    "back\\slash",
    "tail\\",
    "quote'd",
    'dq"x',
    "semi;DROP TABLE x",
    "new\nline",
    "tab\tx",
    "nul\0x",
    "ünï😀",
    "SELECT",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_quote_identifier_wraps_in_backticks_and_leaves_no_unescaped_backtick(name: str) -> None:
    quoted = q.quote_identifier(name)
    assert quoted.startswith("`") and quoted.endswith("`")
    inner = quoted[1:-1]
    i = 0
    while i < len(inner):  # every backtick and backslash inside is escaped
        if inner[i] == "\\":
            i += 2
            continue
        assert inner[i] != "`", quoted
        i += 1


def test_quote_identifier_escapes_backticks_and_backslashes() -> None:
    assert q.quote_identifier("a`b") == "`a\\`b`"
    assert q.quote_identifier("a\\b") == "`a\\\\b`"
    assert q.quote_identifier("x") == "`x`"


def test_quote_identifier_refuses_an_empty_name() -> None:
    with pytest.raises(ValueError, match="empty"):
        q.quote_identifier("")


def test_quote_identifier_refuses_a_non_string() -> None:
    with pytest.raises(TypeError):
        q.quote_identifier(3)  # type: ignore[arg-type]


def test_qualified_quotes_both_parts_separately() -> None:
    assert q.qualified("d.b", "t`x") == "`d.b`.`t\\`x`"


def test_quote_string_escapes_quotes_backslashes_and_control_characters() -> None:
    assert q.quote_string("it's") == "'it\\'s'"
    assert q.quote_string("a\\b") == "'a\\\\b'"
    assert q.quote_string("l1\nl2\t\0") == "'l1\\nl2\\t\\0'"


def test_quote_strings_builds_an_in_list_and_refuses_an_empty_one() -> None:
    assert q.quote_strings(["a", "b'"]) == "('a', 'b\\'')"
    with pytest.raises(ValueError):
        q.quote_strings([])


def test_column_list_quotes_every_name() -> None:
    assert q.column_list(["a", "b c"]) == "(`a`, `b c`)"


def test_format_param_uses_the_escaped_text_format() -> None:
    assert q.format_param("a\tb\nc\\") == "a\\tb\\nc\\\\"
    assert q.format_param(True) == "1"
    assert q.format_param(12) == "12"
    assert q.format_param(1.5) == "1.5"
    assert q.format_param(["x", "y'"]) == "['x','y\\'']"


def test_format_param_refuses_unsupported_types() -> None:
    with pytest.raises(TypeError):
        q.format_param(object())


def test_a_record_table_ddl_quotes_every_column_and_key_and_appends_its_settings() -> None:
    ddl = q.record_table_ddl("`d`.`t`", [("partition", "Int64"), ("x`y", "String")], ["partition"], "a = 1")
    assert ddl == (
        "CREATE TABLE IF NOT EXISTS `d`.`t` (`partition` Int64, `x\\`y` String) "
        "ENGINE = MergeTree ORDER BY (`partition`) SETTINGS a = 1"
    )
    assert not q.record_table_ddl("`d`.`t`", [("a", "Int8")], ["a"]).endswith("SETTINGS ")
