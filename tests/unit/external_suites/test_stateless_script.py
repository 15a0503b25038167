"""How ClickHouse test scripts are cut into statements (tests/external_suites/sql_script.py),
checked against what clickhouse-client does with the same text."""

from __future__ import annotations

from tests.external_suites.sql_script import Expected, split_statements, substitute


def test_a_hint_on_the_line_of_a_statement_is_its_expected_error_and_leading_comments_are_sent_with_the_next() -> None:
    script = (
        "-- Tags: no-fasttest\n"
        "commit; -- { serverError INVALID_TRANSACTION } -- no transaction\n"
        "-- Verify something\n"
        "SELECT 1;\n"
    )

    first, second = split_statements(script)

    assert first.text == "-- Tags: no-fasttest\ncommit"
    assert first.expected == Expected("serverError", ("INVALID_TRANSACTION",))
    assert second.text == "-- Verify something\nSELECT 1"
    assert second.expected is None


def test_a_hint_in_a_leading_comment_is_ignored_as_clickhouse_client_ignores_it() -> None:
    script = (
        "-- INSERT INTO t VALUES (6); -- { serverError NOT_IMPLEMENTED }\n"
        "SET a = 1;\n"
        "-- SELECT 2; -- { serverError 1 }\n"
    )

    (only,) = split_statements(script)

    assert only.text.endswith("SET a = 1")
    assert only.expected is None


def test_semicolons_in_strings_identifiers_and_block_comments_do_not_end_a_statement() -> None:
    script = "SELECT 'a;b', `c;d` /* e; f */ FROM t; select throwIf(1); -- { serverError 395, 1 }\n"

    first, second = split_statements(script)

    assert first.text == "SELECT 'a;b', `c;d` /* e; f */ FROM t"
    assert second.text == "select throwIf(1)"
    assert second.expected is not None and second.expected.matches(395, "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO")
    assert not second.expected.matches(48, "NOT_IMPLEMENTED")


def test_the_database_placeholders_are_replaced_as_clickhouse_test_replaces_them() -> None:
    assert substitute("{CLICKHOUSE_DATABASE}.t, {CLICKHOUSE_DATABASE_1}.u", "db") == "db.t, db_1.u"
